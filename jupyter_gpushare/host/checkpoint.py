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
import queue
import signal
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

    def close(self) -> None:
        """Nothing more will be parked or resumed (the server stops)."""
        ...


class DriverCheckpoint:
    """The CUDA driver's checkpoint API, called from one helper process that lives as long as this object: the
    driver is attached once (about 0.1 s a call saved on an H200 with driver 580: bench/README.md), and the helper
    knows what it parked. Calls are one at a time. A call is never killed midway (that desyncs the driver:
    criu#2547); one that does not answer within HELPER_TIMEOUT_S is left to finish, and undone (a park), and a new
    helper serves the next call."""

    kind = "driver"

    def __init__(self, python: str = sys.executable) -> None:
        self.python = python
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._replies: queue.Queue[str | None] = queue.Queue()  # (the current helper's)
        # The driver is asked once, in a thread of its own: the answer is read on the server's IOLoop, which must
        # never wait for a helper process.
        self._unavailable: str | None = "the driver's checkpoint API is being probed"
        self._probing = threading.Thread(target=self._probe, name="gpushare-checkpoint-probe", daemon=True)
        self._probing.start()

    def _probe(self) -> None:
        try:
            self._unavailable = self._ask({"op": "probe"})["reason"]
        except CheckpointError as e:
            self._unavailable = str(e)
        if self._unavailable is not None:
            self.close()  # (nothing to park here: no helper waits)

    def unavailable(self) -> str | None:
        return self._unavailable

    def probed(self) -> str | None:
        """``unavailable()`` once the driver has answered (blocks: for the command line and the benchmarks)."""
        self._probing.join(HELPER_TIMEOUT_S)
        return self._unavailable

    def park(self, pids: list[int], lock_timeout_s: float) -> dict[str, float]:
        return self._ask({"op": "park", "timeout_ms": int(lock_timeout_s * 1000), "pids": pids})["seconds"]

    def resume(self, pids: list[int]) -> dict[str, float]:
        return self._ask({"op": "resume", "pids": pids})["seconds"]

    def states(self, pids: list[int]) -> dict[int, str]:
        """The driver's word on each process: running, locked, checkpointed, failed (or why it cannot say)."""
        return {int(pid): state for pid, state in self._ask({"op": "state", "pids": pids})["states"].items()}

    def close(self) -> None:
        """The helper ends once its call (if any) is done; a process it parked and nobody resumed is ended then
        (its GPU state cannot outlive the server that knew of it)."""
        with self._lock:
            self._let_go()

    def _let_go(self, abandon: bool = False) -> None:
        """The helper's input ends (it ends what it parked, as when the server dies); ``abandon``: a call it still
        runs was given up, so it undoes that call and hands the rest over (``serve``'s ``let-go``)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.stdin is not None:
            try:
                if abandon:
                    proc.stdin.write(json.dumps({"op": "let-go"}) + "\n")
                proc.stdin.close()
            except OSError:
                pass

    def _ask(self, request: dict) -> dict:
        with self._lock:
            proc = self._proc if self._proc is not None and self._proc.poll() is None else self._spawn()
            try:
                assert proc.stdin is not None
                proc.stdin.write(json.dumps(request) + "\n")
                proc.stdin.flush()
                line = self._replies.get(timeout=HELPER_TIMEOUT_S)
            except (OSError, ValueError) as e:
                self._let_go()
                raise CheckpointError(f"the checkpoint helper ended ({e}); the next call starts a new one") from e
            except queue.Empty:
                self._let_go(abandon=True)
                raise CheckpointError(
                    f"the checkpoint helper did not answer within {HELPER_TIMEOUT_S:.0f} s; it was left to finish "
                    "(a checkpoint is never stopped midway), and the next call starts a new one"
                ) from None
            if line is None:
                self._let_go()
                raise CheckpointError(f"the checkpoint helper ended (exit status {proc.wait()})")
        try:
            reply = json.loads(line)
        except ValueError:
            raise CheckpointError(f"the checkpoint helper said something else than an answer: {line[:200]!r}") from None
        if not reply.get("ok"):
            raise CheckpointError(str(reply.get("error")))
        return reply

    def _spawn(self) -> subprocess.Popen:
        """A new helper (its own session: a Ctrl-C meant for the server never stops a checkpoint midway)."""
        try:
            proc = subprocess.Popen([self.python, "-I", "-S", __file__, "serve"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
        except OSError as e:
            raise CheckpointError(f"the checkpoint helper could not start: {e}") from e
        replies: queue.Queue[str | None] = queue.Queue()
        self._replies = replies
        threading.Thread(target=_read_lines, args=(proc.stdout, replies), name="gpushare-checkpoint-helper",
                         daemon=True).start()  # fmt: skip
        self._proc = proc
        return proc


def _read_lines(out, replies: queue.Queue) -> None:
    """The helper's answers, a line each, then None at its end."""
    try:
        for line in out:
            replies.put(line)
    finally:
        replies.put(None)


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

    def close(self) -> None:
        pass


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

    def close(self) -> None:
        pass


def checkpointer_for(backend) -> Checkpointer:
    """What parks kernels on ``backend``'s cards: the driver on real ones, the stand-in on simulated ones."""
    if getattr(backend, "simulated", False) and hasattr(backend, "park"):
        return StandInCheckpoint(backend)
    if getattr(backend, "kind", "") == "nvml":
        return DriverCheckpoint()
    return Unavailable(f"no GPU driver here ({getattr(backend, 'reason', None) or 'no cards'})")


# -- the helper process: ctypes on libcuda -----------------------------------------------------------------------
# Run as `python -I -S checkpoint.py serve`: one JSON request a line in ({"op": "probe" | "park" | "resume" |
# "state", "pids": [...], "timeout_ms": ...}), one JSON answer a line out, until its input ends. Or one call in a
# fresh process (an admin's last resort for a kernel whose server is gone; the benchmarks' "one process a call"):
# `checkpoint.py park <lock timeout ms> <pid>... | resume <pid>... | state <pid>...`.

STATES = {0: "running", 1: "locked", 2: "checkpointed", 3: "failed"}  # CUprocessState


def _driver():  # pragma: no cover - needs an NVIDIA driver (bench/gpu/check_park.py runs it on the GPU)
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise CheckpointError(f"no NVIDIA driver library here ({e})") from e
    if lib.cuInit(0) != 0:
        raise CheckpointError("the CUDA driver did not initialise (cuInit failed)")
    if not hasattr(lib, "cuCheckpointProcessLock"):
        version = ctypes.c_int()
        lib.cuDriverGetVersion(ctypes.byref(version))
        raise CheckpointError(f"this driver (CUDA {version.value}) has no checkpoint API: it came with driver 570")
    return lib


def _call(lib, name: str, pid: int, *args) -> None:  # pragma: no cover - as above
    import ctypes

    result = getattr(lib, name)(ctypes.c_int(pid), *(args or (None,)))
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


def _states(lib, pids: list[int]) -> dict[str, str]:  # pragma: no cover - as above
    import ctypes

    out = {}
    for pid in pids:
        state = ctypes.c_int(-1)
        try:
            _call(lib, "cuCheckpointProcessGetState", pid, ctypes.byref(state))
            out[str(pid)] = STATES.get(state.value, f"state {state.value}")
        except CheckpointError as e:
            out[str(pid)] = f"unknown: {e}"
    return out


def _quietly(lib, name: str, pid: int) -> None:  # pragma: no cover - as above
    try:
        _call(lib, name, pid)
    except CheckpointError:
        pass


def _started(pid: int) -> str | None:
    """The process's start time (/proc/PID/stat), to tell it from a later process with its pid. (host/procs.py reads
    the same with psutil; this helper runs on the standard library alone.)"""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _answer(lib, request: object, parked: dict[int, str | None]) -> dict:
    """One request's answer (``parked``: what this helper parked and nobody resumed, with each start time)."""
    if not isinstance(request, dict) or request.get("op") not in ("probe", "park", "resume", "state"):
        raise CheckpointError("the request must be an object whose op is probe, park, resume or state")
    pids = request.get("pids", [])
    if not isinstance(pids, list) or not all(isinstance(p, int) and not isinstance(p, bool) and p > 0 for p in pids):
        raise CheckpointError("pids must be a list of process ids")
    if request["op"] == "probe":
        return {"ok": True, "reason": None}
    if request["op"] == "state":
        return {"ok": True, "states": _states(lib, pids)}
    if request["op"] == "resume":
        seconds = _resume(lib, pids)
        for pid in pids:
            parked.pop(pid, None)
        return {"ok": True, "seconds": seconds}
    timeout_ms = request.get("timeout_ms")
    if not isinstance(timeout_ms, int) or isinstance(timeout_ms, bool) or not 0 < timeout_ms <= 600_000:
        raise CheckpointError("timeout_ms must be a whole number of milliseconds, at most 600000")
    seconds = _park(lib, timeout_ms, pids)
    parked.update((pid, _started(pid)) for pid in pids)
    return {"ok": True, "seconds": seconds}


def _let_go(lib, last: list[int], parked: dict[int, str | None]) -> None:
    """The server stopped waiting for this helper's last call (``DriverCheckpoint``, past HELPER_TIMEOUT_S), and
    said the kernel runs on: a park that finished meanwhile is undone. The other processes it parked stay parked:
    the server knows them, and its next helper resumes them."""
    if lib is not None and last:
        for name in ("cuCheckpointProcessRestore", "cuCheckpointProcessUnlock"):
            for pid in last:
                _quietly(lib, name, pid)
    parked.clear()


def serve(lines, write) -> None:
    """Answer each request line until the input ends; then end every process this helper parked and nobody
    resumed: its server is gone, its GPU state lives in the driver, and nothing could bring it back or free it
    (Jupyter's kernels of a dead server are not taken up again). A ``let-go`` line instead ends the helper at
    once, nothing ended (``_let_go``)."""
    lib, why_not = None, None
    try:
        lib = _driver()
    except CheckpointError as e:
        why_not = str(e)
    parked: dict[int, str | None] = {}
    last: list[int] = []  # the processes the last park parked
    for line in lines:
        try:
            request = json.loads(line)
            if isinstance(request, dict) and request.get("op") == "let-go":
                _let_go(lib, last, parked)
                return
            if why_not is not None:
                reply = (
                    {"ok": True, "reason": why_not} if request.get("op") == "probe" else {"ok": False, "error": why_not}
                )
            else:
                before = set(parked)
                reply = _answer(lib, request, parked)
                last = [pid for pid in parked if pid not in before]
        except (CheckpointError, ValueError, AttributeError) as e:
            reply = {"ok": False, "error": str(e)}
        write(json.dumps(reply) + "\n")
    for pid, started in parked.items():
        if started is not None and _started(pid) == started:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
            sys.stderr.write(
                f"jupyter-gpushare: the checkpoint helper's server is gone; parked kernel process {pid} was ended "
                "(its GPU state could not be kept without its server).\n"
            )


def main(argv: list[str]) -> int:
    what, rest = (argv[1], argv[2:]) if len(argv) > 1 else ("", [])
    if what == "serve":

        def write(text: str) -> None:
            sys.stdout.write(text)
            sys.stdout.flush()

        serve(sys.stdin, write)
        return 0
    try:
        if what not in ("park", "resume", "state") or not rest or not all(a.isdigit() for a in rest):
            raise CheckpointError(
                "usage: checkpoint.py serve | park <lock timeout ms> <pid>... | resume|state <pid>..."
            )
        request: dict = {"op": what, "pids": [int(p) for p in rest[what == "park" :]]}
        if what == "park":
            request["timeout_ms"] = int(rest[0])
        reply = _answer(_driver(), request, {})
    except CheckpointError as e:
        reply = {"ok": False, "error": str(e)}
    sys.stdout.write(json.dumps(reply) + "\n")
    return 0 if reply["ok"] else 1


if __name__ == "__main__":
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)  # the pids are the host's; the helper sees every card
    sys.exit(main(sys.argv))
