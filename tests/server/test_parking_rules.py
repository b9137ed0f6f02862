"""Parking's choice of kernels, on its own (server/parking.py): which idle kernels are candidates. The moves
themselves run through a real server in test_parking.py."""

from __future__ import annotations

from types import SimpleNamespace

from jupyter_gpushare.core.policy import ParkRules
from jupyter_gpushare.host.checkpoint import Unavailable
from jupyter_gpushare.server.parking import Parking


def _parking() -> Parking:
    async def blocking(fn, *args):
        return fn(*args)

    rules = ParkRules(after_s=5.0, frameworks=("torch",))
    return Parking(SimpleNamespace(records={}), Unavailable("not in this test"), rules, blocking)


def _kernel(kid: str = "k1"):
    rec = SimpleNamespace(kernel_id=kid, state="running", lease=SimpleNamespace(reserved_mib=4096), parked=None)
    usage = SimpleNamespace(used_mib=1024, pid=4242, processes=[SimpleNamespace(pid=4242, used_mib=1024)])
    return rec, usage


def test_an_idle_kernel_is_a_candidate_and_a_busy_or_short_idle_one_is_not():
    parking = _parking()
    rec, usage = _kernel()
    parking.consider(rec, usage, 4.9, ["torch"])
    parking.consider(rec, usage, 60.0, ["torch", "jax"])  # a framework off the list
    assert parking._candidates == []
    parking.consider(rec, usage, 60.0, ["torch"])
    assert [c[1].kernel_id for c in parking._candidates] == ["k1"]


def test_a_kernel_sent_a_cell_or_just_resumed_is_not_a_candidate_whatever_the_last_reading_said():
    """The reading that says 'idle for 60 s' can predate the cell that was just sent to the kernel (or its resume,
    whose held cell runs next): parking it then would freeze a running cell (seen on the H200, 2026-11-26)."""
    parking = _parking()
    rec, usage = _kernel()
    parking.touch("k1")
    parking.consider(rec, usage, 60.0, ["torch"])
    assert parking._candidates == []
