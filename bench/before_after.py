"""One benchmark against this checkout's package and an earlier commit's, taking turns, in one run: each figure
side by side and its ratio, so that a refactor is shown no slower.

The earlier commit's package is unpacked into a temporary folder (``git archive``), and the same benchmark script,
this checkout's, runs with that folder first on PYTHONPATH, then with this checkout's, and so on ``--runs`` times,
the order swapped each time. Jupyter servers and kernels the benchmark starts inherit the path, so they run the
same tree. ``{out}`` in the benchmark's arguments is replaced by each run's own JSON file.

    python bench/before_after.py BASE OUT.json [--runs 3] -- bench/bench_snapshot_read.py --json {out}
    python bench/before_after.py BASE OUT.json [--runs 2] -- bench/bench_turnover.py {out} --trials 6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def figures(result: object, prefix: str = "") -> dict[str, float]:
    """A run's medians, by their path in its JSON (``read_ms.median``, ``median_s.file_own``, …)."""
    out: dict[str, float] = {}
    if isinstance(result, dict):
        for key, value in result.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and "median" in path:
                out[path] = float(value)
            elif isinstance(value, dict):
                out.update(figures(value, path))
    return out


def run(tree: Path, command: list[str], out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]).rstrip(":")}
    argv = [sys.executable, *(a.replace("{out}", str(out)) for a in command)]
    subprocess.run(argv, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", help="the earlier commit")
    ap.add_argument("out")
    ap.add_argument("--runs", type=int, default=3)
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args, command = ap.parse_args(argv[:split]), argv[split + 1 :]
    if not command:
        ap.error("name the benchmark after --")
    commit = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()  # fmt: skip
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "before"
        before.mkdir()
        archive = subprocess.run(["git", "archive", commit, "jupyter_gpushare"], cwd=ROOT, capture_output=True,
                                 check=True).stdout  # fmt: skip
        subprocess.run(["tar", "-x", "-C", str(before)], input=archive, check=True)
        trees = {"before": before, "after": ROOT}
        for n in range(args.runs):
            for name in ("before", "after") if n % 2 == 0 else ("after", "before"):
                runs[name].append(run(trees[name], command, Path(tmp) / f"{name}-{n}.json"))
                print(name, n, json.dumps(figures(runs[name][-1])), flush=True)
    table = {}
    for key in figures(runs["after"][0]):
        b = statistics.median(figures(r)[key] for r in runs["before"] if key in figures(r))
        a = statistics.median(figures(r)[key] for r in runs["after"] if key in figures(r))
        table[key] = {"before": round(b, 4), "after": round(a, 4), "after_over_before": round(a / b, 2) if b else None}
    result = {"benchmark": command, "before": commit, "after": head, "runs": args.runs, "figures": table,
              "all_runs": runs}  # fmt: skip
    Path(args.out).write_text(json.dumps(result, indent=1))
    for key, row in table.items():
        print(f"{key:40} before {row['before']:>10}  after {row['after']:>10}  after/before {row['after_over_before']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
