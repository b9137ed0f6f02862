"""Parking's choice of kernels, on its own (server/parking.py): which idle kernels are candidates. The moves
themselves run through a real server in test_parking.py."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from clocks import SteppedClock

from jupyter_gpushare.core.policy import ParkRules
from jupyter_gpushare.host.checkpoint import Unavailable
from jupyter_gpushare.server.clock import SYSTEM
from jupyter_gpushare.server.parking import Parking
from jupyter_gpushare.server.sampler import Readings


def _parking(clock=SYSTEM) -> Parking:
    async def blocking(fn, *args):
        return fn(*args)

    rules = ParkRules(after_s=5.0, frameworks=("torch",))
    services = SimpleNamespace(readings=Readings())  # (no move is made here: no ledger, line or holding is used)
    parts = (None, None, None, services)
    return Parking(SimpleNamespace(records={}), parts, Unavailable("not in this test"), rules, blocking, clock)


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


def test_a_touched_kernel_counts_as_idle_again_after_park_after_of_the_parts_clock():
    """The idle time since a cell was sent is kept on the clock the manager gives its parts (server/clock.py), so
    stepping that clock, and nothing else, makes the kernel a candidate."""
    clock = SteppedClock()
    parking = _parking(clock)
    rec, usage = _kernel()
    parking.touch("k1")
    clock.step(4.9)
    parking.consider(rec, usage, 60.0, ["torch"])
    assert parking._candidates == []
    clock.step(0.2)
    parking.consider(rec, usage, 60.0, ["torch"])
    assert [c[1].kernel_id for c in parking._candidates] == ["k1"]


def _waiting_line_parking(after_s: float) -> Parking:
    """A parking whose checkpoints can run, in a registry with a sampler's readings (nothing is parked here: the
    candidates are asked for no move)."""

    async def blocking(fn, *args):
        return fn(*args)

    line = SimpleNamespace(turns=0, turns_done=0, room_freed=lambda: None)
    services = SimpleNamespace(readings=Readings())
    checkpointer = SimpleNamespace(unavailable=lambda: None)
    parts = (None, line, None, services)
    return Parking(
        SimpleNamespace(records={}), parts, checkpointer, ParkRules(after_s=after_s, frameworks=("torch",)), blocking
    )


async def test_a_kernel_not_yet_idle_long_enough_is_judged_again_when_it_will_be_not_at_the_next_interval():
    """A kernel whose cell ended 0.4 s ago, with parks after 1 s and a kernel in line: a reading is asked for when it
    will have been idle 1 s (its park is decided then), not left to the sampler's interval, which put up to a
    second more into every wave change of a class (bench/README.md). A busy kernel, or nobody in line, asks for
    nothing."""
    parking = _waiting_line_parking(after_s=1.0)
    wanted = parking.services.readings.wanted
    rec, usage = _kernel()
    parking.consider(rec, usage, 60.0, ["torch"], execution="busy")
    parking.decide(4096)
    parking.consider(rec, usage, 0.4, ["torch"])
    parking.decide(0)  # nobody waits
    await asyncio.sleep(0.9)
    assert not wanted.is_set()

    t0 = time.monotonic()
    parking.consider(rec, usage, 0.4, ["torch"])
    assert parking._candidates == []
    parking.decide(4096)
    while not wanted.is_set() and time.monotonic() - t0 < 3:
        await asyncio.sleep(0.01)
    assert 0.5 <= time.monotonic() - t0 < 2.0, time.monotonic() - t0  # (at 0.6 s; the rest is a loaded machine)


async def test_a_move_just_done_counts_as_room_coming_only_until_the_line_has_had_a_turn():
    """A park's reservation goes to the line, which grants it in its next turn: until that turn is done it counts as
    room coming (else a second kernel would be parked for the same waiter). Then no longer: a fixed second of it
    had a waiter whose room was already granted hold up the next park by up to two seconds (bench/README.md)."""
    parking = _waiting_line_parking(after_s=1.0)
    line = parking.line
    started: list[str] = []

    async def park(rec, pids, used, pid):
        started.append(rec.kernel_id)

    parking._park = park
    line.turns = 3  # a turn under way as the move is done (it may have read the ledger before the release)
    parking._room_freed(4096)
    rec, usage = _kernel()
    line.turns_done = 3
    parking.consider(rec, usage, 60.0, ["torch"])
    parking.decide(4096)
    await asyncio.sleep(0)
    assert started == []  # the room given back is still coming
    line.turns, line.turns_done = 4, 4  # a turn begun after the move is done
    parking.consider(rec, usage, 60.0, ["torch"])
    parking.decide(4096)
    await asyncio.sleep(0.01)
    assert started == ["k1"]
