"""Simulated cards, for machines without a GPU: the quota flow can be tried, no memory is real.

They are the NVML backend over the fake NVML of ``fake.py``: tests (and demos) add processes to
``backend.fake`` and the sampler, the API and the UI show their use like a real card's. With
``claims_dir`` (the kernels' report directory), a kernel process that says it uses memory
(``gpushare_simulate.use('1.5GiB')`` in a notebook) is shown using it, so a student can try what
happens near and over a quota without a GPU.
"""

from __future__ import annotations

import os

import psutil

from ..reports import read_regular
from .base import DeviceSample
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

    claims_dir: str | None = None
    _claimed: set[int] = set()  # (replaced, never changed in place)
    _parked: frozenset[int] = frozenset()  # processes whose (simulated) GPU state is parked: they hold nothing

    def park(self, pids: list[int]) -> None:
        """The stand-in for the driver's checkpoint (host/checkpoint.py): these processes hold nothing until
        ``unpark``, on the card and in every reading."""
        self._parked = self._parked | set(pids)
        for pid in pids:
            self.fake.remove_process(pid)

    def unpark(self, pids: list[int]) -> None:
        self._parked = self._parked - set(pids)

    def sample(self) -> list[DeviceSample]:
        if self.claims_dir:
            self._apply_claims()
        return super().sample()

    def _apply_claims(self) -> None:
        """Processes' claimed use, from ``<kernel id>.<pid>.simulated`` files ("<MiB> <card index>"): a file of a
        process that is gone is removed, one that does not read as two small numbers is ignored."""
        claims: dict[int, tuple[int, int]] = {}
        assert self.claims_dir is not None  # (only with a claims directory)
        try:
            names = [n for n in os.listdir(self.claims_dir) if n.endswith(".simulated")]
        except OSError:
            names = []
        for name in names:
            path = os.path.join(self.claims_dir, name)
            raw = read_regular(path, 40)
            try:
                pid = int(name.split(".")[-2])
                mib, card = (int(x) for x in (raw or b"").split())
            except ValueError:
                continue
            if not _holds_memory(pid):
                os.unlink(path)
            elif 0 <= mib <= 1 << 30 and 0 <= card < len(self.fake.devices) and pid not in self._parked:
                claims[pid] = (mib, card)
        for pid in self._claimed - claims.keys():
            self.fake.remove_process(pid)
        for pid, (mib, card) in claims.items():
            self.fake.remove_process(pid)
            self.fake.add_process(pid, mib, card=card)
        self._claimed = set(claims)


def _holds_memory(pid: int) -> bool:
    """Whether a process could hold GPU memory: it exists and has not exited (the driver frees an exited process's
    memory at once, before its parent reaps it)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
