"""Inside the kernel: the GPU is as large as the kernel's quota, as far as the kernel can see.

Standard library only, Python >= 3.9 (see ``_gpushare_boot``, which registers these hooks). Code that
sizes itself from the GPU's free and total memory (Accelerate's ``get_max_memory`` and
``device_map="auto"``, vLLM, batch-size finders, a notebook's own ``torch.cuda.mem_get_info()``)
would otherwise plan for the whole card and fail at the cap. Right after a module is imported, these
functions are wrapped, in Python, never in the driver:

- ``torch.cuda.mem_get_info``: total = the quota, free = the quota less what this process's caching
  allocator holds (``torch.cuda.memory_reserved``, which is what the cap counts), at most the card's
  real free memory;
- ``torch.cuda.get_device_properties``: the same object's attributes, ``total_memory`` the quota
  (torch's own modules get the real object: they use it to set the cap, and torch.compile keys on it);
- ``cupy.cuda.runtime.memGetInfo`` and ``cupy.cuda.Device.mem_info``: as torch, with what CuPy's
  default pool holds (which ``CUPY_GPU_MEMORY_LIMIT`` counts);
- ``pynvml.nvmlDeviceGetMemoryInfo`` (and ``_v2``) on the kernel's card: total = the reservation
  (quota + context reserve: NVML counts the CUDA context, which the framework caps do not), used = what
  the kernel's processes hold (NVML, its process tree), free = the rest, at most the card's real free.

JAX (``device.memory_stats()["bytes_limit"]`` is already the quota: XLA_PYTHON_CLIENT_MEM_FRACTION of the
card's total) and TensorFlow (its logical device's ``memory_limit`` is the quota; it reports no total)
need nothing. Nothing here creates a CUDA context: wrapping calls nothing, and the wrappers call the
real function first.
"""

from __future__ import annotations

import os
import sys

import _gpushare_env as env
import _gpushare_report as rep

MiB = 2**20


def _quota_bytes() -> int | None:
    """The kernel's quota in bytes when this process's views should show it, else None."""
    if rep.no_cap_reason():
        return None
    return rep.cap_mib() * MiB


def _one_visible_card() -> bool:
    """CUDA sees the kernel's card alone, as the provisioner set it (otherwise device 0 may be another card)."""
    card = os.environ.get(env.CARD_UUID)
    return bool(card) and os.environ.get("CUDA_VISIBLE_DEVICES") == card


def fit(free: int, total: int, quota: int, own: int) -> tuple[int, int]:
    """(free, total) of a card of ``quota`` bytes on which this process holds ``own``: free is never more
    than the real card has free."""
    size = min(quota, total)
    return max(0, min(free, size - own)), size


def _mark(fn, original):
    fn._gpushare = True
    fn.__wrapped__ = original
    fn.__doc__ = getattr(original, "__doc__", None)
    fn.__name__ = getattr(original, "__name__", fn.__name__)
    return fn


def _wrapped(fn) -> bool:
    return getattr(fn, "_gpushare", False)


# -- PyTorch --------------------------------------------------------------------------------------------


class DeviceProperties:
    """torch's device properties with ``total_memory`` the kernel's quota; every other attribute is the
    device's, and ``isinstance(p, torch.cuda._CudaDeviceProperties)`` holds (through ``__class__``)."""

    __slots__ = ("_props", "total_memory")

    def __init__(self, props, total_memory: int) -> None:
        self._props, self.total_memory = props, total_memory

    def __getattr__(self, name: str):
        return getattr(self._props, name)

    @property  # type: ignore[misc]  # a read-only __class__, on purpose
    def __class__(self):  # noqa: D105  (isinstance() reads it, as for unittest.mock's spec)
        return type(self._props)

    def __dir__(self):
        return dir(self._props)

    def __repr__(self) -> str:
        import re

        return re.sub(r"total_memory=\d+MB", f"total_memory={self.total_memory // MiB}MB", repr(self._props))


def _torch_mem_get_info(cuda, original, quota: int):
    def mem_get_info(device=None):
        free, total = original(device)
        return fit(free, total, quota, cuda.memory_reserved(device))

    return _mark(mem_get_info, original)


def _torch_get_device_properties(original, quota: int):
    def get_device_properties(device=None):
        props = original(device)
        caller = sys._getframe(1).f_globals.get("__name__") or ""
        if caller == "torch" or caller.startswith("torch."):
            return props
        return DeviceProperties(props, min(quota, props.total_memory))

    return _mark(get_device_properties, original)


def _torch_post(torch) -> None:
    quota = _quota_bytes()
    cuda = getattr(torch, "cuda", None)
    if quota is None or cuda is None or not _one_visible_card():
        return
    done = []
    memory = getattr(cuda, "memory", None)
    original = getattr(cuda, "mem_get_info", None)
    if original is not None and not _wrapped(original) and hasattr(cuda, "memory_reserved"):
        wrapper = _torch_mem_get_info(cuda, original, quota)
        cuda.mem_get_info = wrapper
        if memory is not None and getattr(memory, "mem_get_info", None) is original:
            memory.mem_get_info = wrapper
        done.append("torch.cuda.mem_get_info")
    original = getattr(cuda, "get_device_properties", None)
    if original is not None and not _wrapped(original):
        cuda.get_device_properties = _torch_get_device_properties(original, quota)
        done.append("torch.cuda.get_device_properties")
    if done:
        rep.add_views(done)


# -- CuPy -----------------------------------------------------------------------------------------------


def set_type_attribute(cls, name: str, value) -> bool:
    """``setattr(cls, name, value)``, also on an extension type Python will not change (CuPy's ``Device`` is
    a Cython class): through the type's namespace dict, then ``PyType_Modified`` so lookups see it."""
    try:
        setattr(cls, name, value)
        return True
    except TypeError:
        pass
    import ctypes
    import gc

    namespace = [d for d in gc.get_referents(cls.__dict__) if isinstance(d, dict)]
    if len(namespace) != 1 or name not in namespace[0]:
        return False
    namespace[0][name] = value
    ctypes.pythonapi.PyType_Modified(ctypes.py_object(cls))
    return getattr(cls, name, None) is value


def _cupy_post(cupy) -> None:
    quota = _quota_bytes()
    cuda = getattr(cupy, "cuda", None)
    if quota is None or cuda is None or not _one_visible_card():
        return

    def held() -> int:
        return cupy.get_default_memory_pool().total_bytes()  # the current device's pool

    done = []
    runtime = getattr(cuda, "runtime", None)
    original = getattr(runtime, "memGetInfo", None)
    if runtime is not None and original is not None and not _wrapped(original):

        def memGetInfo():  # noqa: N802  (CuPy's name)
            free, total = original()
            return fit(free, total, quota, held())

        runtime.memGetInfo = _mark(memGetInfo, original)
        done.append("cupy.cuda.runtime.memGetInfo")
    device = getattr(cuda, "Device", None)
    real = getattr(device, "__dict__", {}).get("mem_info")
    if real is not None and not _wrapped(getattr(real, "fget", None)):

        def mem_info(self):
            free, total = real.__get__(self, type(self))
            with self:
                return fit(free, total, quota, held())

        view = property(_mark(mem_info, real), doc="tuple: free and total memory of this kernel's quota, in bytes.")
        if set_type_attribute(device, "mem_info", view):
            done.append("cupy.cuda.Device.mem_info")
    if done:
        rep.add_views(done)


# -- NVML (pynvml, from nvidia-ml-py) ------------------------------------------------------------------


def _in_kernel(pid: int, root: int) -> bool:
    """Whether ``pid`` is the kernel's process or one of its descendants (Linux /proc; elsewhere this one)."""
    for _ in range(64):
        if pid == root or pid == os.getpid():
            return True
        if pid <= 1:
            return False
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            pid = int(stat[stat.rindex(b")") + 2 :].split()[1])  # "pid (comm) state ppid ..."
        except (OSError, ValueError, IndexError):
            return False
    return False


def _kernel_use(lib, handle) -> int | None:
    """Bytes the kernel's processes hold on the card (NVML), or None when NVML does not say."""
    root = rep.env_int(env.ROOT_PID) or os.getpid()
    held: dict = {}
    for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        try:
            procs = getattr(lib, name)(handle)
        except Exception:
            if name.startswith("nvmlDeviceGetCompute"):
                return None
            continue
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            if isinstance(used, int) and _in_kernel(p.pid, root):
                held[p.pid] = max(held.get(p.pid, 0), used)  # a process in both lists is counted once
    return sum(held.values())


def _nvml_memory_info(lib, original, card: str, reservation: int):
    def memory_info(handle, *args, **kwargs):
        info = original(handle, *args, **kwargs)
        if "jupyter_gpushare" in sys.modules:  # the server, broker or CLI: they must see the real card
            return info
        try:
            uuid = lib.nvmlDeviceGetUUID(handle)
        except Exception:
            return info
        if (uuid.decode() if isinstance(uuid, bytes) else uuid) != card:
            return info  # another card: nothing of it is reserved for this kernel
        total = min(reservation, info.total)
        used = _kernel_use(lib, handle)
        free = min(info.free, total if used is None else max(0, total - used))
        info.total, info.free, info.used = total, free, total - free if used is None else used
        if hasattr(info, "reserved"):
            info.reserved = 0  # (v2) the driver's share of the card is not the kernel's
        return info

    return _mark(memory_info, original)


def wrap_nvml(lib) -> list:
    """Wrap ``lib``'s memory info calls (``pynvml``, or a stand-in with its calls) for the kernel's card.
    Returns the names wrapped."""
    card, reserve = os.environ.get(env.CARD_UUID), rep.env_int(env.RESERVE_MIB) or 0
    quota = _quota_bytes()
    if quota is None or not card:
        return []
    done = []
    for name in ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2"):
        original = getattr(lib, name, None)
        if original is not None and not _wrapped(original):
            setattr(lib, name, _nvml_memory_info(lib, original, card, quota + reserve * MiB))
            done.append(f"pynvml.{name}")
    return done


def _pynvml_post(pynvml) -> None:
    done = wrap_nvml(pynvml)
    if done:
        rep.add_views(done)
        rep.write_report()


HOOKS = {
    "torch": (None, _torch_post),
    "cupy": (None, _cupy_post),
    "pynvml": (None, _pynvml_post),
}
