"""Prometheus metrics on the server's /metrics, read from the server's snapshot (snapshot.py) at scrape time.

jupyter_server serves prometheus_client's default registry at /metrics. One collector is
registered per process; it reads whichever server's snapshots are current, so label sets exist only for the
cards and kernels of the latest snapshot (a kernel that is gone has no series any more).
Sizes are in bytes and utilisation is a 0-1 ratio, as Prometheus naming asks.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client.core import REGISTRY, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from .snapshot import Snapshots

MIB = 2**20
_lock = threading.Lock()
_collector: GpuShareCollector | None = None


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"gpushare_{name}", doc, labels=labels)


class GpuShareCollector(Collector):
    """Turns the current snapshot into gauges; holds no figures of its own."""

    def __init__(self) -> None:
        self.snapshots: Snapshots | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snapshots = self.snapshots
        if snapshots is None:
            return
        current = snapshots.current
        snap = current.usage
        card_labels = ["card", "uuid"]
        g = {
            "total": _gauge("card_memory_total_bytes", "GPU memory of the card", card_labels),
            "reserved": _gauge(
                "card_memory_reserved_bytes", "GPU memory reserved by kernels (all servers of the host)", card_labels
            ),
            "used": _gauge("card_memory_used_bytes", "GPU memory in use (NVML)", card_labels),
            "kernels": _gauge(
                "card_memory_used_by_kernels_bytes", "GPU memory used by this server's kernels", card_labels
            ),
            "others": _gauge("card_memory_used_by_others_bytes", "GPU memory used by every other process", card_labels),
            "free": _gauge("card_memory_free_bytes", "Free GPU memory (NVML)", card_labels),
            "util": _gauge("card_utilization_ratio", "GPU utilisation, 0-1", card_labels),
        }
        reserved = {c.uuid: c.row.reserved_mib for c in current.server.cards}
        for uuid, c in snap.cards.items():
            labels = [str(c.index), uuid]
            for key, value in (
                ("total", c.total_mib),
                ("reserved", reserved.get(uuid)),
                ("used", c.used_mib),
                ("kernels", c.used_by_kernels_mib),
                ("others", c.used_by_others_mib),
                ("free", c.free_mib),
            ):
                if value is not None:
                    g[key].add_metric(labels, value * MIB)
            if c.utilization is not None:
                g["util"].add_metric(labels, c.utilization / 100)
        yield from g.values()

        klabels = ["kernel_id", "card"]
        k = {
            "used": _gauge("kernel_memory_used_bytes", "GPU memory used by the kernel's process tree", klabels),
            "peak": _gauge(
                "kernel_memory_peak_bytes", "Highest GPU memory use of the kernel since it (re)started", klabels
            ),
            "reserved": _gauge(
                "kernel_memory_reserved_bytes", "The kernel's reservation (quota + context reserve)", klabels
            ),
            "quota": _gauge("kernel_memory_quota_bytes", "The kernel's framework quota", klabels),
            "util": _gauge("kernel_utilization_ratio", "SM utilisation of the kernel's processes, 0-1", klabels),
            "over": _gauge("kernel_over_quota", "1 when the kernel uses more than its reservation", klabels),
            "idle": _gauge(
                "kernel_idle", "1 when the kernel holds a reservation and has been idle past the idle timeout", klabels
            ),
        }
        states = current.judged
        for kid, usage in snap.kernels.items():
            kernel = current.kernel(kid)
            rec = kernel.record if kernel else None
            lease = rec.lease if rec else None
            labels = [kid, str(rec.card.index) if rec and rec.card else ""]
            for key, value in (
                ("used", usage.used_mib),
                ("peak", usage.peak_mib),
                ("reserved", lease.reserved_mib if lease else None),
                ("quota", lease.quota_mib if lease else None),
            ):
                if value is not None:
                    k[key].add_metric(labels, value * MIB)
            if usage.utilization is not None:
                k["util"].add_metric(labels, usage.utilization / 100)
            k["over"].add_metric(labels, 1.0 if states.get(kid) == "over_quota" else 0.0)
            k["idle"].add_metric(labels, 1.0 if states.get(kid) == "idle" else 0.0)
        yield from k.values()

        s = _gauge("sampler_tick_seconds", "Duration of the last sampler tick", [])
        s.add_metric([], snap.tick_ms / 1000)
        yield s
        a = _gauge("gpu_measured", "1 when GPU use is being measured, 0 when not (no GPU, NVML error)", [])
        a.add_metric([], 0.0 if snap.error else 1.0)
        yield a
        if current.parking:
            yield from _parking_gauges(current.parking, current.moves_s)


def _parking_gauges(parking: Mapping[str, Any], moves_s: Mapping[str, float]) -> Iterator[GaugeMetricFamily]:
    """Parked kernels (Parking.view()): how many, the host memory their GPU state takes, the last moves' seconds
    and the reservations given back."""
    figures = (
        ("parked_kernels", "Kernels parked now (their GPU state in host memory)", parking["parked_kernels"]),
        ("parked_memory_bytes", "Host memory the parked kernels' GPU state takes", parking["parked_mib"] * MIB),
        ("parked_given_back_gib_hours", "Reservations given back to the line by parking, in GiB-hours",
         parking["given_back_gib_h"]),
        ("stood_by_kernels", "Times a kernel gave back a reservation it had not used (stand-by), since the server "
         "started", parking["stood_by"]),
    )  # fmt: skip
    for name, doc, value in figures:
        g = _gauge(name, doc, [])
        g.add_metric([], value)
        yield g
    for move in ("park", "resume"):
        last = moves_s.get(move)
        if last is not None:
            g = _gauge(f"{move}_seconds", f"Seconds the last {move} took", [])
            g.add_metric([], last)
            yield g


def install(snapshots: Snapshots) -> GpuShareCollector:
    """Point the process-wide collector at this server's snapshots (registering it once)."""
    global _collector
    with _lock:
        if _collector is None:
            _collector = GpuShareCollector()
            REGISTRY.register(_collector)
        _collector.snapshots = snapshots
        return _collector


def uninstall(snapshots: Snapshots) -> None:
    """Stop reporting these snapshots (the collector stays registered and reports nothing)."""
    with _lock:
        if _collector is not None and _collector.snapshots is snapshots:
            _collector.snapshots = None
