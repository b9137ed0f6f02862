"""Smoke test of the GPU study harness on a simulated card, so it does not rot between GPU runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HARNESS = Path(__file__).resolve().parent.parent / "bench" / "study" / "harness.py"


def test_study_harness_runs_jobs_through_a_real_server_and_queues_the_one_that_does_not_fit(tmp_path):
    out = subprocess.run(
        [sys.executable, str(HARNESS), "--simulate", "--out", str(tmp_path), "--epochs", "1", "--images", "2000", "--job-timeout", "120"],
        capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads((tmp_path / "results.json").read_text())
    (run,) = doc["results"]
    assert run["scenario"] == "gpushare" and run["jobs"] == 3 and run["fit"] == 2
    logs = "".join(f"\n--- {p.name}\n{p.read_text()[-6000:]}" for p in tmp_path.glob("server-*.log"))
    assert (run["ok"], run["failed"], run["refused"]) == (3, 0, 0), f"{run['per_job']}\n{run['events']}{logs}"
    assert run["queued"] == 1 and "queued" in run["events"] and "admitted" in run["events"]
    waits = sorted(j["wait_s"] for j in run["per_job"])
    assert waits[-1] >= min(j["run_s"] for j in run["per_job"])  # it waited for a job to finish
    assert all(j["job_s"] is not None and j["pid"] for j in run["per_job"])
    assert (tmp_path / "jobs.csv").read_text().count("\n") == 4
