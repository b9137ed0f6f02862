"""Ledger reserve latency: 1 process alone, then 8 processes at once, on one SQLite file.

Each process does reserve → release cycles of random sizes on two 80 GiB simulated cards and
times every reserve call. Target: p99 under 20 ms with 8 concurrent processes; zero overbooking
(checked after every step).

    python bench/bench_ledger.py [--ops 500] [--json bench/results/ledger.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import random
import statistics
import tempfile
import time
from datetime import datetime, timezone

from jupyter_gpushare.core.policy import Policy, Size
from jupyter_gpushare.host.gpu import Card
from jupyter_gpushare.ledger.ledger import Lease, Ledger, Request

CARDS = [Card(0, "GPU-0", "sim", 81920, True), Card(1, "GPU-1", "sim", 81920, True)]
POLICY = Policy(context_reserve_mib=640)


def worker(path: str, seed: int, ops: int, start, out) -> None:
    rng = random.Random(seed)
    ledger = Ledger(path)
    held: list[str] = []
    latencies, overbooked = [], 0
    start.wait()
    for i in range(ops):
        if held and (rng.random() < 0.5 or len(held) > 6):
            ledger.release(held.pop(rng.randrange(len(held))))
        kid = f"{seed}-{i}"
        t0 = time.perf_counter()
        got = ledger.reserve(Request(kid, Size(mib=rng.choice([1024, 2048, 4096]))), POLICY, CARDS, wait=False)
        latencies.append(time.perf_counter() - t0)
        if isinstance(got, Lease):
            held.append(kid)
        overbooked += sum(total > 81920 for total in ledger.reserved_by_card().values())
    for kid in held:
        ledger.release(kid)
    out.put((latencies, overbooked))


def run(procs: int, ops: int) -> dict:
    path = os.path.join(tempfile.mkdtemp(prefix="gpushare-ledger-"), "ledger.sqlite")
    Ledger(path).close()
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    ps = [ctx.Process(target=worker, args=(path, s, ops, start, out)) for s in range(procs)]
    for p in ps:
        p.start()
    time.sleep(1.0)
    t0 = time.perf_counter()
    start.set()
    results = [out.get(timeout=600) for _ in ps]
    wall = time.perf_counter() - t0
    for p in ps:
        p.join()
    lat = sorted(x * 1000 for r in results for x in r[0])
    return {
        "processes": procs,
        "reserves": len(lat),
        "p50_ms": round(statistics.median(lat), 3),
        "p99_ms": round(lat[int(len(lat) * 0.99) - 1], 3),
        "max_ms": round(lat[-1], 3),
        "throughput_per_s": round(len(lat) / wall, 1),
        "overbooked_checks": sum(r[1] for r in results),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=500)
    ap.add_argument("--json")
    args = ap.parse_args()
    alone, eight = run(1, args.ops), run(8, args.ops)
    for r in (alone, eight):
        print(f"{r['processes']} process(es): {r['reserves']} reserves, p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, "
              f"max {r['max_ms']} ms, {r['throughput_per_s']}/s, overbooked {r['overbooked_checks']}")  # fmt: skip
    print(f"p99 ratio 8 processes / 1 process: {eight['p99_ms'] / alone['p99_ms']:.2f} (target: 8-process p99 < 20 ms)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({
                "benchmark": "ledger_reserve",
                "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}, SQLite {__import__('sqlite3').sqlite_version}",
                "one_process": alone, "eight_processes": eight,
            }, f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
