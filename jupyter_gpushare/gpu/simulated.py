"""Simulated cards, for machines without a GPU: the quota flow can be tried, no memory is real."""

from __future__ import annotations

from .base import Card, GpuBackend

SIMULATED_NAME = "Simulated GPU (no real memory)"


class SimulatedBackend(GpuBackend):
    """Cards of the given sizes in MiB. Labelled as simulated in every card and API reply."""

    kind = "simulated"
    simulated = True

    def __init__(self, sizes_mib: list[int], reason: str | None = None):
        self._cards = [
            Card(index=i, uuid=f"GPU-simulated-{i}", name=SIMULATED_NAME, total_mib=size, simulated=True)
            for i, size in enumerate(sizes_mib)
        ]
        self.reason = reason or "Simulated cards were configured (GpuShareApp.gpu_backend = 'simulated')."

    def cards(self) -> list[Card]:
        return list(self._cards)
