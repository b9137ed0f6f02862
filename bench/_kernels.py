"""A server's kernel processes, as the benchmarks count them (its warm pool filled, a framework loaded)."""

from __future__ import annotations

import psutil


def kernels_with(server_pid: int, library: str | None = None) -> int:
    """How many of the server's child processes are kernels, each with ``library`` (e.g. libtorch) loaded if named.
    A child that ends while it is read is not counted."""
    found = 0
    for child in psutil.Process(server_pid).children():
        try:
            if "ipykernel" in " ".join(child.cmdline()) and (
                library is None or any(library in m.path for m in child.memory_maps())
            ):
                found += 1
        except psutil.Error:
            pass
    return found
