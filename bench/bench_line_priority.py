"""What kernels in line cost a kernel that holds a GPU, on the CPU (issue 48, item 1; GpuShareApp.line_cpu).

A "running kernel" does a fixed CPU job (a pure-Python loop, single-threaded, as a training loop's Python side and
data loading are), timed: alone; beside WAITERS processes that start and import PyTorch over and over (what 22 to 66
kernels in line do at a class's start) at normal priority; and beside the same under SCHED_IDLE (host/priority.py),
as kernels in line run with line_cpu = 'idle'. Side by side in one run, ROUNDS times in turn; prints the job's
seconds and the ratios to alone, and how many imports the waiters finished meanwhile (they still progress on idle
CPU).

    python bench/bench_line_priority.py [--waiters 4] [--rounds 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from _report import report

JOB = "n = 0\nfor i in range(60_000_000): n += i * i % 7\n"  # about 3-5 s of one core
IMPORT = "import torch"


def job() -> float:
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", JOB], check=True)
    return time.monotonic() - t0


def waiter(idle: bool) -> subprocess.Popen:
    """A process that starts Python and imports PyTorch again and again (a kernel in line, starting), printing one
    line per import; under SCHED_IDLE with ``idle`` (what it starts inherits it)."""
    loop = f"import subprocess, sys\nwhile True:\n    subprocess.run([sys.executable, '-c', {IMPORT!r}]); print(1, flush=True)\n"

    def yield_cpu() -> None:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))

    return subprocess.Popen(
        [sys.executable, "-c", loop], stdout=subprocess.PIPE, text=True, preexec_fn=yield_cpu if idle else None
    )


def beside(count: int, idle: bool) -> tuple[float, int]:
    """The job's seconds beside ``count`` waiters, and how many imports they finished meanwhile."""
    waiters = [waiter(idle) for _ in range(count)]
    time.sleep(2.0)  # under way
    try:
        seconds = job()
    finally:
        for w in waiters:
            w.kill()
    done = 0
    for w in waiters:
        out, _ = w.communicate()
        done += out.count("1")
    return seconds, done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waiters", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    subprocess.run([sys.executable, "-c", IMPORT], check=True)  # warm the page cache: every case reads it warm
    runs: dict[str, list[float]] = {"alone": [], "normal": [], "idle": []}
    imports: dict[str, list[int]] = {"normal": [], "idle": []}
    for _ in range(args.rounds):
        runs["alone"].append(job())
        for case in ("normal", "idle"):
            seconds, done = beside(args.waiters, case == "idle")
            runs[case].append(seconds)
            imports[case].append(done)
    alone = statistics.median(runs["alone"])
    figures = {
        "cpus": len(os.sched_getaffinity(0)),
        "waiters": args.waiters,
        "job_s": runs,
        "imports_done_meanwhile": imports,
        "ratio_to_alone": {case: round(statistics.median(runs[case]) / alone, 2) for case in ("normal", "idle")},
    }
    report(figures, args.json)


if __name__ == "__main__":
    main()
