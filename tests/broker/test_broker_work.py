"""A user's share of the broker is counted in work, not lines (hardening, round two, item 1): a large request
costs one token per KiB, lines are bounded to what real requests need, and a keep list past what a server holds
is refused before any ledger work. bench/bench_broker_flood.py measures the flood itself."""

from __future__ import annotations

import pytest

from jupyter_gpushare.broker.guard import Guard
from jupyter_gpushare.broker.protocol import MAX_KEEP, MAX_LINE, BrokerRefused, decode_request


def test_a_large_request_costs_its_size_in_tokens():
    guard = Guard(rate=100.0, burst=200.0)
    assert guard.delay("u:alice", now=0.0, size=200) == 0.0  # a real request: one token
    # A 60 KiB request costs 61 tokens: three at once fit the 199 left of the burst, the fourth is 45 short,
    # which alice's rate (100 a second) makes good in 0.45 s.
    waits = [guard.delay("u:alice", now=0.0, size=60 * 1024) for _ in range(4)]
    assert waits == [0.0, 0.0, 0.0, pytest.approx(0.45)]
    assert guard.delay("u:bob", now=0.0, size=200) == 0.0  # bob's share is his own


def test_an_answer_costs_the_work_it_took_and_its_size():
    guard = Guard(rate=100.0, burst=200.0)
    assert guard.delay("u:alice", now=0.0) == 0.0  # one token: 199 left
    guard.charge("u:alice", seconds=0.034, size=150 * 1024)  # a view of 2,000 rows: 34 ms, a 150 KiB answer
    assert guard.delay("u:alice", now=0.0) == 0.0  # 199 - 184 - 1 = 14 left
    guard.charge("u:alice", seconds=0.034, size=150 * 1024)
    assert guard.delay("u:alice", now=0.0) == pytest.approx(1.71)  # 14 - 184 - 1 = -171: 1.71 s at 100 a second
    guard.charge("u:root", trusted=True, seconds=10.0)  # root and the broker's user are never charged
    assert guard.delay("u:root", trusted=True, now=0.0) == 0.0
    assert guard.delay("u:bob", now=0.0) == 0.0  # bob's share is his own


def test_lines_and_keep_lists_are_bounded_to_what_servers_send():
    assert MAX_LINE == 64 * 1024
    ids = [f"{i:08x}-0000-4000-8000-{i:012x}" for i in range(MAX_KEEP + 1)]
    with pytest.raises(BrokerRefused, match=f"a list of at most {MAX_KEEP} texts"):
        decode_request({"op": "release_owned_except", "args": {"keep": ids}})
    op, args = decode_request({"op": "release_owned_except", "args": {"keep": ids[:MAX_KEEP]}})
    assert op == "release_owned_except" and len(args.keep) == MAX_KEEP
