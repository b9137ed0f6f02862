"""Where an idle study's time over its ideal went, along the path of the job that finished last.

    python bench/study/gaps.py bench/results/study/study-idle4x-importfirst-after-h100-2026-11-27-run*.json

The last job's end is reached by a chain: its second run (after its resume wait), its 60 s idle, its first run
from its grant, and before that grant the park that made room for it, whose kernel's first run began at an
earlier grant, back to a kernel granted at the class's start. The ideal (``harness.ideal_schedule``) is the same
chain with every switch free: each first run the median first run, the second the median second run. So the
time over the ideal splits exactly into: the class's start (until the first kernel of the chain ran its job),
each first run over the median (the first wave's holds its ``import torch``), each wave change (from a job's end
to the grant of the kernel that took its room: ``park_after``, the park, the grant), the idle over the study's,
the resume wait, and the second run over the median. A grant made by a stand-by or at a start ends the chain.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def chain(result: dict) -> list[dict]:
    """The jobs of the path to the last job's end, first granted first: each with the wave change before its
    grant (None for the chain's first) and the park that made its room."""
    jobs = {j["index"]: j for j in result["per_job"]}
    t0 = min(j["requested"] for j in jobs.values())
    made_room: dict[int, dict] = {}  # a granted job -> the park before its grant, taken in order
    parks: list[dict] = []
    for m in result["moves"]:
        if m["kind"] == "parked" and isinstance(m["job"], int):
            parks.append(m)
        elif m["kind"] == "stood-by":
            parks.append({**m, "job": None})
        elif m["kind"] == "admitted" and isinstance(m["job"], int) and parks and m["job"] not in made_room:
            if abs(jobs[m["job"]]["admitted"] - m["at"]) < 0.5:  # the first grant, not a resume's
                made_room[m["job"]] = parks.pop(0)
    path = []
    job: dict | None = max(jobs.values(), key=lambda j: j["finished"])
    while job is not None:
        park = made_room.get(job["index"])
        before = jobs.get(park["job"]) if park and park["job"] is not None else None
        change = job["admitted"] - (before["first_done"] - t0) if before else None
        path.append({"job": job, "park": park, "change_s": change})
        job = before
    return path[::-1]


def gaps(result: dict) -> dict:
    """The time over the ideal, in parts that add up to it (see the module's text)."""
    path = chain(result)
    t0 = min(j["requested"] for j in result["per_job"])
    run1, run2, idle = result["run1_s_median"], result["run2_s_median"], result["idle_s"]
    first, last = path[0]["job"], path[-1]["job"]
    waves = [p["job"]["first_done"] - t0 - p["job"]["admitted"] - run1 for p in path]
    parts = {
        "start_s": first["admitted"],
        "first_run_over_median_s": waves[0],
        "later_runs_over_median_s": sum(waves[1:]),
        "wave_changes_s": sum(p["change_s"] for p in path[1:]),
        "idle_over_s": last["again"] - last["first_done"] - idle,
        "resume_wait_s": last["again_wait_s"] or 0.0,
        "second_run_over_median_s": last["finished"] - last["again"] - (last["again_wait_s"] or 0.0) - run2,
    }
    return {
        "all_ok_s": result["all_ok_s"],
        "ideal_s": result["ideal_s"],
        "waves": len(path),
        "chain_ends_s": round(last["finished"] - t0, 2),
        "chain_starts_at_a_start": path[0]["park"] is None,
        "changes": [
            {"s": round(p["change_s"], 2), "park_s": p["park"].get("park_s"), "kind": p["park"]["kind"]}
            for p in path[1:]
        ],
        **{k: round(v, 2) for k, v in parts.items()},
        "over_ideal_s": round(sum(parts.values()), 2),
    }


def main(files: list[str]) -> int:
    head = ("start", "wave 1", "waves 2+", "changes", "idle", "resume", "run 2", "over", "all ok", "ideal")
    print(f"{'file':62}" + "".join(f"{h:>9}" for h in head))
    for name in files:
        for result in json.loads(Path(name).read_text())["results"]:
            if not result.get("moves") or not result.get("ideal_s"):
                continue
            g = gaps(result)
            cells = [g[k] for k in ("start_s", "first_run_over_median_s", "later_runs_over_median_s",
                                    "wave_changes_s", "idle_over_s", "resume_wait_s", "second_run_over_median_s",
                                    "over_ideal_s", "all_ok_s", "ideal_s")]  # fmt: skip
            print(f"{Path(name).name[:61]:62}" + "".join(f"{c:>9.2f}" for c in cells))
            print(
                f"{'':62}   changes: "
                + ", ".join(f"{c['s']:.2f} ({c['kind']}, park {c['park_s']})" for c in g["changes"])
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
