"""When a kernel in line will likely be granted: from how long kernels held their reservations before.

Owns the ``holds`` table (each reservation given back, by its kernel's end, a park or a restart: its user, its
kernel's name and how long it was held) and the estimate read from it. It decides nothing: the line's order and
its grants are queue.py's and ledger.py's.

- **A reservation held now ends**, by its past, after the median of the past holds of its user's kernels of the
  same name that lasted longer than it has lasted so far (a kernel that has held for an hour is not about to end
  because most holds last ten minutes); with fewer than ``MIN_HOLDS`` such holds, after those of every user's
  kernels of that name, then of every kernel here. One that has held longer than any past hold, or one whose
  kind has too little history, has no expected end: the estimate does not count it.
- **The line is served** at each expected end in time order, as the ledger serves it: in order, each kernel
  placed on the first allowed card where it fits (one that fits passes one that does not). The first moment the
  kernel fits is its estimate; None when the known ends never make room for it. Kernels that join later, parks
  and the aged kernels' kept room are not foreseen: it is an estimate, said as one.
"""

from __future__ import annotations

import sqlite3
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence

from ..core.policy import CardView, Policy
from .leases import Lease
from .queue import Entry

HOLDS_KEPT = 5000  # the most recent holds kept (about a term of a class's sessions)
MIN_HOLDS = 3  # a kind of kernel's past holds count only with at least this many longer than the current one


def record_holds(db: sqlite3.Connection, ended: Iterable[Lease], now: float) -> None:
    """Remember how long each of these reservations was held, ending now."""
    db.executemany(
        "INSERT INTO holds (user, kernel_name, held_s, ended) VALUES (?,?,?,?)",
        [(lease.user, lease.kernel_name, max(0.0, now - lease.created), now) for lease in ended],
    )
    db.execute("DELETE FROM holds WHERE rowid <= (SELECT max(rowid) FROM holds) - ?", (HOLDS_KEPT,))


class PastHolds:
    """The holds table, read into sorted durations by (user, kernel name), by kernel name, and all together; read
    again only when the table changed (a hold added or pruned), so that a reserve of a kernel in line, asked
    twice a second, costs one small query while nothing ends."""

    def __init__(self) -> None:
        self._read: tuple | None = None
        self.by_user: dict[tuple[str, str], list[float]] = {}
        self.by_name: dict[str, list[float]] = {}
        self.every: list[float] = []

    @classmethod
    def of(cls, holds: Mapping[tuple[str, str], Sequence[float]]) -> PastHolds:
        """From durations by (user, kernel name) (tests, and ``read``)."""
        past = cls()
        for (user, name), durations in holds.items():
            past.by_user.setdefault((user, name), []).extend(durations)
            past.by_name.setdefault(name, []).extend(durations)
            past.every.extend(durations)
        for durations in (*past.by_user.values(), *past.by_name.values(), past.every):
            durations.sort()
        return past

    def read(self, db: sqlite3.Connection) -> PastHolds:
        key = tuple(db.execute("SELECT min(rowid), max(rowid) FROM holds").fetchone())
        if key != self._read:
            rows = db.execute("SELECT user, kernel_name, held_s FROM holds").fetchall()
            holds: dict[tuple[str, str], list[float]] = {}
            for user, name, held_s in rows:
                holds.setdefault((user, name), []).append(held_s)
            fresh = PastHolds.of(holds)
            self.by_user, self.by_name, self.every, self._read = fresh.by_user, fresh.by_name, fresh.every, key
        return self

    def expected_end(self, lease: Lease, now: float) -> float | None:
        """When ``lease`` likely ends (module docstring)."""
        held = now - lease.created
        for durations in (self.by_user.get((lease.user, lease.kernel_name), []), self.by_name.get(lease.kernel_name, []), self.every):  # fmt: skip
            first = bisect_right(durations, held)
            longer = len(durations) - first
            if longer >= MIN_HOLDS:
                return lease.created + (durations[first + (longer - 1) // 2] + durations[first + longer // 2]) / 2
        return None


def serve_until_placed(
    room: Mapping[str, int],
    line: Sequence[Mapping[str, int]],
    ends: Sequence[tuple[float, str, int]],
    now: float,
) -> float | None:
    """The moment the last of ``line`` (each a need in MiB by allowed card, in the line's order) is placed, as
    ``ends`` (when, card, MiB given back) give room back to ``room`` (MiB free by card now); None if never."""
    free = dict(room)
    waiting = list(range(len(line)))  # who is still in line, by place
    for at, card, mib in [(now, "", 0), *sorted(ends)]:
        if card:
            free[card] = free.get(card, 0) + mib
        for place in list(waiting):
            need = line[place]
            fits = next((c for c in sorted(need) if need[c] <= free.get(c, 0)), None)
            if fits is None:
                continue
            free[fits] -= need[fits]
            waiting.remove(place)
            if place == len(line) - 1:
                return max(at, now)
    return None


def likely_at(
    db: sqlite3.Connection,
    past: PastHolds,
    leases: Sequence[Lease],
    mine: Entry,
    ahead: Sequence[Entry],
    views: Sequence[CardView],
    policy: Policy,
    now: float,
) -> float | None:
    """When ``mine``, with ``ahead`` before it in line, is likely granted (module docstring); None: not known.
    ``past``: the process's PastHolds, read again here if the table changed."""
    if not past.read(db).every:
        return None
    by_uuid = {v.uuid: v for v in views if policy.card_allowed(v.uuid, v.index)}

    def needs(entry: Entry) -> dict[str, int]:
        out = {}
        for uuid, view in by_uuid.items():
            need = policy.need_mib(entry.quota, view.total_mib)
            if (not entry.cards or uuid in entry.cards) and need <= policy.usable_mib(view.total_mib):
                out[uuid] = need
        return out

    ends = []
    for lease in leases:
        end = past.expected_end(lease, now) if lease.card_uuid in by_uuid else None
        if end is not None:
            ends.append((end, lease.card_uuid, lease.reserved_mib))
    room = {uuid: max(0, view.room_mib(policy)) for uuid, view in by_uuid.items()}
    return serve_until_placed(room, [needs(e) for e in (*ahead, mine)], ends, now)
