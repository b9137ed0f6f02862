"""The SQLite ledger: atomic, FIFO, never overbooks, survives restarts, reclaims the dead."""

from __future__ import annotations

import multiprocessing
import os
import random
import sqlite3
import subprocess
import sys
import time

import pytest
from old_ledgers import V1_SCHEMA

from jupyter_gpushare.core.policy import Policy, PolicyError, Size
from jupyter_gpushare.host.gpu import Card
from jupyter_gpushare.ledger.ledger import Lease, Ledger, LedgerError, ProcessRef, Request, Waiting

CARDS = [Card(0, "GPU-a", "A", 10240), Card(1, "GPU-b", "B", 10240)]
POLICY = Policy(context_reserve_mib=512)


def req(kid: str, gib: float = 4) -> Request:
    return Request(kid, Size(mib=int(gib * 1024)))


def dead_process() -> ProcessRef:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    ref = ProcessRef.of(proc.pid)
    proc.wait()
    return ref


def test_reserve_places_best_fit_and_release_frees(tmp_path):
    ledger = Ledger(tmp_path / "l.sqlite")
    a = ledger.reserve(req("k1", 6), POLICY, CARDS, wait=False)
    assert isinstance(a, Lease) and a.reserved_mib == 6 * 1024 + 512
    b = ledger.reserve(req("k2", 2), POLICY, CARDS, wait=False)
    assert b.card_uuid == a.card_uuid  # best fit: the fuller card still holds it
    c = ledger.reserve(req("k3", 6), POLICY, CARDS, wait=False)
    assert c.card_uuid != a.card_uuid
    assert ledger.reserve(req("k1", 6), POLICY, CARDS, wait=False) == a  # idempotent
    assert ledger.release("k1") == a and ledger.release("k1") is None
    assert ledger.reserved_by_card() == {b.card_uuid: 2560, c.card_uuid: 6656}


def test_queue_order_backfill_and_aging(tmp_path):
    """Through the SQLite ledger: kernels in line are served in order where they fit; a small one passes a large
    one that does not fit, until the large one has waited the overtake limit."""
    ledger = Ledger(tmp_path / "l.sqlite")
    cards = CARDS[:1]
    assert isinstance(ledger.reserve(req("big1", 8), POLICY, cards, wait=False), Lease)  # 1.5 GiB left
    w1 = ledger.reserve(req("w1", 4), POLICY, cards, wait=True)
    assert isinstance(w1, Waiting) and w1.position == 1
    w2 = ledger.reserve(req("w2", 0.5), POLICY, cards, wait=True)  # fits in the 1.5 GiB: passes w1
    assert isinstance(w2, Lease)
    assert [w.kernel_id for w in ledger.waiters()] == ["w1"]
    w3 = ledger.reserve(req("w3", 1), POLICY, cards, wait=True)  # 0.5 GiB left: waits behind w1
    assert isinstance(w3, Waiting) and w3.position == 2 and w3.ahead == 1
    ledger.release("big1")  # 9 GiB free: w1 (4.5) and w3 (1.5) both fit, in order
    assert isinstance(ledger.reserve(req("w3", 1), POLICY, cards, wait=True), Lease)
    assert isinstance(ledger.reserve(req("w1", 4), POLICY, cards, wait=True), Lease)
    assert ledger.waiters() == []

    strict = Policy(context_reserve_mib=512, overtake_limit_s=0.0)  # w1 has "waited its turn out" at once
    ledger.release("w1")
    ledger.release("w3")
    ledger.reserve(req("big2", 8), strict, cards, wait=False)
    assert isinstance(ledger.reserve(req("w4", 4), strict, cards, wait=True), Waiting)
    assert isinstance(ledger.reserve(req("w5", 0.5), strict, cards, wait=True), Waiting)  # the card is kept for w4
    assert [w.kernel_id for w in ledger.waiters()] == ["w4", "w5"]


def test_waiting_kernels_count_against_limits_and_the_cap(tmp_path):
    from jupyter_gpushare.core.policy import PolicyError, UserLimits

    ledger = Ledger(tmp_path / "l.sqlite")
    policy = Policy(context_reserve_mib=512, max_waiting=2)
    limits = UserLimits(max_kernels=3, max_total=Size(mib=12 * 1024))
    alice = [Request(f"a{i}", Size(mib=4096), "alice") for i in range(4)]
    assert isinstance(ledger.reserve(alice[0], policy, CARDS[:1], True, limits), Lease)
    assert isinstance(ledger.reserve(alice[1], policy, CARDS[:1], True, limits), Lease)
    assert isinstance(ledger.reserve(alice[2], policy, CARDS[:1], True, limits), Waiting)  # in line: counts
    with pytest.raises(PolicyError, match="max_kernels"):
        ledger.reserve(alice[3], policy, CARDS[:1], True, limits)  # 2 held + 1 in line = 3: no fourth
    bob = [Request(f"b{i}", Size(mib=1024), "bob") for i in range(3)]
    ledger.reserve(Request("fill", Size(mib=1024), "carol"), policy, CARDS[:1], False)  # the card is full now
    assert isinstance(ledger.reserve(bob[0], policy, CARDS[:1], True), Waiting)
    assert isinstance(ledger.reserve(bob[1], policy, CARDS[:1], True), Waiting)
    with pytest.raises(PolicyError, match="2 kernels waiting for a GPU already"):
        ledger.reserve(bob[2], policy, CARDS[:1], True)
    assert isinstance(ledger.reserve(bob[1], policy, CARDS[:1], True), Waiting)  # one already in line keeps its place


def test_a_wait_past_the_queue_timeout_is_given_up_by_the_ledger(tmp_path):
    ledger = Ledger(tmp_path / "l.sqlite")
    ledger.reserve(req("full", 9), POLICY, CARDS[:1], wait=False)
    got = ledger.reserve(req("w", 4), POLICY, CARDS[:1], wait=True)
    assert isinstance(got, Waiting) and not got.expired
    hurried = Policy(context_reserve_mib=512, queue_timeout_s=0.0)  # the broker's own timeout, say
    got = ledger.reserve(req("w", 4), hurried, CARDS[:1], wait=True)
    assert isinstance(got, Waiting) and got.expired and ledger.waiters() == []


def test_the_line_has_one_deadline_a_waiter_set_when_it_joins(tmp_path):
    ledger = Ledger(tmp_path / "l.sqlite")
    ledger.reserve(req("full", 9), POLICY, CARDS[:1], wait=False)
    policy = Policy(context_reserve_mib=512, queue_timeout_s=300.0)
    first = ledger.reserve(req("w", 4), policy, CARDS[:1], wait=True)
    (joined,) = [w.created for w in ledger.waiters()]
    time.sleep(0.05)
    again = ledger.reserve(req("w", 4), policy, CARDS[:1], wait=True)  # a heartbeat does not move it
    assert isinstance(first, Waiting) and isinstance(again, Waiting)
    assert first.gives_up_at == again.gives_up_at == joined + 300
    no_limit = ledger.reserve(req("w", 4), Policy(context_reserve_mib=512, queue_timeout_s=float("inf")), CARDS[:1], wait=True)  # fmt: skip
    asked_once = ledger.reserve(req("x", 4), policy, CARDS[:1], wait=False)
    assert isinstance(no_limit, Waiting) and isinstance(asked_once, Waiting)
    assert no_limit.gives_up_at is None and asked_once.gives_up_at is None  # no limit; not in line


def test_waiting_says_what_is_needed_and_free(tmp_path):
    ledger = Ledger(tmp_path / "l.sqlite")
    ledger.reserve(req("a", 8), POLICY, CARDS[:1], wait=False)
    got = ledger.reserve(req("b", 4), POLICY, CARDS[:1], wait=False)
    assert got.need_mib == 4608 and got.free_mib == 10240 - 8704


def test_survives_reopen_and_keeps_live_leases(tmp_path):
    path = tmp_path / "l.sqlite"
    ledger = Ledger(path)
    ledger.reserve(req("k1"), POLICY, CARDS, wait=False)
    ledger.attach("k1", ProcessRef.me())
    ledger.close()
    other = Ledger(path, owner=dead_process())
    assert [lease.kernel_id for lease in other.leases()] == ["k1"]
    assert other.reap() == []


def test_reclaims_leases_whose_owner_and_kernel_are_gone(tmp_path):
    path = tmp_path / "l.sqlite"
    gone_owner = Ledger(path, owner=dead_process())
    gone_owner.reserve(req("dead"), POLICY, CARDS, wait=False)
    gone_owner.attach("dead", dead_process())
    gone_owner.reserve(req("never-started"), POLICY, CARDS, wait=False)
    gone_owner.reserve(req("orphan-alive"), POLICY, CARDS, wait=False)
    gone_owner.attach("orphan-alive", ProcessRef.me())
    gone_owner.reserve(req("w", 20), POLICY, CARDS, wait=True)
    ledger = Ledger(path)
    reclaimed = {lease.kernel_id for lease in ledger.reap()}
    assert reclaimed == {"dead", "never-started"}
    assert [lease.kernel_id for lease in ledger.leases()] == ["orphan-alive"]
    assert ledger.waiters() == []


def test_pid_reuse_is_not_mistaken_for_the_kernel(tmp_path):
    me = ProcessRef.me()
    assert me.alive()
    assert not ProcessRef(me.pid, me.start - 100).alive()


def test_release_owned_except_frees_forgotten_kernels(tmp_path):
    ledger = Ledger(tmp_path / "l.sqlite")
    for kid in ("a", "b", "c"):
        ledger.reserve(req(kid, 1), POLICY, CARDS, wait=False)
    assert {lease.kernel_id for lease in ledger.release_owned_except({"b"})} == {"a", "c"}
    assert [lease.kernel_id for lease in ledger.leases()] == ["b"]


def test_corrupt_file_is_named_and_left_untouched(tmp_path):
    path = tmp_path / "l.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(LedgerError) as e:
        Ledger(path)
    assert str(path) in str(e.value) and "left as it is" in str(e.value)
    assert path.read_bytes() == b"this is not a database" * 100


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "l.sqlite"
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version=99")
    db.close()
    with pytest.raises(LedgerError, match="newer jupyter-gpushare"):
        Ledger(path)


def _stress(path: str, seed: int, steps: int, queue) -> None:
    rng = random.Random(seed)
    ledger = Ledger(path)
    cards = CARDS
    usable = {c.uuid: POLICY.usable_mib(c.total_mib) for c in cards}
    mine: list[str] = []
    try:
        for step in range(steps):
            roll = rng.random()
            if mine and roll < 0.35:
                ledger.release(mine.pop(rng.randrange(len(mine))))
            elif mine and roll < 0.55:  # a quota change in place: smaller always, larger only where it fits
                kid, quota = rng.choice(mine), rng.choice([256, 1024, 3072, 6144])
                try:
                    lease = ledger.resize(kid, quota, POLICY, cards)
                    assert lease is not None and lease.quota_mib == quota, lease
                except PolicyError as e:
                    assert e.code == "grow-no-room", e
            else:
                kid = f"{seed}-{step}"
                got = ledger.reserve(
                    Request(kid, Size(mib=rng.choice([512, 1024, 2048, 3072]))), POLICY, cards, wait=False
                )
                if isinstance(got, Lease):
                    mine.append(kid)
            for uuid, total in ledger.reserved_by_card().items():
                if total > usable[uuid]:
                    raise AssertionError(f"step {step}: card {uuid} overbooked: {total} > {usable[uuid]}")
        queue.put(("ok", seed, len(mine)))
    except Exception as e:  # report to the parent instead of dying silently
        queue.put(("error", seed, repr(e)))


def test_concurrent_processes_never_overbook(tmp_path):
    """Six processes reserve, resize and release at random on one file: no card is ever overbooked."""
    path = str(tmp_path / "stress.sqlite")
    Ledger(path).close()
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_stress, args=(path, seed, 600, queue)) for seed in range(6)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert all(r[0] == "ok" for r in results), results
    ledger = Ledger(path)
    assert len(ledger.leases()) <= sum(r[2] for r in results)
    # every worker has exited: what they still held is reclaimed (owner gone, no kernel started)
    ledger.reap()
    assert ledger.leases() == []


def test_ledger_path_that_cannot_be_created(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(LedgerError, match="cannot be used"):
        Ledger(blocker / "sub" / "l.sqlite")
    assert os.path.isfile(blocker)


def test_room_held_by_the_dead_is_found_between_periodic_reaps(tmp_path):
    path = tmp_path / "l.sqlite"
    ledger = Ledger(path)
    ledger.reap()  # reserve() will not reap again on its own for a second...
    gone = Ledger(path, owner=dead_process())
    assert isinstance(gone.reserve(req("dead", 9), POLICY, CARDS[:1], wait=False), Lease)
    got = ledger.reserve(req("k", 4), POLICY, CARDS[:1], wait=False)
    assert isinstance(got, Lease)  # ...except before it answers "no room"
    assert [lease.kernel_id for lease in ledger.leases()] == ["k"]


def test_a_schema_1_ledger_is_migrated_with_its_leases(tmp_path):
    """A ledger written by the previous release (schema 1) keeps its live leases after the upgrade."""
    path = tmp_path / "l.sqlite"
    me = ProcessRef.me()
    db = sqlite3.connect(path)
    db.executescript(V1_SCHEMA)
    db.execute(
        "INSERT INTO leases VALUES ('old', 'GPU-a', 0, 2048, 512, 'alice', 'python3', ?, ?, ?, ?, 1.0)",
        (me.pid, me.start, me.pid, me.start),
    )
    db.commit()
    db.close()
    from jupyter_gpushare.ledger.ledger import read_ledger

    assert read_ledger(path)[0][0].owner == me  # `jupyter gpushare status` reads it without migrating it
    ledger = Ledger(path, owner=dead_process())
    assert ledger.reap() == []  # its kernel (this process) lives: kept
    assert [(x.kernel_id, x.owner, x.kernel) for x in ledger.leases()] == [("old", me, me)]
    assert ledger._file._db.execute("PRAGMA user_version").fetchone()[0] == 2
    assert isinstance(ledger.reserve(req("new", 2), POLICY, CARDS, wait=False), Lease)


def test_session_owned_leases_live_while_the_session_is_touched(tmp_path):
    """A server seen only through a session (a container): its leases go when the session expires."""
    from jupyter_gpushare.ledger.ledger import SessionRef, host_clock

    path = tmp_path / "l.sqlite"
    session = SessionRef("hub:alice:1234")
    broker = Ledger(path, owner=session)
    broker.touch_session(session, "alice", host_clock() + 60)
    got = broker.reserve(req("s1", 2), POLICY, CARDS, wait=False)
    assert isinstance(got, Lease) and got.owner == session and got.kernel is None
    waiting = broker.reserve(req("s2", 30), POLICY, CARDS[:1], wait=True)
    assert isinstance(waiting, Waiting) and broker.waiters()[0].owner == session
    other = Ledger(path, owner=dead_process())
    assert other.reap() == [] and {x.kernel_id for x in other.leases()} == {"s1"}
    assert broker.release_owned_except({"s1"}) == []  # the session's own bookkeeping
    broker.touch_session(session, "alice", host_clock() - 1)  # touching never shortens a session
    assert other.reap() == []
    other._file._db.execute("UPDATE sessions SET expires=?", (host_clock() - 1,))  # it stopped calling
    assert [x.kernel_id for x in other.reap()] == ["s1"] and other.waiters() == []
    assert other._file._db.execute("SELECT count(*) FROM sessions").fetchone()[0] == 0
    # a broker back from an outage gives every session time to call again
    broker.touch_session(session, "alice", host_clock() - 100)
    broker.extend_sessions(host_clock() + 60)
    assert other._file._db.execute("SELECT count(*) FROM sessions").fetchone()[0] == 1


def test_sessions_and_waiters_do_not_follow_the_wall_clock(tmp_path, monkeypatch):
    """Expiries and heartbeats are on the host clock: the wall clock stepped 2 minutes ahead reclaims no live
    session's lease and ends no fresh wait; stepped an hour back, it keeps no session past its expiry."""
    import time

    from jupyter_gpushare.ledger.ledger import SessionRef, host_clock

    path = tmp_path / "l.sqlite"
    session = SessionRef("hub:alice:1")
    broker = Ledger(path, owner=session)
    broker.touch_session(session, "alice", host_clock() + 60)
    assert isinstance(broker.reserve(req("s1", 2), POLICY, CARDS, wait=False), Lease)
    assert isinstance(broker.reserve(req("s2", 30), POLICY, CARDS[:1], wait=True), Waiting)
    other = Ledger(path, owner=dead_process())
    wall = time.time()
    monkeypatch.setattr(time, "time", lambda: wall + 120)
    assert other.reap() == [] and [w.kernel_id for w in other.waiters()] == ["s2"]
    monkeypatch.setattr(time, "time", lambda: wall - 3600)
    other._file._db.execute("UPDATE sessions SET expires=?", (host_clock() - 1,))  # it stopped calling
    assert [x.kernel_id for x in other.reap()] == ["s1"]


def test_rows_an_older_version_wrote_on_the_wall_clock_are_taken_over(tmp_path):
    from jupyter_gpushare.ledger.ledger import SessionRef, host_clock

    path = tmp_path / "l.sqlite"
    session = SessionRef("hub:alice:1")
    broker = Ledger(path, owner=session)
    broker.touch_session(session, "alice", host_clock() + 60)
    broker.reserve(req("s1", 2), POLICY, CARDS, wait=False)
    broker._file._db.execute("UPDATE sessions SET expires=?", (1.8e9,))  # an old broker's wall-clock expiry
    other = Ledger(path, owner=dead_process())
    assert other.reap() == []
    expires = other._file._db.execute("SELECT expires FROM sessions").fetchone()[0]
    assert host_clock() < expires <= host_clock() + 60  # a minute to call again, on the host clock


def test_memory_used_outside_reservations_is_taken(tmp_path):
    """What processes without a reservation use (sampler.unreserved_use) is taken when placing, and the
    answer to a kernel that does not fit says how much it is."""
    ledger = Ledger(tmp_path / "l.sqlite")
    cards = CARDS[:1]
    got = ledger.reserve(req("k1", 4), POLICY, cards, wait=False, outside={"GPU-a": 6144})
    assert isinstance(got, Waiting) and (got.free_mib, got.outside_mib) == (4096, 6144)
    assert isinstance(ledger.reserve(req("k1", 3), POLICY, cards, wait=False, outside={"GPU-a": 6144}), Lease)
    # another card's figure does not touch this one
    assert isinstance(ledger.reserve(req("k2", 4), POLICY, cards, wait=False, outside={"GPU-x": 99999}), Lease)
    ledger.close()


def test_a_broker_back_from_a_crash_hears_from_waiters_within_seconds(tmp_path):
    """Waiters of servers that died while the broker was down (a container's session is extended at the broker's
    start) leave the line once they do not call within the grace; a live server's waiter calls and stays."""
    import time

    from jupyter_gpushare.ledger.ledger import SessionRef, host_clock

    path = tmp_path / "l.sqlite"
    gone, live = SessionRef("hub:gone:1"), SessionRef("hub:live:1")
    for session, kid in ((gone, "w-gone"), (live, "w-live")):
        ledger = Ledger(path, owner=session)
        ledger.touch_session(session, session.id, host_clock() + 60)
        assert isinstance(ledger.reserve(req(kid, 30), POLICY, CARDS[:1], wait=True), Waiting)
    broker = Ledger(path, owner=dead_process())
    broker.hear_waiters_within(0.3)
    time.sleep(0.1)
    Ledger(path, owner=live).reserve(req("w-live", 30), POLICY, CARDS[:1], wait=True)  # the live server calls
    time.sleep(0.4)
    broker.reap()
    assert [w.kernel_id for w in broker.waiters()] == ["w-live"]


OPEN_AT = """
import sys, time
from jupyter_gpushare.ledger.ledger import Ledger
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
Ledger(sys.argv[1]).close()
"""


def test_servers_that_create_a_new_ledger_at_once_all_open_it(tmp_path):
    """Two servers of a user started together (seen in a test, 2 runs in 10): the second's first open of the new
    file raised "database is locked" (SQLite does not wait to turn a new file to WAL), and its kernels started
    without a GPU. Sixteen processes now open a new file at the same instant, five times: every one opens it."""
    for attempt in range(5):
        path = tmp_path / f"new-{attempt}" / "ledger.sqlite"
        at = str(time.time() + 1.5)
        procs = [
            subprocess.Popen([sys.executable, "-c", OPEN_AT, str(path), at], stderr=subprocess.PIPE, text=True)
            for _ in range(16)
        ]
        failed = [p.stderr.read()[-300:] for p in procs if p.wait(60) != 0]
        assert failed == [], failed
