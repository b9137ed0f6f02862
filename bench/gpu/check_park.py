"""Parking a notebook-like process on a real GPU with the product's own checkpointer (host/checkpoint.py).

Run on a GPU machine from the repo root (PYTHONPATH=. ; nothing else of Jupyter is needed):

    python3 bench/gpu/check_park.py OUT_DIR [--runs 3]

Per case and run: a child process of the framework holds 4 GiB of known data on the card (and, for
``torch-cache``, 4 GiB more freed into PyTorch's cache); the parent parks it through
``DriverCheckpoint.park`` (lock + checkpoint, in the helper process the server uses), then reads the card
through NVML (what the child holds while parked, what is free), then a *neighbour* process allocates all but
2 GiB of the free memory and touches it (the freed memory is really usable), exits, and the parent resumes
the child (``DriverCheckpoint.resume``); the child then checks its data and runs a matmul. Cases: ``torch``
(``empty_cache()`` before parking, as the server's parking would have the kernel do), ``torch-cache`` (the
allocator's cache kept), ``cupy``, ``jax`` (XLA_PYTHON_CLIENT_PREALLOCATE=false), ``tensorflow`` (memory growth on; its GPU build
through ../shared/tools/tf-gpu). A child that dies while
parked is recorded as such. Every run is written, the failed ones too: OUT_DIR/check_park-<case>-runN.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from jupyter_gpushare.host.checkpoint import CheckpointError, DriverCheckpoint  # noqa: E402

GIB = 4
CHILD = r"""
import os, sys, time
fw, gib, keep_cache = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "1"
n = int(gib * 2**30) // 4
if fw == "torch":
    import torch
    x = torch.arange(n, device="cuda", dtype=torch.float32) % 9973
    if keep_cache:
        y = torch.empty(n, device="cuda", dtype=torch.float32); y.fill_(1); del y  # freed into the cache
    else:
        torch.cuda.empty_cache()
    torch.cuda.synchronize()
    total = lambda: float(x[::4096].double().sum().item())
    def matmul():
        a = torch.randn(4096, 4096, device="cuda"); t = time.perf_counter(); (a @ a).sum().item()
        return time.perf_counter() - t
elif fw == "cupy":
    import cupy
    x = cupy.arange(n, dtype=cupy.float32) % 9973
    cupy.cuda.Device().synchronize()
    total = lambda: float(x[::4096].astype(cupy.float64).sum().get())
    def matmul():
        a = cupy.random.randn(4096, 4096, dtype=cupy.float32); t = time.perf_counter(); float((a @ a).sum().get())
        return time.perf_counter() - t
elif fw == "tensorflow":  # memory growth, as notebooks set it (TF's default takes the card)
    import tensorflow as tf
    for g in tf.config.list_physical_devices("GPU"):
        tf.config.experimental.set_memory_growth(g, True)
    with tf.device("/GPU:0"):
        x = tf.math.floormod(tf.range(n, dtype=tf.float32), 9973.0)
    total = lambda: float(tf.reduce_sum(tf.cast(x[::4096], tf.float64)).numpy())
    def matmul():
        with tf.device("/GPU:0"):
            a = tf.random.normal((4096, 4096)); t = time.perf_counter(); float(tf.reduce_sum(a @ a).numpy())
        return time.perf_counter() - t
else:
    import jax, jax.numpy as jnp
    x = (jnp.arange(n, dtype=jnp.float32) % 9973).block_until_ready()
    total = lambda: float(jnp.sum(x[::4096].astype(jnp.float32)))
    def matmul():
        a = jax.random.normal(jax.random.PRNGKey(0), (4096, 4096)); t = time.perf_counter()
        float((a @ a).sum()); return time.perf_counter() - t
print("READY", total(), flush=True)
for line in sys.stdin:
    if line.strip() == "CHECK":
        s = total(); ms = matmul() * 1000
        print("CHECKED", s, round(ms, 2), flush=True)
    elif line.strip() == "EXIT":
        break
"""
NEIGHBOUR = r"""
import sys, torch
mib = int(sys.argv[1])
x = torch.empty(mib * 2**20 // 4, device="cuda", dtype=torch.float32); x.fill_(1.0); torch.cuda.synchronize()
print("ALLOCATED", mib, float(x[::1 << 20].sum().item()), flush=True)
"""


def nvml_used(pid: int) -> tuple[int | None, int]:
    """(MiB the process holds on card 0, or None when NVML lists it not; MiB free on the card)."""
    import pynvml

    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    used = None
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
        if p.pid == pid:
            used = (p.usedGpuMemory or 0) >> 20
    return used, pynvml.nvmlDeviceGetMemoryInfo(h).free >> 20


def read_line(proc: subprocess.Popen, prefix: str, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the child ended (rc {proc.poll()}) before {prefix}")
        if line.startswith(prefix):
            return line.split()
    raise RuntimeError(f"no {prefix} within {timeout} s")


def one_run(case: str, checkpointer: DriverCheckpoint) -> dict:
    fw = "torch" if case.startswith("torch") else case
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    child = subprocess.Popen([sys.executable, "-c", CHILD, fw, str(GIB), "1" if case == "torch-cache" else "0"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    out: dict = {"case": case, "pid": child.pid}
    try:
        ready = read_line(child, "READY", 300)
        out["checksum_before"] = float(ready[1])
        time.sleep(1.0)
        out["used_before_mib"], out["free_before_mib"] = nvml_used(child.pid)
        t0 = time.perf_counter()
        try:
            out["park_steps_s"] = checkpointer.park([child.pid], 10.0)
        except CheckpointError as e:
            out["park_error"] = str(e)
            return out
        out["park_s"] = round(time.perf_counter() - t0, 3)
        time.sleep(0.5)
        out["used_parked_mib"], out["free_parked_mib"] = nvml_used(child.pid)
        out["child_alive_parked"] = child.poll() is None
        take = max(0, out["free_parked_mib"] - 2048)
        n = subprocess.run([sys.executable, "-c", NEIGHBOUR, str(take)], capture_output=True, text=True, timeout=300)
        out["neighbour"] = {"asked_mib": take, "rc": n.returncode, "said": n.stdout.strip(), "err": n.stderr[-400:]}
        if child.poll() is not None:
            out["child_rc_while_parked"] = child.returncode
            out["child_err"] = child.stderr.read()[-800:]
        t1 = time.perf_counter()
        try:
            out["resume_steps_s"] = checkpointer.resume([child.pid])
        except CheckpointError as e:
            out["resume_error"] = str(e)
            return out
        out["resume_s"] = round(time.perf_counter() - t1, 3)
        out["used_after_mib"], _ = nvml_used(child.pid)
        child.stdin.write("CHECK\n")
        child.stdin.flush()
        checked = read_line(child, "CHECKED", 120)
        out["checksum_after"], out["matmul_ms_after"] = float(checked[1]), float(checked[2])
        out["data_intact"] = out["checksum_after"] == out["checksum_before"]
    except Exception as e:  # noqa: BLE001 (recorded, like every other outcome)
        out["error"] = f"{type(e).__name__}: {e}"
        if child.poll() is not None:
            out["child_rc"] = child.returncode
            out["child_err"] = (child.stderr.read() or "")[-800:]
    finally:
        if child.poll() is None:
            try:
                child.stdin.write("EXIT\n")
                child.stdin.flush()
                child.wait(30)
            except Exception:  # noqa: BLE001
                child.kill()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cases", default="torch,torch-cache,cupy,jax")
    args = ap.parse_args()
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    gpu = pynvml.nvmlDeviceGetName(h)
    driver = pynvml.nvmlSystemGetDriverVersion()
    checkpointer = DriverCheckpoint()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": gpu if isinstance(gpu, str) else gpu.decode(), "driver": driver,
            "date": datetime.date.today().isoformat(), "unavailable": checkpointer.probed(), "gib": GIB}  # fmt: skip
    print(json.dumps(meta), flush=True)
    for case in args.cases.split(","):
        for run in range(1, args.runs + 1):
            result = {**meta, "run": run, **one_run(case, checkpointer)}
            (out_dir / f"check_park-{case}-run{run}.json").write_text(json.dumps(result, indent=1))
            print(json.dumps({k: result.get(k) for k in ("case", "run", "used_before_mib", "park_s", "used_parked_mib",
                  "neighbour", "resume_s", "data_intact", "park_error", "resume_error", "error", "child_rc_while_parked")}),
                  flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
