"""What kernels in line cost a kernel that holds a GPU, on the CPU (issue 48, item 1; GpuShareApp.line_cpu).

A "running kernel" does a fixed CPU job (a pure-Python loop, single-threaded, as a training loop's Python side and
data loading are), timed: alone; beside WAITERS processes that start and import PyTorch over and over (what 22 to 66
kernels in line do at a class's start) at normal priority; and beside the same yielding. Each process leads a session
of its own, as every kernel does (jupyter_client starts it so), except in the first yielding case. The cases:

- normal: the waiters at normal priority;
- idle, one session: the waiters under SCHED_IDLE, all in the job's session (how this bench ran before 2026-11-30);
- idle: the waiters under SCHED_IDLE, each in its own session (the code before 2026-11-30 gave kernels this);
- yield: SCHED_IDLE, and the session's group at nice 19 where the scheduler groups by session (autogroup, sched(7)):
  what 0492f3f gave a kernel in line, withdrawn since (bench/README.md).

Side by side in one run, ROUNDS times in turn; prints the job's seconds and the ratios to alone, how many imports the
waiters finished meanwhile (they still progress on idle CPU), and whether this host groups by session.

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
AUTOGROUP = "/proc/sys/kernel/sched_autogroup_enabled"


CASES = ("normal", "idle, one session", "idle", "yield")


def job(session: bool) -> float:
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", JOB], check=True, start_new_session=session)
    return time.monotonic() - t0


def waiter(case: str) -> subprocess.Popen:
    """A process that starts Python and imports PyTorch again and again (a kernel in line, starting), printing one
    line per import, run as ``case`` says (what it starts inherits its policy and session)."""
    loop = f"import subprocess, sys\nwhile True:\n    subprocess.run([sys.executable, '-c', {IMPORT!r}]); print(1, flush=True)\n"

    def sched_idle() -> None:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))

    process = subprocess.Popen(
        [sys.executable, "-c", loop],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=sched_idle if case.startswith("idle") else None,
        start_new_session=case != "idle, one session",
    )
    if case == "yield" and grouped():  # its session's group at nice 19 (as 0492f3f did, since withdrawn)
        with open(f"/proc/{process.pid}/autogroup", "w") as f:
            f.write("19")
    return process


def grouped() -> bool:
    """Whether this host's scheduler groups processes by session (autogroup, sched(7))."""
    try:
        with open(AUTOGROUP) as f:
            return f.read().strip() == "1"
    except OSError:
        return False


def beside(count: int, case: str) -> tuple[float, int]:
    """The job's seconds beside ``count`` waiters, and how many imports they finished meanwhile."""
    waiters = [waiter(case) for _ in range(count)]
    time.sleep(2.0)  # under way
    try:
        seconds = job(session=case != "idle, one session")
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
    runs: dict[str, list[float]] = {"alone": [], **{case: [] for case in CASES}}
    imports: dict[str, list[int]] = {case: [] for case in CASES}
    for _ in range(args.rounds):
        runs["alone"].append(job(session=True))
        for case in CASES:
            seconds, done = beside(args.waiters, case)
            runs[case].append(seconds)
            imports[case].append(done)
    alone = statistics.median(runs["alone"])
    figures = {
        "cpus": len(os.sched_getaffinity(0)),
        "waiters": args.waiters,
        "autogroup": grouped(),
        "job_s": runs,
        "imports_done_meanwhile": imports,
        "ratio_to_alone": {case: round(statistics.median(runs[case]) / alone, 2) for case in CASES},
    }
    report(figures, args.json)


if __name__ == "__main__":
    main()
