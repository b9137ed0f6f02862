"""The server's snapshot: one per sampler tick and per change of its kernels, built here alone, only read elsewhere.

``Snapshots`` owns it. At each tick of the sampler, and soon after each change of the kernels' registry (a
record, an event, a judgment of the enforcer), it reads the ledger (leases, line, outside use, the host view, on
the ledger's thread) and the kernels' reports (off it), takes the records, the enforcer's judgments, the events and
parking as they are then, and swaps in one immutable ``ServerSnapshot``. The REST handlers, the metrics and the
enforcer read that and nothing else of the server's state, so every part of one reply is of the same moment. A
handler that answers a request made after a change waits for the snapshot that holds it (``latest``): a reply
never shows a state older than its request.

A build only reads. What it reads of the kernels' reports goes to ``on_reports`` after it (the registry notes an
out-of-memory error one tells: Learning.saw_reports), and the change that makes brings the next build.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import json
import logging
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any, Callable, Protocol

from ..core.policy import Policy
from ..host.gpu import Card, DeviceSample, GpuBackend
from ..host.reports import read_reports, report_dir
from ..ledger.file import LedgerError
from ..ledger.ledger import Lease, Waiter
from ..ledger.reservations import Reservations
from ..ledger.view import host_view
from .clock import Clock
from .holding import Holding
from .ledger_worker import LedgerWorker
from .parking import Parking
from .records import Change, KernelRecord, Version
from .sampler import UsageSnapshot
from .views import KernelView, LedgerState, ServerState, card_view, cards_view, config_view, line_view

REPORTS_EVERY_S = 1.0  # the kernels' reports are read again at most this often while the same kernels run
SETTLE_S = 0.05  # a change is built into a snapshot this soon (changes within it go into one)
EMPTY: Mapping = MappingProxyType({})


class Registry(Protocol):
    """What a snapshot reads of the kernels' registry (QuotaManager): everything a view shows, read, never written
    (an out-of-memory error a kernel's report tells goes to ``Snapshots.on_reports``, after the build)."""

    user: str
    policy: Policy
    cards: list[Card]
    records: dict[str, KernelRecord]
    version: Version
    events: collections.deque[dict]
    backend: GpuBackend
    ledger: LedgerWorker
    holding: Holding
    parking: Parking
    clock: Clock

    def blocking(self, fn: Callable[..., Any], *args: Any) -> Awaitable[Any]: ...
    def latest_samples(self) -> Sequence[DeviceSample]: ...


@dataclass(frozen=True)
class LedgerReading:
    """One read of the ledger, on its thread: leases, the host's line, what processes without a reservation use,
    and the host view this server's user may see (or why it cannot be read now)."""

    leases: tuple[Lease, ...] = ()
    waiters: tuple[Waiter, ...] = ()
    outside: Mapping[str, int] | None = None
    host: Mapping[str, Any] | None = None  # None: no ledger is open, or (``host_error``) it failed
    host_error: str | None = None


async def read_ledger(manager: Registry) -> LedgerReading:
    """``manager``'s ledger as it is now (QuotaManager); an empty reading while no ledger is open. LedgerError (the
    broker is down) is the caller's."""

    def read(ledger: Reservations) -> LedgerReading:
        leases, waiters = ledger.leases(), ledger.waiters()
        outside = ledger.outside(manager.latest_samples(), leases)
        try:
            host, error = host_view(ledger, manager.user, manager.cards, manager.policy, leases, waiters), None
        except LedgerError as e:
            host, error = None, str(e)
        return LedgerReading(tuple(leases), tuple(waiters), outside, host, error)

    return await manager.ledger.on(read) or LedgerReading()


async def read_kernel_reports(manager: Registry, kernel_ids: Sequence[str]) -> dict[str, Any]:
    """The kernels' own word on their frameworks' caps and errors (off the ledger's thread)."""

    def read() -> dict[str, Any]:
        directory = report_dir()
        return {kid: read_reports(directory, kid) for kid in kernel_ids}

    return await manager.blocking(read)


def frameworks_of(reports: Mapping[str, Any], kernel_id: str) -> dict[str, Any] | None:
    """A kernel's frameworks, as its reports (``read_kernel_reports``) said; None where it said none."""
    return (reports.get(kernel_id) or {}).get("frameworks")


def server_state(manager: Registry, reading: LedgerReading, mine: set[str], now: float) -> ServerState:
    """What the server holds as ``reading`` of the ledger says it: its cards with what is reserved on them, the
    host's line (its own kernels, ``mine``, named), the ledger and the enforcement level."""
    ledger = manager.ledger
    backend = manager.backend
    return ServerState(
        backend=backend.kind,
        simulated=backend.simulated,
        reason=backend.reason,
        ledger=LedgerState(
            path=None if ledger.broker else ledger.path,
            broker=ledger.broker.socket if ledger.broker else None,
            error=ledger.error,
            replaced=ledger.replaced,
        ),
        enforcement=MappingProxyType(manager.holding.enforcement(manager.policy.required_level)),
        cards=cards_view(manager.cards, manager.policy, reading.leases, reading.outside),
        queue=line_view(manager.cards, manager.policy, reading.waiters, mine, now),
    )


async def take_snapshot(manager: Registry) -> dict[str, Any]:
    """Cards with their reservations, ``manager``'s kernels and the host-wide queue, read now (QuotaManager.snapshot,
    for programs and tests; a server's handlers read ``Snapshots``)."""
    reading, reports = await asyncio.gather(read_ledger(manager), read_kernel_reports(manager, list(manager.records)))
    now = manager.clock.wall()
    records = list(manager.records.values())
    kernels = [{**rec.to_dict(now), "frameworks": frameworks_of(reports, rec.kernel_id)} for rec in records]
    return {**server_state(manager, reading, {rec.kernel_id for rec in records}, now).to_json(), "kernels": kernels}


@dataclass(frozen=True)
class ServerSnapshot:
    """Everything the server says of its cards and kernels, of one moment. Never changed once built."""

    seq: int = 0
    usage: UsageSnapshot = field(default_factory=UsageSnapshot)  # the sampler's reading it was built with
    server: ServerState = ServerState()  # the cards and what is reserved on them, the line, the ledger, …
    kernels: tuple[KernelView, ...] = ()  # each kernel's view: record, frameworks, measured use, judged state, held
    judged: Mapping[str, str] = field(
        default_factory=lambda: EMPTY
    )  # the enforcer's judgments (kernel id -> near_quota | over_quota | idle)
    events: tuple[Mapping[str, Any], ...] = ()  # the recent events, oldest first
    parking: Mapping[str, Any] = field(default_factory=lambda: EMPTY)  # Parking.view()
    moves_s: Mapping[str, float] = field(
        default_factory=lambda: EMPTY
    )  # how long the last park and the last resume took (s)
    config: Mapping[str, Any] = field(default_factory=lambda: EMPTY)  # views.config_view()
    host: Mapping[str, Any] | None = None  # what this server's user may see of the host (ledger/view.py)
    host_error: str | None = None  # why ``host`` could not be read (the broker is down)

    def kernel(self, kernel_id: str) -> KernelView | None:
        return self._by_id.get(kernel_id)

    @cached_property
    def _by_id(self) -> Mapping[str, KernelView]:
        return {k.kernel_id: k for k in self.kernels}

    @cached_property
    def frameworks(self) -> Mapping[str, Any]:
        """Each kernel's frameworks, as its reports said."""
        return {k.kernel_id: k.frameworks for k in self.kernels}

    @cached_property
    def kernels_body(self) -> str:
        """GET /api/gpushare/kernels, encoded once per snapshot (pollers)."""
        return json.dumps({"kernels": [k.to_json() for k in self.kernels]})

    def cards(self) -> dict[str, Any]:
        """GET /api/gpushare/cards: the cards with their reservations and measured use."""
        server = self.server
        return {
            "backend": server.backend,
            "simulated": server.simulated,
            "reason": server.reason,
            "ledger": server.ledger.to_json(),
            "cards": [card_view(c, self.usage) for c in server.cards],
            "sampler": self.usage.status(),
            "parking": dict(self.parking),
        }


class Snapshots:
    """The owner of the server's snapshot (``current``): it alone builds one, at each sampler tick (``tick``) and
    soon after each change of the kernels' registry (``changed``), one build at a time."""

    def __init__(
        self,
        manager: Registry,
        judged: Callable[[], Mapping[str, str]] = dict,
        log: logging.Logger | None = None,
        on_reports: Callable[[Mapping[str, Any]], None] = lambda reports: None,
    ):
        """``manager``: the kernels' registry (QuotaManager); ``judged``: the enforcer's judgments now;
        ``on_reports``: told of the kernels' reports each time a build has read them anew, after it."""
        self.manager, self._judged, self._on_reports = manager, judged, on_reports
        self.log = log or logging.getLogger("jupyter_gpushare")
        self.current = ServerSnapshot(config=MappingProxyType(config_view(manager.policy)))
        self._usage = UsageSnapshot()
        self._said = 0  # changes said (``changed``)
        self._built_for = -1  # the registry's version the current snapshot was built from
        self._building_for = -1  # the one the build under way was started from
        self._task: asyncio.Future | None = None
        self._again = False  # a change came while a build ran: build once more after it
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reading = LedgerReading()
        self._reports: dict[str, Any] = {}
        self._reports_at = float("-inf")
        self._stopped = False

    def _version(self) -> int:
        """The registry's version: every assignment to one of its records, and every change said."""
        return self.manager.version.n + self._said

    def tick(self, usage: UsageSnapshot) -> None:
        """A new reading of the sampler (on the IOLoop): build the snapshot that holds it."""
        self._usage = usage
        if not self._stopped:
            self._kick()

    def changed(self, change: Change | None = None) -> None:
        """A change of the registry (a kernel's record, an event, a judgment), said from any thread: a snapshot that
        holds it is built within SETTLE_S."""
        self._said += 1
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # from another thread (a lease reclaimed on the ledger's): onto the loop first
            if self._loop is not None and not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self.changed, change)
            return
        self._loop = loop
        if self._timer is None and not self._stopped:
            self._timer = loop.call_later(SETTLE_S, self._settled)

    def _settled(self) -> None:
        self._timer = None
        self._kick()

    async def latest(self) -> ServerSnapshot:
        """The current snapshot, once it holds every change made before this call (a build is awaited if not)."""
        wanted = self._version()
        while self._built_for < wanted and not self._stopped:
            build = self._kick(again=self._building_for < wanted)
            try:
                await asyncio.shield(build)
            except asyncio.CancelledError:
                if not (self._stopped and build.cancelled()):
                    raise  # (the reader itself was cancelled)
        return self.current  # (the server stopped meanwhile: the last one, not an error for each reader)

    def stop(self) -> None:
        """The server is stopping: no more builds (the manager's ledger closes after this)."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._task is not None:
            self._task.cancel()

    def _kick(self, again: bool = True) -> asyncio.Future:
        """Start a build, or (``again``) ask the one under way for another after it; the future is done when they
        are."""
        self._loop = asyncio.get_running_loop()
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._builds())
        elif again:
            self._again = True
        return self._task

    async def _builds(self) -> None:
        self._again = True
        while self._again:
            self._again = False
            version = self._building_for = self._version()  # what changes after this is for the next build
            try:
                fresh = await self._build()
            except Exception:  # the last snapshot stays; the next tick tries again
                self.log.exception("jupyter-gpushare: the server's snapshot could not be built")
                fresh = None
            self._built_for = version
            if fresh is not None:  # (what it changes is said, and brings the next build)
                try:
                    self._on_reports(fresh)
                except Exception:  # noqa: BLE001 (the snapshot stands; the next reading tells again)
                    self.log.exception("jupyter-gpushare: the kernels' reports could not be taken in")

    async def _build(self) -> Mapping[str, Any] | None:
        """Build the snapshot of the registry as it is now; the kernels' reports, where it read them anew."""
        manager = self.manager
        # What is in memory is taken first, at once: the registry as it is at this build's version (a reply to a
        # request made after a change shows the change, not what came of it meanwhile).
        now = manager.clock.wall()
        records = [copy.copy(rec) for rec in list(manager.records.values())]  # (frozen: the fields as they are now)
        usage, judged, events = self._usage, MappingProxyType(dict(self._judged())), tuple(manager.events)
        parking = MappingProxyType(manager.parking.view())
        moves_s = MappingProxyType({move: took[-1] for move, took in manager.parking.seconds.items() if took})
        ids = [rec.kernel_id for rec in records]
        due = set(ids) != set(self._reports) or time.monotonic() - self._reports_at >= REPORTS_EVERY_S
        reading, reports = await asyncio.gather(
            read_ledger(manager), read_kernel_reports(manager, ids) if due else _nothing(), return_exceptions=True
        )
        fresh = None
        if isinstance(reports, BaseException):
            self.log.warning("jupyter-gpushare: the kernels' reports could not be read: %r", reports)
        elif reports is not None:
            fresh = self._reports = reports
            self._reports_at = time.monotonic()
        if isinstance(reading, LedgerError):  # the broker is down: what it said last, and why the host view is missing
            reading = LedgerReading(
                self._reading.leases, self._reading.waiters, self._reading.outside, None, str(reading)
            )
        elif isinstance(reading, BaseException):
            raise reading
        self._reading = reading
        held = server_state(manager, reading, set(ids), now)
        kernels = []
        for rec in records:
            frameworks = frameworks_of(self._reports, rec.kernel_id)
            kernels.append(
                KernelView(
                    rec,
                    now,
                    frameworks,
                    usage.kernels.get(rec.kernel_id),
                    judged.get(rec.kernel_id),
                    manager.holding.held(rec.kernel_id, frameworks),
                )
            )
        self.current = ServerSnapshot(
            seq=self.current.seq + 1,
            usage=usage,
            server=held,
            kernels=tuple(kernels),
            judged=judged,
            events=events,
            parking=parking,
            moves_s=moves_s,
            config=MappingProxyType(config_view(manager.policy)),
            host=reading.host,
            host_error=reading.host_error,
        )
        return fresh


async def _nothing() -> None:
    return None
