"""Simulated cards, for machines without a GPU: the quota flow can be tried, no memory is real.

They are the NVML backend over the fake NVML of ``fake.py``: tests (and demos) add processes to
``backend.fake`` and the sampler, the API and the UI show their use like a real card's.
"""

from __future__ import annotations

from .base import Card
from .fake import FakeNvml
from .nvml import NvmlBackend

SIMULATED_NAME = "Simulated GPU (no real memory)"


class SimulatedBackend(NvmlBackend):
    """Cards of the given sizes in MiB. Labelled as simulated in every card and API reply."""

    kind = "simulated"
    simulated = True

    def __init__(self, sizes_mib: list[int], reason: str | None = None):
        self.fake = FakeNvml(sizes_mib, name=SIMULATED_NAME, uuid_prefix="GPU-simulated-")
        super().__init__(library=self.fake)
        self.reason = reason or "Simulated cards were configured (GpuShareApp.gpu_backend = 'simulated')."

    def _make_card(self, index: int, uuid: str, name: str, total_mib: int, mig_instance: int | None = None) -> Card:
        return Card(index=index, uuid=uuid, name=name, total_mib=total_mib, simulated=True, mig_instance=mig_instance)
