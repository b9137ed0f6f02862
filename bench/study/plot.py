"""Plots of a study run: jobs over time, per-job run times, card memory over time (PNG).

    python bench/study/plot.py bench/results/study/results.json docs/img/
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"ok": "#2e7d32", "failed": "#c62828", "refused": "#6d4c41"}


def main(results: str, outdir: str) -> None:
    doc = json.loads(Path(results).read_text())
    runs = [r for r in doc["results"] if "per_job" in r]
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    title = f"{doc['device']} — {doc['date'][:10]}"

    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 1.6 * len(runs) + 1), squeeze=False, sharex=True)
    for ax, r in zip(axes[:, 0], runs):
        for j in r["per_job"]:
            y = j["index"]
            ax.barh(y, j["wait_s"] or 0, left=j["requested"], color="#bdbdbd", height=0.8)
            if j["admitted"] is not None and j["finished"] is not None:
                ax.barh(y, j["finished"] - j["admitted"], left=j["admitted"], color=COLORS.get(j["status"], "k"), height=0.8)
        ax.set_ylabel(f"{r['framework']}\n{r['scenario']}\n{r['jobs']} jobs", rotation=0, ha="right", va="center", fontsize=8)
        ax.set_yticks([])
        ax.text(1.0, 0.5, f"ok {r['ok']}, failed {r['failed']}, queued {r['queued']}", transform=ax.transAxes, ha="left", va="center", fontsize=8)
    axes[-1, 0].set_xlabel("seconds since the jobs were submitted (grey: waiting in the queue; green: ran; red: failed)")
    fig.suptitle(f"Jobs over time — {title}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "study-jobs.png", dpi=110)

    fig, ax = plt.subplots(figsize=(10, 4))
    labels = []
    for i, r in enumerate(runs):
        times = [j["job_s"] for j in r["per_job"] if j["status"] == "ok" and j["job_s"] is not None]
        ax.scatter([i] * len(times), times, s=12, color="#1565c0")
        fails = sum(j["status"] != "ok" for j in r["per_job"])
        labels.append(f"{r['framework']} {r['scenario']}\n{r['jobs']} jobs, {fails} failed")
    ax.set_xticks(range(len(runs)), labels, fontsize=7)
    ax.set_ylabel("run time of each finished job (s)")
    ax.set_title(f"Per-job run times — {title}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "study-runtimes.png", dpi=110)

    fig, ax = plt.subplots(figsize=(10, 4))
    for r in runs:
        tl = r["timeline"]
        if tl:
            ax.plot([s["t"] for s in tl], [s["used_mib"] / 1024 for s in tl], label=f"{r['framework']} {r['scenario']} {r['jobs']}")
    total = doc["sizing"]["card_mib"] / 1024
    ax.axhline(total, color="k", linestyle="--", linewidth=0.8, label="card")
    ax.set_xlabel("seconds")
    ax.set_ylabel("card memory used (GiB, NVML)")
    ax.legend(fontsize=7)
    ax.set_title(f"Card memory over time — {title}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "study-memory.png", dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
