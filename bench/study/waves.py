"""Where a class's time over its ideal goes, wave by wave, from the harness's result files (issue 48).

    python bench/study/waves.py bench/results/class_start-h200-2026-11-29-run*.json

One line per run (every run, not the best): its all ok; its share of the ideal (waves × the median grant → done of
all jobs, over all ok); the grants of wave 1; each job's grant → done; and the hand-off, from the k-th job's end to
the grant of the k-th kernel that waited (the room a job leaves goes to the next in line: its client's DELETE, the
kernel's exit, the release and the grant); and, where the run has them, from a job's end to its kernel's DELETE
answered (jupyter_server answers once the kernel is shut down and its room released), from a job's end to the
server's release of its room (its 'released' event), and from the k-th release to the k-th grant of a kernel in line.
"""

from __future__ import annotations

import json
import math
import statistics
import sys


def waves(result: dict) -> dict | None:
    """The figures of one run's result; None where it has no per-job grants (or not every job was ok)."""
    ok = sorted((j for j in result.get("per_job", ()) if j["status"] == "ok" and j.get("admitted") is not None),
                key=lambda j: j["admitted"])  # fmt: skip
    if not ok or not result.get("all_ok_s"):
        return None
    fit, grants = result["fit"], [j["admitted"] for j in ok]
    ends = sorted(j["finished"] for j in ok)
    runs = [j["finished"] - j["admitted"] for j in ok]
    handoffs = [grants[fit + k] - ends[k] for k in range(len(ok) - fit)]
    median = statistics.median(runs)
    shutdowns = [j["deleted"] - j["finished"] for j in ok if j.get("deleted") is not None]
    releases = sorted(j["released"] for j in ok if j.get("released") is not None)
    freed = [j["released"] - j["finished"] for j in ok if j.get("released") is not None]
    regrants = [grants[fit + k] - releases[k] for k in range(min(len(ok) - fit, len(releases)))]
    return {
        "all_ok_s": result["all_ok_s"],
        "free_place_s": free_place_s(ok, fit),
        "of_ideal": math.ceil(result["jobs"] / fit) * median / result["all_ok_s"],
        "wave1_grants_s": (grants[0], grants[min(fit, len(grants)) - 1]),
        "run_s": (min(runs), median, max(runs)),
        "handoff_s": (statistics.median(handoffs), max(handoffs)) if handoffs else None,
        "delete_s": (statistics.median(shutdowns), max(shutdowns)) if shutdowns else None,
        "release_s": (statistics.median(freed), max(freed)) if freed else None,
        "regrant_s": (statistics.median(regrants), max(regrants)) if regrants else None,
        "open_s": (result.get("open_to_first_output_median_s"), result.get("open_to_gpu_op_median_s")),
    }


def free_place_s(ok: list[dict], fit: int) -> float:
    """Place-seconds that stood free while a job still waited for its grant: each span between two grants or releases,
    times the places free in it (``fit`` less those granted and not yet released), until the last grant."""
    marks = sorted(
        [(j["admitted"], 1) for j in ok] + [(j["released"], -1) for j in ok if j.get("released") is not None]
    )
    last_grant = max(j["admitted"] for j in ok)
    free, held, before = 0.0, 0, marks[0][0]
    for at, change in marks:
        if at > last_grant:
            break
        free += max(0, fit - held) * (at - before)
        held, before = held + change, at
    return free


def main(files: list[str]) -> None:
    for name in files:
        run = json.load(open(name))
        for result in run["results"]:
            w = waves(result)
            label = f"{name.rsplit('/', 1)[-1]}: {run.get('class', '?')}, {run.get('arm', '?')}"
            if w is None:
                print(f"{label}: no per-job grants")
                continue
            hand = "–" if w["handoff_s"] is None else "{:.2f} s median, {:.2f} s at most".format(*w["handoff_s"])
            for key, what in (("delete_s", "end → DELETE answered"), ("release_s", "end → its room released"),
                              ("regrant_s", "a release → the next grant")):  # fmt: skip
                if w[key] is not None:
                    hand += "; {} {:.2f} s median, {:.2f} s at most".format(what, *w[key])
            if None not in w["open_s"]:
                hand += "; wave 1's open → first output {:.2f} s, → first GPU operation {:.2f} s (medians)".format(
                    *w["open_s"]
                )
            print(f"{label}: all ok {w['all_ok_s']:.1f} s, {w['of_ideal']:.1%} of ideal; wave 1 granted "
                  "{:.2f}–{:.2f} s; grant → done {:.1f} / {:.1f} / {:.1f} s; hand-off {}; places free while a job "
                  "waited {:.1f} place-s".format(*w["wave1_grants_s"], *w["run_s"], hand, w["free_place_s"]))  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
