"""A kernel's GPU state moved to host memory and back: the CUDA driver's checkpoint API, or a stand-in for it.

The driver's API (driver 570 and later; ``cuCheckpointProcessLock`` / ``Checkpoint`` / ``Restore`` / ``Unlock``)
acts on another process by its pid: locked, a process's CUDA calls block; checkpointed, its device memory and
contexts are in host memory and the card holds nothing of it; restored and unlocked, it goes on where it was.
The calls run in a helper process (this file, run as a script with the standard library only), so that neither
the server nor the broker ever loads the driver's library or touches a card.

``park`` locks every process, then checkpoints each; a failure undoes what was done (restore, unlock) and raises
CheckpointError with the driver's words. ``resume`` restores and unlocks. On simulated cards a stand-in does the
same to the simulated card's bookkeeping (the processes' use is hidden while parked), so the whole path runs in
CI; ``unavailable()`` says why a host cannot park (no driver, a driver without the API).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Protocol

HELPER_TIMEOUT_S = 120.0  # a park of tens of GiB takes tens of seconds (bench/results/check_park-*)


class CheckpointError(RuntimeError):
    """The driver could not park or resume a process; the message says which and why."""


class Checkpointer(Protocol):
    kind: str  # 'driver' or 'stand-in'

    def unavailable(self) -> str | None:
        """Why kernels cannot be parked on this host; None when they can."""
        ...

    def park(self, pids: list[int], lock_timeout_s: float) -> dict[str, float]:
        """Move the processes' GPU state to host memory; seconds per step. Raises CheckpointError (undone)."""
        ...

    def resume(self, pids: list[int]) -> dict[str, float]:
        """Bring it back and let them run on; seconds per step. Raises CheckpointError."""
        ...


class DriverCheckpoint:
    """The CUDA driver's checkpoint API, called from a helper process."""

    kind = "driver"

    def __init__(self, python: str = sys.executable) -> None:
        self.python = python
        # The driver is asked once, in a thread of its own: the answer is read on the server's IOLoop, which must
        # never wait for a helper process.
        self._unavailable: str | None = "the driver's checkpoint API is being probed"
        self._probing = threading.Thread(target=self._probe, name="gpushare-checkpoint-probe", daemon=True)
        self._probing.start()

    def _probe(self) -> None:
        try:
            self._unavailable = self._helper("probe")["reason"]
        except CheckpointError as e:
            self._unavailable = str(e)

    def unavailable(self) -> str | None:
        return self._unavailable

    def probed(self) -> str | None:
        """``unavailable()`` once the driver has answered (blocks: for the command line and the benchmarks)."""
        self._probing.join(HELPER_TIMEOUT_S)
        return self._unavailable

    def park(self, pids: list[int], lock_timeout_s: float) -> dict[str, float]:
        return self._helper("park", str(int(lock_timeout_s * 1000)), *map(str, pids))["seconds"]

    def resume(self, pids: list[int]) -> dict[str, float]:
        return self._helper("resume", *map(str, pids))["seconds"]

    def _helper(self, *args: str) -> dict:
        try:
            out = subprocess.run([self.python, "-I", "-S", __file__, *args], capture_output=True, text=True,
                                 timeout=HELPER_TIMEOUT_S)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as e:
            raise CheckpointError(f"the checkpoint helper did not answer: {e}") from e
        try:
            reply = json.loads(out.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise CheckpointError(
                f"the checkpoint helper failed: {out.stderr.strip()[-500:] or out.returncode}"
            ) from None
        if not reply.get("ok"):
            raise CheckpointError(str(reply.get("error")))
        return reply


class StandInCheckpoint:
    """Parks on simulated cards: the processes' simulated use is hidden while parked (host/gpu/simulated.py)."""

    kind = "stand-in"

    def __init__(self, backend) -> None:
        self.backend = backend  # a SimulatedBackend

    def unavailable(self) -> str | None:
        return None

    def park(self, pids: list[int], lock_timeout_s: float) -> dict[str, float]:
        self.backend.park(pids)
        return {"lock": 0.0, "checkpoint": 0.0}

    def resume(self, pids: list[int]) -> dict[str, float]:
        self.backend.unpark(pids)
        return {"restore": 0.0, "unlock": 0.0}


class Unavailable:
    """A host where nothing can be parked, and why."""

    kind = "none"

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def unavailable(self) -> str | None:
        return self.reason

    def park(self, pids: list[int], lock_timeout_s: float) -> dict[str, float]:
        raise CheckpointError(self.reason)

    def resume(self, pids: list[int]) -> dict[str, float]:
        raise CheckpointError(self.reason)


def checkpointer_for(backend) -> Checkpointer:
    """What parks kernels on ``backend``'s cards: the driver on real ones, the stand-in on simulated ones."""
    if getattr(backend, "simulated", False) and hasattr(backend, "park"):
        return StandInCheckpoint(backend)
    if getattr(backend, "kind", "") == "nvml":
        return DriverCheckpoint()
    return Unavailable(f"no GPU driver here ({getattr(backend, 'reason', None) or 'no cards'})")


# -- the helper process: ctypes on libcuda -----------------------------------------------------------------------
# Run as `python -I -S checkpoint.py probe | park <lock timeout ms> <pid>... | resume <pid>...`; one JSON line out.


def _driver():  # pragma: no cover - needs an NVIDIA driver (bench/gpu/check_park.py runs it on the GPU)
    import ctypes

    lib = ctypes.CDLL("libcuda.so.1")
    if lib.cuInit(0) != 0:
        raise CheckpointError("the CUDA driver did not initialise (cuInit failed)")
    if not hasattr(lib, "cuCheckpointProcessLock"):
        version = ctypes.c_int()
        lib.cuDriverGetVersion(ctypes.byref(version))
        raise CheckpointError(f"this driver (CUDA {version.value}) has no checkpoint API: it came with driver 570")
    return lib


def _call(lib, name: str, pid: int, args=None) -> None:  # pragma: no cover - as above
    import ctypes

    result = getattr(lib, name)(ctypes.c_int(pid), args)
    if result != 0:
        text = ctypes.c_char_p()
        lib.cuGetErrorName(result, ctypes.byref(text))
        raise CheckpointError(f"{name}({pid}) failed: {(text.value or b'').decode() or result}")


def _park(lib, timeout_ms: int, pids: list[int]) -> dict[str, float]:  # pragma: no cover - as above
    import ctypes

    class LockArgs(ctypes.Structure):
        _fields_ = [("timeoutMs", ctypes.c_uint), ("reserved0", ctypes.c_uint), ("reserved1", ctypes.c_uint64 * 7)]

    locked: list[int] = []
    parked: list[int] = []
    t0 = time.perf_counter()
    try:
        for pid in pids:
            _call(lib, "cuCheckpointProcessLock", pid, ctypes.byref(LockArgs(timeout_ms)))
            locked.append(pid)
        t1 = time.perf_counter()
        for pid in pids:
            _call(lib, "cuCheckpointProcessCheckpoint", pid)
            parked.append(pid)
    except CheckpointError:
        for pid in parked:
            _quietly(lib, "cuCheckpointProcessRestore", pid)
        for pid in locked:
            _quietly(lib, "cuCheckpointProcessUnlock", pid)
        raise
    return {"lock": round(t1 - t0, 3), "checkpoint": round(time.perf_counter() - t1, 3)}


def _resume(lib, pids: list[int]) -> dict[str, float]:  # pragma: no cover - as above
    t0 = time.perf_counter()
    for pid in pids:
        _call(lib, "cuCheckpointProcessRestore", pid)
    t1 = time.perf_counter()
    for pid in pids:
        _call(lib, "cuCheckpointProcessUnlock", pid)
    return {"restore": round(t1 - t0, 3), "unlock": round(time.perf_counter() - t1, 3)}


def _quietly(lib, name: str, pid: int) -> None:  # pragma: no cover - as above
    try:
        _call(lib, name, pid)
    except CheckpointError:
        pass


def main(argv: list[str]) -> int:
    what, rest = (argv[1], argv[2:]) if len(argv) > 1 else ("", [])
    try:
        if what not in ("probe", "park", "resume") or not all(a.isdigit() for a in rest):
            raise CheckpointError("usage: checkpoint.py probe | park <lock timeout ms> <pid>... | resume <pid>...")
        try:
            lib = _driver()
        except OSError as e:
            raise CheckpointError(f"no NVIDIA driver library here ({e})") from e
        if what == "probe":
            reply: dict = {"ok": True, "reason": None}
        elif what == "park":
            reply = {"ok": True, "seconds": _park(lib, int(rest[0]), [int(p) for p in rest[1:]])}
        else:
            reply = {"ok": True, "seconds": _resume(lib, [int(p) for p in rest])}
    except CheckpointError as e:
        reply = {"ok": False, "error": str(e)} if what != "probe" else {"ok": True, "reason": str(e)}
    sys.stdout.write(json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)  # the pids are the host's; the helper sees every card
    sys.exit(main(sys.argv))
