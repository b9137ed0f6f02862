"""The checkpoint helper (host/checkpoint.py) as the server runs it: one process for the server's life, one JSON
line in and out per call, and nothing parked left behind when its server is gone. There is no NVIDIA driver here:
the helper's own answers on such a host are tested as they are, and its bookkeeping of what it parked with a
driver that answers every call with success (``Accepting``); the driver's real calls run on the GPU
(bench/gpu/check_park_faults.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from jupyter_gpushare.host import checkpoint
from jupyter_gpushare.host.checkpoint import CheckpointError, DriverCheckpoint


class Accepting:
    """A driver library whose every checkpoint call succeeds, and that records them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def __getattr__(self, name: str):
        def call(pid, *_):
            self.calls.append((name, pid.value))
            return 0

        return call


def served(requests: list, monkeypatch) -> tuple[list[dict], Accepting]:
    lib = Accepting()
    monkeypatch.setattr(checkpoint, "_driver", lambda: lib)
    out: list[str] = []
    checkpoint.serve([json.dumps(r) if not isinstance(r, str) else r for r in requests], out.append)
    return [json.loads(line) for line in out], lib


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_process_parked_and_never_resumed_is_ended_when_the_server_is_gone(monkeypatch):
    """The helper's input ends (its server died, or let it go): what it parked and nobody resumed is ended, since
    nothing could bring its GPU state back; a process it resumed runs on."""
    parked, resumed = sleeper(), sleeper()
    try:
        replies, lib = served(
            [
                {"op": "park", "timeout_ms": 5000, "pids": [parked.pid, resumed.pid]},
                {"op": "resume", "pids": [resumed.pid]},
            ],
            monkeypatch,
        )
        assert [r["ok"] for r in replies] == [True, True]
        assert ("cuCheckpointProcessCheckpoint", parked.pid) in lib.calls
        assert parked.wait(10) == -9  # ended by the helper
        time.sleep(0.2)
        assert resumed.poll() is None  # runs on
    finally:
        for p in (parked, resumed):
            p.kill()
            p.wait()


def test_a_park_the_server_gave_up_on_is_undone_and_the_others_stay_parked(monkeypatch):
    """The server stopped waiting for a park (past HELPER_TIMEOUT_S) and told its kernel it runs on: when the helper
    hears ``let-go``, it restores and unlocks what that park parked, ends nothing, and leaves the kernels parked
    before it to the server's next helper."""
    before, given_up = sleeper(), sleeper()
    try:
        replies, lib = served(
            [
                {"op": "park", "timeout_ms": 5000, "pids": [before.pid]},
                {"op": "park", "timeout_ms": 5000, "pids": [given_up.pid]},
                {"op": "let-go"},
                {"op": "probe"},  # (not read: the helper ended at let-go)
            ],
            monkeypatch,
        )
        assert len(replies) == 2
        undone = [call for call in lib.calls if call[0] in ("cuCheckpointProcessRestore", "cuCheckpointProcessUnlock")]
        assert undone == [("cuCheckpointProcessRestore", given_up.pid), ("cuCheckpointProcessUnlock", given_up.pid)]
        time.sleep(0.2)
        assert before.poll() is None and given_up.poll() is None
    finally:
        for p in (before, given_up):
            p.kill()
            p.wait()


def test_a_later_process_with_a_parked_ones_pid_is_not_ended(monkeypatch):
    """A pid is checked against the start time it had when parked: a process that took it later is left alone."""
    later = sleeper()
    starts = iter(["when it was parked", "a later process's"])
    monkeypatch.setattr(checkpoint, "_started", lambda pid: next(starts))
    try:
        replies, _ = served([{"op": "park", "timeout_ms": 5000, "pids": [later.pid]}], monkeypatch)
        assert replies[0]["ok"]
        time.sleep(0.2)
        assert later.poll() is None
    finally:
        later.kill()
        later.wait()


@pytest.mark.parametrize(
    "request_, error",
    [
        ("not json", "Expecting value"),
        ({"op": "unlock-everything"}, "op is probe, park, resume or state"),
        ({"op": "resume", "pids": "1"}, "pids must be a list"),
        ({"op": "resume", "pids": [True]}, "pids must be a list"),
        ({"op": "resume", "pids": [-1]}, "pids must be a list"),
        ({"op": "park", "pids": [1]}, "timeout_ms must be"),
        ({"op": "park", "pids": [1], "timeout_ms": 10**9}, "timeout_ms must be"),
        ([1, 2], "must be an object"),
    ],
)
def test_a_bad_request_gets_a_clear_refusal_and_the_helper_goes_on(request_, error, monkeypatch):
    replies, lib = served([request_, {"op": "probe"}], monkeypatch)
    assert replies[0] == {"ok": False, "error": replies[0]["error"]} and error in replies[0]["error"]
    assert replies[1] == {"ok": True, "reason": None} and lib.calls == []


def test_without_a_driver_the_helper_says_why_and_nothing_waits():
    """This host has no NVIDIA driver: the probe says so in the driver's words, each call is refused with them,
    and no helper process stays."""
    checkpointer = DriverCheckpoint()
    reason = checkpointer.probed()
    assert reason is not None and "libcuda" in reason
    assert checkpointer._proc is None
    with pytest.raises(CheckpointError, match="libcuda"):
        checkpointer.park([1], 1.0)
    checkpointer.close()


def test_one_helper_serves_every_call_and_a_dead_one_is_replaced():
    """The driver is attached once: one helper process answers call after call; one that died is replaced at the
    next call, and the call it died in says so."""
    checkpointer = DriverCheckpoint()
    checkpointer.probed()
    for _ in range(3):
        with pytest.raises(CheckpointError, match="libcuda"):
            checkpointer.states([1])
    first = checkpointer._proc
    assert first is not None and first.poll() is None
    with pytest.raises(CheckpointError, match="libcuda"):
        checkpointer.states([1])
    assert checkpointer._proc is first
    first.kill()
    first.wait()
    with pytest.raises(CheckpointError):
        checkpointer.states([1])  # (the dead one's end, or the new one's answer)
    with pytest.raises(CheckpointError, match="libcuda"):
        checkpointer.states([1])
    assert checkpointer._proc is not None and checkpointer._proc is not first
    proc = checkpointer._proc
    checkpointer.close()
    assert proc.wait(10) == 0  # its input ended: it ends
