"""Pretend GPU memory use on a simulated card (a machine without a GPU), to try the quota flow.

In a kernel started on a simulated card::

    import gpushare_simulate
    gpushare_simulate.use("1.5GiB")   # this process now "uses" 1.5 GiB: the sidebar shows it, the policies judge it
    gpushare_simulate.use(0)          # and now nothing
    gpushare_simulate.use("1GiB", cached="2GiB")  # 1 GiB in use and 2 GiB an allocator keeps: 3 GiB on the card

Cached memory is what a framework's allocator keeps for later (PyTorch's, CuPy's pools): the server asks a kernel
to give it back before it parks it (``_gpushare_alloc.trim``), and on a simulated card that drops the cached part.

Nothing is allocated: the server's simulated card reads what each kernel process says it uses (a small file
next to the kernel's reports) and shows it as measured use. On a real GPU this module refuses to run.
Standard library only (the kernel's environment may not have jupyter-gpushare).
"""

from __future__ import annotations

import os
import re
import sys
import types

import _gpushare_env as env

_UNITS = {"": 1, "m": 1, "mib": 1, "mb": 1, "g": 1024, "gib": 1024, "gb": 1024}


def _mib(size: object) -> int:
    if isinstance(size, int) and not isinstance(size, bool):
        return size
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", str(size), re.ASCII)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"{size!r} is not a size; write e.g. '1.5GiB' or 512 (MiB).")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


_cached = {"mib": 0, "used": 0}  # this process's simulated allocator cache, and what it uses besides


def use(size: object, cached: object = 0) -> None:
    """Say that this process uses ``size`` of its simulated card ('1.5GiB', '512MiB', or MiB as an int), and keeps
    ``cached`` more in an allocator's cache (given back by ``trim``). In a kernel in line this is its first GPU use:
    the cell waits for the grant, saying its place, as ``import torch`` does, and goes on once the card is its."""
    waiting = sys.modules.get("_gpushare_wait")
    if os.environ.get(env.SIMULATED) != "1" and os.environ.get(env.MODE) == "queued" and waiting is not None:
        waiting.wait_for_gpu(types.SimpleNamespace(__name__=__name__))  # (GpuWaitEnded if its wait ends without)
    if os.environ.get(env.SIMULATED) != "1":
        raise RuntimeError("gpushare_simulate works only in a kernel on a simulated card; this one is not.")
    mib, kept = _mib(size), _mib(cached)
    if not (0 <= mib <= 1 << 30 and 0 <= kept <= 1 << 30):
        raise ValueError(f"{size!r} and {cached!r} must be sizes a card could hold.")
    _cached.update(mib=kept, used=mib)
    _write(mib + kept)


def trim() -> int:
    """Give the simulated cache back, as ``torch.cuda.empty_cache()`` does; the MiB given back."""
    kept = _cached["mib"]
    if kept:
        _cached["mib"] = 0
        _write(_cached["used"])
    return kept


def _write(mib: int) -> None:
    path = os.path.join(os.environ[env.REPORT_DIR], f"{os.environ[env.KERNEL_ID]}.{os.getpid()}.simulated")
    with open(path + ".tmp", "w", encoding="ascii") as f:
        f.write(f"{mib} {os.environ.get(env.CARD_INDEX, '0')}")
    os.replace(path + ".tmp", path)
