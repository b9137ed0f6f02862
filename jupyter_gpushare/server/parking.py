"""Parking: an idle kernel's GPU state goes to host memory and its reservation to the line; it comes back when
the kernel is wanted again.

Owns which kernels are parked, and the two moves. It does not judge idleness (the enforcer tells it how long a
kernel has been idle), nor decide who gets a reservation (the line does, by its rules, for a resume as for a
start), nor touch a card itself (host/checkpoint.py does, through the driver or its stand-in).

- **Park** as many kernels as the line needs, each one that holds a reservation, has been idle for ``after_s``
  (no cell running, 0% GPU; a cell just sent, or a resume just done, restarts that clock) while another kernel
  waits in line, whose frameworks are all on the allow-list (measured on the GPU:
  bench/results/check_park-*), and whose state fits the host memory budget: the kernel is asked to give its
  frameworks' cached memory back (the server's ``trim``), then its GPU processes are checkpointed,
  the card is read until it shows them holding nothing, and the reservation is given back. Every view says
  ``parked``. A park that fails leaves the kernel running and is not tried again for that process.
- **Stand by**, first, a kernel that holds a reservation it has not used: a Python kernel under line_place = 'start'
  (its pipe to the server is open, granted at its start or in line), with nothing of it on the card, no GPU
  framework in its reports, and held ``after_s`` while another kernel waits, busy with a CPU cell or not. It is
  asked (its provisioner's ``stand_by``) and agrees only if it imported no GPU framework and runs no child process;
  it then gives its reservation to the line and runs on, its card closed, and its next GPU use asks again as at a
  first use (line_place = 'first-use'). Nothing is checkpointed, and its cells are never held. One that says no (or
  cannot be asked) is not asked again for that process; once idle, it may be parked.
- **Resume** at the kernel's next cell (seam/connection.py holds the cell meanwhile) or on request: it asks for its
  reservation again on the same card, through the line, then restores. A resume that waits past the line's
  timeout leaves the kernel parked; its next cell asks again.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from ..core.policy import ParkRules, PolicyError, Size, format_mib
from ..core.words import render
from ..host.checkpoint import Checkpointer, CheckpointError
from ..host.gpu import Card
from ..ledger.ledger import Lease, LedgerError, Request, Waiting
from ..ledger.reservations import Reservations
from .card_word import CardWord, holding
from .clock import SYSTEM, Clock
from .holding import Holding
from .kernel_word import why_not_parked
from .ledger_worker import LedgerWorker
from .line import Line
from .records import Grant, KernelRecord, Parked, QuotaUnavailable, Tells, Writes
from .sampler import KernelUsage
from .services import Services


class Registry(Tells, Writes, Protocol):
    """What parking needs of the kernels' registry (QuotaManager): the records and what becomes of each, the last
    readings, and the student's events."""

    user: str
    records: dict[str, KernelRecord]
    log: logging.Logger

    def settle(self, rec: KernelRecord, grant: Grant, why: str = ..., **figures: Any) -> Grant: ...
    def reserve(self, ledger: Reservations, request: Request, wait: bool, home: str | None) -> Lease | Waiting: ...
    def card(self, uuid: str) -> Card | None: ...
    async def attach(self, kernel_id: str, pid: int | None) -> None: ...
    def end_kernel(self, kernel_id: str) -> None: ...
    def kernel_usage(self, kernel_id: str) -> KernelUsage | None: ...


LOCK_TIMEOUT_S = 10.0  # a running GPU call that does not end within this is not parked
SETTLE_S = 1.0  # a park's room counts as coming until the line has had a turn since (at most this long)
AT_ONCE = 8  # parks under way at one time (each moves its state to host memory; they share the bus)
STARTING_S = 30.0  # a kernel is not idle while Jupyter says it is starting, for at most this long
NOT_NOW_S = 30.0  # a kernel that may not be parked now (the budget, a thread, a port) is not tried again for this long
ASK_AGAIN_S = 15.0  # a resume that did not happen is tried again, while its kernel is busy, at most this often


class Parking:
    """The parked kernels of this server, and the moves that park and resume them."""

    def __init__(
        self,
        kernels: Registry,
        parts: tuple[LedgerWorker, Line, Holding, Services],
        checkpointer: Checkpointer,
        rules: ParkRules,
        blocking: Callable[..., Awaitable[Any]],
        clock: Clock = SYSTEM,
    ) -> None:
        """``parts``: the host's ledger, this server's line, its kernels' cgroups and cards (a kernel that stands by
        has its card closed), and its services (how it tells a kernel, and the sampler's readings)."""
        self.kernels, self.checkpointer, self.rules, self._blocking = kernels, checkpointer, rules, blocking
        self.ledger, self.line, self.holding, self.services = parts
        self.clock = clock
        # the card's word on what is held and free, not the driver's (on the sampler's clock: its readings' times)
        self.card = CardWord(self.services.readings)
        self._moving: dict[str, asyncio.Future] = {}  # kernels being parked or resumed: the move's task
        self._failed: dict[str, int | None] = {}  # kernels whose park failed: the process it failed for
        self._touched: dict[str, float] = {}  # (monotonic) a cell sent to the kernel, or its resume: its idle clock
        self.given_back_mib_s = 0.0  # reserved MiB × seconds parked, of kernels resumed or gone
        self.stood_by_count = 0  # kernels that stood by so far (each time one did)
        self.seconds: dict[str, list[float]] = {"park": [], "resume": []}  # the last moves' durations
        self._parking: dict[str, int] = {}  # the kernels being parked now: the reservation each gives back
        # (this reading's) idle for, record, processes to checkpoint (None: to stand by), MiB used, pid
        self._candidates: list[tuple[float, KernelRecord, list[int] | None, int, int | None]] = []
        # parks and stand-bys just done: (monotonic) until when, the MiB given back, the line's turns begun by then
        self._settling: list[tuple[float, int, int]] = []
        self._soonest = math.inf  # (this reading's) in how many s a kernel not yet idle long enough will be
        self._wake: asyncio.TimerHandle | None = None  # the reading asked for then (``_read_at``)
        self._standing: dict[str, int] = {}  # kernels being asked to stand by now: the reservation each gives back
        self._kept: dict[str, int | None] = {}  # kernels that would not stand by: the process that said so
        self._not_until: dict[str, float] = {}  # (monotonic) kernels that may not be parked now: until when
        self._again: dict[str, tuple[float, str]] = {}  # resumes that did not happen: (monotonic) retry from, why

    # -- what is parked ------------------------------------------------------------------------------

    def parked(self) -> list[KernelRecord]:
        return [rec for rec in self.kernels.records.values() if rec.parked is not None]

    def away(self, kernel_id: str) -> bool:
        """Whether the kernel is parked or being parked: a cell sent to it now must bring it back first."""
        return self.card_of(kernel_id) is not None or kernel_id in self._parking

    def card_of(self, kernel_id: str) -> str | None:
        """The card a parked kernel comes back on (its GPU state belongs there)."""
        rec = self.kernels.records.get(kernel_id)
        return rec.parked.card_uuid if rec is not None and rec.parked is not None else None

    def parked_mib(self) -> int:
        return sum(rec.parked.parked_mib for rec in self.parked() if rec.parked)

    def given_back_gib_h(self, now: float | None = None) -> float:
        """Reservations given back by parking, in GiB-hours, the kernels parked now included."""
        now = self.clock.wall() if now is None else now
        live = sum(p.reserved_mib * (now - p.since) for p in (r.parked for r in self.parked()) if p)
        return (self.given_back_mib_s + live) / 1024 / 3600

    def view(self) -> dict[str, Any]:
        """What the API says of parking on this server (GET /api/gpushare/cards)."""
        reason = self.unavailable()
        return {
            "available": reason is None,
            "reason": reason,
            "by": self.checkpointer.kind,
            "after_s": self.rules.after_s,
            "frameworks": list(self.rules.frameworks),
            "host_budget_mib": self.rules.host_budget_mib,
            "parking_now": next(iter(self._parking), None),
            "parked_kernels": len(self.parked()),
            "parked_mib": self.parked_mib(),
            "given_back_gib_h": round(self.given_back_gib_h(), 6),
            "stood_by": self.stood_by_count,
        }

    def unavailable(self) -> str | None:
        """Why this server parks nothing; None when it parks idle kernels."""
        if not self.rules.after_s:
            return "parking is off (GpuShareApp.park_after = 0)"
        return self.checkpointer.unavailable()

    # -- park ------------------------------------------------------------------------------------------

    def consider(
        self,
        rec: KernelRecord,
        usage: KernelUsage,
        idle_for: float,
        frameworks: Sequence[str],
        execution: str | None = None,
    ) -> None:
        """One kernel of this reading that may be parked (the enforcer calls it for each, then ``decide``);
        ``execution``: its state as Jupyter last heard it."""
        kid = rec.kernel_id
        if self._may_stand_by(rec, usage, frameworks, idle_for, execution):
            return
        if (
            not self.rules.after_s
            or execution == "busy"
            # a kernel still starting is not idle: its notebook's first cell waits for it (a class that opened at
            # once had its first kernels parked, and sent to the back of the line, before they ran a cell); one that
            # no client ever connected to stays "starting" for Jupyter, and is judged by its activity after a while
            or (execution == "starting" and idle_for < STARTING_S)
            or rec.state != "running"
            or rec.lease is None
            or kid in self._moving
            or self._failed.get(kid, -1) == usage.pid
            or not set(frameworks) <= set(self.rules.frameworks)
        ):
            return
        touched = self.clock.mono() - self._touched.get(kid, -math.inf)
        wait = self.rules.after_s - min(idle_for, touched)
        if wait > 0:  # not idle long enough yet: when it will be, if nothing runs meanwhile
            self._soonest = min(self._soonest, wait)
            return
        used = usage.used_mib or 0
        if self._not_until.get(kid, -math.inf) > self.clock.mono():  # (the budget, a thread, a port: _may_park)
            return
        pids = holding(usage.processes)
        self._candidates.append((idle_for, rec, pids, used, usage.pid))

    def _may_stand_by(
        self, rec: KernelRecord, usage: KernelUsage, frameworks: Sequence[str], idle_for: float, execution: str | None
    ) -> bool:
        """Whether the kernel is one of this reading's to ask to stand by (the module's docstring): it holds a
        reservation, has held it ``after_s`` without anything on the card, and reports no GPU framework."""
        kid, lease = rec.kernel_id, rec.lease
        if (
            not self.rules.after_s
            or rec.state != "running"
            or lease is None
            or frameworks
            or usage.processes
            or kid in self._moving
            or self._kept.get(kid, -1) == usage.pid
            or (execution == "starting" and idle_for < STARTING_S)
            or not self.services.starts.can_stand_by(kid)  # no pipe to ask through
        ):
            return False
        wait = self.rules.after_s - (self.clock.wall() - lease.created)
        if wait > 0:
            self._soonest = min(self._soonest, wait)
            return True  # (not a park either: it would be the same kernel, sooner)
        self._candidates.append((math.inf, rec, None, 0, usage.pid))
        return True

    def touch(self, kernel_id: str) -> None:
        """A cell goes to the kernel now (seam/connection.py), or it came back: it is not idle, whatever the last reading
        said (a reading can predate the cell; a park must never freeze a running cell)."""
        self._touched[kernel_id] = self.clock.mono()

    def decide(self, need_mib: int) -> None:
        """Park as many of this reading's candidates as the line needs: ``need_mib``, what the kernels in line need
        beyond the free room (0: nobody waits). The ones with the least GPU state first (the cheapest to park and
        bring back: a kernel that holds a reservation and uses nothing costs nothing), then the ones idle the
        longest; at most AT_ONCE at a time. The reservations of parks under way, and of those done since the line's
        last turn (at most SETTLE_S ago: the line is granting them), count as room coming."""
        candidates, self._candidates = self._candidates, []
        soonest, self._soonest = self._soonest, math.inf
        now = self.clock.mono()
        done = self.line.turns_done  # a turn begun after the move is done: its room was granted, or is free
        self._settling = [(until, mib, turn) for until, mib, turn in self._settling if until > now and done <= turn]
        coming = sum(self._parking.values()) + sum(self._standing.values()) + sum(m for _, m, _ in self._settling)
        if need_mib <= coming:
            return
        if self.checkpointer.unavailable():  # only what stands by, which moves nothing
            candidates = [c for c in candidates if c[2] is None]
        for _, rec, pids, used, pid in sorted(candidates, key=lambda c: (c[3], -c[0])):
            if coming >= need_mib or len(self._parking) >= AT_ONCE:
                break
            assert rec.lease is not None
            coming += rec.lease.reserved_mib
            moving = self._stand_by(rec, pid) if pids is None else self._park(rec, pids, used, pid)
            self._start(rec.kernel_id, moving)
        if coming < need_mib and soonest < math.inf:
            self._read_at(soonest)

    def _read_at(self, delay: float) -> None:
        """Ask for a reading in ``delay`` s, when a kernel will have been idle ``after_s`` (its park is decided then,
        not at the sampler's next interval); one such wake-up at a time, the soonest."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # judged outside the IOLoop (a direct call): the sampler's interval will do
            return
        at, wake = loop.time() + delay, self._wake
        if wake is not None and not wake.cancelled() and wake.when() > loop.time():  # one is still to come
            if wake.when() <= at:
                return
            wake.cancel()
        self._wake = loop.call_at(at, self.services.readings.wanted.set)

    async def park(self, kernel_id: str) -> None:
        """Park a kernel now (an admin or its user asked): it must hold a reservation. PolicyError says why not."""
        rec = self.kernels.records.get(kernel_id)
        if rec is None or rec.state != "running" or rec.lease is None:
            raise PolicyError(f"Kernel {kernel_id} holds no GPU reservation, so there is nothing to park.")
        reason = self.checkpointer.unavailable()
        if reason:
            raise PolicyError(f"Kernels cannot be parked on this host: {reason}.")
        why_not = await why_not_parked(self.services.starts, kernel_id, self.rules.frameworks)
        if why_not is not None:
            raise PolicyError(f"Kernel {kernel_id} is not parked: {why_not}.")
        usage = self.kernels.kernel_usage(kernel_id)  # (what the park falls back on: it reads the card afresh)
        pids, used = (holding(usage.processes), usage.used_mib or 0) if usage is not None else ([], 0)
        why_not = await self._start(kernel_id, self._park(rec, pids, used, usage.pid if usage else None, asked=True))
        if why_not is not None:
            raise PolicyError(f"Kernel {kernel_id} is not parked: {why_not}.")

    async def _stand_by(self, rec: KernelRecord, pid: int | None) -> None:
        """Ask a kernel to stand by (``decide``); its reservation counts as room coming meanwhile."""
        kid = rec.kernel_id
        reserved = rec.lease.reserved_mib if rec.lease is not None else 0
        self._standing[kid] = reserved
        try:
            said = await self.services.starts.stand_by(kid)
        finally:
            del self._standing[kid]
        if said != "standby":
            self._kept[kid] = pid

    async def stood_by(self, kernel_id: str) -> None:
        """A kernel agreed to stand by (its provisioner says so, whoever asked): its card closes to it and its
        reservation goes to the line; it runs on as a kernel that asks at its first GPU use."""
        rec = self.kernels.records.get(kernel_id)
        if rec is None or rec.lease is None:
            return
        lease = rec.lease
        self.kernels.move(rec, "standby", lease=None, card=None, line=None)
        try:  # (it stands by whatever fails here: its environment has no GPU now)
            await self.holding.close_cards(kernel_id)
        except OSError as e:  # its group is gone meanwhile; or the host's: what it takes is outside use, acted on
            self.kernels.log.warning("jupyter-gpushare: kernel %s stood by; its card stays open: %s", kernel_id, e)
        try:
            await self.ledger.on(lambda ledger: ledger.release(kernel_id))
        except Exception as e:  # noqa: BLE001 (a full disk, the broker down: reconcile gives its room back later)
            self.kernels.event("release-pending", kernel_id, reason=str(e))
        held_s = round(self.clock.wall() - lease.created)
        self.stood_by_count += 1
        self._room_freed(lease.reserved_mib)
        self.kernels.event("stood-by", kernel_id, reserved_mib=lease.reserved_mib, held_s=held_s)

    def _room_freed(self, mib: int) -> None:
        """A move gave ``mib`` back to the line just now: the line is served at once, and the room counts as coming
        until a turn of it begun after now is done."""
        self.line.room_freed()
        self._settling.append((self.clock.mono() + SETTLE_S, mib, self.line.turns))

    async def _park(
        self, rec: KernelRecord, pids: list[int], used_mib: int, pid: int | None, asked: bool = False
    ) -> str | None:
        """Why it was not parked (None: it is). ``asked``: the kernel said already that it may be (``park``)."""
        self._parking[rec.kernel_id] = rec.lease.reserved_mib if rec.lease is not None else 0
        try:
            return await self._park_now(rec, pids, used_mib, pid, asked)
        finally:
            del self._parking[rec.kernel_id]

    async def _park_now(
        self, rec: KernelRecord, pids: list[int], used_mib: int, pid: int | None, asked: bool
    ) -> str | None:
        kid, lease, card = rec.kernel_id, rec.lease, rec.card
        assert lease is not None
        t0 = self.clock.mono()
        why_not = None if asked else await why_not_parked(self.services.starts, kid, self.rules.frameworks)
        if why_not is not None:
            self._not_until[kid] = self.clock.mono() + NOT_NOW_S
            self.kernels.log.info("jupyter-gpushare: kernel %s is not parked: %s", kid, why_not)
            return why_not
        trimmed = await self.services.starts.trim(kid)  # its frameworks give their caches back: only what is in use
        if trimmed is None:  # (it said it may be parked a moment ago: a cell runs now, or it hangs)
            self._not_until[kid] = self.clock.mono() + NOT_NOW_S
            return "it did not answer the request to give its cached GPU memory back (a cell runs, or it hangs)"
        # moves, as the card shows it now (a reading from before the kernel's last cell would park what it held then:
        # a cell that had just filled the card had nothing of it moved, and its reservation went to the line)
        pids, used_mib = await self.card.in_use(kid, pids, used_mib)
        budget = self.rules.host_budget_mib
        try:  # the host's one budget, in the ledger (the broker's, where there is one), before any state moves
            await self.ledger.run(self.ledger.must, lambda ledger: ledger.park(kid, used_mib, budget))
        except (PolicyError, LedgerError) as e:
            self._not_until[kid] = self.clock.mono() + NOT_NOW_S
            self.kernels.log.info("jupyter-gpushare: kernel %s is not parked: %s", kid, e)
            return str(e)
        try:
            steps = await self._blocking(self.checkpointer.park, pids, LOCK_TIMEOUT_S) if pids else {}
            held = await self.card.held(pids)
            if held is not None:
                await self._blocking(self.checkpointer.resume, pids)
                raise CheckpointError(f"the card still showed {format_mib(held)} held after parking")
        except CheckpointError as e:
            self._failed[kid] = pid
            self._unpark(kid)
            self.kernels.event("park-failed", kid, reason=str(e))
            return str(e)
        seconds = round(self.clock.mono() - t0, 2)
        self.seconds["park"] = [*self.seconds["park"][-49:], seconds]
        try:  # the reservation goes back as it is (its notebook's history and reports stay: the kernel runs on)
            await self.ledger.on(lambda ledger: ledger.release(kid))
        except Exception as e:  # noqa: BLE001 (a full disk, the broker down: not parked, and said)
            await self._blocking(self.checkpointer.resume, pids) if pids else None
            self._failed[kid] = pid
            self._unpark(kid)
            self.kernels.event("park-failed", kid, reason=str(e))
            return str(e)
        parked = Parked(lease.card_uuid, lease.card_index, tuple(pids), used_mib, lease.quota_mib,
                        lease.reserved_mib, self.clock.wall(), seconds)  # fmt: skip
        self.kernels.move(rec, "parked", lease=None, card=card, parked=parked)
        self._room_freed(lease.reserved_mib)
        self.services.starts.tell(kid, {"parked": {"parked_mib": used_mib}})  # its next demand brings it back
        self.kernels.event(
            "parked", kid, parked_mib=used_mib, reserved_mib=lease.reserved_mib, park_s=seconds, trimmed=trimmed or [],
            **steps,
        )  # fmt: skip
        return None

    # -- resume ------------------------------------------------------------------------------------------

    def resume(self, kernel_id: str, retry: bool = False) -> asyncio.Future:
        """Bring a parked kernel back (idempotent: a second call joins the first); the future is done once it runs
        again, or stays parked (its wait for a reservation ended, or its card has no room). ``retry``: a demand that
        stands (the kernel is still busy), tried again at most every ASK_AGAIN_S after a resume that did not happen."""
        moving = self._moving.get(kernel_id)
        if moving is not None and kernel_id in self._parking:  # a park under way: come back right after it
            return asyncio.ensure_future(self._after(moving, kernel_id))
        if moving is not None:
            return moving
        rec = self.kernels.records.get(kernel_id)
        if rec is None or rec.parked is None or (retry and self._again.get(kernel_id, (0.0,))[0] > self.clock.mono()):
            done: asyncio.Future = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done
        return self._start(kernel_id, self._resume(rec, rec.parked))

    async def _after(self, park: asyncio.Future, kernel_id: str) -> None:
        await asyncio.wait([park])
        await self.resume(kernel_id)

    async def _resume(self, rec: KernelRecord, parked: Parked) -> None:
        kid, t0 = rec.kernel_id, self.clock.mono()
        request = Request(kid, Size(mib=parked.quota_mib), self.kernels.user, rec.kernel_name, rec.path or "")
        home = parked.card_uuid  # (its GPU state comes back on its own card)
        try:
            got = await self.ledger.run(self.ledger.must, lambda db: self.kernels.reserve(db, request, True, home))
            if isinstance(got, Lease):
                self.line.leave(kid, "it was admitted")
                lease = got
            else:
                self.line.join(rec, request, got)
                grant = await self.line.granted(kid)
                if grant.lease is None:
                    raise QuotaUnavailable(grant.reason or "no reservation")
                lease = grant.lease
        except (QuotaUnavailable, PolicyError, Exception) as e:  # noqa: BLE001 (it stays parked, and says why)
            self._stays_parked(rec, parked, "resume-waited-out", reason=str(e))
            return
        waited = round(self.clock.mono() - t0, 2)
        free = await self.card.short(parked.card_uuid, parked.parked_mib)
        if free is not None:  # the ledger agrees, the card does not: no restore without the room (it stays parked)
            await self.ledger.on(lambda ledger: ledger.release(kid))
            self._room_freed(lease.reserved_mib)
            figures: dict[str, Any] = {"free_mib": free, "parked_mib": parked.parked_mib}  # (words: the catalogue)
            self._stays_parked(rec, parked, "resume-no-room", **figures)
            return
        try:
            steps = await self._blocking(self.checkpointer.resume, list(parked.pids)) if parked.pids else {}
        except CheckpointError as e:
            self.kernels.event("resume-failed", kid, reason=str(e))
            why = render("event.resume-failed", {"reason": str(e)})
            self.kernels.move(rec, "failed", parked=None, line=None, reason=why)  # (it is shut down next)
            self._unpark(kid)
            self.kernels.end_kernel(kid)
            return
        seconds = round(self.clock.mono() - t0 - waited, 2)
        self.seconds["resume"] = [*self.seconds["resume"][-49:], seconds]
        self.given_back_mib_s += parked.reserved_mib * (self.clock.wall() - parked.since)
        self._again.pop(kid, None)
        self._unpark(kid)
        self.services.starts.tell(kid, {"back": {}})
        self.touch(kid)  # its cell runs next: its idle clock starts again
        self.kernels.settle(rec, Grant("gpu", lease=lease, card=self.kernels.card(lease.card_uuid)))  # (unparked)
        await self.kernels.attach(kid, rec.pid)
        self.kernels.event("resumed", kid, waited_s=waited, resume_s=seconds, **steps)

    def _stays_parked(self, rec: KernelRecord, parked: Parked, code: str, **figures: Any) -> None:
        """A resume that did not happen: parked again (no lease: a grant of the line's went back), told so, and why:
        a cell that runs says it (its GPU call waits in the driver: never a silent hang). The same words again (a
        demand that stands, tried again) are said once."""
        self.kernels.move(rec, "parked", lease=None, line=None)
        figures["again_s"] = ASK_AGAIN_S
        message = render(f"event.{code}", figures)
        said = self._again.get(rec.kernel_id, (0.0, None))[1]
        self._again[rec.kernel_id] = (self.clock.mono() + ASK_AGAIN_S, message)
        if message != said:
            self.services.starts.tell(rec.kernel_id, {"parked": {"parked_mib": parked.parked_mib, "why": message}})
            self.kernels.event(code, rec.kernel_id, **figures)

    def forget(self, kernel_id: str, parked: Parked | None) -> None:
        """The kernel is gone or restarts, and ``parked``, the parked state its record held, went with its process
        (its record is gone, or moved on without it: QuotaManager.release)."""
        if parked is not None:
            self.given_back_mib_s += parked.reserved_mib * (self.clock.wall() - parked.since)
            self._unpark(kernel_id)
        self._not_until.pop(kernel_id, None)
        self._again.pop(kernel_id, None)
        self._failed.pop(kernel_id, None)
        self._kept.pop(kernel_id, None)
        self._touched.pop(kernel_id, None)

    def _unpark(self, kernel_id: str) -> None:
        """Its parked state no longer takes host memory (back on the card, or gone): the host's budget is told."""
        self.ledger.later(f"unpark({kernel_id})", lambda ledger: ledger.unpark(kernel_id))

    def _start(self, kernel_id: str, move: Awaitable[Any]) -> asyncio.Future:
        task = asyncio.ensure_future(move)
        self._moving[kernel_id] = task
        task.add_done_callback(lambda _: self._moving.pop(kernel_id, None))
        return task
