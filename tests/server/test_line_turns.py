"""The line's turns (server/line.py), on their own: room freed while a turn runs brings the next turn at once, and
each turn is counted begun and done (parking.py counts a move's room as coming until a turn begun after it is
done). The grants themselves run through a real server in test_waiting.py and test_parking.py."""

from __future__ import annotations

import asyncio
import logging
import time
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
