"""This server's kernels in the host's line, and how each wait ends.

A kernel the ledger cannot place now joins the line (``join``); while any of this server's kernels wait, the
line asks the ledger for each every QUEUE_POLL_S (a heartbeat too; PUSHED_POLL_S while a broker says each change,
room_watch.py) and at once when room is freed, and hands each answer to the kernels' registry (QuotaManager):
granted, refused, or still waiting at its place. ``ServerQueue`` decides when a wait ends without a grant
(cancelled, past the timeout, unwatched, the server closing); the ledger decides who is granted
(``queue.choose_card``). One that no notebook or client wants steps out of the host's line after
UNWANTED_S, so that it holds no one up, and joins again at the back once wanted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from dataclasses import dataclass
from typing import Callable, Protocol

from ..core.policy import Policy, PolicyError
from ..host.gpu import Card
from ..ledger.file import LedgerError
from ..ledger.leases import Lease, Waiting
from ..ledger.queue import Request
from ..ledger.reservations import Reservations
from .admission import Refusal, Start
from .clock import SYSTEM, Clock
from .ledger_worker import LedgerWorker
from .records import Grant, InLine, KernelRecord, QuotaUnavailable, Tells, Writes, full_message, rule_figures
from .room_watch import RoomWatch
from .services import KernelStarts

QUEUE_POLL_S = 0.5
PUSHED_POLL_S = 2.0  # while the broker says each change (room_watch.py): a heartbeat, and what no ledger says
UNWANTED_S = 3.0  # a kernel in line that nothing wants (no session, no client) this long gives its place up


ENDINGS = ("cancelled", "timeout", "unwatched", "closing")  # why a wait ends without a grant (Wait.ending)


@dataclass
class Wait:
    """One of this server's kernels in line: since when (monotonic), until when, and how it ends. ``deadline`` is
    the line's one deadline for it, the ledger's (``Waiting.gives_up_at``), on this server's monotonic clock."""

    request: Request
    since: float
    result: asyncio.Future  # the Grant, or the QuotaUnavailable that ends the wait
    deadline: float = math.inf
    unwatched_since: float | None = None  # no client connected since then
    ending: str | None = None  # one of ENDINGS, once decided
    why: str = ""  # for 'cancelled': what stopped it
    last: Waiting | None = None  # the ledger's last answer
    unwanted_since: float | None = None  # no notebook and no client wants it since then (QuotaManager.may_grant)
    stepped_out: bool = False  # its place in the host's line was given up while nothing wanted it
    ledger_down: bool = False  # the ledger (its broker, its disk) could not be asked at the last turn
    passed: bool = False  # the last turn passed it by: room was freed, and the next turn began at the front

    def order(self) -> tuple[float, float]:
        """Its place in a turn: by its place in the host's line as the ledger last said it, the new ones after."""
        return (math.inf if self.last is None else self.last.position, self.since)

    @property
    def kernel_id(self) -> str:
        return self.request.kernel_id


class ServerQueue:
    """The kernels of this server that wait in the host's line, and when each stops waiting.

    The ledger decides who is granted (``choose_card``); this decides, at each tick, which waits to ask it about
    and which end now: cancelled (its owner stopped it, or it was shut down), past its deadline (the ledger's), unwatched (no
    client connected for ``unwatched_s``), or the server is closing. Its deadlines are on the monotonic clock: a
    change of the wall clock neither ends nor prolongs a wait.
    """

    def __init__(self, unwatched_s: float = 0.0, clock: Clock = SYSTEM):
        self.unwatched_s = unwatched_s
        self.clock = clock
        self.waits: dict[str, Wait] = {}
        self.closing = False

    def join(self, request: Request) -> Wait:
        """Put a kernel in line, or keep its place: the same kernel asking for the same quota again (a restart
        while it waits, a reload) is the same wait."""
        old = self.waits.get(request.kernel_id)
        if old is not None and old.request == request and old.ending is None:
            return old
        if old is not None:
            self.end(old.kernel_id, "cancelled", "it asked for another quota")
        now = self.clock.mono()
        wait = Wait(request, now, asyncio.get_running_loop().create_future())
        self.waits[request.kernel_id] = wait
        return wait

    def answered(self, wait: Wait, got: Waiting) -> None:
        """The ledger's answer for a kernel in line: its place, and its deadline. The host's line keeps one
        deadline a waiter (its joining plus the ledger's policy's queue_timeout; none where there is no limit),
        read here and never computed again."""
        wait.last = got
        wait.deadline = (
            math.inf if got.gives_up_at is None else self.clock.mono() + (got.gives_up_at - self.clock.wall())
        )

    def end(self, kernel_id: str, ending: str, why: str = "") -> Wait | None:
        """Mark a wait as ending (the next ``due`` reports it); None if the kernel is not in line."""
        wait = self.waits.get(kernel_id)
        if wait is not None and wait.ending is None:
            wait.ending, wait.why = ending, why
        return wait

    def leave(self, kernel_id: str) -> Wait | None:
        """Take a kernel out of line (granted, or its ending handled)."""
        return self.waits.pop(kernel_id, None)

    def due(self, watchers: Callable[[str], int | None] = lambda kernel_id: None) -> tuple[list[Wait], list[Wait]]:
        """(waits to ask the ledger about now, waits that end now). ``watchers(kernel_id)``: how many clients are
        connected to the kernel, None where that does not apply (a kernel started by nbclient is its client)."""
        now = self.clock.mono()
        ask: list[Wait] = []
        ending: list[Wait] = []
        for wait in list(self.waits.values()):
            if wait.ending is None and self.closing:
                wait.ending = "closing"
            elif wait.ending is None and now >= wait.deadline:
                wait.ending = "timeout"
            elif wait.ending is None and self.unwatched_s:
                count = watchers(wait.kernel_id)
                if count is None or count > 0:
                    wait.unwatched_since = None
                elif wait.unwatched_since is None:
                    wait.unwatched_since = now
                elif now - wait.unwatched_since >= self.unwatched_s:
                    wait.ending = "unwatched"
            (ask if wait.ending is None else ending).append(wait)
        return ask, ending


class Registry(Tells, Writes, Protocol):
    """What the line needs of the kernels' registry (QuotaManager): their records, and to apply what a wait came to
    (``conclude``: the line says the outcome, the registry alone changes the record and says it)."""

    policy: Policy
    records: dict[str, KernelRecord]

    def conclude(
        self, kernel_id: str, outcome: Start | Refusal, rec: KernelRecord | None = ...
    ) -> Grant | QuotaUnavailable: ...
    def keeps(self, rec: KernelRecord | None) -> bool: ...
    def card(self, uuid: str) -> Card | None: ...
    def reserve(self, ledger: Reservations, request: Request, wait: bool, home: str | None) -> Lease | Waiting: ...
    def card_home(self, kernel_id: str) -> str | None: ...


class Line:
    """This server's waits and the task that serves them. ``starts`` (services.KernelStarts) says how many clients a
    kernel has and whether one still wants it (a Jupyter server's), and hears each answer of the ledger to a kernel
    in line (nbclient's progress on stderr, batch.py)."""

    def __init__(
        self,
        kernels: Registry,
        ledger: LedgerWorker,
        starts: KernelStarts,
        unwatched_s: float,
        log: logging.Logger,
        clock: Clock = SYSTEM,
    ) -> None:
        self.kernels, self.ledger, self.starts, self.log, self.clock = kernels, ledger, starts, log, clock
        self.queue = ServerQueue(unwatched_s, clock)
        self._serving: asyncio.Future | None = None  # the task that serves the line while anyone waits
        self._room = asyncio.Event()  # set when this server frees room: the line is served at once
        self.turns = 0  # the line's turns begun (each asks the ledger for every kernel in line, and answers)
        self.turns_done = 0  # the last turn done: what the ledger said in it is in the kernels' records
        self._cut = False  # the turn under way passed kernels by (room freed meanwhile): it is not done
        self._watch: RoomWatch | None = None  # another server's release, pushed by the broker (room_watch.py)
        self._watching = False  # the watch is held while the server runs, not only while a kernel waits
        self.on_change: Callable[[], None] = lambda: None  # told at each change the broker says (a ruling too)

    def waiting(self, kernel_id: str) -> Wait | None:
        return self.queue.waits.get(kernel_id)

    def close(self) -> list[Wait]:
        """The server is closing: every wait ends (their kernels are shut down with the server's)."""
        self.queue.closing = True
        waits = list(self.queue.waits.values())
        for wait in waits:
            self.queue.end(wait.kernel_id, "closing")
            self.end_wait(wait)
        return waits

    def cancel(self, kernel_id: str, why: str) -> bool:
        """Stop a kernel's wait (its start is refused, 'cancelled'); False when it is not in line."""
        wait = self.queue.end(kernel_id, "cancelled", why)
        if wait is None:
            return False
        self.end_wait(wait)
        return True

    def stop(self) -> None:
        if self._serving is not None:
            self._serving.cancel()
        if self._watch is not None:
            self._watch.stop()

    def join(self, rec: KernelRecord, request: Request, got: Waiting) -> None:
        """A kernel the ledger answered with a place in line joins this server's waits (or keeps its place)."""
        self.leave(request.kernel_id, "it asked for another quota")
        self.queue.answered(self.queue.join(request), got)
        self.kernels.move(rec, "queued", line=InLine(self.clock.wall()), wait_ended=None)
        self._update(rec, got)
        self.kernels.event("queued", request.kernel_id, position=got.position, need_mib=got.need_mib)
        if self._serving is None or self._serving.done():
            self._serving = asyncio.ensure_future(self._serve())
        self._ensure_watch()

    def keep_watching(self) -> None:
        """Hold the broker's watch for as long as this server runs, not only while a kernel of it waits: a teacher's
        ruling on a kernel of this server reaches it at once (``on_change``), not at its next reconcile."""
        self._watching = True
        self._ensure_watch()

    def _ensure_watch(self) -> None:
        if self._watch is None:
            client = self.ledger.twin()
            self._watch = None if client is None else RoomWatch(client, self._changed, self.log)

    def _changed(self) -> None:
        self.room_freed()
        self.on_change()

    def leave(self, kernel_id: str, why: str) -> None:
        """Take a kernel out of line without granting it (it no longer asks, or asks for something else)."""
        wait = self.queue.leave(kernel_id)
        if wait is not None and not wait.result.done():
            wait.result.cancel()
            self._cancel_wait(kernel_id)

    def _cancel_wait(self, kernel_id: str) -> None:
        """Take the kernel out of the host's line, not waiting (a wait not cancelled goes stale without heartbeats
        and is dropped)."""
        self.ledger.later(f"cancel_wait({kernel_id})", lambda ledger: ledger.cancel_wait(kernel_id))

    async def granted(self, kernel_id: str) -> Grant:
        """Wait until a kernel in line is granted its reservation (or starts without a GPU); QuotaUnavailable when
        its wait ends without one, asyncio.CancelledError when it is taken out of line (shut down, another quota)."""
        wait = self.queue.waits.get(kernel_id)
        if wait is None:
            raise asyncio.CancelledError(f"kernel {kernel_id} is not in line")
        return await asyncio.shield(wait.result)

    def _update(self, rec: KernelRecord, got: Waiting) -> None:
        self.kernels.update(rec, line=self._in_line(rec, got))
        self.starts.on_wait(rec, got)

    def _in_line(self, rec: KernelRecord, got: Waiting) -> InLine:
        """``rec``'s wait with the ledger's answer ``got``."""
        return InLine(rec.line.since if rec.line else self.clock.wall(), got)

    async def _serve(self) -> None:
        """While kernels of this server wait: ask the ledger for each (a heartbeat too) every QUEUE_POLL_S, grant,
        and end the waits that end (ServerQueue.due)."""
        while self.queue.waits:
            self._room.clear()  # (before the turn: room freed during it brings the next one at once)
            self.turns += 1
            try:
                await self._serve_once()
            except Exception:  # noqa: BLE001 (one bad turn must not leave every kernel waiting forever)
                self.log.exception("jupyter-gpushare: serving the queue failed; trying again")
            if not self._cut:
                self.turns_done = self.turns
            poll = PUSHED_POLL_S if self._watch is not None and self._watch.live else QUEUE_POLL_S
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._room.wait(), poll)
        if self._watch is not None and not self._watching:  # nobody of this server waits: no watch held
            self._watch.stop()
            self._watch = None

    def room_freed(self) -> None:
        """This server gave a reservation back, or (through a broker) the line may have moved on the host: ask the
        ledger for its kernels in line now, not at the next poll."""
        self._room.set()

    async def _serve_once(self) -> None:
        ask, ending = self.queue.due(self.starts.watchers)
        ask = sorted((w for w in ask if self._wanted(w)), key=Wait.order)  # the front first: room goes to it
        self._cut = False
        for wait in ending:
            self.end_wait(wait)
        for wait in ask:  # each on its own ledger job, answered at once: a read of the ledger (a snapshot's, a
            # request's) waits for one reserve, not a whole turn (60 kernels on 2 cores: 25 s for GET /kernels)
            if self._ended(wait):  # meanwhile: nothing to ask
                continue
            if self._room.is_set() and not wait.passed:  # room was freed meanwhile: the next turn starts at once,
                wait.passed = self._cut = True  # from the front; this one is asked then (passed at most once in a
                continue  # row, so a burst of releases delays a kernel behind the front by one turn at most)
            wait.passed = False
            try:
                home = self.kernels.card_home(wait.kernel_id)  # (read here, on the IOLoop)
                got = await self.ledger.run(self._reserve_one, wait.request, home)
            except Exception as e:  # noqa: BLE001 (a bug must not leave every kernel waiting forever)
                self.log.exception("jupyter-gpushare: serving the queue failed")
                got = e
            self._answer(wait, got)

    def _wanted(self, wait: Wait) -> bool:
        """Whether to ask the ledger for this kernel now. One that no notebook or client wants for UNWANTED_S
        steps out of the host's line, so that it holds no one up; it joins again, at the back, once wanted."""
        if self.starts.may_grant(wait.kernel_id):
            wait.unwanted_since = None
            if wait.stepped_out:
                wait.stepped_out = False
                self.log.info("jupyter-gpushare: kernel %s is wanted again and joins the line", wait.kernel_id)
            return True
        now = self.clock.mono()
        if wait.unwanted_since is None:
            wait.unwanted_since = now
        elif now - wait.unwanted_since >= UNWANTED_S and not wait.stepped_out:
            wait.stepped_out = True
            self._cancel_wait(wait.kernel_id)
        return False

    def _reserve_one(self, request: Request, home: str | None) -> Lease | Waiting | Exception:
        """On the ledger thread: one reserve for a kernel in line (on its ``home`` card, or any); its answer, or the
        error that is its own."""
        try:
            return self.ledger.must(lambda ledger: self.kernels.reserve(ledger, request, True, home))
        except (LedgerError, PolicyError) as e:
            return e

    def _ended(self, wait: Wait) -> bool:
        """Whether ``wait`` ended (granted, cancelled, or its kernel gone): it then leaves the line, unless its kernel
        has a wait of its own that came since."""
        if not wait.result.done() and wait.kernel_id in self.kernels.records:
            return False
        if self.queue.waits.get(wait.kernel_id) is wait:
            self.queue.leave(wait.kernel_id)
        return True

    def _answer(self, wait: Wait, got: Lease | Waiting | Exception) -> None:
        """What the ledger said of a kernel in line."""
        rec = self.kernels.records.get(wait.kernel_id)
        if self._ended(wait) or rec is None:
            return
        if isinstance(got, Lease):
            self.queue.leave(wait.kernel_id)
            now = self.clock.wall()
            waited = round(now - (rec.line.since if rec.line else now))
            grant = Grant("gpu", lease=got, card=self.kernels.card(got.card_uuid))
            self._conclude(wait, Start(grant, waited_s=waited), rec)
        elif isinstance(got, LedgerError):
            # The broker is down, the disk is full: a kernel keeps its place and is asked for again at the next turn
            # (until its wait's own timeout); the line's outage is said once per wait, not ended by it.
            if not wait.ledger_down:
                self.log.warning(
                    "jupyter-gpushare: kernel %s stays in line; the ledger cannot be reached now: %s",
                    wait.kernel_id,
                    got,
                )
            wait.ledger_down = True
            reason = f"Still in line: no GPU reservation can be made now ({got}); asked again every few seconds."
            self.kernels.update(rec, reason=reason)
        elif isinstance(got, PolicyError) and got.code == "taken-out" and self.starts.holds:
            # A teacher took it out of line, and the ledger said so before this server took the notice (teacher.py):
            # its wait ends as the notice ends it, and the kernel runs on without a GPU (a program's start, which
            # does not run while it waits, is refused as taken out, below)
            by, why = got.params.get("by"), got.params.get("why")
            self.queue.end(wait.kernel_id, "cancelled", f"{by} took it out of the line" + (f": {why}" if why else ""))
            self.end_wait(wait)
        elif isinstance(got, Exception):
            self.queue.leave(wait.kernel_id)
            status, rule = (400, rule_figures(got)) if isinstance(got, PolicyError) else (503, {})
            code = rule.pop("code", None)
            self._conclude(wait, Refusal(str(got), status, code, self.kernels.keeps(rec), rule), rec)
        elif got.expired:
            self.queue.end(wait.kernel_id, "timeout")
            self.kernels.update(rec, line=self._in_line(rec, got))
            self.end_wait(wait, got)
        else:
            if wait.ledger_down:  # the ledger answers again
                wait.ledger_down = False
                self.kernels.update(rec, reason=None)
            self.queue.answered(wait, got)
            self._update(rec, got)

    def end_wait(self, wait: Wait, got: Waiting | None = None) -> None:
        """A wait that ends without a grant. A kernel that runs while it waits (a Jupyter server's) runs on without
        a GPU, and says why; else the start is refused (and the kernel shut down by its owner) with why. A kernel
        that nobody watched, or whose server closes, is shut down."""
        self.queue.leave(wait.kernel_id)
        if wait.result.done():
            return
        self._cancel_wait(wait.kernel_id)
        rec = self.kernels.records.get(wait.kernel_id)
        runs = self.starts.holds and rec is not None and wait.ending in ("timeout", "cancelled")
        outcome: Start | Refusal
        if wait.ending == "timeout":
            shown = got or wait.last or Waiting(wait.kernel_id, 1, 0, 0, 0)
            since = rec.line.since if rec and rec.line else None
            waited = round(self.clock.wall() - since) if since else None
            message = full_message(wait.request.quota, shown, self.kernels.policy.context_reserve_mib, waited)
            figures = {"need_mib": shown.need_mib, "free_mib": shown.free_mib, "waited_s": waited}
            outcome = (
                Start(Grant("cpu", reason=message), "refused-timeout", figures)
                if runs
                else Refusal(message, code="refused-timeout", keep=self.kernels.keeps(rec), figures=figures)
            )
        elif wait.ending == "unwatched":
            outcome = Refusal(
                f"Stopped waiting for a GPU: no notebook or program was connected to this kernel for "
                f"{self.queue.unwatched_s:.0f} s, so it was shut down before it could hold memory for no one. "
                "Open the notebook and run a cell to start it again.",
                status=409, kind="cancelled", code="cancelled-unwatched",
                figures={"unwatched_s": round(self.queue.unwatched_s)},
            )  # fmt: skip
        elif wait.ending == "closing":
            outcome = Refusal("Stopped waiting for a GPU: the Jupyter server is shutting down.", 409, "refused-closing")
        else:
            why = f"Stopped waiting for a GPU: {wait.why or 'the start was cancelled'}."
            outcome = Start(Grant("cpu", reason=why), "cancelled") if runs else Refusal(why, 409, kind="cancelled")
        self._conclude(wait, outcome, rec)

    def _conclude(self, wait: Wait, outcome: Start | Refusal, rec: KernelRecord | None) -> None:
        """The line's outcome for a kernel whose wait is over, which the registry applies; its start (or a parked
        kernel's resume) hears it."""
        got = self.kernels.conclude(wait.kernel_id, outcome, rec)
        if isinstance(got, QuotaUnavailable):
            wait.result.set_exception(got)
        else:
            wait.result.set_result(got)
