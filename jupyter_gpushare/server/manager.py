"""Admission control: one QuotaManager per process, used by the provisioner and the REST handlers.

It asks the ledger for room (queueing, falling back or refusing as the policy says) and keeps a
record per kernel for the API. Every ledger call runs on the ledger worker's thread
(ledger_worker.py), so nothing blocks the Tornado IOLoop.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import logging
import os
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

from ..broker.groups import BrokerGroups
from ..broker.protocol import is_tcp
from ..config.settings import GpuShareApp
from ..core.addresses import BrokerAt
from ..core.history import HistoryRules
from ..core.policy import CardView, ParkRules, Policy, PolicyError, Size
from ..host.cgroups import KernelCgroups
from ..host.checkpoint import checkpointer_for
from ..host.gpu import Card, DeviceSample, GpuBackend, list_cards, open_backend
from ..host.gpu.simulated import SimulatedBackend
from ..host.reports import remove_reports, report_dir
from ..ledger.ledger import Lease, LedgerError, ProcessRef, Request, Waiting
from ..ledger.reservations import Reservations
from . import admission
from .clock import SYSTEM, Clock
from .holding import Holding
from .learning import Learning
from .ledger_worker import LedgerWorker
from .line import Line
from .parking import AT_ONCE, Parking
from .quota_change import QuotaChanges
from .records import Grant, KernelRecord, QuotaUnavailable
from .registry import KernelRegistry
from .sampler import KernelUsage
from .seam.internals import fresh_event_loop
from .services import Services
from .snapshot import take_snapshot
from .teacher import Teacher
from .warm import WarmPool

T = TypeVar("T")
ROOM_READ_S = 2.0  # how long room given back waits for a reading of the cards that shows it (then it goes on)


class QuotaManager:
    """Reserve, keep and release GPU quotas for the kernels this process starts."""

    def __init__(
        self,
        policy: Policy,
        backend: GpuBackend,
        ledger_path: str,
        log: logging.Logger | None = None,
        broker: BrokerAt | None = None,
        history: HistoryRules | None = None,
        cards: list[Card] | None = None,
        unwatched_s: float = 0.0,
        cgroups: KernelCgroups | None = None,
        parking: ParkRules | None = None,
        services: Services | None = None,
        clock: Clock = SYSTEM,
    ):
        """``broker``: reserve through the host's broker (broker/) instead of the ledger file; ``history``: quotas learned from
        earlier runs (history.py); ``cards``: the backend's, when the caller has just listed them; ``unwatched_s``: a
        kernel in line with no client connected for this long leaves it (0: never; see ``watchers``); ``cgroups``: the
        kernels' cgroups (cgroups.py; None: none, kernels are tracked by their process tree); ``parking``: the rules for
        parking idle kernels (parking.py; None: the defaults); ``services``: how this process starts kernels, where
        its sampler's readings are, who hears of each change a person would notice (a kernel's state, quota or place
        in line, a kernel listed or gone, an event) and the watchdog (services.py; None: a program's, with none);
        ``clock``: the one clock of the line, parking and the enforcer (clock.py; a test steps its own)."""
        self.policy = policy
        self.backend = backend
        self.log = log or logging.getLogger("jupyter_gpushare")
        self.user = getpass.getuser()
        self.services = services or Services()
        self.clock = clock
        # Blocking work that is not the ledger's (kernels' reports, their cgroups, parks and resumes). Not the
        # loop's default executor: a forked child inherits that one without its threads, and would wait on it
        # forever. A park or resume holds a thread for its driver call (about 1 s): two threads made the parks of
        # one wave land in pairs; there are enough for AT_ONCE parks, as many resumes, and the rest.
        self._work = ThreadPoolExecutor(max_workers=2 + 2 * AT_ONCE, thread_name_prefix="gpushare-work")
        self.closing = False  # the server is shutting down: no new kernel is admitted
        self._closed = False  # close() ran
        self._cleaning = 0  # kernels whose clean-up runs now (``cleaning``)
        self._room_reads: set[asyncio.Future] = set()  # room given back, waiting for a reading (_room_after_reading)
        self.cards: list[Card] = list_cards(backend) if cards is None else cards
        # The kernels' records and events: the registry's, which every part reads through the manager
        self.registry = KernelRegistry(
            self.user, self.cards, self.services.changes, self.log, lambda: self.services.starts.holds, clock
        )
        self.records, self.version, self.events = self.registry.records, self.registry.version, self.registry.events
        self.record, self.forget, self.event = self.registry.record, self.registry.forget, self.registry.event
        self.update, self.move = self.registry.update, self.registry.move
        self.conclude, self.refuse, self.keeps = self.registry.conclude, self.registry.refuse, self.registry.keeps
        self.settle, self.usage_targets, self.card = (
            self.registry.settle,
            self.registry.usage_targets,
            self.registry.card,
        )
        self.holding = Holding(
            cgroups or KernelCgroups(enabled=False), backend, self.cards, self.blocking, self.event,
            self.services.watchdog,
        )  # fmt: skip
        self.ledger = LedgerWorker(ledger_path, broker, self.log, self._reclaimed)
        self.line = Line(self, self.ledger, self.services.starts, unwatched_s, self.log, clock)
        self.learning = Learning(
            history or HistoryRules(), policy, self.ledger, self.user, self.blocking, self.log, self.registry
        )
        parts = (self.ledger, self.line, self.holding, self.services)
        self.parking = Parking(self, parts, checkpointer_for(backend), parking or ParkRules(), self.blocking, clock)
        self.quotas = QuotaChanges(self, self.line.room_freed)
        self.teacher = Teacher(self, self.ledger, self.line, self.parking, self.services.starts)
        self.line.on_change = self.teacher.soon  # a ruling reaches this server as the broker says it
        self.warm: WarmPool | None = None  # the server's warm kernels (warm.py; None: none, or not a server)

    async def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """Blocking work that is not the ledger's (kernels' reports, their cgroups), off the IOLoop (on it once
        closed, or once the interpreter exits: an atexit clean-up, as nbclient's, where no thread starts)."""
        if self._closed:
            return fn(*args)
        try:
            running = asyncio.get_running_loop().run_in_executor(self._work, fn, *args)
        except RuntimeError:  # "cannot schedule new futures after interpreter shutdown"
            return fn(*args)
        return await running

    @contextlib.asynccontextmanager
    async def cleaning(self) -> AsyncIterator[None]:
        """A kernel's clean-up (the provisioner's): the manager does not close while one runs."""
        self._cleaning += 1
        try:
            yield
        finally:
            self._cleaning -= 1
            self.close_if_done()

    def close_if_done(self) -> None:
        """Close once the server is closing and its last kernel is gone, its clean-up done."""
        if self.closing and not self.records and not self._cleaning:
            self.close()

    def _reclaimed(self, leases: Sequence[Lease]) -> None:
        for lease in leases:
            self.event("reclaimed", lease.kernel_id, reserved_mib=lease.reserved_mib)

    def latest_samples(self) -> Sequence[DeviceSample]:
        """The driver's last per-process reading, for what processes that hold no reservation use (none outside a
        server: no sampler reads the card there)."""
        return self.services.readings.latest_samples()

    def kernel_usage(self, kernel_id: str) -> KernelUsage | None:
        """A kernel's last reading (sampler.KernelUsage), whose peak is recorded when it stops."""
        return self.services.readings.kernel_usage(kernel_id)

    @property
    def holds_starts(self) -> bool:
        """A Jupyter server's way of starting kernels: a kernel in line is listed at once, launched when granted."""
        return self.services.starts.holds

    def end_kernel(self, kernel_id: str) -> None:
        """Shut down a kernel whose wait ended without a grant (its session too), as its server does."""
        self.services.starts.end_kernel(kernel_id)

    # -- the provisioner's port (launch/port.py): the parts it may not reach itself ----------------------------

    @property
    def learns(self) -> bool:
        return self.learning.rules.enabled

    async def granted(self, kernel_id: str) -> Grant:
        return await self.line.granted(kernel_id)

    async def apply_quota(self, kernel_id: str) -> None:
        await self.quotas.apply(kernel_id)

    def cgroups(self, kernel_id: str, grant: Grant | None) -> tuple[list[str], tuple[str, str] | None]:
        return self.holding.groups(kernel_id, grant)

    async def open_cards(self, kernel_id: str, grant: Grant) -> None:
        await self.holding.open_cards(kernel_id, grant)

    async def adopt(self, warm_id: str, kernel_id: str, grant: Grant) -> None:
        await self.holding.adopt(warm_id, kernel_id, grant)

    async def end_groups(self, kernel_id: str, restart: bool) -> None:
        await self.holding.end(kernel_id, restart)

    def resume(self, kernel_id: str) -> asyncio.Future:
        return self.parking.resume(kernel_id)

    async def stood_by(self, kernel_id: str) -> None:
        await self.parking.stood_by(kernel_id)

    async def ask(self, kernel_id: str, expression: str, timeout: float) -> str | None:
        return await self.services.starts.ask(kernel_id, expression, timeout)

    # -- admission -----------------------------------------------------------------------------

    async def admit(
        self,
        kernel_id: str,
        kernel_name: str,
        language: str,
        requested: Size | None = None,
        hold: bool = False,
        first_use: bool = False,
    ) -> Grant:
        """Reserve GPU room for a kernel about to start, or decide it starts without.

        When no card has room and the policy says ``queue``, the kernel joins the host's line: with ``hold`` (a
        Jupyter server, which lists the kernel at once) this returns a ``queued`` Grant and the start's caller
        awaits ``granted(kernel_id)``; without it (nbclient, papermill) this waits here until granted. Raises
        QuotaUnavailable (with how much was needed, how much was free and what to do) when the kernel must not
        start; a kernel that was restarting then stays listed as 'failed', with that reason.

        ``first_use`` (line_place = 'first-use', a server's Python kernel): a start that the rules allow reserves
        nothing yet and takes no place: a ``standby`` Grant; the kernel asks again, without it, at its first GPU use.
        """
        rec = self.record(kernel_id, kernel_name, language)
        ask = admission.StartRequest(
            kernel_name, language, requested, rec.pending_quota,
            restarting=rec.restarting or rec.state not in ("starting", "queued"),  # (a new record starts so)
        )  # fmt: skip
        cards = self._cards_now()
        planned = admission.plan(ask, cards, self.policy)
        # the pending quota is applied now, as it is
        self.update(
            rec,
            pending_quota=None,
            quota_source=planned.source,
            quota=rec.quota if planned.quota is None else planned.quota,
        )
        if planned.quota is None:
            self.line.leave(kernel_id, "it reserves no GPU memory now")
        if planned.outcome is not None:
            return self._carry_out(rec, planned.outcome)
        assert planned.quota is not None  # (none: decided above, without a GPU)
        if not await self.ledger.available():
            return self._carry_out(rec, admission.no_ledger(self.ledger.error))
        quota, learned_from = await self.learning.at_start(rec, planned.quota, cards.views())
        if learned_from:
            self.event("learned", kernel_id, quota=str(quota), learned_from=learned_from)
        refused = admission.check(quota, ask, cards, self.policy)
        if refused is not None:
            return self._carry_out(rec, refused)
        request = Request(kernel_id, quota, self.user, kernel_name, rec.path or "")
        wait = self.line.waiting(kernel_id)
        if wait is not None and wait.request == request and wait.ending is None:
            return Grant("queued") if hold else await self.line.granted(kernel_id)  # still in line: keep its place
        if first_use and hold and self.policy.on_full == "queue":
            self.line.leave(kernel_id, "it asks at its first GPU use")
            self.move(rec, "standby", line=None, wait_ended=None, restarting=False)
            return Grant("standby")
        got: Lease | Waiting | LedgerError | PolicyError
        try:
            queue = self.policy.on_full == "queue"
            home = self.card_home(kernel_id)
            got = await self.ledger.run(self.ledger.must, lambda ledger: self.reserve(ledger, request, queue, home))
        except (LedgerError, PolicyError) as e:  # the broker down, a full disk; a per-user limit the broker enforces
            got = e
        outcome = admission.answer(got, quota, ask, cards, self.policy)
        if isinstance(outcome, admission.Queue):
            self.line.join(rec, request, outcome.waiting)
            return Grant("queued") if hold else await self.line.granted(kernel_id)
        return self._carry_out(rec, outcome)

    def _cards_now(self) -> admission.Cards:
        """What admission judges a start against: the cards, and how this server holds kernels now."""
        missing = self.holding.missing()
        return admission.Cards(tuple(self.cards), self.backend.reason, self.holding.level(), missing, self.closing)

    def _carry_out(self, rec: KernelRecord, outcome: admission.Start | admission.Refusal) -> Grant:
        """What admission decided for a start: its grant (settled), or its refusal (raised)."""
        if isinstance(outcome, admission.Start) and outcome.grant.mode == "gpu":
            self.line.leave(rec.kernel_id, "it was admitted")
        got = self.conclude(rec.kernel_id, outcome, rec)
        if isinstance(got, QuotaUnavailable):
            raise got from getattr(outcome, "cause", None)
        return got

    async def remember_peak(self, kernel_id: str) -> None:
        """Record the peak of a kernel's process as it shuts down or restarts (Learning.at_stop)."""
        rec = self.records.get(kernel_id)
        if rec is not None:
            card = self.card(rec.lease.card_uuid) if rec.lease else None
            await self.learning.at_stop(rec, self.kernel_usage(kernel_id), card)

    def card_home(self, kernel_id: str) -> str | None:
        """On the IOLoop: the card a kernel's reservation must be on (a parked kernel's, where its GPU state
        belongs), or None."""
        return self.parking.card_of(kernel_id)

    def reserve(self, ledger: Reservations, request: Request, wait: bool, home: str | None) -> Lease | Waiting:
        """On the ledger thread, from what the caller read on the IOLoop: ``home``, the card a parked kernel's GPU
        state comes back on (``parking.card_of``; None: any card). Memory that processes without a reservation use
        is taken too: measured here against the ledger's leases, or by the broker itself, which sees every user's."""
        outside = ledger.outside(self.latest_samples())
        cards = [c for c in self.cards if c.uuid == home] if home else self.cards
        return ledger.reserve(request, self.policy, cards, wait, outside=outside)

    async def stop_admitting(self) -> None:
        """The server is shutting down: refuse new starts and end every wait in line (their kernels are shut down
        with the server's)."""
        self.closing = True
        self.line.close()

    def cancel_start(self, kernel_id: str, why: str = "you chose Stop waiting") -> KernelRecord:
        """Stop a queued kernel's wait: its start is refused with a 'cancelled' event (and the server shuts it down).
        ``why`` is read by the kernel's user (its notebook, its status): the banner's *Stop waiting*, or the same
        request from a script, is hers ("its owner stopped it" was read as someone else's act)."""
        rec = self.records[kernel_id]
        if not self.line.cancel(kernel_id, why):
            raise PolicyError(
                f"Kernel {kernel_id} is not waiting for a GPU (it is {rec.state}); shut it down with DELETE /api/kernels/{kernel_id}."
            )
        return rec

    async def max_quota_mib(self, grant: Grant) -> int | None:
        """The largest quota this kernel could be given on its card (the in-kernel OOM note's "ask for up to"):
        what the card and ``max_quota`` allow, and at most the user's own limits where the broker sets them (a
        student limited to 4 GiB was told 22,912 MiB)."""
        if grant.card is None:
            return None
        total = grant.card.total_mib
        most = self.policy.largest_quota_mib(total)
        try:
            limits = await self.ledger.on(lambda ledger: ledger.caller()[2])
        except LedgerError:
            limits = None
        bounds = (limits.max_kernel, limits.max_total) if limits is not None else ()
        return min([most, *(bound.resolve(total) for bound in bounds if bound is not None)])

    def card_views(self) -> list[CardView]:
        return [CardView(c.uuid, c.index, c.total_mib) for c in self.cards]

    async def attach(self, kernel_id: str, pid: int | None) -> None:
        """Record the kernel's process once it runs (after every restart too)."""
        rec = self.records.get(kernel_id)
        if rec is None:
            return
        ref = ProcessRef.of(pid) if pid else None
        self.update(rec, pid=pid, oom=None, retry_quota_mib=None, run_started=ref.start if ref else None)
        if rec.lease is not None:
            await self.ledger.quietly(f"attach({kernel_id})", lambda ledger: ledger.attach(kernel_id, ref))

    async def release(self, kernel_id: str, why: str = "shut down", forget: bool = True, said: bool = False) -> None:
        """Give a kernel's reservation back, or its place in line (idempotent), and, unless it restarts, forget its
        record. ``said``: the caller told the user itself (Ctrl-C outside a server): the event is not logged too."""
        if self._closed:
            return  # (the server's last kernel was released: nothing of it is left)
        self.line.leave(kernel_id, why)
        await self.remember_peak(kernel_id)
        rec = self.forget(kernel_id) if forget else self.records.get(kernel_id)
        self.parking.forget(kernel_id, rec.parked if rec is not None else None)
        if rec is not None and not forget:  # a restart: its next start is decided as the kernel starts again
            self.move(rec, "starting", lease=None, card=None, line=None, wait_ended=None, parked=None, restarting=True)
        try:
            lease = await self.ledger.on(lambda ledger: ledger.release(kernel_id))
        except LedgerError as e:  # a full disk: the kernel goes all the same; reconcile gives its room back later
            lease = None
            self.event("release-pending", kernel_id, reason=str(e))
        await self.blocking(remove_reports, report_dir(), kernel_id)
        if lease is not None:
            self.event("released", kernel_id, reserved_mib=lease.reserved_mib, why=why)
            self._room_after_reading(time.time())
        elif rec is not None and rec.state == "queued":
            self.event("cancelled", kernel_id, logged=not said, path=rec.path, why=why)
        self.close_if_done()

    def _room_after_reading(self, since: float) -> None:
        """Room given back: the line is served once the cards were read after ``since``, or at once where nothing
        reads them. A reading from before lists the kernel's process, gone since, as one without a reservation,
        whose memory admission counts as taken: the next kernel in line then waited for the sampler's next reading
        and the line's next poll (a release to the next grant: 0.67 s median in a class on an H200)."""
        readings = self.services.readings
        if readings.usage.seq == 0 or self.closing or self._closed:  # (no sampler reads the cards, or no longer)
            self.line.room_freed()
            return

        async def served() -> None:
            try:
                await readings.fresh(since, ROOM_READ_S)
            finally:
                self.line.room_freed()

        self._room_reads.add(task := asyncio.ensure_future(served()))
        task.add_done_callback(self._room_reads.discard)

    def end_at_exit(self, kernel_id: str) -> None:
        """Give a kernel's reservation back as this program exits (batch.end_at_exit), its process gone: now, in
        this thread. By then the interpreter has stopped every executor's thread, the ledger's too, so this uses a
        ledger connection of its own; a failure is logged (what is left is reclaimed once its holders are gone)."""
        self.forget(kernel_id)
        try:
            self.holding.cgroups.remove(kernel_id, False)
            lease = self.ledger.at_exit(lambda ledger: ledger.release(kernel_id))
            remove_reports(report_dir(), kernel_id)
        except (LedgerError, OSError) as e:
            self.log.warning("jupyter-gpushare: kernel %s's reservation was not given back at exit: %s", kernel_id, e)
            return
        if lease is not None:  # (nobody of this program waits any more: the line's loop is closed, not told)
            self.event("released", kernel_id, reserved_mib=lease.reserved_mib, why="its program exited")

    async def reconcile(self, known: set[str] | None = None) -> None:
        """Release this process's leases for kernels it no longer has, and reclaim the dead. Raises LedgerError
        while the ledger cannot be used (the caller logs it and tries again at the next interval).

        ``known``: the kernels the server still has (started or starting). A record of another kernel is
        forgotten: jupyter_client drops a kernel whose restart failed without cleaning it up."""
        if known is not None:
            for kernel_id, rec in list(self.records.items()):
                if kernel_id not in known and rec.state not in ("starting", "queued"):
                    await self.release(kernel_id, "gone from the server")
        keep = set(self.records)
        for lease in await self.ledger.on(lambda ledger: ledger.release_owned_except(keep)) or []:
            self.event("reclaimed", lease.kernel_id, reserved_mib=lease.reserved_mib)
        self._reclaimed(await self.ledger.on(lambda ledger: ledger.reap()) or [])
        await self.teacher.take()

    # -- views for the API ------------------------------------------------------------------------

    async def snapshot(self) -> dict[str, Any]:
        """Cards with their reservations, this process's kernels, and the host-wide queue (snapshot.py)."""
        return await take_snapshot(self)

    def close(self) -> None:
        """Close the ledger and the threads (once): a server's, after its last kernel is gone (``release``) or as it
        stops without kernels (app.stop_extension); a server in a process that goes on (a test suite's) leaves no
        file open."""
        if self._closed:
            return
        self._closed = True
        for task in list(self._room_reads):
            task.cancel()
        self.line.stop()
        self.parking.checkpointer.close()
        self.ledger.close()
        self._work.shutdown(wait=False)


# The manager this process's provisioners use. jupyter_client makes each provisioner itself, from an entry point,
# and hands it nothing of ours, so this is where a provisioner finds it: a server's (set as the extension starts),
# or a program's own (set by its first kernel's provisioner). Nothing else reads it.
_this_process: QuotaManager | None = None
_inherited: list[QuotaManager] = []  # a forked child's copies of its parent's managers: kept, never used


def process_manager() -> QuotaManager | None:
    """The manager this process's provisioners use (None: none yet)."""
    return _this_process


def use_in_process(manager: QuotaManager | None) -> None:
    """Make ``manager`` the one this process's provisioners use (None: none; the next kernel's builds one)."""
    global _this_process
    _this_process = manager


def _forget_the_parents_manager() -> None:
    """In a forked child (a multiprocessing or ProcessPoolExecutor worker, a prefork server's worker): its
    parent's manager came along without its ledger thread, and with the parent's SQLite connection, which must
    never be used across a fork. The child builds its own on first use (GpuShareProvisioner._manager). The copy
    is kept referenced, so that no finalizer closes the parent's connection (and checkpoints its WAL) from here."""
    global _this_process
    if _this_process is not None:
        _inherited.append(_this_process)
        _this_process = None
        fresh_event_loop()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_the_parents_manager)


def kernel_cgroups(settings: GpuShareApp) -> KernelCgroups:
    """This server's kernels' cgroups: its own where it may make them and a kernel could not leave them (or it runs
    as root, which a kernel of root's could leave anyway); else, where the host's broker (on its Unix socket) makes
    them for its servers, the broker's (broker/groups.py); else its own, or none."""
    own = KernelCgroups(enabled=settings.kernel_cgroups == "auto")
    broker = settings.broker()
    if settings.kernel_cgroups != "auto" or broker is None or is_tcp(broker.socket) or os.geteuid() == 0:
        return own
    if own.level.tracking == "cgroup" and not own.level.escapable:
        return own
    return BrokerGroups.offered(broker) or own


def build_manager(
    settings: GpuShareApp, log: logging.Logger | None = None, services: Services | None = None
) -> QuotaManager:
    """A QuotaManager from the admin's settings, after they are checked as a whole against this host's cards
    (PolicyError names the settings and the fix), working with ``services`` (None: a program's)."""
    policy = settings.build_policy()
    backend = open_backend(settings.gpu_backend, settings.simulated_cards)
    if isinstance(backend, SimulatedBackend):  # kernels may say what they "use" of it (gpushare_simulate)
        backend.claims_dir = report_dir()
    cards = list_cards(backend)
    settings.check(policy, [CardView(c.uuid, c.index, c.total_mib) for c in cards])
    return QuotaManager(
        policy,
        backend,
        settings.ledger_path,
        log=log,
        broker=settings.broker(),
        history=settings.build_history(),
        cards=cards,
        unwatched_s=settings.queue_unwatched_timeout,
        cgroups=kernel_cgroups(settings),
        parking=settings.build_park(),
        services=services,
    )
