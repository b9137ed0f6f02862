"""Side by side: the extension's queue against memory growth, from the study's result files.

    python bench/study/compare.py bench/results/study/study-queue-h100-2026-11-24-run*.json

One line per recorded scenario (every run, not the best), then per framework and job count the
ratios that matter to a class: jobs lost in the batch, and the time until every job is ok
(growth's failed jobs rerun), gpushare's over growth's. Where the jobs are a whole number of
cards' worth, "of ideal" is the shortest a queue can take (jobs / kernels that fit, rounds of the
median run time) over gpushare's time until every job was ok.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path


def rows(files: list[str]) -> list[dict]:
    out = []
    for name in files:
        doc = json.loads(Path(name).read_text())
        for r in doc["results"]:
            if "skipped" in r or "all_ok_s" not in r:
                continue
            out.append({**r, "file": Path(name).name, "fit": r.get("fit") or doc["sizing"]["fit"]})
    return out


def seconds(v: float | None) -> str:
    return "never" if v is None else f"{v:.1f}"


def main(files: list[str]) -> int:
    runs = rows(files)
    if not runs:
        print("no study results with 'all_ok_s' in the files given", file=sys.stderr)
        return 1
    print(f"{'framework':10} {'scenario':9} {'jobs':>4} {'failed':>6} {'queued':>6} {'all ok (s)':>10}  file")
    for r in runs:
        print(
            f"{r['framework']:10} {r['scenario']:9} {r['jobs']:>4} {r['failed']:>6} {r['queued']:>6} "
            f"{seconds(r['all_ok_s']):>10}  {r['file']}"
        )
    groups: dict[tuple, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        groups[(r["framework"], r["jobs"])][r["scenario"]].append(r)
    print()
    for (framework, jobs), by in sorted(groups.items()):
        share, growth = by.get("gpushare", []), by.get("growth", [])
        fit = (share or growth)[0]["fit"]
        line = f"{framework} {jobs} jobs ({jobs / fit:.1f}x the {fit} that fit):"
        if share:
            lost = sum(r["failed"] for r in share)
            line += f" gpushare lost {lost} of {jobs * len(share)} over {len(share)} run(s)"
            waves = jobs // fit
            ideals = [waves * r["run_s_median"] / r["all_ok_s"] for r in share if r["all_ok_s"]]
            if ideals and jobs % fit == 0:  # a last, partial wave runs faster than a full one: no ideal
                line += f", {min(ideals):.0%}-{max(ideals):.0%} of ideal ({waves} waves)"
        if growth:
            lost = sum(r["failed"] for r in growth)
            never = sum(r["all_ok_s"] is None for r in growth)
            line += f"; growth lost {lost} of {jobs * len(growth)} in the batch"
            line += f" ({never} run(s) never all ok)" if never else ""
        ok_share = [r["all_ok_s"] for r in share if r["all_ok_s"]]
        ok_growth = [r["all_ok_s"] for r in growth if r["all_ok_s"]]
        if ok_share and ok_growth:
            line += (
                f"; all ok gpushare/growth = {min(ok_share) / max(ok_growth):.2f}-{max(ok_share) / min(ok_growth):.2f}"
            )
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
