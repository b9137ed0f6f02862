"""Where CI's time goes: each test's wall time and the CPU it and its processes used, then the sums per file.

    CI_CPU_LOG=/tmp/cpu.jsonl python -m pytest -n 4 --dist loadfile -m "not alone"   # (tests/conftest.py loads it)
    python bench/ci_cpu.py /tmp/cpu.jsonl [--top N]   # per file: CPU seconds, wall seconds, worker; the totals

On CI's 2 cores the suite is bound by CPU, not by waiting: the whole run takes about the CPU all tests use over the
cores, plus what the last worker does alone. A test's CPU is its worker's own and that of the processes it started
and waited for (a server's kernels, programs), from getrusage: a process not waited for is not counted, and the
browser's is mostly missed (CI run 49: test_browser ran 338 s and counted 56 CPU s).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from collections import defaultdict

import pytest


def _cpu() -> tuple[float, float]:
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    path = os.environ.get("CI_CPU_LOG")  # (not GPUSHARE_*: the kernels' environment of ours is managed by name)
    wall, (own, children) = time.monotonic(), _cpu()
    yield
    if not path:
        return
    own_after, children_after = _cpu()
    row = {
        "test": item.nodeid,
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        "start": time.time() - (time.monotonic() - wall),
        "wall_s": round(time.monotonic() - wall, 2),
        "cpu_s": round(own_after - own, 2),
        "children_cpu_s": round(children_after - children, 2),
    }
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", help="the JSON lines CI_CPU_LOG named")
    ap.add_argument("--top", type=int, default=None, help="only the N files that used the most CPU")
    ap.add_argument(
        "--since", type=float, default=None, help="CI's start (epoch s): say how long came before the tests"
    )
    args = ap.parse_args()
    rows = [json.loads(line) for line in open(args.log)]
    files: dict[str, dict] = defaultdict(lambda: {"cpu": 0.0, "wall": 0.0, "tests": 0, "worker": ""})
    for r in rows:
        f = files[r["test"].split("::")[0]]
        f["cpu"] += r["cpu_s"] + r["children_cpu_s"]
        f["wall"] += r["wall_s"]
        f["tests"] += 1
        f["worker"] = r["worker"]
    total_cpu = sum(f["cpu"] for f in files.values())
    span = max(r["start"] + r["wall_s"] for r in rows) - min(r["start"] for r in rows)
    print(
        f"{len(rows)} tests, {total_cpu:.0f} CPU s in all, {span:.0f} s from the first test's start to the last's end"
    )
    print(f"{'CPU s':>8} {'share':>6} {'wall s':>8} {'tests':>5}  worker  file")
    for name, f in sorted(files.items(), key=lambda kv: -kv[1]["cpu"])[: args.top]:
        share = f["cpu"] / total_cpu if total_cpu else 0
        print(f"{f['cpu']:8.0f} {share:6.1%} {f['wall']:8.0f} {f['tests']:5d}  {f['worker']:6}  {name}")
    by_worker: dict[str, float] = defaultdict(float)
    for r in rows:
        by_worker[r["worker"]] = max(by_worker[r["worker"]], r["start"] + r["wall_s"])
    first = min(r["start"] for r in rows)
    if args.since is not None:  # the install (pip, the sidebar's build) and the collection came before
        print(f"the first test started {first - args.since:.0f} s after CI's start")
    print(
        "each worker's last test ended at: " + ", ".join(f"{w} {t - first:.0f} s" for w, t in sorted(by_worker.items()))
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
