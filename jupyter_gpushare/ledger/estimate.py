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
from collections.abc import Iterable, Mapping, Sequence
from statistics import median

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


def expected_end(lease: Lease, past: Mapping[tuple[str, str], list[float]], now: float) -> float | None:
    """When ``lease`` likely ends, by the past holds (``past``: by (user, kernel name); module docstring)."""
    held = now - lease.created
    name = lease.kernel_name
    mine = past.get((lease.user, name), [])
    same_name = [h for (user, kernel), holds in past.items() if kernel == name for h in holds]
    everyone = [h for holds in past.values() for h in holds]
    for holds in (mine, same_name, everyone):
        longer = [h for h in holds if h > held]
        if len(longer) >= MIN_HOLDS:
            return lease.created + median(longer)
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
    leases: Sequence[Lease],
    mine: Entry,
    ahead: Sequence[Entry],
    views: Sequence[CardView],
    policy: Policy,
    now: float,
) -> float | None:
    """When ``mine``, with ``ahead`` before it in line, is likely granted (module docstring); None: not known."""
    rows = db.execute("SELECT user, kernel_name, held_s FROM holds ORDER BY rowid DESC LIMIT ?", (HOLDS_KEPT,))
    past: dict[tuple[str, str], list[float]] = {}
    for user, kernel_name, held_s in rows:
        past.setdefault((user, kernel_name), []).append(held_s)
    if not past:
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
        end = expected_end(lease, past, now) if lease.card_uuid in by_uuid else None
        if end is not None:
            ends.append((end, lease.card_uuid, lease.reserved_mib))
    room = {uuid: max(0, view.room_mib(policy)) for uuid, view in by_uuid.items()}
    return serve_until_placed(room, [needs(e) for e in (*ahead, mine)], ends, now)
