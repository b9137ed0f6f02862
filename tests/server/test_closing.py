"""A server that stops closes its ledger's files once its last kernel's reservation is given back, so that a
process which goes on (a test suite that starts many servers: jupyter_server's own) keeps none of them open.

A real QuotaManager on a simulated card, a real SQLite ledger; the files a process holds, as psutil reads them.
"""

from __future__ import annotations

import asyncio

import psutil

from jupyter_gpushare.core.policy import Policy, Size
from jupyter_gpushare.host.gpu import SimulatedBackend
from jupyter_gpushare.server.manager import QuotaManager


def ledger_files(tmp_path) -> list[str]:
    return sorted(f.path for f in psutil.Process().open_files() if f.path.startswith(str(tmp_path)))


def test_a_closing_server_closes_its_ledger_files_once_its_last_kernel_is_released(tmp_path):
    policy = Policy(default_quota=Size(mib=1024), context_reserve_mib=512, headroom=Size(mib=0))
    manager = QuotaManager(policy, SimulatedBackend([10240]), str(tmp_path / "ledger.sqlite"))

    async def case():
        for kid in ("k1", "k2"):
            assert (await manager.admit(kid, "python3", "python")).mode == "gpu"
        await manager.stop_admitting()  # the server stops; its kernels are shut down after its extensions
        await manager.release("k1")
        assert str(tmp_path / "ledger.sqlite.lock") in ledger_files(tmp_path)  # k2 still holds a reservation
        await manager.release("k2")
        assert ledger_files(tmp_path) == []
        await manager.release("k1")  # a late release of a kernel already gone changes nothing, and raises nothing

    try:
        asyncio.run(asyncio.wait_for(case(), 30))
    finally:
        manager.close()
