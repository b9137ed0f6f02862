"""The wait estimate (ledger/estimate.py): a held reservation's likely end from past holds, and the line served
at those ends; through the real ledger, holds are remembered as reservations are given back."""

from __future__ import annotations

import sqlite3

from jupyter_gpushare.core.policy import Policy, Size
from jupyter_gpushare.host.gpu import Card
from jupyter_gpushare.host.procs import ProcessRef
from jupyter_gpushare.ledger.estimate import MIN_HOLDS, PastHolds, serve_until_placed
from jupyter_gpushare.ledger.leases import Lease
from jupyter_gpushare.ledger.ledger import Ledger, Request, Waiting

GIB = 1024
POLICY = Policy(context_reserve_mib=512)
CARD = Card(0, "GPU-0", "sim", 10 * GIB, True)


def lease(created: float, user: str = "ann", name: str = "python3", card: str = "GPU-0", mib: int = 4608) -> Lease:
    return Lease(f"k{created}", card, 0, mib - 512, 512, user, name, ProcessRef(1, 1.0), None, created)


def test_a_held_reservation_ends_by_the_past_holds_longer_than_it_has_lasted():
    holds = {("ann", "python3"): [60.0, 600.0, 610.0, 620.0, 3600.0]}
    # Held 10 s: the median of all five past holds (610 s) from its start
    assert PastHolds.of(holds).expected_end(lease(created=1000.0), now=1010.0) == 1000.0 + 610.0
    # Held 700 s: only the holds longer than that count: fewer than MIN_HOLDS of the user's, so everyone's
    holds[("bob", "python3")] = [900.0, 1200.0]
    assert MIN_HOLDS == 3
    assert PastHolds.of(holds).expected_end(lease(created=1000.0), now=1700.0) == 1000.0 + 1200.0
    # Held longer than any past hold: no expected end
    assert PastHolds.of(holds).expected_end(lease(created=1000.0), now=1000.0 + 4000.0) is None
    # An even count: the middle two's mean
    even = PastHolds.of({("ann", "python3"): [100.0, 200.0, 300.0, 400.0]})
    assert even.expected_end(lease(created=0.0), now=1.0) == 250.0


def test_too_little_history_gives_no_end():
    assert PastHolds.of({("ann", "python3"): [100.0, 200.0]}).expected_end(lease(created=0.0), now=1.0) is None


def test_the_line_is_served_in_order_at_each_end():
    room = {"A": 1000}
    line = [{"A": 3000}, {"A": 2000}]  # one ahead needs 3 GiB, this one 2 GiB
    ends = [(50.0, "A", 2500), (20.0, "A", 1500)]
    # at 20: 2,500 free: the one ahead does not fit, this one does (it passes it, as the line lets it)
    assert serve_until_placed(room, line, ends, now=10.0) == 20.0
    # with 2 GiB free now, one that needs 3 GiB as well waits for the first (placed at 20), then for the end at 50
    assert serve_until_placed({"A": 2000}, [{"A": 3000}, {"A": 3000}], ends, now=10.0) == 50.0
    # the known ends never make room: no estimate
    assert serve_until_placed(room, [{"A": 9000}], ends, now=10.0) is None


def test_two_waiters_with_the_same_need_are_told_apart():
    assert serve_until_placed({"A": 0}, [{"A": 100}, {"A": 100}], [(5.0, "A", 100), (9.0, "A", 100)], 0.0) == 9.0


def test_the_ledger_remembers_holds_and_says_when_a_waiter_is_likely_granted(tmp_path):
    ledger = Ledger(tmp_path / "l.sqlite")
    request = Request("w", Size(mib=4 * GIB), "ann", "python3")
    for i in range(3):  # three earlier kernels that each held a reservation, then gave it back
        ledger.reserve(Request(f"old{i}", Size(mib=4 * GIB), "ann", "python3"), POLICY, [CARD], wait=False)
        ledger.release(f"old{i}")
    with sqlite3.connect(tmp_path / "l.sqlite") as db:
        assert db.execute("SELECT count(*) FROM holds").fetchone()[0] == 3
        db.execute("UPDATE holds SET held_s = 600")  # each held its card for 10 minutes
    ledger.reserve(Request("a", Size(mib=4 * GIB), "ann", "python3"), POLICY, [CARD], wait=False)
    ledger.reserve(Request("b", Size(mib=4 * GIB), "ann", "python3"), POLICY, [CARD], wait=False)
    got = ledger.reserve(request, POLICY, [CARD], wait=True)
    assert isinstance(got, Waiting)
    (held,) = {lease.created for lease in ledger.leases() if lease.kernel_id == "a"}
    assert got.likely_at is not None and abs(got.likely_at - (held + 600)) < 1.0
    # without history of its kind and of anyone's, nothing is said
    fresh = Ledger(tmp_path / "fresh.sqlite")
    fresh.reserve(Request("a", Size(mib=9 * GIB), "ann", "python3"), POLICY, [CARD], wait=False)
    unknown = fresh.reserve(request, POLICY, [CARD], wait=True)
    assert isinstance(unknown, Waiting) and unknown.likely_at is None
