"""Background sampling of GPU use into a cached, immutable snapshot.

One thread per server reads every card (memory, utilisation, processes) through the GPU backend,
maps GPU processes to this server's kernels through each kernel's process tree, and swaps in a new
``UsageSnapshot``. Request handlers, the metrics collector and the enforcer only read it: nothing
of NVML or psutil runs on the Tornado IOLoop.

Attribution walks up from each GPU process (there are few) to a kernel's root process, instead of
down from every kernel (a full /proc scan per kernel). Processes are known by (pid, create_time),
so a reused pid is never taken for the process that had it before. A GPU process whose ancestry
reaches no kernel of this server (another user's job, another server's kernel, a child that was
re-parented to init, a process that has exited) counts as "other" in the card totals.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable

import psutil

from .gpu import DeviceSample, GpuUnavailable
from .ledger import Lease, SessionRef
from .settings import MIN_INTERVAL_S

MAX_DEPTH = 64  # ancestors walked from a GPU process before giving up
QUOTA_REFRESH_S = 5.0  # the manager's snapshot (ledger, framework reports) is re-read at least this often
REVALIDATE_S = 10.0  # a pid listed in consecutive readings is re-read from /proc at least this often
EMPTY: Mapping = MappingProxyType({})


@dataclass(frozen=True)
class ProcessUse:
    """One GPU process of a kernel's tree."""

    pid: int
    card_index: int
    used_mib: int | None
    utilization: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "card_index": self.card_index,
            "used_mib": self.used_mib,
            "utilization": self.utilization,
        }


@dataclass(frozen=True)
class KernelUsage:
    """Measured GPU use of one kernel's process tree. None = not measured (no GPU, card lost)."""

    kernel_id: str
    pid: int | None
    used_mib: int | None
    peak_mib: int | None
    utilization: float | None
    processes: tuple[ProcessUse, ...] = ()


@dataclass(frozen=True)
class CardUsage:
    """Measured use of one card, split between this server's kernels and every other process."""

    uuid: str
    index: int
    total_mib: int | None
    used_mib: int | None
    used_by_kernels_mib: int | None
    used_by_others_mib: int | None
    free_mib: int | None
    utilization: float | None
    mig: bool = False
    lost: bool = False
    errors: Mapping[str, str] = field(default_factory=lambda: EMPTY)

    def figures(self) -> dict[str, Any]:
        """The fields the API adds to a card."""
        return {
            "used_mib": self.used_mib,
            "used_by_kernels_mib": self.used_by_kernels_mib,
            "used_by_others_mib": self.used_by_others_mib,
            "free_mib": self.free_mib,
            "utilization": self.utilization,
            "mig": self.mig,
            "lost": self.lost,
            "errors": dict(self.errors),
        }


@dataclass(frozen=True)
class UsageSnapshot:
    """One sampler tick: everything handlers, metrics and the enforcer read. Never mutated."""

    time: float = 0.0
    tick_ms: float = 0.0
    interval_s: float = 1.0
    error: str | None = "not sampled yet"
    cards: Mapping[str, CardUsage] = field(default_factory=lambda: EMPTY)  # by card uuid
    kernels: Mapping[str, KernelUsage] = field(default_factory=lambda: EMPTY)  # by kernel id
    quota: Mapping[str, Any] = field(
        default_factory=lambda: EMPTY
    )  # QuotaManager.snapshot() of the same tick (reservations, frameworks)
    frameworks: Mapping[str, Any] = field(default_factory=lambda: EMPTY)  # kernel id -> frameworks, from ``quota``
    seq: int = 0
    samples: tuple[DeviceSample, ...] = ()  # the driver's reading itself (per-process figures), for admission

    def status(self) -> dict[str, Any]:
        return {
            "time": self.time or None,
            "tick_ms": round(self.tick_ms, 3),
            "interval_s": self.interval_s,
            "error": self.error,
            "seq": self.seq,
        }


def _proc_stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of a process, or None when it does not exist (one read on Linux).

    The start time is in clock ticks since boot on Linux (from /proc/<pid>/stat), elsewhere
    psutil's create_time: either way, with the pid it names one process for its whole life.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError:
        return _psutil_stat(pid)
    fields = data[data.rindex(b")") + 2 :].split()  # the name may hold spaces and parentheses
    try:
        return int(fields[1]), int(fields[19])  # ppid (field 4), starttime (field 22)
    except (IndexError, ValueError):
        return _psutil_stat(pid)


def _psutil_stat(pid: int) -> tuple[int, int] | None:
    try:
        p = psutil.Process(pid)
        return p.ppid(), int(p.create_time() * 1000)
    except (psutil.Error, ValueError):
        return None


if not os.path.isdir("/proc/self"):  # not Linux: psutil for both
    _proc_stat = _psutil_stat  # noqa: F811


def pid_namespace_depth(pid: int | str) -> int:
    """How many PID namespaces a process is in, as /proc sees it (its NSpid line, readable by any user);
    0 when that cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return len(line.split()) - 1
    except OSError:  # gone
        pass
    return 0


def _exists(pid: int) -> bool:
    """The pid names a process (a signal-0 probe: one system call, no /proc read)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: another user's process, alive
        pass
    return True


def _under(pid: int, roots: set[int]) -> bool:
    """Whether a process is one of ``roots`` or descends from one (its parents read from /proc; a process
    that is gone or hidden from us is under none)."""
    for _ in range(MAX_DEPTH):
        if pid in roots:
            return True
        stat = _proc_stat(pid)
        if stat is None or stat[0] <= 1:
            return False
        pid = stat[0]
    return False


def unreserved_use(samples: Sequence[DeviceSample], leases: Sequence[Lease]) -> dict[str, int]:
    """Per card (uuid), the GPU memory of processes that hold no reservation: a script run in a terminal,
    a program started outside Jupyter, a kernel started without a quota. That is every process the driver
    lists in no lease's kernel tree, with two exceptions. Processes in a PID namespace below ours
    (containers, whose kernels' pids the ledger does not know) are taken to be the kernels of the card's
    leases held by sessions (servers known by a Hub token) up to what those reserve, and only the rest
    counts. In a container ourselves, where the driver's pids are the host's, nothing can be told, so
    the answer is {} (as it is with no reading). A figure the driver does not give counts as 0.
    """
    own_depth = pid_namespace_depth("self")
    if own_depth > 1:
        return {}
    if not any(s.processes for s in samples):
        return {s.card.uuid: 0 for s in samples}
    roots = {lease.kernel.pid for lease in leases if lease.kernel is not None and lease.kernel.alive()}
    by_session: dict[str, int] = {}
    for lease in leases:
        if isinstance(lease.owner, SessionRef):  # a server in a container, known by its Hub token
            by_session[lease.card_uuid] = by_session.get(lease.card_uuid, 0) + lease.reserved_mib
    out: dict[str, int] = {}
    for sample in samples:
        outside = in_containers = 0
        for p in sample.processes:
            if _under(p.pid, roots):
                continue
            if pid_namespace_depth(p.pid) > own_depth:
                in_containers += p.used_mib or 0
            else:
                outside += p.used_mib or 0
        out[sample.card.uuid] = outside + max(0, in_containers - by_session.get(sample.card.uuid, 0))
    return out


class ProcessTrees:
    """Maps pids to the kernel whose process tree holds them, caching by (pid, start time)."""

    def __init__(self) -> None:
        self._roots: dict[int, tuple[int, str]] = {}  # root pid -> (start time, kernel id)
        self._owner: dict[tuple[int, int], tuple[int, int] | None] = {}  # process -> its kernel root
        self._roots_version = 0
        self._negative_version: dict[tuple[int, int], int] = {}
        self._recent: dict[int, tuple[tuple[int, int], tuple[int, int], float]] = {}  # pid -> (key, stat, read at)

    def set_roots(self, roots: dict[str, int | None]) -> None:
        """The kernels' root pids (kernel id -> pid); a root's start time is read once."""
        current = {pid: kid for kid, pid in roots.items() if pid}
        changed = False
        for pid in list(self._roots):
            if current.get(pid) != self._roots[pid][1]:
                del self._roots[pid]
                changed = True
        for pid, kid in current.items():
            if pid not in self._roots:
                stat = _proc_stat(pid)
                if stat is None:
                    continue
                self._roots[pid] = (stat[1], kid)
                changed = True
        if changed:
            self._roots_version += 1

    def owners(self, pids: set[int]) -> dict[int, str]:
        """Kernel id for every pid that belongs to a kernel of this server; others are left out.

        A pid listed by the driver in the previous reading too, still alive, and read from /proc
        less than REVALIDATE_S ago, is taken to be the same process without reading /proc again: for another
        process to hold that pid, this one must have exited (and the driver drops exited processes
        at once), the pid be handed out again and the new process reach the GPU, all within one
        interval. Every other pid is read (one small /proc read each).
        """
        now = time.monotonic()
        found: dict[int, str] = {}
        seen: dict[int, tuple[tuple[int, int], tuple[int, int], float]] = {}
        for pid in pids:
            recent = self._recent.get(pid)
            if recent is not None and now - recent[2] < REVALIDATE_S and _exists(pid):
                key, stat, checked = recent
            else:
                stat = _proc_stat(pid)
                if stat is None:
                    continue  # exited (or another namespace's pid): "other"
                key, checked = (pid, stat[1]), now
            seen[pid] = (key, stat, checked)
            root = self._lookup(pid, stat, key)
            if root is not None:
                entry = self._roots.get(root[0])
                if entry is not None and entry[0] == root[1]:
                    found[pid] = entry[1]
        self._recent = seen
        if len(self._owner) > len(seen):  # forget processes no longer on a GPU
            keys = {v[0] for v in seen.values()}
            for key in [k for k in self._owner if k not in keys]:
                self._owner.pop(key, None)
                self._negative_version.pop(key, None)
        return found

    def _lookup(self, pid: int, stat: tuple[int, int], key: tuple[int, int]) -> tuple[int, int] | None:
        if key in self._owner:
            root = self._owner[key]
            if root is not None or self._negative_version.get(key) == self._roots_version:
                return root
        root = None
        cur_pid, (ppid, start) = pid, stat
        for _ in range(MAX_DEPTH):
            entry = self._roots.get(cur_pid)
            if entry is not None and entry[0] == start:
                root = (cur_pid, start)
                break
            if ppid <= 1:
                break
            parent = _proc_stat(ppid)
            if parent is None or parent[1] > start:  # gone, or younger than its child: the pid was reused
                break
            cur_pid, (ppid, start) = ppid, parent
        self._owner[key] = root
        if root is None:
            self._negative_version[key] = self._roots_version
        return root


class Sampler:
    """One background thread per server that keeps ``snapshot`` fresh.

    ``tick()`` can also be called directly (tests, benchmarks). ``on_sample`` is called on the
    IOLoop with each new snapshot (the enforcer); the manager's own snapshot (ledger reservations,
    framework reports) is refreshed on the IOLoop's side too when the set of kernels changes and at
    least every QUOTA_REFRESH_S, and cached with the usage figures (reading 200 kernels' framework
    reports takes ~15 ms of the ledger thread, too much for every tick).
    """

    def __init__(
        self,
        manager: Any,
        interval_s: float = 1.0,
        loop: asyncio.AbstractEventLoop | None = None,
        on_sample: Callable[[UsageSnapshot], None] | None = None,
        log: logging.Logger | None = None,
    ) -> None:
        self.manager = manager
        self.interval_s = max(MIN_INTERVAL_S, float(interval_s))
        self.loop = loop
        self.on_sample = on_sample
        self.log = log or logging.getLogger("jupyter_gpushare")
        self.snapshot = UsageSnapshot(interval_s=self.interval_s)
        self._trees = ProcessTrees()
        self._peaks: dict[str, tuple[int | None, int]] = {}  # kernel id -> (pid, peak MiB)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pending: Any = None
        self._last_error: str | None = None
        self._seq = 0
        self._quota_ids: frozenset[str] = frozenset()
        self._quota_at = 0.0

    def latest_samples(self) -> tuple[DeviceSample, ...]:
        """The driver's last reading, if no older than a few intervals (else none: nothing is known)."""
        snap = self.snapshot
        return snap.samples if time.time() - snap.time <= max(5.0, 5 * self.interval_s) else ()

    # -- thread ------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gpushare-sampler", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the thread (safe to call from the IOLoop: it never waits on the loop)."""
        self._stop.set()
        pending = self._pending
        if pending is not None:
            pending.cancel()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.tick()
            except Exception:  # keep sampling; say what broke once per kind of failure
                self.log.exception("jupyter-gpushare: sampler tick failed")
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    # -- one tick ------------------------------------------------------------------------------

    def _kernel_usage(
        self,
        targets: Sequence[tuple[str, int | None, str | None]],
        per_kernel: Mapping[str, list[ProcessUse]],
        measured: bool,
    ) -> dict[str, KernelUsage]:
        """Each kernel's use from its processes' (0 when the driver's list was read and none is there), and its peak."""
        kernels: dict[str, KernelUsage] = {}
        for kid, pid, _card in targets:
            procs = tuple(per_kernel.get(kid, ()))
            known = [p.used_mib for p in procs if p.used_mib is not None]
            if procs:
                used = sum(known) if known else None
            else:
                used = 0 if measured and pid else None
            utils = [p.utilization for p in procs if p.utilization is not None]
            util = min(100.0, sum(utils)) if utils else (0.0 if used is not None and not procs else None)
            prev_pid, prev_peak = self._peaks.get(kid, (pid, 0))
            peak = prev_peak if prev_pid == pid else 0  # a restarted kernel starts a new peak
            if used is not None:
                peak = max(peak, used)
            self._peaks[kid] = (pid, peak)
            kernels[kid] = KernelUsage(kid, pid, used, peak if used is not None or peak else None, util, procs)
        for kid in [k for k in self._peaks if k not in kernels]:
            del self._peaks[kid]
        return kernels

    def tick(self) -> UsageSnapshot:
        """Sample once and publish the snapshot (also returned)."""
        t0 = time.perf_counter()
        targets = self.manager.usage_targets()  # [(kernel id, pid, card uuid)]
        error = None
        try:
            samples: list[DeviceSample] = self.manager.backend.sample()
            if not samples and not self.manager.cards:
                error = f"No GPU: {self.manager.backend.reason}"
        except GpuUnavailable as e:
            samples, error = [], str(e)
        if error != self._last_error and error is not None:
            self.log.warning("jupyter-gpushare: GPU use is not measured: %s", error)
        self._last_error = error

        self._trees.set_roots({kid: pid for kid, pid, _ in targets})
        pids = {p.pid for s in samples for p in s.processes}
        owners = self._trees.owners(pids) if pids else {}

        per_kernel: dict[str, list[ProcessUse]] = {}
        cards = {s.card.uuid: _card_usage(s, owners, per_kernel) for s in samples}
        measured = any("processes" not in s.errors and not s.lost for s in samples)
        kernels = self._kernel_usage(targets, per_kernel, measured)

        ids = frozenset(kid for kid, _, _ in targets)
        quota = None
        if ids != self._quota_ids or time.monotonic() - self._quota_at >= QUOTA_REFRESH_S:
            quota = self._refresh_quota()
            if quota is not None:
                self._quota_ids, self._quota_at = ids, time.monotonic()
        tick_ms = (time.perf_counter() - t0) * 1000
        self._seq += 1
        snap = UsageSnapshot(
            time=time.time(),
            tick_ms=tick_ms,
            interval_s=self.interval_s,
            error=error,
            cards=MappingProxyType(cards),
            kernels=MappingProxyType(kernels),
            quota=MappingProxyType(quota) if quota is not None else self.snapshot.quota,
            frameworks=MappingProxyType({k["kernel_id"]: k.get("frameworks") for k in quota["kernels"]})
            if quota is not None
            else self.snapshot.frameworks,
            seq=self._seq,
            samples=tuple(samples),
        )
        self.snapshot = snap
        if self.on_sample is not None and self.loop is not None and not self._stop.is_set():
            try:
                self.loop.call_soon_threadsafe(self.on_sample, snap)
            except RuntimeError:  # the loop is closed: the server is going away
                pass
        return snap

    def _refresh_quota(self) -> dict | None:
        """The manager's snapshot (ledger reservations, framework reports), run on the IOLoop."""
        if self.loop is None or self._stop.is_set():
            return None
        try:
            if asyncio.get_running_loop() is self.loop:
                return None  # tick() called on the loop itself (tests, benchmarks): it cannot wait for the loop
        except RuntimeError:
            pass
        try:
            self._pending = asyncio.run_coroutine_threadsafe(self.manager.snapshot(), self.loop)
            return self._pending.result(timeout=max(2.0, 2 * self.interval_s))
        except Exception as e:  # cancelled at stop, loop closed, ledger error: keep the last one
            if not self._stop.is_set():
                self.log.debug("jupyter-gpushare: quota snapshot not refreshed: %r", e)
            return None
        finally:
            self._pending = None


def kernel_view(rec: dict[str, Any], snap: UsageSnapshot, policy_state: str | None = None) -> dict[str, Any]:
    """A kernel record (``KernelRecord.to_dict()``) with the measured use and the policy state."""
    usage = snap.kernels.get(rec["kernel_id"])
    view = {
        **rec,
        "frameworks": snap.frameworks.get(rec["kernel_id"]),
        "used_mib": usage.used_mib if usage else None,
        "peak_mib": usage.peak_mib if usage else None,
        "utilization": usage.utilization if usage else None,
        "processes": [p.to_dict() for p in usage.processes] if usage else [],
    }
    if rec.get("state") == "running" and policy_state:
        view["state"] = policy_state
    return view


def card_view(card: dict[str, Any], snap: UsageSnapshot) -> dict[str, Any]:
    """A card of QuotaManager.snapshot() with the measured use (null figures when not measured)."""
    usage = snap.cards.get(card["uuid"])
    if usage is None:
        figures = dict.fromkeys(("used_mib", "used_by_kernels_mib", "used_by_others_mib", "free_mib", "utilization"))
        figures.update(mig=False, lost=False, errors={})
    else:
        figures = usage.figures()
    return {**card, **figures}


__all__ = [
    "CardUsage",
    "KernelUsage",
    "ProcessTrees",
    "ProcessUse",
    "Sampler",
    "UsageSnapshot",
    "card_view",
    "kernel_view",
]


def _card_usage(s: DeviceSample, owners: Mapping[int, str], per_kernel: dict[str, list[ProcessUse]]) -> CardUsage:
    """One card's use, split between this server's kernels (their processes added to ``per_kernel``) and the rest."""
    mine = others_known = 0
    for p in s.processes:
        kid = owners.get(p.pid)
        if kid is not None:
            per_kernel.setdefault(kid, []).append(ProcessUse(p.pid, s.card.index, p.used_mib, p.utilization))
            mine += p.used_mib or 0
        else:
            others_known += p.used_mib or 0
    readable = "processes" not in s.errors and not s.lost
    by_kernels = mine if readable else None
    if s.used_mib is not None and by_kernels is not None:
        by_others = max(0, s.used_mib - by_kernels)
    else:
        by_others = others_known if readable else None
    return CardUsage(
        uuid=s.card.uuid,
        index=s.card.index,
        total_mib=s.total_mib,
        used_mib=s.used_mib,
        used_by_kernels_mib=by_kernels,
        used_by_others_mib=by_others,
        free_mib=s.free_mib,
        utilization=s.utilization,
        mig=s.mig,
        lost=s.lost,
        errors=MappingProxyType(dict(s.errors)),
    )
