"""Thin REST handlers under /api/gpushare/ (documented in api/openapi.yaml).

What they say of the server's cards and kernels comes from its one snapshot (snapshot.Snapshots), of the change or
sampler tick before the request; what they change, they change through the manager.
"""

from __future__ import annotations

import asyncio
import json

from jupyter_client.jsonutil import json_default
from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.services.kernels.handlers import KernelActionHandler
from tornado import web

from ..broker.client import BrokerSaidNo
from ..core.policy import PolicyError
from ..core.words import FRAMEWORKS, render
from ..ledger.ledger import LedgerError
from ..ledger.notices import ACTIONS, WHY, WHY_MAX, NoSuchKernel
from .manager import QuotaManager
from .seam.internals import KERNEL_ID
from .seam.refusals import RefusalErrors, SessionsHandler, StartKernelHandler
from .snapshot import ServerSnapshot, Snapshots
from .state import build_state, event_view
from .teacher import NotAdmin

API = r"/api/gpushare"
AUTH_RESOURCE = "gpushare"


class GpuShareHandler(RefusalErrors, APIHandler):
    """The extension's handlers: errors as refusals.error_body says them (a rule's code and figures too)."""

    auth_resource = AUTH_RESOURCE

    @property
    def manager(self) -> QuotaManager:
        return self.settings["gpushare_manager"]

    async def snapshot(self) -> ServerSnapshot:
        """The server's snapshot, holding every change made before this request."""
        snapshots: Snapshots = self.settings["gpushare_snapshots"]
        return await snapshots.latest()

    def _record(self, kernel_id: str) -> None:
        """404 unless the kernel is this server's now (before a change through the manager)."""
        if kernel_id not in self.manager.records:
            raise web.HTTPError(404, f"No kernel {kernel_id} holds or waits for a GPU quota on this server.")

    async def kernel(self, kernel_id: str) -> dict:
        """A kernel's view (record, measured use, judged state) in the snapshot; 404 when it has none."""
        view = (await self.snapshot()).kernel(kernel_id)
        if view is None:
            raise web.HTTPError(404, f"No kernel {kernel_id} holds or waits for a GPU quota on this server.")
        return view.to_json()

    def json_body(self) -> dict:
        """The request body as a JSON object, or a 400 that says what is wrong with it."""
        try:
            body = json.loads(self.request.body or b"null")
        except ValueError as e:
            raise web.HTTPError(400, f'The request body is not JSON ({e}). Send e.g. {{"quota": "6GiB"}}.') from e
        except RecursionError as e:  # nested deeper than Python's parser goes: no real body is
            raise web.HTTPError(400, 'The request body is nested too deeply. Send e.g. {"quota": "6GiB"}.') from e
        if not isinstance(body, dict):
            raise web.HTTPError(400, 'The request body must be a JSON object, e.g. {"quota": "6GiB"}.')
        return body


class CardsHandler(GpuShareHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.finish((await self.snapshot()).cards())


class KernelsHandler(GpuShareHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        body = (await self.snapshot()).kernels_body  # encoded once per snapshot (pollers)
        self.set_header("Content-Type", "application/json")
        self.finish(body)


class KernelHandler(GpuShareHandler):
    @web.authenticated
    @authorized
    async def get(self, kernel_id: str) -> None:
        self.finish(await self.kernel(kernel_id))

    @web.authenticated
    @authorized
    async def patch(self, kernel_id: str) -> None:
        self._record(kernel_id)
        body = self.json_body()
        unknown = set(body) - {"quota"}
        if unknown or "quota" not in body:
            raise web.HTTPError(
                400, f'Send {{"quota": "<size>"}}, e.g. {{"quota": "6GiB"}}; got fields {sorted(body)}.'
            )
        try:
            quotas = self.manager.quotas
            await quotas.request(kernel_id, quotas.parse(body["quota"]))
        except PolicyError as e:  # 409: the card has not the extra now (the kernel keeps what it holds)
            raise web.HTTPError(409 if e.code == "grow-no-room" else 400, str(e)) from e
        except LedgerError as e:
            raise web.HTTPError(503, str(e)) from e
        self.finish(await self.kernel(kernel_id))

    @web.authenticated
    @authorized
    async def delete(self, kernel_id: str) -> None:
        """Stop a queued kernel's wait (a running kernel is shut down through /api/kernels)."""
        self._record(kernel_id)
        try:
            self.manager.cancel_start(kernel_id)
        except PolicyError as e:
            raise web.HTTPError(409, str(e)) from e
        self.set_status(202)
        self.finish(await self.kernel(kernel_id))


class KernelMoveHandler(GpuShareHandler):
    """``POST …/kernels/<id>/park``: park a kernel that holds a reservation now (parking.py); ``…/resume``: bring a
    parked kernel back (it waits in line for its reservation if it must); ``…/join``: a kernel whose wait ended
    without a GPU joins the line again in place, its variables kept (409 with the reason where it cannot: then only
    a restart gives it a GPU). Each answers once the move is done."""

    @web.authenticated
    @authorized
    async def post(self, kernel_id: str, move: str) -> None:
        self._record(kernel_id)
        if move == "join":
            await self._join(kernel_id)
            return
        parking = self.manager.parking
        moving = asyncio.ensure_future(parking.park(kernel_id) if move == "park" else parking.resume(kernel_id))
        self.manager.services.changes(
            kernel_id, "move"
        )  # a move under way is a change: the snapshot shows it meanwhile
        try:
            await moving
        except PolicyError as e:
            raise web.HTTPError(409, str(e)) from e
        self.finish(await self.kernel(kernel_id))

    async def _join(self, kernel_id: str) -> None:
        provisioner = getattr(self.kernel_manager.get_kernel(kernel_id), "provisioner", None)
        join = getattr(provisioner, "join_again", None)
        said = "cannot" if join is None else await join()
        if said != "ok":
            rule = join_refusal(said)
            raise web.HTTPError(409, str(rule)) from rule
        self.finish(await self.kernel(kernel_id))


def join_refusal(said: str) -> PolicyError:
    """Why a kernel cannot join the line again in place (its provisioner's ``join_again`` said ``said``)."""
    code, params = "join-cannot", {}
    if said.startswith("imported:"):
        names = said.split(":", 1)[1].split(",")  # (the kernel's modules: shown by their names, PyTorch not torch)
        code, params = "join-needs-restart", {"frameworks": ", ".join(FRAMEWORKS.get(n, n) for n in names)}
    elif said == "busy":
        code = "join-busy"
    return PolicyError(render(f"policy.{code}", params), code, **params)


class HostHandler(GpuShareHandler):
    """Every server's reservations on this host, as this server's user may see them: own kernels in
    detail, other users as anonymous totals per card (admins see all; see broker.view_for)."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        snap = await self.snapshot()
        if snap.host is None:
            error = snap.host_error or snap.server.ledger.error
            raise web.HTTPError(503, error or "No ledger is open on this server.")
        self.finish(dict(snap.host))


class HostKernelHandler(GpuShareHandler):
    """``POST …/host/kernels/<id>`` with ``{"action": "front" | "remove" | "release", "why": "…"}``: a teacher acts
    on any kernel of the host (teacher.py; admins only, 403 otherwise). The student sees it as an event with who
    did it and why. 409 when the kernel is not where the action needs it (no longer in line, holds nothing)."""

    @web.authenticated
    @authorized
    async def post(self, kernel_id: str) -> None:
        body = self.json_body()
        action, why = body.get("action"), body.get("why", "")
        example = '{"action": "front", "why": "her lab is due today"}'
        if set(body) - {"action", "why"} or action not in ACTIONS:
            raise web.HTTPError(400, f"Send {example}; the action is one of {', '.join(ACTIONS)}; got {sorted(body)}.")
        if not isinstance(why, str) or not WHY.fullmatch(why):
            raise web.HTTPError(400, f'"why" is one line of at most {WHY_MAX} characters, shown to the student.')
        try:
            notice = await self.manager.teacher.act(kernel_id, action, why)
        except NotAdmin as e:
            raise web.HTTPError(403, str(e)) from e
        except NoSuchKernel as e:
            raise web.HTTPError(409, str(e)) from e
        except LedgerError as e:  # the broker's refusal (not its admin, not in line), or no ledger now
            raise web.HTTPError(409 if isinstance(e, BrokerSaidNo) else 503, str(e)) from e
        self.finish(notice.to_json())


class QueueHandler(GpuShareHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.finish({"queue": [place.to_json() for place in (await self.snapshot()).server.queue]})


class EventsHandler(GpuShareHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        try:
            since = float(self.get_argument("since", "0"))
        except ValueError as e:
            raise web.HTTPError(400, "'since' must be a Unix time in seconds, e.g. since=1700000000.5.") from e
        events = (await self.snapshot()).events
        self.finish({"events": [event_view(e) for e in events if e["time"] > since]})


class ConfigHandler(GpuShareHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.finish(dict((await self.snapshot()).config))


class StateHandler(GpuShareHandler):
    """Everything the sidebar, the status bar and the notifications show, in one reply (state.py): the server's
    snapshot, with each kernel's notebook as jupyter_server's sessions name it now (a renamed notebook is
    followed). Its ETag is the state's version: an unchanged state is answered 304 with no body."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        snap = await self.snapshot()
        assert self.serverapp is not None  # (a handler of the server's own app)
        sessions = await self.serverapp.session_manager.list_sessions()
        state = build_state(
            snap.server,
            snap.kernels,
            {uuid: card.figures() for uuid, card in snap.usage.cards.items()},
            {s["kernel"]["id"]: s["path"] for s in sessions if s.get("kernel")},
            snap.events,
            snap.config,
            snap.usage.status(),
        )
        etag = f'"{state["version"]}"'
        self.set_header("ETag", etag)
        self.set_header("Cache-Control", "no-cache")
        if etag in (self.request.headers.get("If-None-Match") or ""):
            self.set_status(304)
            self.finish()
            return
        self.finish(state)


class KernelRestartHandler(RefusalErrors, KernelActionHandler):
    """jupyter_server's ``POST /api/kernels/<id>/restart``, but a restart that would hold the request open answers
    as soon as the kernel is back in Jupyter's hands: the restart of a kernel that waits for a GPU (it keeps its place
    in line), or of one whose new quota may have to wait (it joins the line). jupyter_server's restart waits for the
    kernel to answer, up to kernel_info_timeout, and a kernel in line cannot. A second restart of a kernel that is
    restarting is refused with 409, not left to fail inside jupyter_client."""

    @web.authenticated
    @authorized
    async def post(self, kernel_id: str, action: str) -> None:
        restarting: set[str] = self.settings.setdefault("gpushare_restarting", set())
        if kernel_id in restarting:
            raise web.HTTPError(409, f"Kernel {kernel_id} is restarting already; wait until it has restarted.")
        manager: QuotaManager = self.settings["gpushare_manager"]
        rec = manager.records.get(kernel_id)
        km = self.kernel_manager
        restarting.add(kernel_id)
        try:
            if rec is None or (rec.state != "queued" and (rec.pending_quota is None or rec.lease is not None)):
                return await super().post(kernel_id, action)  # type: ignore[misc]  # (async, typed Awaitable | None)
            kernel = km.get_kernel(kernel_id)
            before = getattr(kernel.provisioner, "held", None)
            restart = asyncio.ensure_future(km.restart_kernel(kernel_id))
            restart.add_done_callback(lambda task: task.cancelled() or task.exception())  # logged by jupyter_server
            while not restart.done() and not _held_anew(kernel, before):
                await asyncio.sleep(0.05)
            failed = restart.exception() if restart.done() else None
            if isinstance(failed, web.HTTPError):  # refused (QuotaUnavailable): its status and its reason
                raise failed
            if failed is not None:
                raise web.HTTPError(500, "Exception restarting kernel") from failed
            self.finish(json.dumps(await ensure_async(km.kernel_model(kernel_id)), default=json_default))
        finally:
            restarting.discard(kernel_id)


def _held_anew(kernel, before: object) -> bool:
    """Whether a restarting kernel is back in line: a new stand-in launched (held.py)."""
    held = getattr(getattr(kernel, "provisioner", None), "held", None)
    return held is not None and held is not before and held.launched_at is not None


handlers = [
    (rf"{API}/cards", CardsHandler),
    (rf"{API}/kernels", KernelsHandler),
    (rf"{API}/kernels/([^/]+)", KernelHandler),
    (rf"{API}/kernels/([^/]+)/(park|resume|join)", KernelMoveHandler),
    (rf"{API}/host", HostHandler),
    (rf"{API}/host/kernels/([^/]+)", HostKernelHandler),
    (rf"{API}/queue", QueueHandler),
    (rf"{API}/events", EventsHandler),
    (rf"{API}/config", ConfigHandler),
    (rf"{API}/state", StateHandler),
    (rf"/api/kernels/{KERNEL_ID}/(?P<action>restart)", KernelRestartHandler),
    (r"/api/kernels", StartKernelHandler),  # a refused start: its status, code and figures (seam/refusals.py)
    (r"/api/sessions", SessionsHandler),
]
