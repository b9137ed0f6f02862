"""One reading of a server's reservations: the ledger's leases, line and outside use, and its kernels' own reports,
read together (the ledger on its thread, the reports off it) and put in the API's shape (views.server_view).

Reading a kernel's report is also where an out-of-memory error it reports is noticed (Learning.at_oom).
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..host.reports import read_reports, report_dir
from ..ledger.ledger import Lease, Reservations
from .views import server_view


async def take_snapshot(manager: Any) -> dict[str, Any]:
    """Cards with their reservations, ``manager``'s kernels (QuotaManager), and the host-wide queue."""
    kernel_ids = list(manager.records)

    def read_ledger(ledger: Reservations) -> tuple[list[Lease], list, dict[str, int] | None]:
        leases = ledger.leases()
        return leases, ledger.waiters(), ledger.outside(manager.latest_samples(), leases)

    def read_kernel_reports() -> dict[str, Any]:  # the kernels' own word on their caps: off the ledger's thread
        directory = report_dir()
        return {kid: read_reports(directory, kid) for kid in kernel_ids}

    read, reports = await asyncio.gather(manager.ledger.on(read_ledger), manager.blocking(read_kernel_reports))
    leases, waiters, outside = read or ([], [], None)
    for kid, report in reports.items():
        rec = manager.records.get(kid)
        if rec is not None:
            manager.learning.at_oom(rec, (report or {}).get("oom"))
    ledger = {
        "path": None if manager.ledger.broker_socket else manager.ledger.path,
        "broker": manager.ledger.broker_socket,
        "error": manager.ledger.error,
        "replaced": manager.ledger.replaced,
    }
    return {
        **manager.backend.describe(),
        "ledger": ledger,
        "enforcement": manager.holding.enforcement(manager.policy.required_level),
        **server_view(manager.cards, manager.policy, leases, waiters, outside, list(manager.records.values()), reports),
    }
