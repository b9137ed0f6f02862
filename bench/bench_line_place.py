"""Where a kernel takes its place in line: from its start (what jupyter-gpushare does) or at its first GPU use.

A model of one card and one class, not a run of the server: the line's own rule (first come, first served, a
kernel that fits is granted), one reservation each, held until the notebook closes (no parking, no timeout). Each
student opens a notebook (arrivals spread over the first minute), runs CPU cells for a while, then a GPU job, then
keeps the notebook open for a while before closing it; some never touch the GPU. The two rules, on the same
students (same seeds), side by side:

- **start**: the notebook asks for its reservation as it opens; its GPU job starts once the CPU cells are done
  and the reservation is granted;
- **first use**: it asks only when its first GPU cell runs, and that cell waits for the grant.

Printed per rule: how long a GPU cell waited for the GPU (mean, p95), when the last GPU job ended, and the GPU
time held by notebooks that were not using it (before their first GPU cell, and by those that never use it).

    python bench/bench_line_place.py [--students 40] [--slots 10] [--never 0.0,0.25] [--seeds 5]
                                     [--park-after 60,600] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from dataclasses import dataclass


@dataclass
class Student:
    opens: float
    cpu_s: float  # CPU cells before the first GPU cell
    gpu_s: float  # the GPU job (0: never uses the GPU)
    after_s: float  # the notebook stays open this long after its last cell


def class_of(n: int, never: float, rng: random.Random) -> list[Student]:
    return [
        Student(
            opens=rng.uniform(0, 60),
            cpu_s=rng.uniform(30, 180),
            gpu_s=0.0 if rng.random() < never else rng.uniform(60, 240),
            after_s=rng.uniform(0, 120),
        )
        for _ in range(n)
    ]


def run(students: list[Student], slots: int, rule: str, park_after: float | None = None) -> dict:
    """Simulate one class under ``rule`` ("start" or "first_use"), one second at a time. ``park_after``: while
    anyone waits, a reservation held by a notebook that has not run a GPU job for this long (since its grant, or
    since its job ended) goes to the line (at no cost; the server's parks take seconds), and that notebook asks
    again, at the back, when its GPU cell runs; None: no parking."""
    n = len(students)
    asks = [s.opens if rule == "start" else (s.opens + s.cpu_s if s.gpu_s else None) for s in students]
    granted: list[float | None] = [None] * n
    closed: list[float | None] = [None] * n
    gpu_end: list[float | None] = [None] * n
    line: list[int] = []
    held = 0
    idle_held_s = 0.0
    t = 0.0
    while any(c is None for c in closed):
        for i in sorted(range(n), key=lambda i: asks[i] if asks[i] is not None else 1e18):
            if asks[i] is not None and asks[i] <= t and granted[i] is None and i not in line:
                line.append(i)
        if park_after is not None:
            for i, s in enumerate(students):
                if len(line) <= slots - held or closed[i] is not None or granted[i] is None:
                    continue
                wants_gpu_at = s.opens + s.cpu_s
                before_job = s.gpu_s and gpu_end[i] is None and t < wants_gpu_at
                idle_since = gpu_end[i] if gpu_end[i] is not None else granted[i]
                if t - idle_since < park_after:
                    continue
                if before_job or not s.gpu_s or (gpu_end[i] is not None and t >= gpu_end[i]):
                    granted[i], held = None, held - 1
                    asks[i] = wants_gpu_at if before_job else None
        while line and held < slots:  # first come, first served: the head is granted once it fits
            i = line.pop(0)
            granted[i], held = t, held + 1
        for i, s in enumerate(students):
            if closed[i] is not None:
                continue
            wants_gpu_at = s.opens + s.cpu_s
            if s.gpu_s and granted[i] is not None and gpu_end[i] is None and t >= wants_gpu_at:
                gpu_end[i] = max(t, wants_gpu_at) + s.gpu_s
            last = gpu_end[i] if s.gpu_s else s.opens + s.cpu_s
            if last is not None and t >= last + s.after_s:
                closed[i] = t
                if granted[i] is not None:
                    held -= 1
                elif i in line:
                    line.remove(i)
            elif granted[i] is not None and (gpu_end[i] is None or t >= gpu_end[i]):
                idle_held_s += 1.0  # a reservation held by a notebook that is not running a GPU job now
        t += 1.0
    waits = [
        (granted[i] or 0) - (s.opens + s.cpu_s) if (granted[i] or 0) > s.opens + s.cpu_s else 0.0
        for i, s in enumerate(students)
        if s.gpu_s
    ]
    ordered = sorted(waits)
    return {
        "gpu_wait_mean_s": round(statistics.fmean(waits), 1) if waits else 0.0,
        "gpu_wait_p95_s": ordered[int(0.95 * (len(ordered) - 1))] if ordered else 0.0,
        "last_gpu_job_ends_s": max(e for e in gpu_end if e is not None) if any(gpu_end) else 0.0,
        "idle_reserved_slot_s": idle_held_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--students", type=int, default=40)
    ap.add_argument("--slots", type=int, default=10, help="reservations the card holds at once")
    ap.add_argument("--never", default="0.0,0.25", help="shares of students who never use the GPU")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--park-after", default="60,600", help="park_after values to model (besides no parking)")
    ap.add_argument("--json")
    args = ap.parse_args()
    results = []
    for never in (float(x) for x in args.never.split(",")):
        for seed in range(args.seeds):
            students = class_of(args.students, never, random.Random(seed))
            row = {"never": never, "seed": seed}
            parks = [None, *(float(x) for x in args.park_after.split(","))]
            for after in parks:
                for rule in ("start", "first_use"):
                    row[f"{rule}_park{after}"] = run(students, args.slots, rule, after)
            results.append(row)
            for after in parks:
                s, f = row[f"start_park{after}"], row[f"first_use_park{after}"]
                print(
                    f"never {never:.2f} seed {seed} park_after {after}: GPU wait mean "
                    f"{s['gpu_wait_mean_s']:6.1f} s (start) vs {f['gpu_wait_mean_s']:6.1f} s (first use), ratio "
                    f"{s['gpu_wait_mean_s'] / max(f['gpu_wait_mean_s'], 0.1):.2f}; last job "
                    f"{s['last_gpu_job_ends_s']:.0f} vs {f['last_gpu_job_ends_s']:.0f} s; idle reserved "
                    f"{s['idle_reserved_slot_s'] / 3600:.2f} vs {f['idle_reserved_slot_s'] / 3600:.2f} slot-h"
                )
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"model": __doc__.splitlines()[0], "args": vars(args), "runs": results}, out, indent=1)


if __name__ == "__main__":
    main()
