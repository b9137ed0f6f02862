"""What one snapshot's ledger read costs: the server reads the ledger once per snapshot (server/snapshot.py's
read: leases, the host's line, what processes without a reservation use, the host view), on the ledger's thread.

A class's ledger on one SQLite file (two 80 GiB simulated cards): N kernels holding reservations and N in line.
Printed side by side in one run: one snapshot's read against one reserve (a kernel's admission, the ledger's
busiest call), their medians and p99, and the ratio.

    python bench/bench_snapshot_read.py [--kernels 40] [--reads 400] [--json bench/results/snapshot_read.json]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from datetime import datetime, timezone

from _report import report

from jupyter_gpushare.core.policy import Policy, Size
from jupyter_gpushare.host.gpu import Card
from jupyter_gpushare.ledger.ledger import Ledger, Request
from jupyter_gpushare.ledger.view import host_view

CARDS = [Card(0, "GPU-0", "sim", 81920, True), Card(1, "GPU-1", "sim", 81920, True)]
POLICY = Policy(context_reserve_mib=640)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=40, help="kernels holding reservations, and as many in line")
    ap.add_argument("--reads", type=int, default=400)
    ap.add_argument("--holds", type=int, default=0, help="past holds first (each reserve of one in line estimates)")
    ap.add_argument("--json")
    args = ap.parse_args()
    ledger = Ledger(os.path.join(tempfile.mkdtemp(), "ledger.sqlite"))
    quota = Size(mib=(2 * 81920) // args.kernels - POLICY.context_reserve_mib)
    for i in range(args.holds):  # kernels that held a reservation and gave it back (ledger/estimate.py)
        ledger.reserve(Request(f"past{i}", quota, f"user{i % 20}", "python3"), POLICY, CARDS, wait=False)
        ledger.release(f"past{i}")
    for i in range(2 * args.kernels):  # the first half fits, the second waits
        ledger.reserve(Request(f"k{i}", quota, f"user{i % 20}", "python3"), POLICY, CARDS, wait=True)
    leases, waiters = ledger.leases(), ledger.waiters()
    reads, reserves = [], []
    for i in range(args.reads):
        t0 = time.perf_counter()
        leases, waiters = ledger.leases(), ledger.waiters()
        ledger.outside([], leases)
        host_view(ledger, "user0", CARDS, POLICY, leases, waiters)
        reads.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        ledger.reserve(Request(f"k{args.kernels + i % args.kernels}", quota, "u", "python3"), POLICY, CARDS, wait=True)
        reserves.append((time.perf_counter() - t0) * 1000)
    result = {
        "bench": "snapshot_read",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": f"{platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "leases": len(leases),
        "waiters": len(waiters),
        "holds": args.holds,
        "read_ms": {"median": round(statistics.median(reads), 3), "p99": round(percentile(reads, 0.99), 3)},
        "reserve_ms": {"median": round(statistics.median(reserves), 3), "p99": round(percentile(reserves, 0.99), 3)},
    }
    result["read_over_reserve"] = round(result["read_ms"]["median"] / result["reserve_ms"]["median"], 2)
    report(result, args.json)


if __name__ == "__main__":
    main()
