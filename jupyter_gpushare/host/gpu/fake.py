"""A fake NVML library: a test double of the driver's behaviour, driven by tests and simulated cards.

It implements the ``pynvml`` calls NvmlBackend makes, with the real ``pynvml`` error classes, so
the code that runs on a GPU host runs unchanged in tests. Tests add and remove processes with
memory figures, make a card lost (GpuIsLost), make a call NotSupported, or make NVML fail to start.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml

MIB = 2**20


@dataclass
class FakeDevice:
    index: int
    uuid: str
    name: str
    total_mib: int
    driver_used_mib: int = 0  # memory no process owns (driver, other namespaces)
    utilization: float | None = None  # None: derived from the processes
    mig: bool = False  # a GPU in MIG mode, or a MIG instance
    instances: list[FakeDevice | None] = field(default_factory=list)  # MIG slots of a GPU in MIG mode
    gpu_instance: int | None = None  # a MIG instance's GPU instance ID
    lost: bool = False
    unsupported: set[str] = field(default_factory=set)  # names of calls that answer NotSupported
    processes: dict[int, dict] = field(default_factory=dict)  # pid -> {used_mib, utilization, kind}


class FakeNvml:
    """A pynvml stand-in with devices of the given sizes (MiB). Thread-safe."""

    NVMLError = pynvml.NVMLError
    nvmlMemory_v2 = pynvml.nvmlMemory_v2

    def __init__(self, sizes_mib: list[int], name: str = "Fake GPU", uuid_prefix: str = "GPU-fake-") -> None:
        self._lock = threading.RLock()
        self.devices = [FakeDevice(i, f"{uuid_prefix}{i}", name, size) for i, size in enumerate(sizes_mib)]
        self.init_error: int | None = None  # an NVML_ERROR_* code nvmlInit answers with
        self.calls = 0

    # -- test controls -------------------------------------------------------------------------

    def enable_mig(self, card: int, slots: list[int | None]) -> None:
        """Put a GPU in MIG mode with instances of these sizes (MiB) in its slots; None: an empty slot,
        or an instance this host or container is not given. The instance in slot k has GPU instance ID k + 1
        (a real driver numbers them apart from the slots too)."""
        with self._lock:
            dev = self.devices[card]
            dev.mig = True
            dev.instances = [
                None
                if size is None
                else FakeDevice(
                    card,
                    f"MIG-{dev.uuid}-{slot}",
                    f"{dev.name} MIG {size // 1024}g",
                    size,
                    mig=True,
                    gpu_instance=slot + 1,
                )
                for slot, size in enumerate(slots)
            ]

    def _device(self, card: int, slot: int | None) -> FakeDevice:
        dev = self.devices[card]
        if slot is None:
            return dev
        instance = dev.instances[slot]
        assert instance is not None, f"GPU {card} has no MIG instance {slot}"
        return instance

    def add_process(
        self,
        pid: int,
        used_mib: int | None,
        card: int = 0,
        utilization: float = 0.0,
        kind: str = "compute",
        slot: int | None = None,
        sampled_at: float | None = None,
    ) -> None:
        """A process holding ``used_mib`` on a card, or on its MIG instance in ``slot`` (None: the driver
        does not say how much); its utilisation samples are taken at ``sampled_at`` (Unix s; None: when read)."""
        with self._lock:
            self._device(card, slot).processes[pid] = {
                "used_mib": used_mib, "utilization": utilization, "kind": kind, "sampled_at": sampled_at,
            }  # fmt: skip

    def set_process(self, pid: int, card: int = 0, **changes) -> None:
        with self._lock:
            self.devices[card].processes[pid].update(changes)

    def _with_instances(self, devices: list[FakeDevice]) -> list[FakeDevice]:
        return [d for dev in devices for d in (dev, *dev.instances) if d is not None]

    def remove_process(self, pid: int, card: int | None = None) -> None:
        with self._lock:
            for dev in self._with_instances(self.devices if card is None else [self.devices[card]]):
                dev.processes.pop(pid, None)

    def clear(self) -> None:
        with self._lock:
            for dev in self._with_instances(self.devices):
                dev.processes.clear()

    def lose(self, card: int = 0, lost: bool = True) -> None:
        """Make every call about this card answer GpuIsLost (or answer again, with lost=False)."""
        with self._lock:
            self.devices[card].lost = lost

    def not_supported(self, card: int, *calls: str) -> None:
        """Make these calls (e.g. 'nvmlDeviceGetProcessUtilization') answer NotSupported for a card."""
        with self._lock:
            self.devices[card].unsupported.update(calls)

    # -- the pynvml calls NvmlBackend makes ------------------------------------------------------

    def _dev(self, handle: FakeDevice, call: str) -> FakeDevice:
        self.calls += 1
        if handle.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if call in handle.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return handle

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:
        if index >= len(self.devices):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._dev(self.devices[index], "nvmlDeviceGetHandleByIndex")

    def nvmlDeviceGetUUID(self, handle: FakeDevice) -> str:
        return self._dev(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: FakeDevice) -> str:
        return self._dev(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetPciInfo(self, handle: FakeDevice) -> SimpleNamespace:
        index = self._dev(handle, "nvmlDeviceGetPciInfo").index
        return SimpleNamespace(busId=f"00000000:{index + 0x18:02X}:00.0")

    def nvmlDeviceGetMinorNumber(self, handle: FakeDevice) -> int:
        return self._dev(handle, "nvmlDeviceGetMinorNumber").index  # /dev/nvidia<index>, as on most hosts

    def _used_mib(self, dev: FakeDevice) -> int:
        return dev.driver_used_mib + sum(p["used_mib"] or 0 for p in dev.processes.values())

    def nvmlDeviceGetMemoryInfo(self, handle: FakeDevice, version: int | None = None):
        with self._lock:
            dev = self._dev(handle, "nvmlDeviceGetMemoryInfo")
            used = min(self._used_mib(dev), dev.total_mib)
            return SimpleNamespace(
                total=dev.total_mib * MIB, used=used * MIB, free=(dev.total_mib - used) * MIB, reserved=0
            )

    def nvmlDeviceGetUtilizationRates(self, handle: FakeDevice):
        with self._lock:
            dev = self._dev(handle, "nvmlDeviceGetUtilizationRates")
            if dev.mig:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            gpu = dev.utilization
            if gpu is None:
                gpu = min(100.0, sum(p["utilization"] for p in dev.processes.values()))
            return SimpleNamespace(gpu=int(gpu), memory=0)

    def _procs(self, handle: FakeDevice, call: str, kind: str) -> list:
        with self._lock:
            dev = self._dev(handle, call)
            return [
                SimpleNamespace(
                    pid=pid,
                    usedGpuMemory=None if p["used_mib"] is None else p["used_mib"] * MIB,
                    gpuInstanceId=0xFFFFFFFF,
                    computeInstanceId=0xFFFFFFFF,
                )
                for pid, p in dev.processes.items()
                if kind in p["kind"]
            ]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeDevice) -> list:
        return self._procs(handle, "nvmlDeviceGetComputeRunningProcesses", "compute")

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: FakeDevice) -> list:
        return self._procs(handle, "nvmlDeviceGetGraphicsRunningProcesses", "graphics")

    def nvmlDeviceGetProcessUtilization(self, handle: FakeDevice, last_seen_us: int) -> list:
        with self._lock:
            dev = self._dev(handle, "nvmlDeviceGetProcessUtilization")
            if dev.mig:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            now = int(time.time() * 1e6)
            samples = [
                SimpleNamespace(
                    pid=pid,
                    timeStamp=int(p["sampled_at"] * 1e6) if p.get("sampled_at") else now,
                    smUtil=int(p["utilization"]),
                    memUtil=0,
                    encUtil=0,
                    decUtil=0,
                )
                for pid, p in dev.processes.items()
                if p["utilization"] > 0  # like the driver: idle processes have no samples
            ]
            if not samples:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
            return samples

    def nvmlDeviceGetMigMode(self, handle: FakeDevice) -> list[int]:
        dev = self._dev(handle, "nvmlDeviceGetMigMode")
        return [1, 1] if dev.mig else [0, 0]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeDevice) -> int:
        return 7 if self._dev(handle, "nvmlDeviceGetMaxMigDeviceCount").mig else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeDevice, index: int) -> FakeDevice:
        dev = self._dev(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
        instance = dev.instances[index] if dev.mig and index < len(dev.instances) else None
        if instance is None:  # as a real driver answers, MIG off included (bench/results/check_cards-*.json)
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return instance

    def nvmlDeviceGetGpuInstanceId(self, handle: FakeDevice) -> int:
        dev = self._dev(handle, "nvmlDeviceGetGpuInstanceId")
        if dev.gpu_instance is None:  # not a MIG device: a real driver (H100, MIG off) says Invalid Argument
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return dev.gpu_instance

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeDevice:
        for dev in self._with_instances(self.devices):
            if dev.uuid == uuid:
                return self._dev(dev, "nvmlDeviceGetHandleByUUID")
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
