"""Smoke test of the GPU study harness on a simulated card, so it does not rot between GPU runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a real server and real training jobs, several at once: minutes, not seconds

HARNESS = Path(__file__).resolve().parent.parent / "bench" / "study" / "harness.py"


def test_study_harness_runs_jobs_through_a_real_server_and_queues_the_one_that_does_not_fit(tmp_path):
    out = subprocess.run(
        [sys.executable, str(HARNESS), "--simulate", "--out", str(tmp_path), "--epochs", "1", "--images", "2000", "--job-timeout", "120"],
        capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads((tmp_path / "results.json").read_text())
    logs = "".join(f"\n--- {p.name}\n{p.read_text()[-6000:]}" for p in tmp_path.glob("server-*.log"))
    runs = {r["framework"]: r for r in doc["results"]}
    assert set(runs) == {"numpy", "tensorflow"}  # the study's own framework, a Keras CNN (tensorflow-cpu here)
    for framework, run in runs.items():
        assert run["scenario"] == "gpushare" and run["jobs"] == 3 and run["fit"] == 2
        assert (run["ok"], run["failed"], run["refused"]) == (3, 0, 0), f"{run['per_job']}\n{run['events']}{logs}"
        assert run["queued"] == 1 and "queued" in run["events"]
        if framework == "tensorflow":  # its GPU import waited in line until a job finished, then it was admitted
            assert "admitted" in run["events"]
            waits = sorted(j["wait_s"] for j in run["per_job"])
            assert waits[-1] >= min(j["run_s"] for j in run["per_job"])
            # each kernel's room given back (the server's event) after its job's end, before its DELETE answered
            assert all(j["finished"] <= j["released"] <= j["deleted"] + 0.05 for j in run["per_job"]), run["per_job"]
        else:  # numpy needs no GPU: the kernel in line ran its job at once, without waiting for the grant
            assert "admitted" not in run["events"]
            # its use of the simulated card is its first GPU operation, after its first output; wave 1's medians
            used = [j for j in run["per_job"] if j["gpu_at"] is not None]  # (the one in line runs without the card)
            assert len(used) >= 2 and all(j["first_output"] < j["gpu_at"] < j["finished"] for j in used), used
            assert 0 < run["open_to_first_output_median_s"] < run["open_to_gpu_op_median_s"], run
        assert all(j["job_s"] is not None and j["pid"] for j in run["per_job"])
        assert run["reruns"] == 0 and run["all_ok_s"] >= run["run_s_max"]
    assert (tmp_path / "jobs.csv").read_text().count("\n") == 7


def test_a_refused_job_is_run_again_after_the_others_and_counted_until_all_are_done(tmp_path):
    """on_full=reject: the third job is refused at once (a failed job), run again once the first two are done,
    and 'all_ok_s' is when that rerun finished."""
    out = subprocess.run(
        [sys.executable, str(HARNESS), "--simulate", "--out", str(tmp_path), "--epochs", "1", "--images", "2000",
         "--job-timeout", "120", "--on-full", "reject", "--runs-simulated", "numpy"],
        capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    (run,) = json.loads((tmp_path / "results.json").read_text())["results"]
    assert (run["ok"], run["refused"], run["reruns"], run["rerun_rounds"], run["never_ok"]) == (2, 1, 1, 1, 0), run
    (again,) = [j for j in run["per_job"] if j["attempt"] == 1]
    assert again["status"] == "ok" and run["all_ok_s"] == round(again["finished"], 2) > run["total_s"] - 0.5


def test_learned_quotas_fit_what_the_job_used_so_the_batch_does_not_wait(tmp_path):
    """The learned scenario on the simulated card: a warm-up job says it holds its 1,024 MiB working set; the
    batch's kernels get that peak + 10% (quota 487 MiB + 640 MiB context reserve) instead of the fixed 2,048 MiB
    reservation, so all three run at once where fixed quotas queue one."""
    out = subprocess.run(
        [sys.executable, str(HARNESS), "--simulate", "--out", str(tmp_path), "--epochs", "1", "--images", "2000",
         "--job-timeout", "120", "--runs-simulated", "numpy:gpushare,numpy:learned"],
        capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    fixed, learned = json.loads((tmp_path / "results.json").read_text())["results"]
    assert fixed["quotas"]["quota_mib_and_source"] == [[1408, "default"]] and fixed["queued"] == 1
    assert learned["warmup"]["status"] == "ok" and learned["quotas"]["learned_peak_mib"] == [1024]
    assert learned["quotas"]["quota_mib_and_source"] == [[487, "learned"]]
    assert (learned["ok"], learned["queued"], learned["never_ok"]) == (3, 0, 0), learned["event_messages"]


def test_compare_puts_the_recorded_class_runs_side_by_side():
    """bench/study/compare.py on the H100 runs at 2x and 4x the card kept in the repository."""
    root = HARNESS.parent.parent
    files = sorted(str(p) for p in (root / "results" / "study").glob("study-queue-h100-2026-11-24-run*.json"))
    assert len(files) == 3
    out = subprocess.run([sys.executable, str(HARNESS.with_name("compare.py")), *files], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert sum(line.startswith("torch      gpushare ") for line in lines) == 4
    assert sum(line.startswith("torch      growth ") for line in lines) == 3
    assert any(line.startswith("torch      growth      88     64") and "never" in line for line in lines)
    (two,) = [line for line in lines if line.startswith("torch 44 jobs (2.0x the 22 that fit)")]
    assert "gpushare lost 0 of 88 over 2 run(s), 89%-92% of ideal (2 waves)" in two
    assert "growth lost 46 of 88 in the batch" in two and "all ok gpushare/growth = 0.71-0.83" in two
    (four,) = [line for line in lines if line.startswith("torch 88 jobs")]
    assert "gpushare lost 0 of 176 over 2 run(s), 86%-89% of ideal (4 waves)" in four
    assert "1 run(s) never all ok" in four and "gpushare/growth" not in four


def test_compare_says_when_a_file_has_no_results(tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"results": [{"framework": "torch", "scenario": "growth", "skipped": "budget"}]}))
    out = subprocess.run(
        [sys.executable, str(HARNESS.with_name("compare.py")), str(empty)], capture_output=True, text=True
    )
    assert out.returncode == 1 and "no study results" in out.stderr


def test_gaps_splits_the_time_over_the_ideal_along_the_last_jobs_path():
    """bench/study/gaps.py on a recorded 4x idle class (H100): the path back from the last job's end crosses the
    four waves, each change is the park_after (1 s) and the park of the kernel whose room was taken, and the parts
    add up to the class's time over its ideal."""
    sys.path.insert(0, str(HARNESS.parent))
    try:
        import gaps
    finally:
        sys.path.remove(str(HARNESS.parent))
    root = HARNESS.parent.parent
    result = json.loads((root / "results" / "study" / "study-idle4x-importfirst-after-h100-2026-11-27-run9.json")
                        .read_text())["results"][0]  # fmt: skip
    g = gaps.gaps(result)
    assert g["waves"] == 4 and g["chain_starts_at_a_start"]
    assert g["chain_ends_s"] == pytest.approx(result["all_ok_s"], abs=0.05)
    assert g["over_ideal_s"] == pytest.approx(result["all_ok_s"] - result["ideal_s"], abs=0.05)
    assert [c["kind"] for c in g["changes"]] == ["parked"] * 3
    for change in g["changes"]:
        assert change["s"] == pytest.approx(1.0 + change["park_s"], abs=0.1)
    assert g["start_s"] == pytest.approx(3.31, abs=0.01) and g["resume_wait_s"] == pytest.approx(1.08, abs=0.01)
    out = subprocess.run([sys.executable, str(HARNESS.with_name("gaps.py")), str(root / "results" / "study" /
                          "study-idle4x-importfirst-after-h100-2026-11-27-run9.json")], capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0 and "14.36" in out.stdout, out.stdout + out.stderr


def test_waves_says_where_a_class_loses_its_ideal_between_waves():
    """bench/study/waves.py on a recorded 2x class (H200, run 9): the share of the ideal is waves x the median grant
    -> done over all ok, and the hand-off pairs the k-th end with the grant of the k-th kernel that waited."""
    sys.path.insert(0, str(HARNESS.parent))
    try:
        import waves
    finally:
        sys.path.remove(str(HARNESS.parent))
    name = HARNESS.parent.parent / "results" / "class_start-h200-2026-11-29-run9.json"
    result = json.loads(name.read_text())["results"][0]
    w = waves.waves(result)
    assert w["of_ideal"] == pytest.approx(0.921, abs=0.001) and w["run_s"][1] == pytest.approx(33.84, abs=0.01)
    ok = [j for j in result["per_job"] if j["status"] == "ok"]
    assert len(ok) == 44 and w["handoff_s"][0] == pytest.approx(2.49, abs=0.01) and w["delete_s"] is None
    assert w["release_s"] is None and w["regrant_s"] is None  # (run 9 predates them)
    # with releases, the hand-off splits: the k-th release pairs with the grant of the k-th kernel that waited
    split = {**result, "per_job": [{**j, "released": j["finished"] + 1.0} for j in ok]}
    w2 = waves.waves(split)
    assert w2["release_s"] == pytest.approx((1.0, 1.0)) and w2["handoff_s"] == w["handoff_s"]
    assert w2["regrant_s"] == pytest.approx((w["handoff_s"][0] - 1.0, w["handoff_s"][1] - 1.0))
    assert waves.waves({**result, "per_job": []}) is None  # (a run of the code before without grants, say)
    out = subprocess.run(
        [sys.executable, str(HARNESS.with_name("waves.py")), str(name)], capture_output=True, text=True
    )
    assert out.returncode == 0 and "92.1% of ideal" in out.stdout and "hand-off 2.49 s median" in out.stdout, out
