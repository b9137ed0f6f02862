"""The server's one snapshot (server/snapshot.py): built by its owner alone, at each sampler tick and after each
change of the registry, each one of a single moment; a reader never gets one older than its request.

A real QuotaManager on a simulated card, a real SQLite ledger, the real sampler ticked by hand.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest

from jupyter_gpushare.core.policy import Policy, Size
from jupyter_gpushare.host.gpu import SimulatedBackend
from jupyter_gpushare.host.reports import report_dir
from jupyter_gpushare.ledger.file import LedgerError
from jupyter_gpushare.server.manager import QuotaManager
from jupyter_gpushare.server.sampler import Sampler
from jupyter_gpushare.server.snapshot import Snapshots


@pytest.fixture
def manager(tmp_path):
    policy = Policy(default_quota=Size(mib=1024), context_reserve_mib=512, headroom=Size(mib=0))
    manager = QuotaManager(policy, SimulatedBackend([10240]), str(tmp_path / "ledger.sqlite"))
    yield manager
    manager.close()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_a_reader_after_a_change_gets_a_snapshot_that_holds_it(manager):
    async def case():
        snapshots = Snapshots(manager)
        assert (await snapshots.latest()).kernels == ()
        await manager.admit("k1", "python3", "python")
        snap = await snapshots.latest()  # no tick since: the change alone makes a new one
        assert [k.kernel_id for k in snap.kernels] == ["k1"] and snap.kernel("k1").state == "running"
        assert snap.server.cards[0].row.reserved_mib == 1536  # the ledger of the same moment
        assert [e["kind"] for e in snap.events] == ["reserved"]
        manager.update(manager.records["k1"], pid=4242)  # any field of a record, not only the ones announced
        assert (await snapshots.latest()).kernel("k1").record.pid == 4242
        assert snap.kernel("k1").record.pid is None and snap.kernel("k1").to_json()["pid"] is None  # of its moment
        unchanged = await snapshots.latest()
        assert await snapshots.latest() is unchanged  # nothing changed: the same snapshot, not a new build

    run(case())


def test_readers_waiting_for_a_build_when_the_server_stops_get_the_last_snapshot(manager):
    """The server stops while requests wait for a build (a class's pollers): each gets the last snapshot, not a
    CancelledError that jupyter_server logs as an uncaught exception per request."""

    async def case():
        snapshots = Snapshots(manager)
        last = await snapshots.latest()
        manager.update(manager.record("k1", "python3", "python"), pid=4242)  # a change: the readers wait for it
        readers = [asyncio.ensure_future(snapshots.latest()) for _ in range(3)]
        await asyncio.sleep(0)  # the build starts, and waits for the ledger
        snapshots.stop()
        assert await asyncio.gather(*readers) == [last] * 3
        reader = asyncio.ensure_future(snapshots.latest())  # a reader that is cancelled itself is cancelled
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader

    run(case())


def test_a_reader_that_comes_while_the_first_build_runs_gets_that_build(manager):
    async def case():
        snapshots = Snapshots(manager)
        snapshots.tick(Sampler(manager).tick())
        await asyncio.sleep(0)  # its build starts, and waits for the ledger
        snap = await snapshots.latest()
        assert snap.seq == 1 and snap.server.backend == "simulated"

    run(case())


def test_each_tick_gives_one_snapshot_whose_parts_are_of_one_moment(manager):
    async def case():
        snapshots = Snapshots(manager, judged=lambda: {"k1": "near_quota"})
        await manager.admit("k1", "python3", "python")
        manager.update(manager.records["k1"], pid=os.getpid())  # (a real process: the sampler walks process trees)
        manager.backend.fake.add_process(os.getpid(), 1400)
        sampler = Sampler(manager)
        before = await snapshots.latest()
        usage = sampler.tick()
        snapshots.tick(usage)
        snap = await _next(snapshots, before)
        assert snap.usage is usage and snap.seq == before.seq + 1
        kernel = snap.kernel("k1").to_json()
        assert kernel["used_mib"] == usage.kernels["k1"].used_mib == 1400
        assert kernel["state"] == "near_quota" and snap.judged == {"k1": "near_quota"}  # the judgment of that tick
        mine = sum(k.record.lease.reserved_mib for k in snap.kernels if k.record.lease)
        assert snap.server.cards[0].row.reserved_mib == mine == 1536
        assert snap.cards()["cards"][0]["used_by_kernels_mib"] == 1400 and snap.host["kernels"][0]["kernel_id"] == "k1"

    run(case())


def test_changes_close_together_are_built_into_few_snapshots(manager):
    async def case():
        snapshots = Snapshots(manager)
        await snapshots.latest()
        first = snapshots.current.seq
        for i in range(100):
            manager.event("released", None, reserved_mib=i, why="a test")
            snapshots.changed(None)
        deadline = time.monotonic() + 10
        while len(snapshots.current.events) < 100 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # past the settling time: the owner builds them without a reader
        snap = snapshots.current
        assert len(snap.events) == 100 and snap.seq - first <= 2

    run(case())


def test_a_ledger_that_fails_keeps_the_last_reading_and_says_why_there_is_no_host_view(manager):
    async def case():
        snapshots = Snapshots(manager)
        await manager.admit("k1", "python3", "python")
        assert (await snapshots.latest()).host is not None

        def down(call):
            raise LedgerError("the broker is not answering")

        manager.ledger.call = down
        manager.update(manager.records["k1"], pid=1)
        snap = await snapshots.latest()
        assert snap.host is None and snap.host_error == "the broker is not answering"
        assert snap.server.cards[0].row.reserved_mib == 1536  # what it read last

    run(case())


async def _next(snapshots: Snapshots, before):
    for _ in range(300):
        if snapshots.current is not before:
            return snapshots.current
        await asyncio.sleep(0.01)
    raise AssertionError("no new snapshot after the tick")


def test_a_stopped_owner_builds_nothing_more_and_answers_with_what_it_has(manager):
    async def case():
        snapshots = Snapshots(manager)
        last = await snapshots.latest()
        snapshots.stop()
        snapshots.tick(Sampler(manager).tick())
        snapshots.changed("k1")
        await manager.admit("k1", "python3", "python")
        assert await snapshots.latest() is last
        await asyncio.sleep(0.2)
        assert snapshots.current is last

    run(case())


def test_a_build_only_reads_and_an_oom_a_report_tells_is_noted_by_whoever_hears_the_reports(
    manager, tmp_path, monkeypatch
):
    """A kernel's report says PyTorch ran out of memory. Building the snapshot changes no record (it noted the OOM
    on the record while it read, before); the reports go to ``on_reports`` after the build, and the server wires
    them to the registry's learning, whose change brings the next build."""
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    directory = report_dir()
    with open(os.path.join(directory, f"k1.{os.getpid()}.json"), "w") as f:
        json.dump({"pid": os.getpid(), "root": True, "time": time.time(), "frameworks": {}, "oom": "torch"}, f)

    async def case():
        await manager.admit("k1", "python3", "python")
        heard = []
        snap = await Snapshots(manager, on_reports=heard.append).latest()
        assert snap.kernel("k1").record.oom is None and manager.records["k1"].oom is None  # read, nothing written
        assert heard and heard[0]["k1"]["oom"] == "torch"

        snapshots = Snapshots(manager, on_reports=manager.learning.saw_reports)
        await snapshots.latest()
        assert manager.records["k1"].oom == "torch"
        view = (await snapshots.latest()).kernel("k1")
        assert view.to_json()["oom"] == {"framework": "torch", "retry_quota_mib": 1536}

    run(case())
