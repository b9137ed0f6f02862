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

The quota a run teaches (``Run.need_mib``, computed when it is recorded, ``need_of``): what the kernel's own
frameworks needed, not what NVML saw. An allocator grabs more than it uses (TensorFlow's and JAX's BFC grow in
regions of doubling size, PyTorch caches freed blocks), so NVML's peak under a generous quota says what was
grabbed, and under a tight limit the same job can fail below it (a tensor cannot span two regions). So the
bootstrap reports each framework's own peak in use (``_gpushare_alloc``), and a run teaches
``sum(ceil(peak_in_use * (1 + ALLOCATOR_MARGIN[framework])))``, the margins measured on a real card
(docs/frameworks.md, *Learned quotas*); a run whose frameworks reported nothing teaches NVML's figure:
``ceil(peak * (1 + margin)) - context_reserve`` (the peak includes the CUDA context, the quota does not).

Learning from failure: a run that ran out of memory (its report says so) teaches at least ``FAIL_STEP`` times
the quota it had, and a user's learned quota never drops below what a failed run taught while that run is
kept (``max_age_s``), however many runs came after it. The learned quota is clamped to ``[min_quota,
max_quota]``, to what the largest allowed card can hold and to the user's limits (``learned_quota``).
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
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
# What a framework's allocator needs beyond its peak in use under a limit (fragmentation, the largest region it
# must add at once): measured on an H100 by bench/gpu/check_learned.py (docs/frameworks.md, *Learned quotas*)
ALLOCATOR_MARGIN = {"tensorflow": 0.25, "torch": 0.10, "jax": 0.25, "cupy": 0.10}
FAIL_STEP = 1.5  # a run that ran out of memory teaches at least this times the quota it had
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
class Run:
    """One recorded run of a notebook: NVML's peak (CUDA context included), the quota it teaches (None: a run
    recorded by an older release, which teaches from the peak) and whether it ran out of memory."""

    peak_mib: int
    need_mib: int | None = None
    failed: bool = False


def need_of(
    peak_mib: int, allocators: dict[str, int], quota_mib: int | None, failed: bool, margin: float, context_mib: int
) -> int:
    """The quota one run teaches (module docstring): from its frameworks' own peaks in use (``allocators``,
    MiB by framework) when they reported any, else from NVML's ``peak_mib``; after an out-of-memory error, at
    least ``FAIL_STEP`` times the ``quota_mib`` it had."""
    if allocators:
        need = sum(math.ceil(mib * (1 + ALLOCATOR_MARGIN.get(name, margin))) for name, mib in allocators.items())
    else:
        need = math.ceil(peak_mib * (1 + margin)) - context_mib
    if failed and quota_mib:
        need = max(need, retry_quota_mib(quota_mib))
    return max(1, need)


def retry_quota_mib(quota_mib: int) -> int:
    """What a kernel that ran out of memory at ``quota_mib`` is offered to restart with (and its notebook
    learns): ``FAIL_STEP`` times as much, rounded up to 256 MiB."""
    return -(-math.ceil(quota_mib * FAIL_STEP) // 256) * 256


@dataclass(frozen=True)
class Learned:
    """What earlier runs of a notebook teach one user: NVML's peak and the quota (``need_mib``: None when only
    runs of an older release are kept) in MiB, from whose runs, how many users'; ``failed``: a kept run ran
    out of memory (its figure is a floor)."""

    peak_mib: int
    source: str  # "own": the user's own runs; "others": the teachers' or the median of other users'
    users: int = 1
    need_mib: int | None = None
    failed: bool = False

    def to_json(self) -> dict:
        out = {"peak_mib": self.peak_mib, "source": self.source, "users": self.users}
        return {**out, "need_mib": self.need_mib, "failed": self.failed} if self.need_mib is not None else out

    def for_caller(self) -> Learned:
        """What a user is told: of other users' runs, only the figures (not how many users ran the notebook)."""
        return self if self.source == "own" else replace(self, users=1, failed=False)

    @classmethod
    def from_json(cls, d: dict | None) -> Learned | None:
        if not isinstance(d, dict) or not _mib(d.get("peak_mib")):
            return None
        source = "own" if d.get("source") == "own" else "others"
        need = d.get("need_mib") if _mib(d.get("need_mib")) else None
        return cls(d["peak_mib"], source, int(d.get("users") or 1), need, d.get("failed") is True)


def _mib(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_PEAK_MIB


class OthersBudget:
    """How many notebooks each user learned about from other users' runs in the last hour (the broker's).

    Another user's runs answer for a path the student chooses, so every answer from them says that someone ran a
    notebook there, and about how large it got ("exam/final-solutions.ipynb"). That cannot be closed while a
    teacher's run is to teach the class before any student ran the notebook; it is bounded instead: at most
    ``per_hour`` distinct notebooks not the user's own a user may ask about, answered or not (a miss says that no
    one ran a notebook there), each counted once (asking again about one is free), and beyond that a user learns
    from their own runs only, until the hour has passed. The answer names no other user and not
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


def choose_peak(runs: Iterable[tuple[str, Run, float]], user: str, rules: HistoryRules) -> Learned | None:
    """What ``user`` learns from the runs of one notebook, ``(user, Run, recorded)`` each, already within the age
    limit (the rules in the module's docstring); None when nothing applies."""
    by_user: dict[str, list[tuple[float, Run]]] = {}
    for who, run, recorded in runs:
        by_user.setdefault(who, []).append((recorded, run))
    for points in by_user.values():
        points.sort(key=lambda point: point[0], reverse=True)  # newest first
    taught = {who: _highest(points) for who, points in by_user.items()}
    own = taught.pop(user, None)
    if own is not None:
        return replace(own, source="own")
    teachers = [got for who, got in taught.items() if who in rules.teachers]
    if teachers:
        return replace(max(teachers, key=_figure), users=len(teachers))
    if rules.quorum <= 0:
        return None
    latest = sorted(taught, key=lambda who: by_user[who][0][0], reverse=True)[: max(QUORUM_WINDOW, rules.quorum)]
    if len(latest) < rules.quorum:
        return None
    middle = statistics.median_high(_figure(taught[who]) for who in latest)
    return replace(next(taught[who] for who in latest if _figure(taught[who]) == middle), users=len(latest))


def _figure(got: Learned) -> int:
    """What orders what users learned: the quota, or NVML's peak for runs of an older release."""
    return got.need_mib if got.need_mib is not None else got.peak_mib


def _highest(points: Sequence[tuple[float, Run]]) -> Learned:
    """What one user's runs of a notebook (newest first) teach: the highest of the last RUNS_KEPT, and never
    less than a kept run that ran out of memory."""
    recent = [run for _, run in points[:RUNS_KEPT]]
    failed = [run for _, run in points if run.failed and run.need_mib is not None]
    needs = [run.need_mib for run in [*recent, *failed] if run.need_mib is not None]
    return Learned(max(run.peak_mib for run in recent), "others", 1, max(needs) if needs else None, bool(failed))


def notebooks(rows: Iterable[tuple[str, str, str, Run, float]]) -> list[dict[str, Any]]:
    """What each user's runs of each notebook teach that user, for admins (``jupyter gpushare status``): rows
    ``(user, kernel_name, path, Run, recorded)``, newest last or in any order."""
    grouped: dict[tuple[str, str, str], list[tuple[float, Run]]] = {}
    for user, kernel_name, path, run, recorded in rows:
        grouped.setdefault((user, kernel_name, path), []).append((recorded, run))
    out = []
    for (user, kernel_name, path), points in sorted(grouped.items()):
        points.sort(key=lambda point: point[0], reverse=True)
        got = _highest(points)
        out.append(
            {
                "user": user, "kernel_name": kernel_name, "path": path, "runs": len(points),
                "peak_mib": got.peak_mib, "quota_mib": got.need_mib, "failed": got.failed, "last": points[0][0],
            }
        )  # fmt: skip
    return out


NOTEBOOKS_SHOWN = 500  # notebooks in a view's answer: the most recently run (a host keeps up to 200,000 runs)


def newest(found: list[dict[str, Any]], limit: int = NOTEBOOKS_SHOWN) -> list[dict[str, Any]]:
    """The ``limit`` most recently run of ``notebooks()``'s list, in its order: an answer stays bounded however
    many runs the host keeps."""
    if len(found) <= limit:
        return found
    kept = {id(n) for n in sorted(found, key=lambda n: n["last"], reverse=True)[:limit]}
    return [n for n in found if id(n) in kept]


def lookup(
    ledger: Any, user: str, kernel_name: str, path: str, rules: HistoryRules, kernel_id: str = ""
) -> tuple[Learned | None, Any, int]:
    """On the ledger thread: what earlier runs of a notebook teach ``user`` (``ledger.Reservations.learned_peak``)
    and, when the quota is to follow it, the user's per-user limits that bound it (through a broker; else None)
    with the quotas the user's other kernels hold now (which ``max_total`` counts)."""
    got = ledger.learned_peak(user, kernel_name, path, rules) if ledger is not None else None
    limits = ledger.caller()[2] if got is not None and rules.enabled else None
    held = sum(x.quota_mib for x in ledger.leases() if x.user == user and x.kernel_id != kernel_id) if limits else 0
    return got, limits, held


def learned_quota(
    policy: Policy,
    learned: Learned,
    margin: float,
    cards: Sequence[CardView],
    limits: UserLimits | None = None,
    held_mib: int = 0,
) -> Size:
    """The quota ``learned`` teaches (its ``need_mib``; for runs of an older release, ``ceil(peak * (1 + margin))
    - context_reserve``), within the admin's bounds: at least ``min_quota``, at most ``max_quota``, what the
    largest allowed card can hold (percentages are of that card) and the user's ``limits`` on one kernel and in
    all, less ``held_mib`` that the user's other kernels hold (a notebook's history never makes its kernel one
    that the user's limits refuse)."""
    totals = [c.total_mib for c in cards if policy.card_allowed(c.uuid, c.index)]
    total = max(totals, default=0)
    highest = policy.largest_quota_mib(total)
    if limits is not None and limits.max_kernel is not None:
        highest = min(highest, limits.max_kernel.resolve(total))
    if limits is not None and limits.max_total is not None:
        highest = min(highest, limits.max_total.resolve(total) - held_mib)
    mib = learned.need_mib
    if mib is None:
        mib = math.ceil(learned.peak_mib * (1 + margin)) - policy.context_reserve_mib
    return Size(mib=max(policy.min_quota.resolve(total), min(mib, highest)))
