"""NVML backend through nvidia-ml-py (module ``pynvml``): lazy init, every NVMLError handled.

Every driver call goes through ``_query``, which turns any NVMLError into "not available" for the
one figure it was asked for (nvitop's ``nvmlQuery(..., default=NA)`` is the model), so a card that
cannot report its utilisation still reports its memory, and a lost card does not stop the others.
The library is a parameter, so the same code runs on the fake NVML of ``fake.py`` in tests.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from .base import Card, DeviceSample, GpuBackend, GpuUnavailable, ProcessSample
from .pod import apply_pod_limits, limit_samples

log = logging.getLogger("jupyter_gpushare")

MIB = 2**20
NVML_GPU_IS_LOST = 15  # NVML_ERROR_GPU_IS_LOST
NVML_NOT_FOUND = 6  # NVML_ERROR_NOT_FOUND: no utilisation samples since the timestamp
NVML_MIG_ENABLED = 1
UTIL_WINDOW_S = 5.0  # at most this far back on the first utilisation query of a card


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _gpu_instance(nv: Any, device: Any) -> int | None:
    """A MIG device's GPU instance ID, which tells apart instances of one GPU (None if the driver won't say)."""
    try:
        return int(nv.nvmlDeviceGetGpuInstanceId(device))
    except nv.NVMLError:
        return None


def _mib(value: object) -> int | None:
    """Bytes to MiB; None for NVML's "not available" (None from pynvml, or the raw all-ones value)."""
    if value is None or not isinstance(value, int) or value < 0 or value >= 2**63:
        return None
    return value // MIB


class _Lost(Exception):
    """Internal: the card answered GpuIsLost; stop asking it anything this tick."""


class NvmlBackend(GpuBackend):
    kind = "nvml"

    def __init__(self, library: Any = None) -> None:
        self._lock = threading.Lock()
        self._library = library  # a pynvml-like module; None = import pynvml on first use
        self._nvml = None
        self._handles: dict[str, Any] = {}  # card uuid -> NVML handle
        self._cards: list[Card] | None = None
        self._util_seen: dict[str, int] = {}  # card uuid -> last utilisation sample time (µs)

    def _init(self):
        """Import and initialise NVML once; GpuUnavailable with the reason if it cannot be."""
        with self._lock:
            if self._nvml is not None:
                return self._nvml
            nv = self._library
            if nv is None:
                try:
                    import pynvml as nv
                except ImportError as e:  # nvidia-ml-py is a dependency; this is a broken install
                    raise GpuUnavailable(f"The NVML bindings (nvidia-ml-py) cannot be imported: {e}.") from e
            try:
                nv.nvmlInit()
            except nv.NVMLError as e:
                self.reason = (
                    f"NVML could not start ({e}): no NVIDIA driver is loaded on this host, or it cannot be reached."
                )
                raise GpuUnavailable(self.reason) from e
            self._nvml = nv
            return nv

    def _make_card(
        self,
        index: int,
        uuid: str,
        name: str,
        total_mib: int,
        mig_instance: int | None = None,
        minor: int | None = None,
        pci: str | None = None,
    ) -> Card:
        return Card(
            index, uuid, name, total_mib, simulated=self.simulated, mig_instance=mig_instance, minor=minor, pci=pci
        )

    def cards(self) -> list[Card]:
        nv = self._init()
        cards, unusable = [], []
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as e:
            raise GpuUnavailable(f"NVML could not count the GPUs: {e}.") from e
        for i in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(i)
            except nv.NVMLError:
                continue  # a lost or inaccessible card is not schedulable
            # A GPU in MIG mode runs nothing itself: its MIG instances (those this host or container
            # may see) are the cards, each with its own memory and CUDA_VISIBLE_DEVICES=MIG-<uuid>,
            # and the GPU's index (GpuShareApp.cards = ['0'] means all of GPU 0).
            mig = self._mig_devices(nv, handle)
            try:
                minor: int | None = int(nv.nvmlDeviceGetMinorNumber(handle))
            except (nv.NVMLError, AttributeError, TypeError, ValueError):
                minor = None  # (a driver without it: no card isolation by device node)
            try:
                pci: str | None = _text(nv.nvmlDeviceGetPciInfo(handle).busId)
            except (nv.NVMLError, AttributeError, TypeError, ValueError):
                pci = None
            if mig == []:
                unusable.append(
                    f"GPU {i} is in MIG mode, but no MIG instance of it is visible here, and a GPU in MIG mode runs "
                    "nothing itself. Create instances (nvidia-smi mig -cgi <profiles> -C) or, on Kubernetes, "
                    "request one (nvidia.com/mig-<profile>)."
                )
            for device in [handle] if mig is None else mig:
                try:
                    uuid = _text(nv.nvmlDeviceGetUUID(device))
                    name = _text(nv.nvmlDeviceGetName(device))
                    total = nv.nvmlDeviceGetMemoryInfo(device).total // MIB
                except nv.NVMLError:
                    continue
                self._handles[uuid] = device
                instance = None if mig is None else _gpu_instance(nv, device)
                cards.append(self._make_card(i, uuid, name, int(total), instance, minor, pci if mig is None else None))
        if unusable and not cards:
            self.reason = " ".join(unusable)
        for text in unusable if cards else []:
            log.warning("jupyter-gpushare: %s", text)
        if self._library is None:
            cards = apply_pod_limits(cards)  # a HAMi slice is what this pod may use, not the whole card
        self._cards = cards
        return list(cards)

    @staticmethod
    def _mig_devices(nv: Any, handle: Any) -> list[Any] | None:
        """The MIG instances of a GPU in MIG mode ([] when none is visible); None when MIG is off."""
        try:
            if nv.nvmlDeviceGetMigMode(handle)[0] != NVML_MIG_ENABLED:
                return None
            slots = nv.nvmlDeviceGetMaxMigDeviceCount(handle)
        except nv.NVMLError:  # no MIG support on this GPU or driver
            return None
        devices = []
        for slot in range(slots):
            try:
                devices.append(nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot))
            except nv.NVMLError:  # no instance in this slot, or one this container is not given
                continue
        return devices

    # -- sampling (sampler thread only) ------------------------------------------------------------

    def _query(
        self,
        fn: Callable[..., Any],
        *args: Any,
        default: Any = None,
        errors: dict | None = None,
        name: str = "",
        **kw: Any,
    ) -> Any:
        """``fn(*args)``, or ``default`` with the reason in ``errors[name]`` on any NVMLError.

        Raises _Lost when the card is gone, so the caller stops querying it.
        """
        nv = self._nvml
        assert nv is not None  # (queried only once NVML is loaded)
        try:
            return fn(*args, **kw)
        except nv.NVMLError as e:
            if getattr(e, "value", None) == NVML_GPU_IS_LOST:
                raise _Lost(str(e)) from e
            if errors is not None and name:
                errors[name] = str(e) or type(e).__name__
            return default

    def sample(self) -> list[DeviceSample]:
        nv = self._init()
        cards = self._cards if self._cards is not None else self.cards()
        return limit_samples([self._sample_card(nv, card) for card in cards])  # a HAMi share is the card

    def _sample_card(self, nv: Any, card: Card) -> DeviceSample:
        errors: dict[str, str] = {}
        try:
            handle = self._handles.get(card.uuid)
            if handle is None:
                handle = self._query(nv.nvmlDeviceGetHandleByUUID, card.uuid, errors=errors, name="card")
                if handle is None:
                    return DeviceSample(card=card, errors=errors)
                self._handles[card.uuid] = handle
            mig = card.uuid.startswith("MIG-")
            mem = self._query(
                nv.nvmlDeviceGetMemoryInfo, handle, version=nv.nvmlMemory_v2, errors=errors, name="memory"
            )
            if mem is None:  # drivers before r510 have only the v1 call (its "used" includes reserved memory)
                mem = self._query(nv.nvmlDeviceGetMemoryInfo, handle, errors=errors, name="memory")
                if mem is not None:
                    errors.pop("memory", None)
            rates = self._query(nv.nvmlDeviceGetUtilizationRates, handle, errors=errors, name="utilization")
            processes = self._processes(nv, handle, card.uuid, mig, errors)
        except _Lost as e:
            self._handles.pop(card.uuid, None)
            return DeviceSample(
                card=card, lost=True, errors={"card": f"The GPU is lost ({e}); it needs a reset or a reboot."}
            )
        return DeviceSample(
            card=card,
            total_mib=_mib(getattr(mem, "total", None)),
            used_mib=_mib(getattr(mem, "used", None)),
            free_mib=_mib(getattr(mem, "free", None)),
            utilization=float(rates.gpu) if rates is not None else None,
            processes=processes,
            mig=mig,
            errors=errors,
        )

    def _processes(self, nv: Any, handle: Any, uuid: str, mig: bool, errors: dict) -> tuple[ProcessSample, ...]:
        compute = self._query(nv.nvmlDeviceGetComputeRunningProcesses, handle, errors=errors, name="processes")
        graphics = self._query(nv.nvmlDeviceGetGraphicsRunningProcesses, handle, default=[])  # often NotSupported
        if compute is None:
            return ()
        found: dict[int, tuple[int | None, str]] = {}
        for kind, procs in (("compute", compute), ("graphics", graphics)):
            for p in procs:
                used = _mib(getattr(p, "usedGpuMemory", None))
                if p.pid in found:  # a process with both contexts is listed twice with the same memory
                    prev, prev_kind = found[p.pid]
                    found[p.pid] = (
                        max(prev or 0, used or 0) if prev is not None or used is not None else None,
                        f"{prev_kind}+{kind}",
                    )
                else:
                    found[p.pid] = (used, kind)
        util = self._process_utilization(nv, handle, uuid, mig, errors) if found else {}
        samples = []
        for pid, (used, kind) in found.items():
            share, active_at = (None, None) if util is None else util.get(pid, (0.0, None))
            samples.append(ProcessSample(pid=pid, used_mib=used, kind=kind, utilization=share, active_at=active_at))
        return tuple(samples)

    def _process_utilization(
        self, nv: Any, handle: Any, uuid: str, mig: bool, errors: dict
    ) -> dict[int, tuple[float, float | None]] | None:
        """Per pid, its SM percent over the samples since the last call and when the last sample that saw it use
        the SM was taken (Unix seconds; None: none did); {} = no samples (all idle).

        None when the card cannot report it (MIG instances, old GPUs): then per-process utilisation
        is "not available", not 0.
        """
        if mig:
            errors["process_utilization"] = "Not reported per process on MIG instances."
            return None
        since = self._util_seen.get(uuid) or int((time.time() - UTIL_WINDOW_S) * 1e6)
        try:
            samples = nv.nvmlDeviceGetProcessUtilization(handle, since)
        except nv.NVMLError as e:
            if getattr(e, "value", None) == NVML_NOT_FOUND:
                return {}  # no process ran on the card since `since`
            if getattr(e, "value", None) == NVML_GPU_IS_LOST:
                raise _Lost(str(e)) from e
            errors["process_utilization"] = str(e) or type(e).__name__
            return None
        per_pid: dict[int, list[float]] = {}
        active: dict[int, float] = {}
        latest = since
        for s in samples:
            per_pid.setdefault(s.pid, []).append(float(s.smUtil))
            latest = max(latest, int(s.timeStamp))
            if s.smUtil > 0:  # the driver's own clock of the sample (microseconds, the CPU's time)
                active[s.pid] = max(active.get(s.pid, 0.0), int(s.timeStamp) / 1e6)
        self._util_seen[uuid] = latest
        return {pid: (sum(v) / len(v), active.get(pid)) for pid, v in per_pid.items()}

    def close(self) -> None:
        with self._lock:
            if self._nvml is not None:
                try:
                    self._nvml.nvmlShutdown()
                except self._nvml.NVMLError:
                    pass
                self._nvml = None
                self._handles.clear()
