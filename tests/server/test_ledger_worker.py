"""The ledger worker on real SQLite files: a ledger that cannot be opened is said, tried again with a back-off,
and used once it can be; calls run on the worker's one thread, typed against the Reservations protocol."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from jupyter_gpushare.core.policy import Policy, Size
from jupyter_gpushare.host.gpu import Card
from jupyter_gpushare.ledger.ledger import Lease, Ledger, LedgerError, ProcessRef, Request
from jupyter_gpushare.server.ledger_worker import RETRY_S, LedgerWorker


def test_a_ledger_that_cannot_be_opened_is_said_tried_again_and_used_once_it_can(tmp_path, caplog):
    blocker = tmp_path / "lib"
    blocker.write_text("a file where the ledger's folder should be")
    worker = LedgerWorker(str(blocker / "ledger.sqlite"), log=logging.getLogger("test.worker"))
    try:
        assert worker.error and str(blocker) in worker.error
        assert "Kernels will start without a GPU until this is fixed." in caplog.text
        assert worker.call(lambda ledger: ledger.leases()) is None  # no ledger: nothing, no error
        with pytest.raises(LedgerError) as raised:
            worker.must(lambda ledger: ledger.leases())
        assert str(raised.value) == worker.error
        blocker.unlink()
        blocker.mkdir()
        assert worker.call(lambda ledger: ledger.leases()) is None  # within its back-off: not tried yet
        time.sleep(RETRY_S[0] + 0.1)
        assert worker.call(lambda ledger: ledger.leases()) == [] and worker.error is None
        assert "can be used again" in caplog.text
    finally:
        worker.close()


def test_calls_run_on_the_one_worker_thread_and_a_dead_kernels_lease_is_reclaimed_as_it_opens(tmp_path):
    path = str(tmp_path / "ledger.sqlite")
    policy = Policy(default_quota=Size(mib=1024), context_reserve_mib=0, headroom=Size(mib=0))
    cards = [Card(index=0, uuid="GPU-0", name="test", total_mib=8192, simulated=True)]
    gone = Ledger(path, owner=ProcessRef(pid=2**22 + 12345, start=1.0))  # a server whose process is gone
    assert isinstance(gone.reserve(Request("gone", Size(mib=1024), "u"), policy, cards, False), Lease)
    gone.close()
    reclaimed: list[str] = []
    worker = LedgerWorker(path, on_reclaimed=lambda leases: reclaimed.extend(x.kernel_id for x in leases))
    try:
        assert reclaimed == ["gone"]
        threads = asyncio.run(asyncio.wait_for(_threads(worker), 10))
        assert len(set(threads)) == 1 and threads[0] != threading.get_ident()
    finally:
        worker.close()


async def _threads(worker: LedgerWorker) -> list[int]:
    return list(await asyncio.gather(*(worker.on(lambda ledger: threading.get_ident()) for _ in range(5))))
