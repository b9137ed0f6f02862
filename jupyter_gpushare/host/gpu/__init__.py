"""GPU device backends behind one small interface: NVML on a GPU host, a simulated card otherwise."""

from __future__ import annotations

import logging

from ...core.policy import PolicyError, parse_size
from .base import Card, DeviceSample, GpuBackend, GpuUnavailable, NoGpuBackend, ProcessSample
from .fake import FakeNvml
from .simulated import SimulatedBackend

__all__ = [
    "Card",
    "DeviceSample",
    "FakeNvml",
    "GpuBackend",
    "ProcessSample",
    "GpuUnavailable",
    "NoGpuBackend",
    "SimulatedBackend",
    "list_cards",
    "open_backend",
    "parse_simulated_cards",
]

log = logging.getLogger(__name__)


def parse_simulated_cards(text: str, name: str = "GpuShareApp.simulated_cards") -> list[int]:
    """'24GiB' -> [24576]; '2x16GiB' -> [16384, 16384]; '24GiB,16GiB' -> [24576, 16384]."""
    sizes: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        count, _, size = part.rpartition("x") if "x" in part.lower() else ("1", "", part)
        if not count.strip().isdigit() or int(count) < 1:
            raise PolicyError(f"{name}: {part!r} is not a card list. Use e.g. '24GiB', '2x16GiB' or '24GiB,16GiB'.")
        mib = parse_size(size, name, allow_percent=False).mib or 0
        if mib < 1024:
            raise PolicyError(f"{name}: {part!r} is smaller than 1 GiB; use e.g. '24GiB'.")
        sizes += [mib] * int(count)
    if not sizes:
        raise PolicyError(f"{name}: {text!r} names no card. Use e.g. '24GiB' or '2x16GiB'.")
    return sizes


def open_backend(mode: str = "auto", simulated_cards: str = "") -> GpuBackend:
    """The backend for this host.

    ``auto``: NVML if it finds a card, else the simulated cards if configured, else no GPU.
    ``nvml``: NVML only. ``simulated``: the simulated cards, whatever the host has.
    Never raises for a missing GPU or driver: the NoGpuBackend says why.
    """
    sizes = parse_simulated_cards(simulated_cards) if simulated_cards else None
    if mode == "simulated":
        return SimulatedBackend(sizes or [24 * 1024])
    from .nvml import NvmlBackend

    nvml = NvmlBackend()
    try:
        if nvml.cards():
            return nvml
        reason = nvml.reason or "NVML found no GPU on this host."
    except GpuUnavailable as e:
        reason = str(e)
    if mode == "auto" and sizes:
        log.warning("No GPU (%s) Using simulated cards %s: no real GPU memory is reserved.", reason, simulated_cards)
        return SimulatedBackend(sizes, reason=reason)
    return NoGpuBackend(reason)


def list_cards(backend: GpuBackend) -> list[Card]:
    """The backend's cards; none, with the reason on the backend, when a card was lost between its detection
    and now (kernels then start without a GPU and say why)."""
    try:
        return backend.cards()
    except Exception as e:
        backend.reason = f"The GPU list could not be read: {e}"
        return []
