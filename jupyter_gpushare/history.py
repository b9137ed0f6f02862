"""Quotas learned from history: the peak GPU memory each notebook reached, and the quota it teaches.

Pure rules, no I/O (the ledger stores the runs, ledger.py; the broker answers for other users, broker/ops.py).

A run is one kernel process of a notebook: its peak as the sampler measured it through NVML (the kernel's
process tree, CUDA context included), recorded when the kernel shuts down or restarts. Runs are keyed by
the user, the kernelspec name and the notebook's path relative to the Jupyter server's root ("" for a
kernel started without a notebook, e.g. ``POST /api/kernels``: such kernels are keyed by kernelspec alone).

What a user's next kernel of that notebook learns (``choose_peak``), first that applies:
1. their own runs: the highest of their last ``RUNS_KEPT`` runs;
2. the runs of the admin's ``teachers`` (an instructor, TAs): the highest of theirs;
3. with ``quorum`` users or more who ran it: the median of their peaks (each user's highest), over the
   ``QUORUM_WINDOW`` users who ran it last. One user's value alone never teaches another user, and a
   minority of users cannot move the median outside the range of the others' values.
Another user's runs are read only through these rules: one student cannot set another's quota by
running a notebook of the same name (docs/admin-guide.md, "Quotas learned from history").

The arithmetic (``learned_quota``): the reservation is the peak plus the margin, since the peak is what
NVML measured for the whole process, CUDA context included, and the reservation is what the kernel holds
on the card: ``quota = ceil(peak * (1 + margin)) - context_reserve``, clamped to ``[min_quota, max_quota]``
and to what the largest allowed card can hold.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .policy import CardView, Policy, Size, UserLimits

DAY_S = 86400.0
RUNS_KEPT = 5  # per user, kernelspec and notebook: the newest runs kept (and learned from)
QUORUM_WINDOW = 15  # the users who ran a notebook last, whose median teaches the others
ROWS_PER_USER = 2000  # runs kept per user: one user's writes never push out another user's runs
MAX_ROWS = 200_000  # runs kept in all
MAX_PATH = 1024  # characters of a notebook path; a longer one is not remembered
MAX_PEAK_MIB = 1 << 21  # 2 TiB: no card holds more (the broker also checks the lease's card)
# Notebooks a user may learn about from other users' runs in an hour (OthersBudget): a path is a key the student
# chooses, so each answer from others' runs says that someone ran a notebook there; a class opens a few a day
OTHERS_PER_HOUR = 30
# printable and bounded ("" = no notebook): no C0/C1 controls, line separators, bidi overrides (which would
# disguise a path in an admin's listing) or lone surrogates (not text: SQLite cannot store them)
PATH = re.compile(rf"[^\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]{{0,{MAX_PATH}}}")
SOURCES = ("default", "kernelspec", "requested", "learned")  # where a kernel's quota came from (the API's quota_source)


@dataclass(frozen=True)
class HistoryRules:
    """The admin's history settings (settings.GpuShareApp.build_history). The broker applies its own: a
    server's ``teachers`` or ``quorum`` never decide what another user learns."""

    max_age_s: float = 90 * DAY_S  # runs older than this are forgotten; 0 = no history at all
    teachers: frozenset[str] = frozenset()  # users whose runs teach every user
    quorum: int = 3  # users who ran a notebook before their median teaches others; 0 = never
    enabled: bool = False  # quota_from_history: a learned peak sets the quota (else it is only shown)
    margin: float = 0.2  # added to the learned peak: 0.2 = +20 %

    @property
    def kept(self) -> bool:
        return self.max_age_s > 0


@dataclass(frozen=True)
class Learned:
    """What earlier runs of a notebook teach one user: a peak in MiB, from whose runs, how many users'."""

    peak_mib: int
    source: str  # "own": the user's own runs; "others": the teachers' or the median of other users'
    users: int = 1

    def to_json(self) -> dict:
        return {"peak_mib": self.peak_mib, "source": self.source, "users": self.users}

    def for_caller(self) -> Learned:
        """What a user is told: of other users' runs, only the figure (not how many users ran the notebook)."""
        return self if self.source == "own" else Learned(self.peak_mib, self.source, 1)

    @classmethod
    def from_json(cls, d: dict | None) -> Learned | None:
        if not isinstance(d, dict) or not isinstance(d.get("peak_mib"), int) or isinstance(d["peak_mib"], bool):
            return None
        source = d.get("source") if d.get("source") in ("own", "others") else "others"
        return cls(d["peak_mib"], source, int(d.get("users") or 1))


class OthersBudget:
    """How many notebooks each user learned about from other users' runs in the last hour (the broker's).

    Another user's runs answer for a path the student chooses, so every answer from them says that someone ran a
    notebook there, and about how large it got ("exam/final-solutions.ipynb"). That cannot be closed while a
    teacher's run is to teach the class before any student ran the notebook; it is bounded instead: at most
    ``per_hour`` distinct notebooks a user, each counted once (asking again about one is free), and beyond that
    a user learns from their own runs only, until the hour has passed. The answer names no other user and not
    how many ran it (``Learned.for_caller``)."""

    def __init__(self, per_hour: int = OTHERS_PER_HOUR, window_s: float = 3600.0) -> None:
        self.per_hour, self.window_s = per_hour, window_s
        self._asked: dict[str, dict[tuple[str, str], float]] = {}

    def allow(self, user: str, key: tuple[str, str], now: float) -> bool:
        """Whether ``user`` may learn about notebook ``key`` (kernelspec, path) from others' runs now; counts it."""
        asked = {k: t for k, t in self._asked.get(user, {}).items() if now - t < self.window_s}
        if key not in asked and len(asked) >= self.per_hour:
            self._asked[user] = asked
            return False
        asked.setdefault(key, now)
        self._asked[user] = asked
        return True


def history_key(path: str | None) -> str | None:
    """The notebook part of a run's key: its path relative to the server's root, "" without a notebook;
    None (not remembered) for a path too long or with control characters."""
    path = (path or "").strip()
    return path if PATH.fullmatch(path) else None


def choose_peak(runs: Iterable[tuple[str, int, float]], user: str, rules: HistoryRules) -> Learned | None:
    """What ``user`` learns from the runs of one notebook, ``(user, peak MiB, recorded)`` each, already within
    the age limit (the rules in the module's docstring); None when nothing applies."""
    by_user: dict[str, list[tuple[float, int]]] = {}
    for who, peak, recorded in runs:
        by_user.setdefault(who, []).append((recorded, peak))
    for points in by_user.values():
        points.sort(reverse=True)  # newest first
    own = by_user.pop(user, None)
    if own:
        return Learned(max(p for _, p in own[:RUNS_KEPT]), "own", 1)
    peaks = {who: max(p for _, p in points[:RUNS_KEPT]) for who, points in by_user.items()}
    taught = [peak for who, peak in peaks.items() if who in rules.teachers]
    if taught:
        return Learned(max(taught), "others", len(taught))
    if rules.quorum <= 0:
        return None
    latest = sorted(by_user, key=lambda who: by_user[who][0][0], reverse=True)[: max(QUORUM_WINDOW, rules.quorum)]
    if len(latest) < rules.quorum:
        return None
    return Learned(int(statistics.median_high(peaks[who] for who in latest)), "others", len(latest))


def lookup(ledger: Any, user: str, kernel_name: str, path: str, rules: HistoryRules) -> tuple[Learned | None, Any]:
    """On the ledger thread: what earlier runs of a notebook teach ``user`` (``ledger.Reservations.learned_peak``),
    and, when the quota is to follow it, the user's per-user limits that bound it (through a broker; else None)."""
    got = ledger.learned_peak(user, kernel_name, path, rules) if ledger is not None else None
    return got, ledger.caller()[2] if got is not None and rules.enabled else None


def learned_quota(
    policy: Policy, peak_mib: int, margin: float, cards: Sequence[CardView], limits: UserLimits | None = None
) -> Size:
    """The quota that gives a kernel a reservation of its learned peak plus ``margin``, within the admin's
    bounds: ``ceil(peak * (1 + margin)) - context_reserve``, at least ``min_quota``, at most ``max_quota``, what
    the largest allowed card can hold (percentages are of that card) and the user's ``limits`` on one kernel
    and in all (a notebook's history never makes its kernel one that the user's limits refuse alone)."""
    totals = [c.total_mib for c in cards if policy.card_allowed(c.uuid, c.index)]
    total = max(totals, default=0)
    highest = policy.largest_quota_mib(total)
    for limit in (limits.max_kernel, limits.max_total) if limits is not None else ():
        if limit is not None:
            highest = min(highest, limit.resolve(total))
    mib = math.ceil(peak_mib * (1 + margin)) - policy.context_reserve_mib
    return Size(mib=max(policy.min_quota.resolve(total), min(mib, highest)))
