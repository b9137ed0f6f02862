"""Background sampling of GPU use into a cached, immutable reading.

One thread per server reads every card (memory, utilisation, processes) through the GPU backend,
maps GPU processes to this server's kernels through each kernel's process tree, and swaps in a new
``UsageSnapshot``, which it hands to the IOLoop at each tick (the enforcer, then the server's snapshot,
snapshot.py, which the handlers and the metrics read): nothing of NVML or psutil runs on the Tornado IOLoop.
It measures only: the ledger and the kernels' reports are read with the server's snapshot.

Attribution walks up from each GPU process (there are few) to a kernel's root process, instead of
down from every kernel (a full /proc scan per kernel). Processes are known by (pid, create_time),
so a reused pid is never taken for the process that had it before. A GPU process whose ancestry
reaches no kernel of this server (another user's job, another server's kernel, a child that was
re-parented to init, a process that has exited) counts as "other" in the card totals.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Protocol

from ..config.settings import MIN_INTERVAL_S
from ..core.overuse import FAST_INTERVAL_S
from ..host.gpu import Card, DeviceSample, GpuBackend, GpuUnavailable
from ..host.procs import ProcessTrees

HISTORY_EVERY_S, HISTORY_POINTS = 5.0, 72  # a kernel's use over the last 6 minutes, for the sidebar's timeline
READING_KEPT_S = 5.0  # a reading older than this (or five sampler intervals) says nothing of the card now
EMPTY: Mapping = MappingProxyType({})


@dataclass(frozen=True)
class ProcessUse:
    """One GPU process of a kernel's tree."""

    pid: int
    card_index: int
    used_mib: int | None
    utilization: float | None
    active_at: float | None = None  # when the driver last saw it use the SM (ProcessSample.active_at)

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
    history: tuple[tuple[float, int], ...] = ()  # (time, used MiB), oldest first

    @property
    def active_at(self) -> float | None:
        """When the driver last saw one of its processes use the SM, in this reading's window (None: not said)."""
        return max((p.active_at for p in self.processes if p.active_at is not None), default=None)


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
    """One sampler tick: what the cards and the kernels' processes use. Never mutated."""

    time: float = 0.0
    tick_ms: float = 0.0
    interval_s: float = 1.0
    error: str | None = "not sampled yet"
    cards: Mapping[str, CardUsage] = field(default_factory=lambda: EMPTY)  # by card uuid
    kernels: Mapping[str, KernelUsage] = field(default_factory=lambda: EMPTY)  # by kernel id
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


def _answer(future: asyncio.Future, usage: UsageSnapshot) -> None:
    if not future.done():
        future.set_result(usage)


class Readings:
    """The cards as this process's sampler last read them (none yet: an empty reading), where the sampler publishes
    each reading and the manager reads it (services.Services)."""

    def __init__(self) -> None:
        self.usage = UsageSnapshot()
        self.wanted = threading.Event()  # someone waits for a reading: the sampler reads now, not at its interval
        self._lock = threading.Lock()
        self._waiting: list[tuple[float, asyncio.AbstractEventLoop, asyncio.Future]] = []  # ``fresh``'s waiters

    def publish(self, usage: UsageSnapshot) -> None:
        """A new reading (the sampler's thread): it answers the waiters it is fresh enough for, and asks for the
        next one at once while any other still waits (a reading begun before a waiter asked)."""
        self.usage = usage
        with self._lock:
            answered = [w for w in self._waiting if usage.time > w[0]]
            self._waiting = [w for w in self._waiting if usage.time <= w[0]]
            if self._waiting:
                self.wanted.set()
        for _, loop, future in answered:
            try:
                loop.call_soon_threadsafe(_answer, future, usage)
            except RuntimeError:  # its loop has closed: nobody waits any more
                pass

    async def fresh(self, since: float, timeout: float) -> UsageSnapshot | None:
        """The first reading taken after ``since`` (time.time()), asked for now (a park waits on the card's word:
        parking.py); None if none comes within ``timeout`` (no sampler runs). The reading answers the wait as it is
        published: nothing polls."""
        if self.usage.time > since:
            return self.usage
        waiter = (since, asyncio.get_running_loop(), asyncio.get_running_loop().create_future())
        with self._lock:
            self._waiting.append(waiter)
        try:
            if self.usage.time > since:  # published between the first look and joining the waiters
                return self.usage
            self.wanted.set()
            return await asyncio.wait_for(waiter[2], timeout)
        except asyncio.TimeoutError:
            return None
        finally:
            with self._lock:
                if waiter in self._waiting:
                    self._waiting.remove(waiter)

    def latest_samples(self) -> tuple[DeviceSample, ...]:
        """The driver's last per-process reading, if no older than a few intervals (else none: nothing is known)."""
        usage = self.usage
        return usage.samples if time.time() - usage.time <= max(READING_KEPT_S, 5 * usage.interval_s) else ()

    def kernel_usage(self, kernel_id: str) -> KernelUsage | None:
        """A kernel's last reading (None: not measured)."""
        return self.usage.kernels.get(kernel_id)


class Sampled(Protocol):
    """What the sampler reads of the kernels' registry (QuotaManager), from its own thread: the driver, the cards,
    and each kernel's root process and card."""

    cards: list[Card]
    backend: GpuBackend

    def usage_targets(self) -> list[tuple[str, int | None, str | None]]: ...


class Sampler:
    """One background thread per server that keeps ``snapshot`` fresh, published into ``readings``.

    ``tick()`` can also be called directly (tests, benchmarks). ``on_sample`` is called on the
    IOLoop with each new snapshot (the enforcer, then the server's snapshot).
    """

    def __init__(
        self,
        manager: Sampled,
        interval_s: float = 1.0,
        loop: asyncio.AbstractEventLoop | None = None,
        on_sample: Callable[[UsageSnapshot], None] | None = None,
        log: logging.Logger | None = None,
        readings: Readings | None = None,
    ) -> None:
        """``manager``: whose kernels and cards are read (QuotaManager); ``readings``: where each reading is
        published (the manager's, services.Services; None: a place of the sampler's own)."""
        self.manager = manager
        self.interval_s = max(MIN_INTERVAL_S, float(interval_s))
        self.loop = loop
        self.on_sample = on_sample
        self.log = log or logging.getLogger("jupyter_gpushare")
        self.readings = readings or Readings()
        self.readings.publish(UsageSnapshot(interval_s=self.interval_s))
        self._trees = ProcessTrees()
        self._peaks: dict[str, tuple[int | None, int]] = {}  # kernel id -> (pid, peak MiB)
        self._history: dict[str, tuple[int | None, tuple[tuple[float, int], ...]]] = {}  # kernel id -> (pid, points)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_error: str | None = None
        self._seq = 0
        self._hurried = False

    @property
    def snapshot(self) -> UsageSnapshot:
        """The last reading."""
        return self.readings.usage

    def latest_samples(self) -> tuple[DeviceSample, ...]:
        """The driver's last reading, if no older than a few intervals (else none: nothing is known)."""
        return self.readings.latest_samples()

    # -- thread ------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gpushare-sampler", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the thread (safe to call from the IOLoop: it never waits on the loop)."""
        self._stop.set()
        self.readings.wanted.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self._thread = None

    def hurry(self, over: bool) -> None:
        """Read every overuse.FAST_INTERVAL_S (if that is sooner) while ``over``: some kernel is over its
        reservation, and a theft must be seen within a fraction of a second (the enforcer says so each tick)."""
        self._hurried = bool(over)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.tick()
            except Exception:  # keep sampling; say what broke once per kind of failure
                self.log.exception("jupyter-gpushare: sampler tick failed")
            pace = min(self.interval_s, FAST_INTERVAL_S) if self._hurried else self.interval_s
            self.readings.wanted.wait(max(0.0, pace - (time.monotonic() - started)))  # (or asked for: ``fresh``)
            self.readings.wanted.clear()

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
            history = self._remember(kid, pid, used)
            kernels[kid] = KernelUsage(kid, pid, used, peak if used is not None or peak else None, util, procs, history)
        for kid in [k for k in self._peaks if k not in kernels]:
            del self._peaks[kid]
            self._history.pop(kid, None)
        return kernels

    def _remember(self, kid: str, pid: int | None, used: int | None) -> tuple[tuple[float, int], ...]:
        """The kernel's recent use, a point every HISTORY_EVERY_S (a restarted kernel starts anew)."""
        now = time.time()
        prev_pid, points = self._history.get(kid, (pid, ()))
        if prev_pid != pid:
            points = ()
        if used is not None and (not points or now - points[-1][0] >= HISTORY_EVERY_S):
            points = (*points[-(HISTORY_POINTS - 1) :], (round(now, 1), used))
        self._history[kid] = (pid, points)
        return points

    def tick(self) -> UsageSnapshot:
        """Sample once and publish the snapshot (also returned)."""
        t0 = time.perf_counter()
        targets = self.manager.usage_targets()  # [(kernel id, pid, card uuid)]
        error = None
        read_at = time.time()  # (the reading's time: when the driver was read, not when it was published)
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
        tick_ms = (time.perf_counter() - t0) * 1000
        self._seq += 1
        snap = UsageSnapshot(
            time=read_at,
            tick_ms=tick_ms,
            interval_s=self.interval_s,
            error=error,
            cards=MappingProxyType(cards),
            kernels=MappingProxyType(kernels),
            seq=self._seq,
            samples=tuple(samples),
        )
        self.readings.publish(snap)
        if self.on_sample is not None and self.loop is not None and not self._stop.is_set():
            try:
                self.loop.call_soon_threadsafe(self.on_sample, snap)
            except RuntimeError:  # the loop is closed: the server is going away
                pass
        return snap


def _card_usage(s: DeviceSample, owners: Mapping[int, str], per_kernel: dict[str, list[ProcessUse]]) -> CardUsage:
    """One card's use, split between this server's kernels (their processes added to ``per_kernel``) and the rest."""
    mine = others_known = 0
    for p in s.processes:
        kid = owners.get(p.pid)
        if kid is not None:
            per_kernel.setdefault(kid, []).append(
                ProcessUse(p.pid, s.card.index, p.used_mib, p.utilization, p.active_at)
            )
            mine += p.used_mib or 0
        else:
            others_known += p.used_mib or 0
    readable = "processes" not in s.errors and not s.lost
    by_kernels = mine if readable else None
    by_others: int | None
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


__all__ = ["CardUsage", "KernelUsage", "ProcessUse", "Sampler", "UsageSnapshot"]
