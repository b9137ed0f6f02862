"""Can PyTorch (or TensorFlow) be imported before its kernel holds a GPU, and the card given to it after?

For the kernel that imports its framework while it waits (_gpushare_wait, torch only): each check runs in a fresh
process, 3 times. ``late``: torch imported with CUDA_VISIBLE_DEVICES="" (a kernel in line), then the card and
PYTORCH_CUDA_ALLOC_CONF per_process_memory_fraction set in os.environ (the grant), then CUDA used: does torch see the
card, and does it honour the cap set after its import? ``early``: the same cap set before the import (control).
``cap`` is 0.05 of the card; the check allocates 0.03 (must fit) and then 0.10 (must be refused) of it.
Then what the first CUDA use costs after the import, alone and with 8 processes at once, and the process's
resident memory after the import (what a kernel in line holds for it).
``tensorflow``: the same with TensorFlow's GPU build (``../shared/tools/tf-gpu``), its cap a logical device's
``memory_limit`` set after the card is given (as the kernel's bootstrap sets it, after the import); and
``late-keras``: ``import keras`` (Keras 3 on TensorFlow) first, then the card.
    python3 bench/gpu/probe_import_first.py OUT.json [torch|tensorflow]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

CHILD = r"""
import json, os, sys, time
order = sys.argv[1]
uuid = sys.argv[2]
conf = "per_process_memory_fraction:0.05"
if order == "early":
    os.environ["CUDA_VISIBLE_DEVICES"] = uuid
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf
t0 = time.perf_counter()
import torch
out = {"order": order, "torch": torch.__version__, "import_s": round(time.perf_counter() - t0, 3),
       "initialized_after_import": torch.cuda.is_initialized()}
with open("/proc/self/status") as f:  # the host memory a kernel holds while it waits, torch imported
    out["rss_mib_after_import"] = next(int(l.split()[1]) // 1024 for l in f if l.startswith("VmRSS:"))
if order == "late":
    os.environ["CUDA_VISIBLE_DEVICES"] = uuid
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf
t1 = time.perf_counter()
out["available"] = torch.cuda.is_available()
out["count"] = torch.cuda.device_count()
total = torch.cuda.get_device_properties(0).total_memory if out["count"] else 0
x = torch.ones(1, device="cuda") if out["count"] else None
out["first_use_s"] = round(time.perf_counter() - t1, 3)
for share in (0.03, 0.10):
    try:
        t = torch.empty(int(total * share), dtype=torch.uint8, device="cuda")
        out[f"alloc_{share}"] = "ok"
        del t
        torch.cuda.empty_cache()
    except Exception as e:
        out[f"alloc_{share}"] = type(e).__name__
print(json.dumps(out))
"""

TF_CHILD = r"""
import json, os, sys, time
order, uuid, total_mib = sys.argv[1], sys.argv[2], int(sys.argv[3])
if order == "early":
    os.environ["CUDA_VISIBLE_DEVICES"] = uuid
t0 = time.perf_counter()
if order == "late-keras":
    import keras
import tensorflow as tf
out = {"order": order, "tensorflow": tf.__version__, "import_s": round(time.perf_counter() - t0, 3)}
with open("/proc/self/status") as f:
    out["rss_mib_after_import"] = next(int(l.split()[1]) // 1024 for l in f if l.startswith("VmRSS:"))
with open("/proc/self/maps") as f:
    out["libcuda_mapped_after_import"] = "libcuda.so" in f.read()
if order != "early":
    os.environ["CUDA_VISIBLE_DEVICES"] = uuid
t1 = time.perf_counter()
gpus = tf.config.list_physical_devices("GPU")
out["count"] = len(gpus)
if gpus:
    tf.config.set_logical_device_configuration(gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=int(total_mib * 0.05))])
    with tf.device("/GPU:0"):
        float(tf.reduce_sum(tf.ones((1,))).numpy())
out["first_use_s"] = round(time.perf_counter() - t1, 3)
for share in (0.03, 0.10):
    try:
        with tf.device("/GPU:0"):
            t = tf.ones((int(total_mib * share) * 2**18,), tf.float32)
            float(tf.reduce_sum(t).numpy())
        out[f"alloc_{share}"] = "ok"
        del t
    except Exception as e:
        out[f"alloc_{share}"] = type(e).__name__
print(json.dumps(out))
"""
FRAMEWORK = sys.argv[2] if len(sys.argv) > 2 else "torch"


def child(order: str, uuid: str, total_mib: int = 0) -> dict:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # (TensorFlow's GPU build needs the tf-gpu environment)
    code, args = (TF_CHILD, [order, uuid, str(total_mib)]) if FRAMEWORK == "tensorflow" else (CHILD, [order, uuid])
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=300)
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"order": order, "error": done.stderr[-800:]}


def main() -> None:
    uuid = (
        subprocess.run(
            ["nvidia-smi", "--query-gpu=uuid,name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        )
        .stdout.strip()
        .splitlines()[0]
    )
    card = uuid.split(",")[0].strip()
    total = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True).stdout.split()  # fmt: skip
    total_mib = int(total[0]) if total else 0
    runs = {"gpu": uuid, "framework": FRAMEWORK, "date": time.strftime("%Y-%m-%d"), "alone": [], "eight": []}
    orders = ("late", "early", "late-keras") if FRAMEWORK == "tensorflow" else ("late", "early")
    for _ in range(3):
        for order in orders:
            runs["alone"].append(child(order, card, total_mib))
            print(runs["alone"][-1], flush=True)
    for _ in range(2):
        with ThreadPoolExecutor(8) as pool:
            runs["eight"].append(list(pool.map(lambda _: child("late", card, total_mib), range(8))))
        print([(r.get("import_s"), r.get("first_use_s")) for r in runs["eight"][-1]], flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(runs, f, indent=1)


if __name__ == "__main__":
    main()
