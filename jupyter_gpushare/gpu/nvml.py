"""NVML backend through nvidia-ml-py (module ``pynvml``): lazy init, every NVMLError handled."""

from __future__ import annotations

import threading

from .base import Card, GpuBackend, GpuUnavailable


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend(GpuBackend):
    kind = "nvml"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nvml = None

    def _init(self):
        """Import and initialise NVML once; GpuUnavailable with the reason if it cannot be."""
        with self._lock:
            if self._nvml is not None:
                return self._nvml
            try:
                import pynvml
            except ImportError as e:  # nvidia-ml-py is a dependency; this is a broken install
                raise GpuUnavailable(f"The NVML bindings (nvidia-ml-py) cannot be imported: {e}.") from e
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as e:
                self.reason = f"NVML could not start ({e}): no NVIDIA driver is loaded on this host, or it cannot be reached."
                raise GpuUnavailable(self.reason) from e
            self._nvml = pynvml
            return pynvml

    def cards(self) -> list[Card]:
        nv = self._init()
        cards = []
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as e:
            raise GpuUnavailable(f"NVML could not count the GPUs: {e}.") from e
        for i in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(i)
                uuid = _text(nv.nvmlDeviceGetUUID(handle))
                name = _text(nv.nvmlDeviceGetName(handle))
                total = nv.nvmlDeviceGetMemoryInfo(handle).total // 2**20
            except nv.NVMLError:
                continue  # a lost or inaccessible card is not schedulable
            cards.append(Card(index=i, uuid=uuid, name=name, total_mib=int(total)))
        return cards

    def close(self) -> None:
        with self._lock:
            if self._nvml is not None:
                try:
                    self._nvml.nvmlShutdown()
                except self._nvml.NVMLError:
                    pass
                self._nvml = None
