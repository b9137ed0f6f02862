"""What the kernel bootstrap adds to ``import torch`` / ``import tensorflow`` / ``import jax``.

Side by side in one run: fresh interpreters with the kernel environment the provisioner builds,
with and without the bootstrap directory on PYTHONPATH, alternating, several repetitions; prints
medians and the difference. Wall-clock import times are noisy (tens of ms for torch/TF), so it
also prints the time the bootstrap's own code spent around each import (measured in-process by
the bootstrap) and the cost of the meta-path finder on every other import.

On a GPU machine (NVML present) it also shows that ``import torch`` with the bootstrap creates no
CUDA context: NVML lists no process for the pid until the first tensor is put on the GPU.

    python bench/bench_import_hook.py [--reps 7] [--out bench/results/import_hook-<machine>.json] [torch tensorflow jax]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from jupyter_gpushare.host.gpu import Card  # noqa: E402
from jupyter_gpushare.launch.kernel_env import BOOTSTRAP_DIR, kernel_env  # noqa: E402
from jupyter_gpushare.ledger.ledger import Lease, ProcessRef  # noqa: E402
from jupyter_gpushare.server.records import Grant  # noqa: E402

QUOTA = 4096
PROBE = """
import json, sys, time
t = time.perf_counter()
import {fw}
dt = time.perf_counter() - t
boot = sys.modules.get("_gpushare_boot")
print(json.dumps({{"s": dt, "hook_ms": (boot.report()["hook_ms"].get("{fw}") if boot else None), "modules": len(sys.modules)}}))
"""
FINDER_COST = """
import json, sys, timeit
boot = sys.modules["_gpushare_boot"]
n = 200000
s = timeit.timeit(lambda: boot._finder.find_spec("some.module.name"), number=n)
print(json.dumps({"us_per_call": s / n * 1e6}))
"""


def nvml_card():
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        name, uuid = pynvml.nvmlDeviceGetName(h), pynvml.nvmlDeviceGetUUID(h)
        total = pynvml.nvmlDeviceGetMemoryInfo(h).total // 2**20
        return (
            pynvml,
            h,
            Card(
                0,
                uuid if isinstance(uuid, str) else uuid.decode(),
                name if isinstance(name, str) else name.decode(),
                total,
            ),
        )
    except Exception:
        return None, None, None


def envs(card: Card, report_dir: str) -> tuple[dict, dict]:
    lease = Lease("bench", card.uuid, card.index, QUOTA, 768, "bench", "python3", ProcessRef.me(), None, time.time())
    # As after a pip install: bytecode cached (a dev shell may set PYTHONDONTWRITEBYTECODE).
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_") and k != "PYTHONDONTWRITEBYTECODE"}
    base["TF_CPP_MIN_LOG_LEVEL"] = "3"
    with_boot = {**base, **kernel_env(Grant("gpu", lease=lease, card=card), "bench", True, base, report_dir, None)}
    parts = [p for p in with_boot["PYTHONPATH"].split(os.pathsep) if p and os.path.abspath(p) != str(BOOTSTRAP_DIR)]
    without = {**with_boot, "PYTHONPATH": os.pathsep.join(parts)}
    return with_boot, without


def run(code: str, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=os.sep, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def no_context_proof(pynvml, handle, env: dict) -> dict:
    """Import torch with the bootstrap; NVML must list no process for the pid until a tensor goes to the GPU."""
    code = "import sys, torch\nprint('imported', flush=True)\nsys.stdin.readline()\nx = torch.ones(1, device='cuda')\nprint('on gpu', flush=True)\nsys.stdin.readline()\n"
    p = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=os.sep
    )

    def mib() -> int | None:
        for q in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if q.pid == p.pid:
                return (q.usedGpuMemory or 0) // 2**20
        return None

    try:
        assert p.stdout.readline().strip() == "imported"
        time.sleep(1.0)
        after_import = mib()
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "on gpu"
        time.sleep(1.0)
        after_use = mib()
        p.stdin.write("\n")
        p.stdin.flush()
        p.wait(60)
    finally:
        p.kill()
    return {
        "nvml_mib_after_import": after_import,
        "nvml_mib_after_first_tensor": after_use,
        "ok": after_import is None and bool(after_use),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("frameworks", nargs="*", default=["torch", "tensorflow", "jax"])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out")
    args = ap.parse_args()
    pynvml, handle, card = nvml_card()
    on_gpu = card is not None
    card = card or Card(0, "GPU-bench-0", "no GPU on this machine", 81920)
    report_dir = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"gpushare-bench-{os.getpid()}")
    os.makedirs(report_dir, exist_ok=True)
    with_boot, without = envs(card, report_dir)
    result = {
        "what": "bench/bench_import_hook.py: import time with and without the kernel bootstrap",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus",
        "python": platform.python_version(),
        "gpu": card.name if on_gpu else None,
        "reps": args.reps,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "frameworks": {},
    }
    start = {"with": [], "without": []}
    for _ in range(args.reps):
        for label, env in (("with", with_boot), ("without", without)):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], env=env, check=True, cwd=os.sep)
            start[label].append(time.perf_counter() - t)
    result["interpreter_start_ms"] = {k: round(statistics.median(v) * 1000, 2) for k, v in start.items()}
    result["finder_us_per_import"] = round(run(FINDER_COST, with_boot)["us_per_call"], 3)
    print(f"interpreter start (python -c pass), median ms: {result['interpreter_start_ms']}")
    print(f"meta-path finder, per import of an unhooked module: {result['finder_us_per_import']} us")
    for fw in args.frameworks:
        try:
            run(PROBE.format(fw=fw), without)  # warm the page cache once
        except RuntimeError as e:
            print(f"{fw}: not importable here, skipped ({str(e).strip().splitlines()[-1]})")
            continue
        times = {"with": [], "without": []}
        hooks, modules = [], 0
        for _ in range(args.reps):
            for label, env in (("with", with_boot), ("without", without)):
                r = run(PROBE.format(fw=fw), env)
                times[label].append(r["s"])
                if label == "with":
                    hooks.append(r["hook_ms"])
                    modules = r["modules"]
        med = {k: statistics.median(v) * 1000 for k, v in times.items()}
        finder_ms = modules * result["finder_us_per_import"] / 1000
        entry = {
            "median_ms_with": round(med["with"], 1),
            "median_ms_without": round(med["without"], 1),
            "difference_ms": round(med["with"] - med["without"], 1),
            "spread_ms_without": round(max(times["without"]) * 1000 - min(times["without"]) * 1000, 1),
            "hook_code_ms_median": round(statistics.median(h for h in hooks if h is not None), 3)
            if any(h is not None for h in hooks)
            else None,
            "modules_imported": modules,
            "finder_ms_estimate": round(finder_ms, 3),
        }
        result["frameworks"][fw] = entry
        print(
            f"import {fw}: median {entry['median_ms_with']} ms with the bootstrap, {entry['median_ms_without']} ms without "
            f"(difference {entry['difference_ms']} ms, spread without {entry['spread_ms_without']} ms); "
            f"our hook code {entry['hook_code_ms_median']} ms + finder ~{entry['finder_ms_estimate']} ms over {modules} modules"
        )
    if on_gpu and "torch" in result["frameworks"]:
        proof = no_context_proof(pynvml, handle, with_boot)
        result["import_torch_creates_no_context"] = proof
        print(
            f"NVML after import torch (with bootstrap): {proof['nvml_mib_after_import']} (None = no process); after first tensor: {proof['nvml_mib_after_first_tensor']} MiB"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
