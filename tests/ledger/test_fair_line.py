"""A fair line when a student games the aging (issue 33, #1), through the real SQLite ledger on a stepped clock.

The attack: student C holds most of the card; student A keeps two kernels in line that never fit, each joining
again as soon as the ledger times it out, 45 s apart, so that one of them has always waited its turn out (aged);
student B's small kernel fits the free room. Under the old rule the aged waiter kept the whole card for as long as
it did not fit, and B waited up to nearly a whole timeout (89 of 90 s with these settings). The rules now: a kernel
that has itself waited ``queue_overtake_limit`` is held back by no one's kept room, and a user's kernel that
joins again within a timeout of that user's unserved wait does not age.
"""

from __future__ import annotations

import time as real_time
import types

import pytest

from jupyter_gpushare.core.policy import Policy, Size
from jupyter_gpushare.host.gpu import Card
from jupyter_gpushare.ledger import ledger as ledger_module
from jupyter_gpushare.ledger.ledger import Lease, Ledger, Request, Waiting

GIB = 1024
CARD = [Card(0, "GPU-a", "A", 24 * GIB)]
POLICY = Policy(context_reserve_mib=0, overtake_limit_s=30.0, queue_timeout_s=90.0)


@pytest.fixture
def clock(monkeypatch):
    """The ledger's wall clock, stepped by the test (its host clock and monotonic clock stay real: heartbeats and
    liveness caches are not what is tested here)."""
    now = [1_000_000.0]
    fake = types.SimpleNamespace(
        time=lambda: now[0], monotonic=real_time.monotonic, clock_gettime=real_time.clock_gettime,
        CLOCK_MONOTONIC=real_time.CLOCK_MONOTONIC, CLOCK_BOOTTIME=getattr(real_time, "CLOCK_BOOTTIME", 7),
    )  # fmt: skip
    monkeypatch.setattr(ledger_module, "time", fake)
    return now


def play(ledger: Ledger, clock: list[float], policy: Policy, until_s: int, b_every_s: int = 5) -> list[float]:
    """Run the attack for ``until_s`` seconds of the ledger's clock, one call per kernel per second (each call is
    the heartbeat of a kernel in line). B's kernels arrive one after another, each ``b_every_s`` after the last was
    granted (it runs for a second and is shut down). Returns each B kernel's wait."""
    start = clock[0]
    c = ledger.reserve(Request("c", Size(mib=int(20.5 * GIB)), "carol"), policy, CARD, wait=False)
    assert isinstance(c, Lease)  # 3.5 GiB left: A's 4 GiB never fits, B's 2 GiB does
    joins = {"a1": 0.0, "a2": 45.0}  # A's kernels join 45 s apart, then each re-joins at once when timed out
    b: str | None = None
    b_arrives, b_number, waits = 10.0, 0, []
    for second in range(until_s):
        clock[0] = start + second
        for kid, at in joins.items():
            if second >= at:
                got = ledger.reserve(Request(kid, Size(mib=4 * GIB), "alice"), policy, CARD, wait=True)
                assert isinstance(got, Waiting)
        if b is None and second >= b_arrives:
            b_number += 1
            b, b_joined = f"b{b_number}", second
        if b is not None:
            got = ledger.reserve(Request(b, Size(mib=2 * GIB), "bob"), policy, CARD, wait=True)
            if isinstance(got, Lease):
                waits.append(second - b_joined)
                ledger.release(b)
                b, b_arrives = None, second + b_every_s
            elif got.expired:
                waits.append(float("inf"))
                b, b_arrives = None, second + b_every_s
    return waits


def test_staggered_rejoins_hold_no_fitting_kernel_past_the_overtake_limit(tmp_path, clock):
    waits = play(Ledger(tmp_path / "l.sqlite"), clock, POLICY, until_s=600)
    # No wait of B's is longer than the overtake limit (the old rule: up to 89 of the 90 s timeout, or expired).
    assert max(waits) <= POLICY.overtake_limit_s, waits
    assert len(waits) > 10, waits
    # And once A's first two kernels have timed out, their re-joins never age: B is granted at once from then on.
    assert all(w == 0 for w in waits[-5:]), waits


def test_a_rejoined_waiter_ages_again_after_a_timeout_without_rejoining(tmp_path, clock):
    """The rule costs an honest student little: a kernel that joins again a timeout after its user's last unserved
    wait ages as before, and keeps its room from kernels that have waited less."""
    ledger = Ledger(tmp_path / "l.sqlite")
    start = clock[0]
    assert isinstance(ledger.reserve(Request("c", Size(mib=int(20.5 * GIB)), "carol"), POLICY, CARD, False), Lease)
    a = Request("a", Size(mib=4 * GIB), "alice")
    assert isinstance(ledger.reserve(a, POLICY, CARD, wait=True), Waiting)
    clock[0] = start + 10
    ledger.cancel_wait("a")  # alice stops waiting: an unserved end
    clock[0] = start + 20
    assert isinstance(ledger.reserve(a, POLICY, CARD, wait=True), Waiting)  # joins again within the timeout
    clock[0] = start + 55  # waited 35 s, past the 30 s limit: but a re-join within a timeout does not age
    assert isinstance(ledger.reserve(Request("b1", Size(mib=2 * GIB), "bob"), POLICY, CARD, wait=True), Lease)
    ledger.release("b1")
    ledger.cancel_wait("a")
    clock[0] = start + 55 + 91  # a timeout after her last unserved end (at +55): she joins afresh
    assert isinstance(ledger.reserve(a, POLICY, CARD, wait=True), Waiting)
    clock[0] += 31  # aged: bob's new kernel waits behind her kept room...
    assert isinstance(ledger.reserve(Request("b2", Size(mib=2 * GIB), "bob"), POLICY, CARD, wait=True), Waiting)
    clock[0] += 29
    assert isinstance(ledger.reserve(Request("b2", Size(mib=2 * GIB), "bob"), POLICY, CARD, wait=True), Waiting)
    clock[0] += 1  # ...for at most the overtake limit
    assert isinstance(ledger.reserve(Request("b2", Size(mib=2 * GIB), "bob"), POLICY, CARD, wait=True), Lease)


def test_first_come_first_served_is_untouched(tmp_path, clock):
    """``queue_overtake_limit = 0``: no one passes, re-joins go to the back and keep their room at once."""
    strict = Policy(context_reserve_mib=0, overtake_limit_s=0.0, queue_timeout_s=90.0)
    waits = play(Ledger(tmp_path / "l.sqlite"), clock, strict, until_s=300)
    assert waits and all(w > 0 for w in waits), waits  # B waits behind whoever of A's is ahead of it


def test_without_a_timeout_a_rejoin_ages_as_any_kernel():
    from jupyter_gpushare.ledger.queue import ages_from

    assert ages_from(100.0, 50.0, POLICY) == 140.0  # re-joined 50 s after an unserved end: ages from 50 + 90
    assert ages_from(150.0, 50.0, POLICY) is None  # a timeout after it: at once
    assert ages_from(100.0, 50.0, Policy(overtake_limit_s=30.0, queue_timeout_s=float("inf"))) is None
    assert ages_from(100.0, 50.0, Policy(overtake_limit_s=0.0, queue_timeout_s=90.0)) is None
