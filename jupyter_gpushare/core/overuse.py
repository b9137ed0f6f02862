"""Over-use: a kernel whose processes use more GPU memory than its lease, and what is done about it.

Pure rules (no I/O, no signals), the same in a Jupyter server (enforce.py) and in the root broker
(broker/watchdog.py): each reading of the driver becomes one ``Excess`` per kernel over its lease, and
``OverUseJudge`` says what to do, and to which processes.

- **Theft gets no grace.** Over-use that the card's unreserved room covers harms no one yet, and keeps the
  grace. Over-use that takes memory other kernels have reserved (the card's free memory is below what its
  other reservations may still allocate: ``CardRoom.stolen``) is acted on at the reading that sees it.
- **The action falls on the processes that hold the excess.** Where ending some of the kernel's child
  processes alone brings it back within its lease (an ``env -i`` child, a daemon it started), those are
  stopped and the kernel keeps running; where the excess is in the kernel's own process, the kernel is
  restarted (on a theft) or interrupted first (after the grace). An interrupt that frees nothing escalates
  at the next reading after ``SETTLE_S``.
- **Over-time is kept across short dips.** The grace is counted over a window of twice the grace: a kernel
  over for 9 s, under for 2 s, again and again, is acted on once its over-time in the window reaches the
  grace, not never.

Actions: ``notify`` (say so), ``interrupt`` (SIGINT to the kernel), ``restart`` (end the kernel; its server
starts it again on the same reservation), ``shutdown`` (end it for good) and ``stop`` (end ``pids`` alone).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

THEFT_MIN_MIB = 64  # a smaller shortfall is the driver's own bookkeeping moving, not a neighbour's memory
SETTLE_S = 2.0  # how long an interrupt is given to free memory before it is found to have freed nothing
FREED_SHARE = 0.05  # an interrupt that freed less than this share of the excess freed nothing
REPEAT_MIN_S = 5.0  # least time between two actions of the same kind on a kernel that stays over
MAX_CREDIT_S = 10.0  # the most one gap between readings counts as over-time (a stalled reader guesses no more)
FAST_INTERVAL_S = 0.25  # how often the driver is read while any kernel is over its lease
ACTIONS = ("protect", "notify", "interrupt", "restart", "shutdown")


@dataclass(frozen=True)
class CardRoom:
    """One card at one reading: its free memory, and what the leases on it may still allocate.

    ``unused_mib``: per lease whose processes are seen, its reservation less what they use on the card.
    ``unseen_unused_mib``: at most what leases whose use is not seen (another server's, a kernel not yet
    attached) may still allocate: their reservations less every use on the card no seen lease accounts for.
    """

    free_mib: int | None
    unused_mib: Mapping[str, int] = field(default_factory=dict)
    unseen_unused_mib: int = 0

    def stolen(self, kernel_id: str, over_mib: int) -> int:
        """How much of a kernel's ``over_mib`` on this card takes memory that other leases may still allocate."""
        if self.free_mib is None or over_mib <= 0:
            return 0
        others = self.unseen_unused_mib + sum(mib for kid, mib in self.unused_mib.items() if kid != kernel_id)
        short = others - self.free_mib
        return min(over_mib, short) if short >= THEFT_MIN_MIB else 0


def card_room(
    free_mib: int | None,
    used_mib: int | None,
    seen: Iterable[tuple[str, int, int]],
    unseen_reserved_mib: int = 0,
) -> CardRoom:
    """A card's room from its reading (``free_mib``, ``used_mib``) and the leases on it: ``seen`` as (kernel id,
    reserved MiB, MiB its processes use on this card), and the reservations of leases whose use is not seen."""
    unused, seen_used = {}, 0
    for kernel_id, reserved, used in seen:
        unused[kernel_id] = max(0, reserved - used)
        seen_used += used
    unseen = 0
    if unseen_reserved_mib:
        rest = max(0, (used_mib or 0) - seen_used)  # taken to be theirs: the smallest guess of what they may take
        unseen = max(0, unseen_reserved_mib - rest)
    return CardRoom(free_mib, unused, unseen)


@dataclass(frozen=True)
class Excess:
    """What one kernel's processes use beyond its lease at one reading.

    ``over``: card uuid -> MiB beyond the lease (past its reservation on its own card, all of it elsewhere);
    ``stolen_mib``: how much of that other leases had reserved; ``processes``: (pid, card uuid, MiB) of each of
    its GPU processes; ``kernel_pid``: the kernel's own process, when known; ``shared``: whether other leases
    or processes share its card.
    """

    kernel_id: str
    card: str
    reserved_mib: int
    over: Mapping[str, int]
    stolen_mib: int = 0
    processes: tuple[tuple[int, str, int], ...] = ()
    kernel_pid: int | None = None
    shared: bool = True

    @property
    def over_mib(self) -> int:
        return sum(self.over.values())

    @property
    def used_mib(self) -> int:
        return sum(mib for _pid, _card, mib in self.processes)


def over_use(reserved_mib: int, card: str, used: Mapping[str, int]) -> dict[str, int]:
    """Per card, what a lease's processes use (``used``: card uuid -> MiB) beyond the lease: past its reservation
    on its card, all of it on any other; only cards with some."""
    over = {uuid: mib - (reserved_mib if uuid == card else 0) for uuid, mib in used.items()}
    return {uuid: mib for uuid, mib in over.items() if mib > 0}


def excess_holders(excess: Excess) -> tuple[int, ...] | None:
    """The fewest of the kernel's child processes whose end brings it back within its lease, largest first; None
    where that cannot be done without its own process (which then holds the excess)."""
    own = [(card, mib) for pid, card, mib in excess.processes if pid == excess.kernel_pid]
    if excess.kernel_pid is None or any(card != excess.card for card, _ in own):
        return None  # the kernel's own process is not known, or uses another card
    if sum(mib for _, mib in own) > excess.reserved_mib:
        return None
    children = [(pid, card, mib) for pid, card, mib in excess.processes if pid != excess.kernel_pid]
    chosen = [pid for pid, card, mib in children if card != excess.card]  # all use elsewhere is excess
    on_card = sorted(((mib, pid) for pid, card, mib in children if card == excess.card), reverse=True)
    left = sum(mib for _, mib in own) + sum(mib for mib, _ in on_card)
    for mib, pid in on_card:
        if left <= excess.reserved_mib:
            break
        chosen.append(pid)
        left -= mib
    return tuple(sorted(chosen)) if chosen else None


@dataclass(frozen=True)
class Verdict:
    """What to do about one kernel now. ``why``: "theft" (it took memory other kernels reserved), "grace" (over
    for the grace within the window) or "escalate" (an interrupt freed nothing); ``pids``: for "stop", the
    processes to end."""

    kernel_id: str
    action: str
    why: str
    over_s: float
    excess: Excess
    pids: tuple[int, ...] = ()


@dataclass
class _Track:
    readings: deque = field(default_factory=deque)  # (time, over) of the readings in the window
    credit: float = 0.0  # over-time in the window
    acted: str | None = None  # the last action of this episode
    acted_at: float | None = None
    over_then: int = 0  # the excess when it was last acted on
    told: bool = False  # 'notify' said once per episode


class OverUseJudge:
    """Judges the kernels over their leases, reading by reading (``judge``). ``action`` is the admin's
    over_quota_action ('protect': neighbours first); ``grace_s`` the over_quota_grace."""

    def __init__(self, action: str, grace_s: float) -> None:
        if action not in ACTIONS:
            raise ValueError(f"over_quota_action {action!r}: one of {', '.join(ACTIONS)}")
        self.action, self.grace_s = action, grace_s
        self.window_s = 2 * grace_s
        self._tracks: dict[str, _Track] = {}
        self._last: float | None = None

    def episodes(self) -> set[str]:
        """The kernels with over-time in the window (their episode is not over until the window is clear)."""
        return {kid for kid, track in self._tracks.items() if track.credit > 0 or track.acted}

    def forget(self, kernel_id: str) -> None:
        """A kernel that restarted (a new process) or went away starts afresh."""
        self._tracks.pop(kernel_id, None)

    def over_s(self, kernel_id: str) -> float:
        track = self._tracks.get(kernel_id)
        return track.credit if track else 0.0

    def judge(self, now: float, excesses: Sequence[Excess], present: Iterable[str] = ()) -> list[Verdict]:
        """One reading: ``excesses`` of the kernels over their leases now, ``present`` every other kernel judged
        (under its lease now). Kernels in neither are forgotten. Returns the actions due now."""
        gap = 0.0 if self._last is None else min(MAX_CREDIT_S, max(0.0, now - self._last))
        self._last = now
        over_now = {e.kernel_id: e for e in excesses}
        keep = set(over_now) | set(present)
        for kid in [k for k in self._tracks if k not in keep]:
            del self._tracks[kid]
        verdicts = []
        for kid in sorted(keep):
            excess = over_now.get(kid)
            track = self._tracks.get(kid)
            if track is None:
                if excess is None:
                    continue
                track = self._tracks[kid] = _Track()
            self._count(track, now, gap, excess is not None)
            if excess is None:
                if track.credit == 0 and track.acted in (None, "notify"):
                    del self._tracks[kid]  # a clear window: the episode is over
                continue
            verdict = self._verdict(track, now, excess)
            if verdict is not None:
                track.acted, track.acted_at, track.over_then = verdict.action, now, excess.over_mib
                track.told = track.told or verdict.action == "notify"
                verdicts.append(verdict)
        return verdicts

    def _count(self, track: _Track, now: float, gap: float, over: bool) -> None:
        """Add this reading to the window: the gap since the last reading is over-time if both ends were over."""
        was_over = bool(track.readings) and track.readings[-1][1]
        credit = gap if over and was_over else 0.0
        track.readings.append((now, over, credit))
        track.credit += credit
        while track.readings and track.readings[0][0] <= now - self.window_s and len(track.readings) > 1:
            _, _, old = track.readings.popleft()
            track.credit -= old
        track.credit = max(0.0, track.credit)

    def _verdict(self, track: _Track, now: float, excess: Excess) -> Verdict | None:
        since = None if track.acted_at is None else now - track.acted_at
        settled = since is None or since >= SETTLE_S
        if excess.stolen_mib and settled:
            action = self._on_theft(excess)
            said = action == "notify" and track.told
            again_soon = action == "interrupt" and track.acted == action and since is not None and since < REPEAT_MIN_S
            if not said and not again_soon:
                return self._make(excess, action, "theft", track)
        if self.action == "protect" and track.acted == "interrupt" and settled:
            if track.over_then - excess.over_mib < FREED_SHARE * track.over_then:
                return self._make(excess, self._end(excess), "escalate", track)
            track.acted, track.acted_at = None, None  # it freed some: a new grace from here
            track.readings.clear()
            track.credit = 0.0
            return None
        if track.credit < self.grace_s:
            return None
        action = self._on_grace(excess)
        if action == "notify":
            return None if track.told else self._make(excess, action, "grace", track)
        if since is not None and since < max(self.grace_s, REPEAT_MIN_S):
            return None
        return self._make(excess, action, "grace", track)

    def _on_theft(self, excess: Excess) -> str:
        if self.action == "protect":
            return self._end(excess)
        return self.action

    def _on_grace(self, excess: Excess) -> str:
        if self.action != "protect":
            return self.action
        if not excess.shared:
            return "notify"
        return "stop" if excess_holders(excess) else "interrupt"

    @staticmethod
    def _end(excess: Excess) -> str:
        return "stop" if excess_holders(excess) else "restart"

    def _make(self, excess: Excess, action: str, why: str, track: _Track) -> Verdict:
        pids = (excess_holders(excess) or ()) if action == "stop" else ()
        return Verdict(excess.kernel_id, action, why, round(track.credit, 1), excess, pids)
