"""Quotas learned from history: the rules, the ledger's runs table, and the broker's request for it.

What must hold: a user learns from their own runs first; another user's runs teach only as the admin's
teachers or as the median of a quorum of users, so one student running a notebook of the same name with a
huge (or tiny) peak moves no one else's quota; the learned quota is the measured peak plus the margin, less
the CUDA context reserve, within the admin's bounds; runs are kept per kernel process, pruned by age and
bounded in rows; a ledger file from before the table gets it with nothing lost; every value a server sends
to the broker is checked (path, MiB, whose kernel).
"""

from __future__ import annotations

import math
import sqlite3

import pytest

from jupyter_gpushare.broker import BrokerRefused
from jupyter_gpushare.broker.protocol import decode_request
from jupyter_gpushare.config.settings import settings_from
from jupyter_gpushare.core.history import (
    ALLOCATOR_MARGIN,
    DAY_S,
    MAX_PATH,
    RUNS_KEPT,
    HistoryRules,
    Learned,
    Run,
    choose_peak,
    history_key,
    learned_quota,
    need_of,
    retry_quota_mib,
)
from jupyter_gpushare.core.policy import CardView, Policy, PolicyError, Size, UserLimits
from jupyter_gpushare.host.gpu import Card
from jupyter_gpushare.ledger.ledger import Ledger, ProcessRef, Request

GIB = 1024
CARDS = [Card(0, "GPU-a", "A", 10 * GIB)]
POLICY = Policy(context_reserve_mib=512)
RULES = HistoryRules()  # 90 days, no teachers, quorum 3
NB = "course/lab3.ipynb"


def runs(*items: tuple[str, int]) -> list[tuple[str, Run, float]]:
    """(user, peak) runs of an older release (no quota taught), the later ones newer."""
    return [(user, Run(peak), 1000.0 + i) for i, (user, peak) in enumerate(items)]


# -- the rules -----------------------------------------------------------------------------------------


def test_own_runs_teach_first_the_highest_of_the_last_few():
    got = choose_peak(runs(("ann", 3000), ("ann", 1000), ("bob", 9000)), "ann", RULES)
    assert got == Learned(3000, "own", 1)
    many = runs(("ann", 9000), *[("ann", 1000 + i) for i in range(RUNS_KEPT)])
    assert choose_peak(many, "ann", RULES).peak_mib == 1000 + RUNS_KEPT - 1  # an old outlier ages out


def test_one_other_user_never_teaches_and_a_minority_cannot_move_the_median():
    honest = [("s1", 2000), ("s2", 2100), ("s3", 2200), ("s4", 1900)]
    assert choose_peak(runs(("mallory", 40 * GIB)), "ann", RULES) is None  # one user: teaches no one
    assert choose_peak(runs(("s1", 2000), ("mallory", 40 * GIB)), "ann", RULES) is None  # two: below the quorum
    got = choose_peak(runs(*honest, ("mallory", 40 * GIB), ("eve", 40 * GIB)), "ann", RULES)
    assert got.source == "others" and 1900 <= got.peak_mib <= 2200 and got.users == 6
    got = choose_peak(runs(*honest, ("mallory", 1), ("eve", 1)), "ann", RULES)  # nor push it down
    assert 1900 <= got.peak_mib <= 2200
    # many runs of one user still count as one user
    assert choose_peak(runs(*[("mallory", 40 * GIB)] * 10, ("s1", 2000)), "ann", RULES) is None
    assert choose_peak(runs(*honest), "ann", HistoryRules(quorum=0)) is None


def test_teachers_teach_everyone_and_no_one_else_does():
    rules = HistoryRules(teachers=frozenset({"prof"}), quorum=0)
    got = choose_peak(runs(("mallory", 40 * GIB), ("prof", 5000), ("prof", 5200)), "ann", rules)
    assert got == Learned(5200, "others", 1)
    assert choose_peak(runs(("mallory", 40 * GIB)), "ann", rules) is None
    assert choose_peak(runs(("prof", 5000), ("ann", 700)), "ann", rules) == Learned(700, "own", 1)  # own wins


def test_the_learned_quota_is_the_peak_plus_margin_less_the_context_within_bounds():
    cards = [CardView("GPU-a", 0, 80 * GIB)]
    policy = Policy(context_reserve_mib=640, min_quota=Size(mib=256), max_quota=Size(mib=16 * GIB))
    # NVML's peak includes the CUDA context; the reservation (quota + 640) is peak * 1.2
    q = learned_quota(policy, Learned(9 * GIB, "own"), 0.2, cards)
    assert q == Size(mib=11060 - 640) and q.mib + 640 >= 9 * GIB * 1.2
    assert learned_quota(policy, Learned(4974, "own"), 0.2, cards) == Size(mib=5969 - 640)  # the study's 4,974 MiB job
    assert learned_quota(policy, Learned(100, "own"), 0.2, cards) == Size(mib=256)  # min_quota
    assert learned_quota(policy, Learned(60 * GIB, "own"), 0.2, cards) == Size(mib=16 * GIB)  # max_quota
    assert learned_quota(Policy(context_reserve_mib=640), Learned(200 * GIB, "own"), 0.2, cards) == Size(
        mib=80 * GIB - 640
    )
    assert learned_quota(Policy(max_quota=Size(percent=10)), Learned(60 * GIB, "own"), 0.2, cards) == Size(mib=8192)
    limits = UserLimits(max_total=Size(mib=4 * GIB))  # a learned quota the user's limits would refuse alone
    assert learned_quota(policy, Learned(9 * GIB, "own"), 0.2, cards, limits) == Size(mib=4 * GIB)
    # ... and what the user's other kernels hold counts against max_total (issue 24, item 4)
    assert learned_quota(policy, Learned(9 * GIB, "own"), 0.2, cards, limits, held_mib=3 * GIB) == Size(mib=GIB)


def test_a_run_teaches_what_its_frameworks_needed_not_what_nvml_saw():
    """TensorFlow's BFC allocator grew to 9 GiB (NVML) for a job with 3 GiB in use at its peak: the run teaches
    the allocator's figure plus TensorFlow's measured margin; a run without allocator figures teaches NVML's."""
    tf = ALLOCATOR_MARGIN["tensorflow"]
    assert need_of(9 * GIB, {"tensorflow": 3 * GIB}, 4 * GIB, False, 0.2, 640) == math.ceil(3 * GIB * (1 + tf))
    both = need_of(9 * GIB, {"tensorflow": 1000, "torch": 2000}, 4 * GIB, False, 0.2, 640)
    assert both == math.ceil(1000 * (1 + tf)) + math.ceil(2000 * (1 + ALLOCATOR_MARGIN["torch"]))
    assert need_of(9 * GIB, {}, 4 * GIB, False, 0.2, 640) == math.ceil(9 * GIB * 1.2) - 640
    policy, cards = Policy(context_reserve_mib=640), [CardView("GPU-a", 0, 80 * GIB)]
    assert learned_quota(policy, Learned(9 * GIB, "own", 1, 3900), 0.2, cards) == Size(mib=3900)


def test_a_run_that_ran_out_of_memory_raises_what_the_notebook_learns_and_stays_a_floor():
    failed = need_of(3000, {"tensorflow": 2900}, 3072, True, 0.2, 640)
    assert failed == retry_quota_mib(3072) == 4608  # 1.5 x the quota it had, rounded up to 256 MiB
    own = [("ann", Run(3500, failed, True), 1000.0)] + [("ann", Run(2000, 2500), 1001.0 + i) for i in range(9)]
    got = choose_peak(own, "ann", RULES)  # nine good runs later, the failed one is still the floor
    assert (got.need_mib, got.failed, got.source) == (4608, True, "own")
    assert choose_peak(own[1:], "ann", RULES).need_mib == 2500
    others = [(f"s{i}", Run(2000, 2500 + i), 1000.0 + i) for i in range(3)]
    got = choose_peak(others, "ann", RULES)  # the quorum's median of the quotas taught
    assert (got.need_mib, got.source, got.failed) == (2501, "others", False)


def test_paths_that_are_not_remembered():
    assert history_key(None) == "" and history_key(" a/b.ipynb ") == "a/b.ipynb"
    assert history_key("x" * (MAX_PATH + 1)) is None and history_key("a\nb.ipynb") is None


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"history_margin": -0.1}, "GpuShareApp.history_margin: -0.1 is out of range; use 0 to 10"),
        ({"history_margin": float("nan")}, "GpuShareApp.history_margin: nan is out of range"),
        ({"history_max_age_days": -1}, "GpuShareApp.history_max_age_days: -1(.0)? is out of range"),
        ({"history_quorum": -2}, "GpuShareApp.history_quorum: -2 is out of range"),
    ],
)
def test_nonsense_settings_are_refused_with_their_name(settings, message):
    with pytest.raises(PolicyError, match=message):
        settings_from(_config(settings))


def test_a_policy_without_history_is_refused():
    settings = settings_from(_config({"quota_from_history": True, "history_max_age_days": 0}))
    with pytest.raises(PolicyError, match="quota_from_history = True learns from recorded peaks, but history_max_age"):
        settings.build_history()
    rules = settings_from(_config({"history_teachers": ["prof"], "history_margin": 0.5})).build_history()
    assert rules == HistoryRules(teachers=frozenset({"prof"}), margin=0.5)


def _config(values: dict):
    from traitlets.config import Config

    return Config({"GpuShareApp": values})


# -- the ledger ----------------------------------------------------------------------------------------


def _reserve(ledger: Ledger, kid: str, user: str, kernel: ProcessRef | None = None) -> None:
    ledger.reserve(Request(kid, Size(mib=2048), user, "python3"), POLICY, CARDS, wait=False)
    ledger.attach(kid, kernel or ProcessRef.me())


def test_runs_are_kept_per_kernel_process_and_learned_per_user(tmp_path):
    ledger = Ledger(tmp_path / "l.sqlite")
    _reserve(ledger, "k1", "ann")
    assert ledger.record_peak("k1", NB, Run(1500), RULES)
    assert ledger.record_peak("k1", NB, Run(1700), RULES)  # the same process again: replaces
    assert ledger.learned_peak("ann", "python3", NB, RULES) == Learned(1700, "own", 1)
    assert ledger.learned_peak("ann", "python3", "other.ipynb", RULES) is None
    assert ledger.learned_peak("ann", "ir", NB, RULES) is None  # another kernelspec
    assert ledger.learned_peak("bob", "python3", NB, RULES) is None  # one user teaches no one else
    ledger.attach("k1", ProcessRef(ProcessRef.me().pid, 1.0))  # restarted: a new process, a new run
    ledger.record_peak("k1", NB, Run(900), RULES)
    assert ledger._file._db.execute("SELECT count(*) FROM peaks").fetchone()[0] == 2
    assert not ledger.record_peak("gone", NB, Run(900), RULES)  # no lease, no run
    assert not ledger.record_peak("k1", NB, Run(900), HistoryRules(max_age_s=0))  # no history kept
    ledger.close()


def test_what_notebooks_taught_survives_a_ledger_removed_under_the_server(tmp_path):
    """rm ledger.sqlite* under a running server: the file is re-created with its reservations, and with the peaks
    the server's connection could still read in the removed file (they were lost before)."""
    ledger = Ledger(tmp_path / "l.sqlite")
    _reserve(ledger, "k1", "ann")
    assert ledger.record_peak("k1", NB, Run(1500), RULES)
    for suffix in ("", "-wal", "-shm"):
        (tmp_path / f"l.sqlite{suffix}").unlink(missing_ok=True)
    _reserve(ledger, "k2", "ann")  # the next write re-creates the file
    assert "1 recorded peak(s)" in ledger.replaced
    assert ledger.learned_peak("ann", "python3", NB, RULES) == Learned(1500, "own", 1)
    ledger.close()
    again = Ledger(tmp_path / "l.sqlite")  # and it is in the new file, for every process
    assert again.learned_peak("ann", "python3", NB, RULES) == Learned(1500, "own", 1)
    again.close()


def test_runs_are_pruned_by_age_and_bounded(tmp_path, monkeypatch):
    import jupyter_gpushare.ledger.rows as rows_mod

    ledger = Ledger(tmp_path / "l.sqlite")
    for i in range(RUNS_KEPT + 3):
        _reserve(ledger, f"k{i}", "ann")
        assert ledger.record_peak(f"k{i}", NB, Run(1000 + i), RULES)
        ledger.release(f"k{i}")
    count = "SELECT count(*) FROM peaks"
    assert ledger._file._db.execute(count).fetchone()[0] == RUNS_KEPT
    ledger._file._db.execute("UPDATE peaks SET recorded = recorded - ?", (91 * DAY_S,))  # three months later
    assert ledger.learned_peak("ann", "python3", NB, RULES) is None  # too old to learn from
    _reserve(ledger, "new", "ann")
    ledger.record_peak("new", NB, Run(800), RULES)
    assert ledger._file._db.execute(count).fetchone()[0] == 1  # and forgotten at the next record
    monkeypatch.setattr(rows_mod, "ROWS_PER_USER", 3)
    for i in range(5):
        ledger.record_peak("new", f"nb{i}.ipynb", Run(800), RULES)  # the same process: one row, renamed
        _reserve(ledger, f"m{i}", "mallory")
        assert ledger.record_peak(f"m{i}", f"nb{i}.ipynb", Run(800), RULES)
        ledger.release(f"m{i}")
    users = dict(ledger._file._db.execute("SELECT user, count(*) FROM peaks GROUP BY user").fetchall())
    assert users == {"ann": 1, "mallory": 3}  # one user's writes do not push out another's
    ledger.close()


@pytest.mark.parametrize("version", [1, 2])
def test_an_old_ledger_gains_the_table_and_loses_nothing(tmp_path, version):
    from old_ledgers import V1_SCHEMA

    path = tmp_path / "l.sqlite"
    me = ProcessRef.me()
    db = sqlite3.connect(path)
    db.executescript(V1_SCHEMA)
    if version == 2:  # the schema before the peaks table
        db.executescript(
            "ALTER TABLE leases ADD COLUMN owner_session TEXT; ALTER TABLE waiters ADD COLUMN owner_session TEXT;"
            "CREATE TABLE sessions (id TEXT PRIMARY KEY, user TEXT NOT NULL, expires REAL NOT NULL);"
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL); PRAGMA user_version=2;"
        )
    db.execute(
        "INSERT INTO leases (kernel_id, card_uuid, card_index, quota_mib, reserve_mib, user, kernel_name, owner_pid,"
        " owner_start, kernel_pid, kernel_start, created) VALUES ('old', 'GPU-a', 0, 2048, 512, 'ann', 'python3',"
        " ?, ?, ?, ?, 1.0)",
        (me.pid, me.start, me.pid, me.start),
    )
    db.commit()
    assert not db.execute("SELECT 1 FROM sqlite_master WHERE name='peaks'").fetchone()
    db.close()
    ledger = Ledger(path)
    assert [(x.kernel_id, x.user, x.kernel) for x in ledger.leases()] == [("old", "ann", me)]
    assert ledger.record_peak("old", NB, Run(3000), RULES)
    assert ledger.learned_peak("ann", "python3", NB, RULES).peak_mib == 3000
    assert ledger._file._db.execute("PRAGMA user_version").fetchone()[0] == 2  # older servers still open it
    ledger.close()


def test_pruning_by_age_and_by_the_row_bound_walks_an_index(tmp_path):
    """Every record_peak prunes the whole table: without an index on 'recorded' that is a full scan and sort
    (290 ms at 200,000 rows), which one student's requests would repeat on the broker's only thread."""
    ledger = Ledger(tmp_path / "l.sqlite")
    db = ledger._file._db
    for statement in (
        "DELETE FROM peaks WHERE recorded < 1.0",
        "SELECT rowid FROM peaks WHERE 1 ORDER BY recorded DESC LIMIT -1 OFFSET 5",
    ):
        plan = " ".join(row[-1] for row in db.execute(f"EXPLAIN QUERY PLAN {statement}"))
        assert "peaks_recorded" in plan and "TEMP B-TREE" not in plan, plan
    ledger.close()


# -- the broker's request ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, wrong",
    [
        ({"kernel_id": "k", "path": NB, "peak_mib": 0}, "'peak_mib' must be a whole number of MiB from 1"),
        ({"kernel_id": "k", "path": NB, "peak_mib": -5}, "'peak_mib' must be a whole number of MiB from 1"),
        ({"kernel_id": "k", "path": NB, "peak_mib": 1 << 40}, "'peak_mib' must be a whole number of MiB from 1"),
        ({"kernel_id": "k", "path": NB, "peak_mib": True}, "'peak_mib' must be a whole number"),
        ({"kernel_id": "k", "path": NB, "peak_mib": 1.5}, "'peak_mib' must be a whole number"),
        ({"kernel_id": "k", "path": NB}, "'peak_mib' must be a whole number of MiB from 1"),
        ({"kernel_id": "k", "path": "x" * (MAX_PATH + 1), "peak_mib": 9}, "'path' must be text matching"),
        ({"kernel_id": "k", "path": "a\x00b", "peak_mib": 9}, "'path' must be text matching"),
        ({"kernel_id": "k", "path": "\ud800.ipynb", "peak_mib": 9}, "'path' must be text matching"),
        ({"kernel_id": "k", "path": "a\x85b.ipynb", "peak_mib": 9}, "'path' must be text matching"),
        ({"kernel_id": "k", "path": "bnypi.\u202eexe", "peak_mib": 9}, "'path' must be text matching"),
        ({"kernel_id": "k", "path": ["a"], "peak_mib": 9}, "'path' must be text matching"),
        ({"kernel_id": "../../k", "path": NB, "peak_mib": 9}, "'kernel_id' must be text matching"),
    ],
)
def test_the_broker_refuses_bad_history_values(args, wrong):
    with pytest.raises(BrokerRefused, match=f"Bad 'record_peak' request: {wrong}"):
        decode_request({"op": "record_peak", "args": args})


@pytest.mark.parametrize("path", ["\ud800", "a\x85b", "a\u2028b", "bnypi.\u202eexe", "x" * (MAX_PATH + 1)])
def test_the_broker_refuses_a_bad_path_to_learn_from(path):
    with pytest.raises(BrokerRefused, match="Bad 'learned_peak' request: 'path' must be text matching"):
        decode_request({"op": "learned_peak", "args": {"kernel_name": "python3", "path": path}})


def test_through_the_broker_a_user_writes_only_their_own_kernels_history(inproc):
    broker, who = inproc
    alice, bob = who["alice"], who["bob"]
    broker.handle(alice, "reserve", {"kernel_id": "a1", "mib": 2048, "kernel_name": "python3"})
    broker.handle(bob, "reserve", {"kernel_id": "b1", "mib": 2048, "kernel_name": "python3"})
    with pytest.raises(BrokerRefused, match="another user's; you may not record the peak of it"):
        broker.handle(bob, "record_peak", {"kernel_id": "a1", "path": NB, "peak_mib": 1})
    with pytest.raises(BrokerRefused, match="another user's"):  # not even an admin writes another user's history
        broker.handle(who["admin"], "record_peak", {"kernel_id": "a1", "path": NB, "peak_mib": 1})
    with pytest.raises(BrokerRefused, match="more than kernel b1's card holds"):  # a 10 GiB card
        broker.handle(bob, "record_peak", {"kernel_id": "b1", "path": NB, "peak_mib": 40 * GIB})
    assert not broker.handle(bob, "record_peak", {"kernel_id": "nobody", "path": NB, "peak_mib": 1})
    assert broker.handle(alice, "record_peak", {"kernel_id": "a1", "path": NB, "peak_mib": 3000})
    assert broker.handle(bob, "record_peak", {"kernel_id": "b1", "path": NB, "peak_mib": 9000})  # bob's own: kept
    learned = {u: broker.handle(who[u], "learned_peak", {"kernel_name": "python3", "path": NB}) for u in who}
    assert learned["alice"] == {"peak_mib": 3000, "source": "own", "users": 1}  # bob's 9 GiB does not reach her
    assert learned["bob"] == {"peak_mib": 9000, "source": "own", "users": 1}
    assert learned["admin"] is None  # two users are not a quorum
    rows = broker._ledger._file._db.execute("SELECT user, kernel_name, peak_mib FROM peaks ORDER BY user").fetchall()
    assert [tuple(r) for r in rows] == [("alice", "python3", 3000), ("bob", "python3", 9000)]
    with pytest.raises(BrokerRefused, match="more than kernel b1's card holds"):  # the quota it teaches, too
        broker.handle(bob, "record_peak", {"kernel_id": "b1", "path": NB, "peak_mib": 1, "need_mib": 40 * GIB})
    with pytest.raises(BrokerRefused, match="'failed' must be true or false"):
        broker.handle(bob, "record_peak", {"kernel_id": "b1", "path": NB, "peak_mib": 1, "failed": 1})
    failed = {"kernel_id": "a1", "path": NB, "peak_mib": 3100, "need_mib": 4608, "failed": True}
    assert broker.handle(alice, "record_peak", failed)  # the same process again: its run, now failed
    got = broker.handle(alice, "learned_peak", {"kernel_name": "python3", "path": NB})
    assert got == {"peak_mib": 3100, "source": "own", "users": 1, "need_mib": 4608, "failed": True}


def test_the_broker_applies_its_own_rules_not_the_servers(inproc):
    broker, who = inproc
    broker.handle(who["alice"], "reserve", {"kernel_id": "a1", "mib": 2048, "kernel_name": "python3"})
    broker.handle(who["alice"], "record_peak", {"kernel_id": "a1", "path": NB, "peak_mib": 3000})
    from jupyter_gpushare.broker import BrokerLedger  # a server's own rules are not sent at all

    sent = []
    client = BrokerLedger("/nonexistent")
    client._call = lambda op, **args: sent.append((op, args))
    client.learned_peak("bob", "python3", NB, HistoryRules(teachers=frozenset({"alice"}), quorum=1))
    assert sent == [("learned_peak", {"kernel_name": "python3", "path": NB})]
    assert broker.handle(who["bob"], "learned_peak", {"kernel_name": "python3", "path": NB}) is None
    broker.history = HistoryRules(teachers=frozenset({"alice"}))  # the admin's teachers, in the broker's config
    got = broker.handle(who["bob"], "learned_peak", {"kernel_name": "python3", "path": NB})
    assert got == {"peak_mib": 3000, "source": "others", "users": 1}


def test_other_users_notebooks_cannot_be_probed_by_guessing_paths(inproc):
    """The attack (issue 23, item 3): a student asks about 2,000 guessed paths to learn which notebooks a teacher
    ran and how large they got. Other users' runs answer for at most OTHERS_PER_HOUR notebooks an hour, without
    saying how many users ran one; the student's own notebooks and repeated asks are not limited."""
    from jupyter_gpushare.core.history import OTHERS_PER_HOUR

    broker, who = inproc
    broker.history = HistoryRules(teachers=frozenset({"alice"}))
    secret = "exam/final-solutions.ipynb"
    guesses = [f"week{i}/lab.ipynb" for i in range(1999)] + [secret]
    for i, path in enumerate([*guesses[:40], secret]):
        kid = f"a{i}"
        broker.handle(who["alice"], "reserve", {"kernel_id": kid, "mib": 1024, "kernel_name": "python3"})
        broker.handle(who["alice"], "record_peak", {"kernel_id": kid, "path": path, "peak_mib": 3072})
        broker.handle(who["alice"], "release", {"kernel_id": kid})
    broker.handle(who["bob"], "reserve", {"kernel_id": "b1", "mib": 1024, "kernel_name": "python3"})
    broker.handle(who["bob"], "record_peak", {"kernel_id": "b1", "path": "mine.ipynb", "peak_mib": 900})

    ask = lambda path: broker.handle(who["bob"], "learned_peak", {"kernel_name": "python3", "path": path})  # noqa: E731
    answered = [path for path in guesses if ask(path) is not None]
    assert len(answered) == OTHERS_PER_HOUR and secret not in answered  # the 2,000 guesses learn 30 paths
    assert ask(answered[0]) == {"peak_mib": 3072, "source": "others", "users": 1}  # asked before: still answered
    assert ask("mine.ipynb") == {"peak_mib": 900, "source": "own", "users": 1}  # his own: never limited
    assert broker.handle(who["admin"], "learned_peak", {"kernel_name": "python3", "path": secret}) is not None
