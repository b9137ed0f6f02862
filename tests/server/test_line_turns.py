"""The line's turns (server/line.py), on their own: room freed while a turn runs brings the next turn at once, and
each turn is counted begun and done (parking.py counts a move's room as coming until a turn begun after it is
done). The grants themselves run through a real server in test_waiting.py and test_parking.py."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

from jupyter_gpushare.server.line import QUEUE_POLL_S, Line


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
    pool = ThreadPoolExecutor(1)  # the ledger's one thread
    order: list[str] = []

    class Worker:
        async def run(self, fn, *args):
            return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

        def must(self, call):
            return call(None)

    def reserve(ledger, request, wait, home):
        order.append(f"reserve {request}")
        time.sleep(0.01)
        return "waiting"

    kernels = SimpleNamespace(
        records={f"k{i}": object() for i in range(10)}, card_home=lambda kid: None, reserve=reserve
    )
    starts = SimpleNamespace(may_grant=lambda kid: True, watchers=lambda kid: None)
    line = Line(kernels, Worker(), starts, 60.0, logging.getLogger("test"))
    loop = asyncio.get_running_loop()
    waits = [SimpleNamespace(kernel_id=f"k{i}", request=i, result=loop.create_future(), unwanted_since=None,
                             stepped_out=False) for i in range(10)]  # fmt: skip
    line.queue.due = lambda watchers: (waits, [])
    line._answer = lambda wait, got: order.append(f"answer {wait.request}")
    turn = asyncio.ensure_future(line._serve_once())
    while "reserve 0" not in order:
        await asyncio.sleep(0.001)
    await Worker().run(lambda: order.append("read"))
    await turn
    assert [x for x in order if x != "read"] == [f"{what} {i}" for i in range(10) for what in ("reserve", "answer")]
    assert order.index("read") <= order.index("reserve 2"), order  # after one reserve or two, not after ten
    pool.shutdown()
