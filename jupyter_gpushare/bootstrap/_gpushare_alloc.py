"""Inside the kernel: what each framework's allocator had in use at its peak, for quotas learned from history.

Standard library only, Python >= 3.9 (see ``_gpushare_boot``). The server sizes a notebook's learned quota
from these figures, not from NVML's (an allocator grabs more than it uses; ``history.py`` says why). Read
after every cell the notebook runs (IPython's ``post_run_cell``), after an out-of-memory error and when the
process exits, and kept in the report: ``alloc`` (MiB by framework) and ``oom`` (the framework that ran out of
memory, if one did). Each figure is the framework's own count, read only once the framework uses a GPU (reading
it must never be what starts one):

- TensorFlow: ``tf.config.experimental.get_memory_info('GPU:0')['peak']``, bytes in use at the peak;
- PyTorch: ``torch.cuda.max_memory_allocated()``;
- JAX: ``peak_bytes_in_use`` of its GPU device's ``memory_stats()``;
- CuPy: the highest ``total_bytes()`` of its default pool seen at a reading (CuPy keeps no peak; its pool keeps
  freed blocks, so the total at a cell's end is at least what the cell had in use).
"""

from __future__ import annotations

import atexit
import sys

import _gpushare_report as rep

MiB = 2**20
_watching: set = set()  # what is set up: "ipython", "atexit"


def _tf_peak() -> int | None:
    tf = sys.modules["tensorflow"]
    context = sys.modules.get("tensorflow.python.eager.context")
    ctx = context.context() if context is not None else None
    if getattr(ctx, "_context_handle", None) is None or not tf.config.list_physical_devices("GPU"):
        return None  # TensorFlow has not started its runtime: get_memory_info would start it
    return tf.config.experimental.get_memory_info("GPU:0")["peak"]


def _torch_peak() -> int | None:
    torch = sys.modules["torch"]
    return torch.cuda.max_memory_allocated(0) if torch.cuda.is_initialized() else None


def _jax_peak() -> int | None:
    bridge = sys.modules.get("jax._src.xla_bridge")
    if not getattr(bridge, "_backends", None):
        return None  # no backend yet: listing devices would start one
    for device in sys.modules["jax"].local_devices():
        if device.platform == "gpu":
            return (device.memory_stats() or {}).get("peak_bytes_in_use")
    return None


def _cupy_peak() -> int | None:
    return sys.modules["cupy"].get_default_memory_pool().total_bytes()  # update keeps the highest seen


_READERS = {"tensorflow": _tf_peak, "torch": _torch_peak, "jax": _jax_peak, "cupy": _cupy_peak}


def peaks() -> dict:
    """MiB in use at the peak, by framework, for the frameworks this process imported and uses on a GPU."""
    out = {}
    for name, read in _READERS.items():
        if name not in sys.modules:
            continue
        try:
            got = read()
        except Exception:  # a framework's API that changed, or a device that went away: no figure
            continue
        if isinstance(got, int) and got > 0:
            out[name] = -(-got // MiB)
    return out


def trim() -> list:
    """Give the memory the frameworks' allocators keep cached, unused, back to the driver; the frameworks that did.
    The server asks an idle kernel for this before it parks it: the park then moves only what is in use (4 GiB of
    PyTorch tensors with their cache kept took twice as long to park on the H200, six times on the H100:
    bench/README.md). Only frameworks that already use a GPU; reading never starts one. TensorFlow and JAX
    have no such call. Names only the frameworks that gave at least 1 MiB back (the server then waits for a new
    reading of the card before it parks)."""
    done = []
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        before = torch.cuda.memory_reserved()
        torch.cuda.empty_cache()
        if before - torch.cuda.memory_reserved() >= MiB:
            done.append("torch")
    cupy = sys.modules.get("cupy")
    if cupy is not None and cupy.get_default_memory_pool().free_bytes() >= MiB:
        cupy.get_default_memory_pool().free_all_blocks()
        done.append("cupy")
    simulated = sys.modules.get("gpushare_simulate")
    if simulated is not None and simulated.trim():
        done.append("simulated")
    return done


def update(oom: str | None = None) -> None:
    """Read the figures now (and note ``oom``, the framework that ran out of memory); write the report if they
    changed."""
    got = peaks()
    with rep.LOCK:
        before = (dict(rep.STATE.get("alloc", {})), rep.STATE.get("oom"))
        alloc = {**before[0], **{k: max(v, before[0].get(k, 0)) for k, v in got.items()}}
        rep.STATE["alloc"] = alloc
        if oom:
            rep.STATE["oom"] = oom
        changed = (alloc, rep.STATE.get("oom")) != before
    if changed:
        rep.write_report()


def _after_cell(*_args) -> None:
    try:
        update()
    except Exception:
        pass


def watch() -> None:
    """Read the figures after every cell and at exit, from now on (called when a framework is imported)."""
    if "atexit" not in _watching:
        _watching.add("atexit")
        atexit.register(_after_cell)
    if "ipython" in _watching:
        return
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    shell = get() if get else None
    events = getattr(shell, "events", None)
    if events is not None:
        try:
            events.register("post_run_cell", _after_cell)
            _watching.add("ipython")
        except Exception as e:
            rep.warn(f"GPU memory figures for learned quotas are read only at exit: {e}")
