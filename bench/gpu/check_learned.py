"""What each framework's allocator needs beyond its own peak in use, under jupyter-gpushare's caps, on a real GPU.

Run on a GPU machine after `source bench/gpu/device_env.sh` (and `source /tmp/tfgpu-env.sh` for TensorFlow):

    python3 bench/gpu/check_learned.py OUT.json [--frameworks torch,jax,tensorflow] [--repeats 3]

Per framework, the study's job (bench/study/jobs.py, sized as the study sizes it on this card) runs as a kernel's
process would: the in-kernel bootstrap on PYTHONPATH and the environment a kernel gets (kernel_env.kernel_env).
1. Under a generous quota (a quarter of the card): its report gives the allocator's own peak in use, P
   (bootstrap/_gpushare_alloc), and NVML's peak of the process is sampled.
2. The same job at quotas of ceil(P * r) for each r in RATIOS, all at once (each process is held by its own cap),
   each recorded as ok or out of memory.
The smallest r that ran is what the allocator needed under a limit; history.ALLOCATOR_MARGIN[framework] must
give 1 + margin above it in every repeat. NVML's peak over P says how much a quota learned from NVML would
have over-reserved. Everything goes to OUT.json (device, date, every attempt of every repeat).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "bench" / "study")]
from harness import HEADROOM_MIB, sizing_for  # noqa: E402
from jobs import job_code  # noqa: E402

from jupyter_gpushare.core.history import ALLOCATOR_MARGIN  # noqa: E402
from jupyter_gpushare.host.gpu import Card  # noqa: E402
from jupyter_gpushare.launch.kernel_env import kernel_env  # noqa: E402
from jupyter_gpushare.ledger.ledger import Lease  # noqa: E402
from jupyter_gpushare.server.records import Grant  # noqa: E402

RATIOS = (1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3, 1.4, 1.5, 1.75)
RESERVE_MIB = 640  # the study's context reserve
FIT = 22  # the study's jobs per card


class Nvml:
    def __init__(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        self.nv, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        self.uuid = pynvml.nvmlDeviceGetUUID(self.handle)
        self.name = pynvml.nvmlDeviceGetName(self.handle)
        self.driver = pynvml.nvmlSystemGetDriverVersion()
        self.total_mib = pynvml.nvmlDeviceGetMemoryInfo(self.handle).total // 2**20

    def per_process(self) -> dict[int, int]:
        try:
            return {
                p.pid: (p.usedGpuMemory or 0) // 2**20
                for p in self.nv.nvmlDeviceGetComputeRunningProcesses(self.handle)
            }
        except self.nv.NVMLError:
            return {}


def run_jobs(nvml: Nvml, framework: str, code: str, quotas: list[int], workdir: Path) -> list[dict]:
    """The job once per quota, all at once, each as a kernel's process with that quota; what each did."""
    card = Card(0, nvml.uuid, nvml.name, nvml.total_mib)
    procs = []
    for i, quota in enumerate(quotas):
        kid = f"check-{framework}-{i}-{os.getpid()}"
        lease = Lease(kid, card.uuid, 0, quota, RESERVE_MIB, "check", "python3", None, None, time.time())
        env = {**os.environ, **kernel_env(Grant("gpu", lease, card), kid, True, dict(os.environ), str(workdir))}
        p = subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        procs.append((kid, quota, p, time.time()))
    peaks: dict[int, int] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for pid, mib in nvml.per_process().items():
                peaks[pid] = max(peaks.get(pid, 0), mib)
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out = []
    for kid, quota, p, t0 in procs:
        try:
            stdout, stderr = p.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, stderr = p.communicate()
        report_path = workdir / f"{kid}.{p.pid}.json"
        report = json.loads(report_path.read_text()) if report_path.exists() else {}
        ok = p.returncode == 0 and "DONE" in stdout
        out.append(
            {
                "quota_mib": quota,
                "ok": ok,
                "seconds": round(time.time() - t0, 1),
                "oom": report.get("oom") or ("ran out of memory" in stderr),
                "alloc_peak_mib": (report.get("alloc") or {}).get(framework),
                "nvml_peak_mib": peaks.get(p.pid),
                "error": None
                if ok
                else stderr.strip().splitlines()[-1][:300]
                if stderr.strip()
                else f"rc {p.returncode}",
            }
        )
    done.set()
    sampler.join()
    return out


def check(nvml: Nvml, framework: str, repeats: int, epochs: int) -> dict:
    sizing = sizing_for(nvml.total_mib, FIT)
    code = job_code(framework, sizing["ws_mib"][framework], epochs=epochs, growth=True)
    margin = ALLOCATOR_MARGIN[framework]
    runs = []
    for repeat in range(1, repeats + 1):
        with tempfile.TemporaryDirectory() as tmp:
            generous = run_jobs(nvml, framework, code, [nvml.total_mib // 4], Path(tmp))[0]
            peak = generous["alloc_peak_mib"]
            print(f"[{framework} #{repeat}] generous: {generous}", flush=True)
            if not generous["ok"] or not peak:
                runs.append({"repeat": repeat, "generous": generous, "attempts": [], "min_ok_ratio": None})
                continue
            quotas = [math.ceil(peak * r) for r in RATIOS]
            attempts = run_jobs(nvml, framework, code, quotas, Path(tmp))
        for r, a in zip(RATIOS, attempts):
            a["ratio"] = r
            print(
                f"[{framework} #{repeat}] x{r}: quota {a['quota_mib']} MiB -> {'ok' if a['ok'] else 'FAILED'}",
                flush=True,
            )
        ok = [a["ratio"] for a in attempts if a["ok"]]
        # the smallest ratio from which every larger one ran too (a failure above it would be noise to explain)
        steady = next((r for r in RATIOS if all(a["ok"] for a in attempts if a["ratio"] >= r)), None)
        runs.append(
            {
                "repeat": repeat,
                "generous": generous,
                "alloc_peak_mib": peak,
                "nvml_over_alloc": round(generous["nvml_peak_mib"] / peak, 3) if generous["nvml_peak_mib"] else None,
                "attempts": attempts,
                "min_ok_ratio": min(ok) if ok else None,
                "steady_ok_ratio": steady,
            }
        )
    needed = [r["steady_ok_ratio"] for r in runs]
    holds = bool(needed) and all(n is not None and n <= 1 + margin for n in needed)
    print(f"[{framework}] needed ratios {needed}; margin {margin}: {'HOLDS' if holds else 'DOES NOT HOLD'}", flush=True)
    return {"framework": framework, "margin": margin, "ws_mib": sizing["ws_mib"][framework], "runs": runs,
            "needed_ratios": needed, "margin_holds": holds}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--frameworks", default="torch,jax,tensorflow")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=1)
    args = ap.parse_args()
    nvml = Nvml()
    result = {
        "device": f"{nvml.name} ({nvml.total_mib} MiB), driver {nvml.driver}",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "ratios": RATIOS,
        "headroom_mib": HEADROOM_MIB,
        "frameworks": [],
    }
    for framework in args.frameworks.split(","):
        try:
            result["frameworks"].append(check(nvml, framework, args.repeats, args.epochs))
        except Exception as e:  # one framework's failure (e.g. TensorFlow missing) must not lose the others
            result["frameworks"].append({"framework": framework, "error": repr(e)})
        Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({f["framework"]: f.get("needed_ratios", f.get("error")) for f in result["frameworks"]}))


if __name__ == "__main__":
    main()
