"""The line's turns (server/line.py), on their own: room freed while a turn runs brings the next turn at once, and
each turn is counted begun and done (parking.py counts a move's room as coming until a turn begun after it is
done). The grants themselves run through a real server in test_waiting.py and test_parking.py."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

from jupyter_gpushare.ledger.leases import Waiting
from jupyter_gpushare.server.line import QUEUE_POLL_S, Line, Wait


class LedgerThread:
    """The ledger's one thread, as the server's LedgerWorker runs it: each job in turn."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(1)

    async def run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def must(self, call):
        return call(None)


def line_of(reserve) -> Line:
    """A line of ten kernels (k0..k9) that anyone wants, whose reserves run ``reserve`` on the ledger's thread."""
    kernels = SimpleNamespace(
        records={f"k{i}": object() for i in range(10)}, card_home=lambda kid: None, reserve=reserve
    )
    starts = SimpleNamespace(may_grant=lambda kid: True, watchers=lambda kid: None)
    return Line(kernels, LedgerThread(), starts, 60.0, logging.getLogger("test"))


async def test_room_freed_during_a_turn_brings_the_next_turn_at_once():
    line = Line(SimpleNamespace(records={}), SimpleNamespace(), SimpleNamespace(), 60.0, logging.getLogger("test"))
    line.queue.waits["k1"] = SimpleNamespace()  # someone waits: the line is served
    began: list[float] = []
    seen: list[tuple[int, int]] = []

    async def turn() -> None:
        began.append(time.monotonic())
        seen.append((line.turns, line.turns_done))
        await asyncio.sleep(0.05)
        if len(began) == 1:
            line.room_freed()  # a park done while this turn asks the ledger
        if len(began) == 3:
            line.queue.waits.clear()  # nobody waits any more: the line stops

    line._serve_once = turn
    await asyncio.wait_for(line._serve(), 5)
    assert seen == [(1, 0), (2, 1), (3, 2)] and line.turns_done == 3
    assert began[1] - began[0] < 0.05 + QUEUE_POLL_S / 2  # at once, not at the next poll
    assert began[2] - began[1] >= QUEUE_POLL_S * 0.9  # nothing freed: the poll


async def test_a_read_of_the_ledger_during_a_turn_waits_for_one_reserve_not_the_whole_turn():
    """A turn asks the ledger for each kernel in line on a job of its own: a read (a snapshot's, a request's) that
    comes meanwhile runs after the reserve under way, not after all of them. One job for the whole turn made a
    status request wait 17-25 s with 60 kernels on 2 cores (tests/server/test_class_queue.py's class)."""
    order: list[str] = []

    def reserve(ledger, request, wait, home):
        order.append(f"reserve {request.label}")
        time.sleep(0.01)
        return "waiting"

    line = line_of(reserve)
    loop = asyncio.get_running_loop()
    waits = [Wait(SimpleNamespace(kernel_id=f"k{i}", label=i), float(i), loop.create_future()) for i in range(10)]
    line.queue.due = lambda watchers: (waits, [])
    line._answer = lambda wait, got: order.append(f"answer {wait.request.label}")
    turn = asyncio.ensure_future(line._serve_once())
    while "reserve 0" not in order:
        await asyncio.sleep(0.001)
    await line.ledger.run(lambda: order.append("read"))
    await turn
    assert [x for x in order if x != "read"] == [f"{what} {i}" for i in range(10) for what in ("reserve", "answer")]
    assert order.index("read") <= order.index("reserve 2"), order  # after one reserve or two, not after ten
    line.ledger.pool.shutdown()


async def test_room_freed_during_a_turn_goes_to_the_front_at_once_not_after_the_rest_of_the_turn():
    """A class's wave ends in a burst of releases. Room freed while a turn asks the ledger for the kernels in line
    cuts the turn short: the next turn starts at once and asks the front of the line first (its place as the ledger
    last said it, not the order the kernels joined). A kernel is passed by at most once in a row, so one behind the
    front that would fit (backfill) is at most a turn late, and each is still asked (a heartbeat). A cut turn is not
    counted done (parking counts room as coming until a turn begun after it is done).
    (On an H200 this alone did not shorten a class's hand-off: its grant waited for a reading of the card, which
    test_handoff.py keeps from coming back; bench/README.md.)"""
    asked: list[str] = []

    def reserve(ledger, request, wait, home):
        asked.append(request.kernel_id)
        time.sleep(0.005)
        return "waiting"

    line = line_of(reserve)
    loop = asyncio.get_running_loop()
    # joined k0..k9, but the host's line (another server's kernels, a teacher's move) puts k9 first, k8 second
    waits = [Wait(SimpleNamespace(kernel_id=f"k{i}"), float(i), loop.create_future()) for i in range(10)]
    for place, i in enumerate([9, 8, 0, 1, 2, 3, 4, 5, 6, 7], 1):
        waits[i].last = Waiting(f"k{i}", place, 1024, 0, place - 1)
    waits[7].last = None  # answered by none yet: after those whose place is known
    line.queue.due = lambda watchers: (list(waits), [])
    answered: list[str] = []

    def answer(wait, got):
        answered.append(wait.kernel_id)
        if answered == ["k9", "k8", "k0"]:
            line.room_freed()  # a release while the turn is at the third kernel in line

    line._answer = answer
    await line._serve_once()
    assert asked == ["k9", "k8", "k0"] and line._cut, asked  # the front first; cut short once room was freed
    line._room.clear()  # (as each turn of Line._serve begins)
    await line._serve_once()  # the next turn: from the front again, and through to the end
    assert asked[3:] == ["k9", "k8", "k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"] and not line._cut, asked
    line._answer = lambda wait, got: line.room_freed()  # a long burst: room freed at every answer
    del asked[:]
    cuts = []
    for _ in range(4):
        line._room.clear()
        await line._serve_once()
        cuts.append(line._cut)
    rest = ["k8", "k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"]
    assert asked == ["k9"] + ["k9", *rest] + ["k9"] + ["k9", *rest], asked  # each at least every other turn
    assert cuts == [True, False, True, False]  # (a cut turn is not counted done: Line._serve)
    line.ledger.pool.shutdown()
