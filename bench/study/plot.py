"""Plots of study runs: jobs over time, per-job run times, card memory over time (PNG).

python bench/study/plot.py docs/img/ bench/results/study/study-*.json [--prefix study-tf]
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"ok": "#2e7d32", "failed": "#c62828", "refused": "#6d4c41"}


def load(files: list[str]) -> tuple[list[dict], dict]:
    runs, first = [], None
    for name in files:
        doc = json.loads(Path(name).read_text())
        first = first or doc
        for r in doc["results"]:
            if "per_job" not in r:
                continue
            ws = doc["sizing"]["ws_mib"]
            ws = ws[r["framework"]] if isinstance(ws, dict) else ws
            r["label"] = f"{r['framework']} {r['scenario']}, {r['jobs']} jobs\n(working set {ws} MiB)"
            r["card_mib"] = doc["sizing"]["card_mib"]
            runs.append(r)
    return runs, first


def grid(n: int, w: float = 4.2, h: float = 2.6):
    cols = 3
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(w * cols, h * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    return fig, axes.flat


def done_text(r: dict) -> str:
    """The batch's time, and when every job had finished successfully with failed ones rerun after the others."""
    if "all_ok_s" not in r:  # runs recorded before reruns were counted
        return f"all done in {r['total_s']:.0f} s"
    if r["all_ok_s"] is None:
        return f"batch {r['total_s']:.0f} s; {r['never_ok']} never ok after {r['rerun_rounds']} reruns"
    again = f" ({r['reruns']} reruns)" if r["reruns"] else ""
    return f"every job ok in {r['all_ok_s']:.0f} s{again}"


def main(outdir: str, files: list[str], prefix: str = "study") -> None:
    runs, doc = load(files)
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    title = f"{doc['device']}, {doc['date'][:10]}"

    fig, axes = grid(len(runs))
    for ax, r in zip(axes, runs):
        for j in r["per_job"]:
            ax.barh(j["index"], j["wait_s"] or 0, left=j["requested"], color="#bdbdbd", height=0.8)
            if j["admitted"] is not None and j["finished"] is not None:
                ax.barh(
                    j["index"],
                    j["finished"] - j["admitted"],
                    left=j["admitted"],
                    color=COLORS.get(j["status"], "k"),
                    height=0.8,
                )
        ax.set_title(
            f"{r['label']}\nok {r['ok']}, failed {r['failed']}, queued {r['queued']}; {done_text(r)}", fontsize=8
        )
        ax.set_yticks([])
        ax.tick_params(labelsize=7)
    fig.suptitle(f"Jobs over time (grey: waiting for a GPU; green: ran; red: failed) — {title}", fontsize=10)
    fig.supxlabel("seconds since all jobs were submitted", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / f"{prefix}-jobs.png", dpi=100)

    fig, ax = plt.subplots(figsize=(12, 4.2))
    for i, r in enumerate(runs):
        ok = [j["job_s"] for j in r["per_job"] if j["status"] == "ok" and j["job_s"] is not None]
        ax.scatter([i] * len(ok), ok, s=10, color="#1565c0")
        ax.text(
            i,
            0,
            f"{r['failed']} failed",
            ha="center",
            va="bottom",
            fontsize=7,
            color="#c62828" if r["failed"] else "#2e7d32",
        )
    ax.set_xticks(range(len(runs)), [r["label"] for r in runs], fontsize=6, rotation=30, ha="right")
    ax.set_ylabel("run time of each finished job (s)", fontsize=8)
    ax.set_ylim(bottom=0)
    job = doc.get("job", {"epochs": 5, "images": 60000})
    ax.set_title(
        f"Per-job run times (training {job['epochs']} epochs + inference, {job['images']:,} images, batch 32) — {title}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(out / f"{prefix}-runtimes.png", dpi=100)

    fig, axes = grid(len(runs))
    for ax, r in zip(axes, runs):
        tl = r["timeline"]
        ax.plot([s["t"] for s in tl], [s["used_mib"] / 1024 for s in tl], color="#1565c0", linewidth=1)
        ax.axhline(r["card_mib"] / 1024, color="k", linestyle="--", linewidth=0.8)
        ax.set_ylim(0, r["card_mib"] / 1024 * 1.05)
        ax.set_title(r["label"].replace("\n", " "), fontsize=8)
        ax.tick_params(labelsize=7)
    fig.suptitle(f"Card memory used (GiB, NVML; dashed: the card) — {title}", fontsize=10)
    fig.supxlabel("seconds", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / f"{prefix}-memory.png", dpi=100)


if __name__ == "__main__":
    args = sys.argv[1:]
    prefix = "study"
    if "--prefix" in args:
        i = args.index("--prefix")
        prefix = args[i + 1]
        del args[i : i + 2]
    main(args[0], args[1:], prefix)
