"""Admission control: one QuotaManager per process, used by the provisioner and the REST handlers.

It asks the ledger for room (queueing, falling back or refusing as the policy says), keeps a
record per kernel for the API, and runs every ledger call on one worker thread, so nothing
blocks the Tornado IOLoop.
"""

from __future__ import annotations

import asyncio
import collections
import getpass
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, TypeVar

from tornado import web

from .broker import BrokerLedger, host_view
from .gpu import Card, DeviceSample, GpuBackend
from .ledger import Lease, Ledger, LedgerError, ProcessRef, Request, Waiting
from .policy import CardView, Policy, PolicyError, Size, format_mib, parse_size
from .sampler import unreserved_use

T = TypeVar("T")
QUEUE_POLL_S = 0.5
WHAT_TO_DO = (
    "Shut down a kernel you no longer use (Kernel > Shut Down Kernel), ask for a smaller quota, or try again later."
)


class QuotaUnavailable(web.HTTPError):
    """A kernel start refused for want of GPU room. The message reaches the HTTP client as is."""

    def __init__(self, message: str, status: int = 503):
        super().__init__(status, message, reason="GPU quota unavailable")
        self.message = message

    def __str__(self) -> str:
        return self.message


@dataclass
class Grant:
    """What a kernel got: a GPU reservation, a start without GPU (``cpu``), or no quota at all (``none``)."""

    mode: str
    lease: Lease | None = None
    card: Card | None = None
    reason: str | None = None


@dataclass
class KernelRecord:
    """What the API says of one kernel of this process."""

    changes: ClassVar[int] = 0  # bumped on every field assignment: lets the API reuse an encoded reply

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        KernelRecord.changes += 1

    kernel_id: str
    kernel_name: str
    language: str
    user: str
    state: str = "starting"  # starting | queued | running | cpu | none
    quota: str | None = None  # requested (or default) quota
    pending_quota: str | None = None  # applied at the next restart
    lease: Lease | None = None
    card: Card | None = None
    position: int | None = None
    need_mib: int | None = None
    free_mib: int | None = None
    reason: str | None = None
    since: float = field(default_factory=time.time)
    queued_since: float | None = None
    pid: int | None = None
    path: str | None = None  # the notebook, when started through a session
    cancelled: bool = False  # a queued start the user gave up on

    def to_dict(self) -> dict[str, Any]:
        lease = self.lease
        return {
            "kernel_id": self.kernel_id,
            "kernel_name": self.kernel_name,
            "path": self.path,
            "language": self.language,
            "user": self.user,
            "state": self.state,
            "quota": self.quota,
            "pending_quota": self.pending_quota,
            "quota_mib": lease.quota_mib if lease else None,
            "reserve_mib": lease.reserve_mib if lease else None,
            "reserved_mib": lease.reserved_mib if lease else None,
            "card": self.card.to_dict() if self.card else None,
            "position": self.position,
            "need_mib": self.need_mib,
            "free_mib": self.free_mib,
            "waited_s": round(time.time() - self.queued_since, 1) if self.queued_since else None,
            "reason": self.reason,
            "pid": self.pid,
            "since": self.since,
        }


class QuotaManager:
    """Reserve, keep and release GPU quotas for the kernels this process starts."""

    _current: ClassVar[QuotaManager | None] = None

    def __init__(
        self,
        policy: Policy,
        backend: GpuBackend,
        ledger_path: str,
        log: logging.Logger | None = None,
        broker_socket: str | None = None,
        broker_ca_file: str = "",
    ):
        """``broker_socket``: reserve through the host's broker (broker.py) instead of the ledger file;
        ``broker_ca_file``: the CA of its TLS certificate ('tls://' sockets)."""
        self.policy = policy
        self.backend = backend
        self.ledger_path = ledger_path
        self.broker_socket = broker_socket
        self.broker_ca_file = broker_ca_file
        self.log = log or logging.getLogger("jupyter_gpushare")
        self.user = getpass.getuser()
        self.records: dict[str, KernelRecord] = {}
        self.events: collections.deque[dict] = collections.deque(maxlen=500)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpushare-ledger")
        self._ledger: Ledger | None = None
        self.ledger_error: str | None = None
        # The driver's last per-process reading (the sampler's; app.py wires it), for what processes that hold
        # no reservation use.
        self.latest_samples: Callable[[], Sequence[DeviceSample]] = tuple
        try:
            self.cards: list[Card] = backend.cards()
        except Exception as e:  # a card lost between detection and now: run without GPU, say why
            self.cards, backend.reason = [], f"The GPU list could not be read: {e}"
        self._executor.submit(self._open_ledger).result()

    # -- process-wide instance -------------------------------------------------------------

    @classmethod
    def current(cls) -> QuotaManager | None:
        return cls._current

    @classmethod
    def install(cls, manager: QuotaManager | None) -> None:
        cls._current = manager

    # -- ledger thread -----------------------------------------------------------------------

    def _open_ledger(self) -> None:
        try:
            if self.broker_socket:  # many users on this host: their broker owns the ledger
                self._ledger = BrokerLedger(  # type: ignore[assignment]
                    self.broker_socket, ca_file=self.broker_ca_file, on_state=lambda e: setattr(self, "ledger_error", e)
                )
            else:
                self._ledger = Ledger(self.ledger_path)
            reclaimed = self._ledger.reap()
        except LedgerError as e:
            self._ledger, self.ledger_error = None, str(e)
            self.log.error("%s Kernels will start without a GPU until this is fixed.", e)
            return
        for lease in reclaimed:
            self.event(
                "reclaimed", lease.kernel_id, f"Reclaimed {format_mib(lease.reserved_mib)} of a kernel that is gone."
            )

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _ledger_call(self, name: str, *args: Any) -> Any:
        """Run on the ledger thread; None when the ledger is unavailable."""
        if self._ledger is None:
            return None
        return getattr(self._ledger, name)(*args)

    # -- admission -----------------------------------------------------------------------------

    def event(self, kind: str, kernel_id: str | None, message: str, **figures: Any) -> None:
        """Record an event for the API (``/api/gpushare/events``) and the log, with the figures behind it."""
        self.events.append({"time": time.time(), "kind": kind, "kernel_id": kernel_id, "message": message, **figures})
        self.log.info("gpushare %s %s: %s", kind, kernel_id or "", message)

    def usage_targets(self) -> list[tuple[str, int | None, str | None]]:
        """(kernel id, root pid, card uuid) of every kernel record; safe to call from any thread."""
        records = self.records.copy()  # one C-level copy: no iteration over a dict being changed
        return [(kid, rec.pid, rec.card.uuid if rec.card else None) for kid, rec in records.items()]

    def record(self, kernel_id: str, kernel_name: str = "", language: str = "") -> KernelRecord:
        rec = self.records.get(kernel_id)
        if rec is None:
            rec = self.records[kernel_id] = KernelRecord(kernel_id, kernel_name, language, self.user)
        return rec

    async def admit(self, kernel_id: str, kernel_name: str, language: str, requested: Size | None = None) -> Grant:
        """Reserve GPU room for a kernel about to start, or decide it starts without.

        Waits in the host-wide FIFO queue when the policy says ``queue``. Raises QuotaUnavailable
        (with how much was needed, how much was free and what to do) when the kernel must not start.
        """
        rec = self.record(kernel_id, kernel_name, language)
        if rec.pending_quota is not None:
            requested, rec.pending_quota = parse_size(rec.pending_quota, "quota"), None
        quota = self.policy.quota_for(kernel_name, language, requested)
        if quota is None:
            return self._settle(
                rec,
                Grant(
                    "none",
                    reason=f"Kernels of {kernel_name or language!r} reserve no GPU memory here (GpuShareApp.kernel_quotas).",
                ),
            )
        rec.quota = str(quota)
        if not self.cards:
            return self._settle(rec, Grant("cpu", reason=f"No GPU: {self.backend.reason}"))
        if self._ledger is None:
            return self._settle(rec, Grant("cpu", reason=f"No GPU reservation could be made: {self.ledger_error}"))
        try:
            self.policy.check_quota(quota, self._views({}))
        except PolicyError as e:
            raise self._refuse(kernel_id, str(e), status=400) from e
        wait = self.policy.on_full == "queue"
        deadline = time.monotonic() + self.policy.queue_timeout_s
        request = Request(kernel_id, quota, self.user, kernel_name)
        try:
            while True:
                got = await self._run(self._reserve, request, wait)
                if isinstance(got, Lease):
                    if rec.queued_since:
                        self.event(
                            "admitted", kernel_id, f"Admitted after waiting {time.time() - rec.queued_since:.0f} s."
                        )
                    return self._settle(rec, Grant("gpu", lease=got, card=self._card(got.card_uuid)))
                if not wait or time.monotonic() >= deadline:
                    break
                if rec.state != "queued":
                    rec.state, rec.queued_since = "queued", time.time()
                    self.event(
                        "queued",
                        kernel_id,
                        f"Waiting for {format_mib(got.need_mib)} of GPU memory; position {got.position}.",
                    )
                rec.position, rec.need_mib, rec.free_mib = got.position, got.need_mib, got.free_mib
                await asyncio.sleep(QUEUE_POLL_S)
                if rec.cancelled:
                    raise self._refuse(kernel_id, "Stopped waiting for a GPU: the start was cancelled.", status=409)
        except LedgerError as e:  # the host's broker is down (GpuShareApp.broker_socket): start without a GPU
            return self._settle(rec, Grant("cpu", reason=f"No GPU reservation could be made: {e}"))
        except PolicyError as e:  # a per-user limit the broker enforces
            if wait:
                await self._run(self._ledger.cancel_wait, kernel_id)
            raise self._refuse(kernel_id, str(e), status=400) from e
        except BaseException:
            if wait:
                await self._run(self._ledger.cancel_wait, kernel_id)
            raise
        if wait:
            await self._run(self._ledger.cancel_wait, kernel_id)
        message = self._full_message(quota, got, waited=rec.queued_since)
        rec.position = rec.queued_since = None
        if self.policy.on_full == "cpu":
            return self._settle(rec, Grant("cpu", reason=message + " This kernel was started without a GPU."))
        raise self._refuse(kernel_id, message, need_mib=got.need_mib, free_mib=got.free_mib)

    def _reserve(self, request: Request, wait: bool) -> Lease | Waiting:
        """On the ledger thread. Memory that processes without a reservation use is taken too: measured
        here against the ledger's leases, or by the broker itself, which sees every user's."""
        assert self._ledger is not None
        if isinstance(self._ledger, BrokerLedger):
            return self._ledger.reserve(request, self.policy, self.cards, wait)
        outside = self._outside(self._ledger.leases())
        return self._ledger.reserve(request, self.policy, self.cards, wait, outside=outside)

    def _outside(self, leases: Sequence[Lease]) -> dict[str, int]:
        """On the ledger thread: per card, what processes that hold no reservation use; {} through a broker,
        whose other users' kernels are not this server's to see (the broker measures it itself)."""
        if isinstance(self._ledger, BrokerLedger):
            return {}
        return unreserved_use(self.latest_samples(), leases)

    def _refuse(self, kernel_id: str, message: str, status: int = 503, **figures: Any) -> QuotaUnavailable:
        """Forget a kernel that will not start, record why, and return the error to raise."""
        self.records.pop(kernel_id, None)
        self.event("refused", kernel_id, message, **figures)
        return QuotaUnavailable(message, status=status)

    def cancel_start(self, kernel_id: str) -> KernelRecord:
        """Stop a queued kernel's wait: its start request then fails with a 409 that says so."""
        rec = self.records[kernel_id]
        if rec.state != "queued":
            raise PolicyError(
                f"Kernel {kernel_id} is not waiting for a GPU (it is {rec.state}); shut it down with DELETE /api/kernels/{kernel_id}."
            )
        rec.cancelled = True
        return rec

    def _full_message(self, quota: Size, got: Waiting, waited: float | None) -> str:
        reserve = format_mib(self.policy.context_reserve_mib)
        need = format_mib(got.need_mib) if got.need_mib else f"{quota} + {reserve}"
        text = (
            f"No GPU has room for this kernel: it needs {need} (quota {quota} + {reserve} CUDA context reserve), "
            f"and the most unreserved on any card is {format_mib(got.free_mib)}."
        )
        if got.outside_mib:
            text += (
                f" Processes that hold no reservation (a script in a terminal, a program started outside a notebook) "
                f"use {format_mib(got.outside_mib)} of the GPU memory: it counts as taken until they exit."
            )
        if waited:
            text += f" It waited {time.time() - waited:.0f} s in the queue (GpuShareApp.queue_timeout)."
        elif got.ahead:
            text += f" {got.ahead} kernel(s) are already waiting for a GPU."
        return f"{text} {WHAT_TO_DO}"

    def _settle(self, rec: KernelRecord, grant: Grant) -> Grant:
        rec.state = {"gpu": "running"}.get(grant.mode, grant.mode)
        rec.lease, rec.card, rec.reason, rec.position = grant.lease, grant.card, grant.reason, None
        if grant.mode == "gpu" and grant.lease:
            self.event(
                "reserved",
                rec.kernel_id,
                f"{format_mib(grant.lease.reserved_mib)} on "
                f"{grant.card.label if grant.card else f'GPU {grant.lease.card_index}'}.",
                reserved_mib=grant.lease.reserved_mib,
            )
        elif grant.mode == "cpu":
            self.event("no-gpu", rec.kernel_id, grant.reason or "")
        return grant

    def max_quota_mib(self, grant: Grant) -> int | None:
        """The largest quota this kernel could be given on its card (for the in-kernel OOM note)."""
        if grant.card is None:
            return None
        total = grant.card.total_mib
        biggest = self.policy.usable_mib(total) - self.policy.context_reserve_mib
        if self.policy.max_quota is not None:
            biggest = min(biggest, self.policy.max_quota.resolve(total))
        return max(0, biggest)

    def _card(self, uuid: str) -> Card | None:
        return next((c for c in self.cards if c.uuid == uuid), None)

    def _views(self, reserved: dict[str, int]) -> list[CardView]:
        return [CardView(c.uuid, c.index, c.total_mib, reserved.get(c.uuid, 0)) for c in self.cards]

    async def attach(self, kernel_id: str, pid: int | None) -> None:
        """Record the kernel's process once it runs (after every restart too)."""
        rec = self.records.get(kernel_id)
        if rec is None:
            return
        rec.pid = pid
        if rec.lease is not None:
            await self._run(self._ledger_call, "attach", kernel_id, ProcessRef.of(pid) if pid else None)

    async def release(self, kernel_id: str, why: str = "shut down", forget: bool = True) -> None:
        """Give a kernel's reservation back (idempotent) and, unless it restarts, forget its record."""
        rec = self.records.pop(kernel_id, None) if forget else self.records.get(kernel_id)
        if rec is not None and not forget:
            rec.lease = None
        lease = await self._run(self._ledger_call, "release", kernel_id)
        from .provisioner import report_dir  # the provisioner imports this module
        from .reports import remove_reports

        await self._run(lambda: remove_reports(report_dir(), kernel_id))
        if lease is not None:
            self.event(
                "released",
                kernel_id,
                f"Released {format_mib(lease.reserved_mib)} ({why}).",
                reserved_mib=lease.reserved_mib,
            )
        elif rec is not None and rec.state == "queued":
            self.event("cancelled", kernel_id, f"Stopped waiting ({why}).")

    async def reconcile(self) -> None:
        """Release this process's leases for kernels it no longer has, and reclaim the dead."""
        keep = set(self.records)
        for lease in await self._run(self._ledger_call, "release_owned_except", keep) or []:
            self.event(
                "reclaimed",
                lease.kernel_id,
                f"Reclaimed {format_mib(lease.reserved_mib)} of a kernel this server no longer has.",
            )
        for lease in await self._run(self._ledger_call, "reap") or []:
            self.event(
                "reclaimed", lease.kernel_id, f"Reclaimed {format_mib(lease.reserved_mib)} of a kernel that is gone."
            )

    def request_quota(self, kernel_id: str, quota: Size) -> KernelRecord:
        """Ask for another quota for a kernel; it applies when the kernel next restarts."""
        rec = self.records[kernel_id]
        self.policy.check_quota(quota, self._views({}))
        rec.pending_quota = str(quota)
        self.event("quota-requested", kernel_id, f"Quota {quota} requested; it applies at the next restart.")
        return rec

    # -- views for the API ------------------------------------------------------------------------

    async def host_view(self) -> dict[str, Any] | None:
        """Every reservation on the host as this user may see it (broker.view_for); None without a ledger."""
        return await self._run(host_view, self._ledger, self.user, self.cards, self.policy)

    async def snapshot(self) -> dict[str, Any]:
        """Cards with their reservations, this process's kernels, and the host-wide queue."""

        from .provisioner import report_dir  # the provisioner imports this module
        from .reports import read_reports

        kernel_ids = list(self.records)

        def read() -> tuple[list[Lease], list, dict[str, Any], dict[str, int]]:
            directory = report_dir()  # the kernels' own reports of their framework caps
            reports = {kid: read_reports(directory, kid) for kid in kernel_ids}
            if self._ledger is None:
                return [], [], reports, {}
            leases = self._ledger.leases()
            return leases, self._ledger.waiters(), reports, self._outside(leases)

        leases, waiters, reports, outside = await self._run(read)
        cards = []
        for card in self.cards:
            mine = [lease for lease in leases if lease.card_uuid == card.uuid]
            reserved = sum(lease.reserved_mib for lease in mine)
            usable = self.policy.usable_mib(card.total_mib)
            cards.append(
                {
                    **card.to_dict(),
                    "usable_mib": usable,
                    "reserved_mib": reserved,
                    "unreserved_mib": max(0, usable - reserved),
                    "kernels": len(mine),
                    "allowed": self.policy.card_allowed(card.uuid, card.index),
                    "outside_mib": outside.get(card.uuid),
                }
            )
        queue = [
            {
                "position": i + 1,
                "kernel_id": w.kernel_id if w.kernel_id in self.records else None,
                "mine": w.kernel_id in self.records,
                "quota": w.quota,
                "waited_s": round(time.time() - w.created, 1),
            }
            for i, w in enumerate(waiters)
        ]
        return {
            **self.backend.describe(),
            "ledger": {
                "path": None if self.broker_socket else self.ledger_path,
                "broker": self.broker_socket,
                "error": self.ledger_error,
            },
            "cards": cards,
            "kernels": [
                {**r.to_dict(), "frameworks": (reports.get(r.kernel_id) or {}).get("frameworks")}
                for r in self.records.values()
            ],
            "queue": queue,
        }

    def close(self) -> None:
        if self._ledger is not None:
            self._executor.submit(self._ledger.close).result()
        self._executor.shutdown(wait=False)
