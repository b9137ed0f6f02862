"""The GPU's size seen inside a kernel, on a real GPU: libraries that plan from it plan for the quota.

Run on a GPU machine (torch, jax, cupy, nvidia-ml-py, plus accelerate and transformers with their
dependencies; no Jupyter server needed: jupyter_client's AsyncKernelManager with our provisioner, the
QuotaManager on the NVML backend, as check_caps.py):

    source bench/gpu/device_env.sh
    JUPYTER_DATA_DIR=$(mktemp -d) JUPYTER_RUNTIME_DIR=$(mktemp -d) python3 bench/gpu/check_views.py out.json

Kernels with a QUOTA_MIB quota (+ RESERVE_MIB for the CUDA context):
(a) torch.cuda.mem_get_info() and get_device_properties(0).total_memory give the quota, free goes down
    by what the kernel's allocator holds, also in a child process (!python); CuPy's
    runtime.memGetInfo() and Device().mem_info (also an array's device) the same; NVML inside the
    kernel gives the reservation as total and the kernel's NVML use as used; JAX's
    memory_stats()["bytes_limit"] is the quota; importing them creates no CUDA context;
(b) Accelerate's get_max_memory() gives at most the quota for the GPU, and infer_auto_device_map of a
    Llama-shaped model of ~6 B parameters in fp16 (built under init_empty_weights from a config: no
    download, no memory) puts what does not fit on the CPU;
(c) a ~2.7 B-parameter model (random weights, saved here first) loaded with
    from_pretrained(device_map="auto"), whose max memory is Accelerate's get_max_memory() (transformers
    keeps 10% of a lone GPU for buffers), runs a forward pass within the quota (NVML use <= quota +
    reserve; get_max_memory() is recorded beside it);
(d) the same code in a plain python3 without the extension (no bootstrap: no GPUSHARE_* in its
    environment), with a student's own hard cap of the same size
    (torch.cuda.set_per_process_memory_fraction), plans for the whole card and runs out of memory.
Prints PASS/FAIL lines, writes every figure behind them to the JSON file named on the command line,
exits non-zero on a failure. GPUSHARE_CHECK_SMOKE=1 runs the plumbing on a simulated card with tiny
models (no GPU: the checks are listed, expected to fail, and the exit status says only whether the run
got through).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [ROOT, HERE]

from _manager import SMOKE, check_header, install_quota_manager  # noqa: E402
from check_caps import execute, nvml_used_by_pid, tree_pids  # noqa: E402
from jupyter_client.manager import AsyncKernelManager  # noqa: E402

from jupyter_gpushare.host.gpu import SimulatedBackend  # noqa: E402
from jupyter_gpushare.host.gpu.nvml import NvmlBackend  # noqa: E402
from jupyter_gpushare.host.reports import read_reports, report_dir  # noqa: E402

QUOTA_MIB = 4096
RESERVE_MIB = 1024
MiB, GiB = 2**20, 2**30

# Llama-shaped configs (no download): (b) ~5.9 B parameters, 11.9 GB in fp16; (c, d) ~2.7 B, 5.4 GB.
BIG = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=28, num_attention_heads=32, vocab_size=32000)
SMALL = dict(hidden_size=2560, intermediate_size=6912, num_hidden_layers=32, num_attention_heads=32, vocab_size=32000)
if SMOKE:
    BIG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, vocab_size=1000)
    SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=1000)

TORCH_IMPORT = "import torch, pynvml\nprint(torch.__version__, torch.cuda.is_initialized())"
TORCH_VIEWS = """
import json, os, subprocess, sys
free0, total0 = torch.cuda.mem_get_info()
x = torch.empty(2**30, dtype=torch.uint8, device="cuda")  # 1 GiB
free1, total1 = torch.cuda.mem_get_info()
p = torch.cuda.get_device_properties(0)
pynvml.nvmlInit()
m = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByUUID(os.environ["CUDA_VISIBLE_DEVICES"]))
child = subprocess.run([sys.executable, "-c", "import json, torch; print(json.dumps(torch.cuda.mem_get_info()))"],
                       capture_output=True, text=True)
seen_by_child = json.loads(child.stdout.strip().splitlines()[-1]) if child.returncode == 0 else None
print(json.dumps({"before": [free0, total0], "after_1g": [free1, total1], "reserved": torch.cuda.memory_reserved(),
                  "props": [p.total_memory, p.name, p.multi_processor_count, isinstance(p, torch.cuda._CudaDeviceProperties)],
                  "nvml": [m.total, m.used, m.free], "child": seen_by_child, "child_stderr": child.stderr[-500:]}))
"""
CUPY_IMPORT = "import cupy\nprint(cupy.__version__)"
CUPY_VIEWS = """
import json
before = cupy.cuda.runtime.memGetInfo()
x = cupy.ones((2**30,), dtype=cupy.uint8)  # 1 GiB
print(json.dumps({"before": before, "after_1g": cupy.cuda.runtime.memGetInfo(), "device": cupy.cuda.Device().mem_info,
                  "array_device": x.device.mem_info, "pool": cupy.get_default_memory_pool().total_bytes()}))
"""
JAX_IMPORT = "import jax, jax.numpy as jnp\nprint(jax.__version__)"
JAX_VIEWS = """
import json
x = jnp.ones((2**28,), dtype=jnp.float32).block_until_ready()  # 1 GiB
s = jax.devices()[0].memory_stats() or {}
print(json.dumps({"platform": jax.devices()[0].platform, **{k: s.get(k) for k in ("bytes_limit", "bytes_in_use", "bytes_reservable_limit")}}))
"""
# (b): Accelerate's plan for a model larger than the quota, from its config only.
PLAN = """
import json, torch, transformers
from accelerate import init_empty_weights, infer_auto_device_map
from accelerate.utils import compute_module_sizes, get_max_memory
with init_empty_weights():
    big = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**{config}), torch_dtype=torch.float16)
mm = get_max_memory()
plan = infer_auto_device_map(big, max_memory=mm, no_split_module_classes=list(big._no_split_modules), dtype=torch.float16)
sizes = compute_module_sizes(big, dtype=torch.float16)
placed = {{}}
for name, device in plan.items():
    placed[str(device)] = placed.get(str(device), 0) + sizes[name]
print(json.dumps({{"params": sum(p.numel() for p in big.parameters()), "model_bytes": sizes[""],
                  "max_memory": {{str(k): v for k, v in mm.items()}}, "placed_bytes": placed}}))
"""
# (c) in a kernel, (d) in a plain python3: the same loading code.
LOAD = """
import json, torch, transformers
from accelerate.utils import get_max_memory
out = {{}}
try:
    mm = get_max_memory()
    out["max_memory"] = {{str(k): v for k, v in mm.items()}}
    model = transformers.AutoModelForCausalLM.from_pretrained({path!r}, device_map="auto", torch_dtype=torch.float16)
    placed = {{}}
    for device in (getattr(model, "hf_device_map", None) or {{}}).values():
        placed[str(device)] = placed.get(str(device), 0) + 1
    out["modules_placed"] = placed
    ids = torch.randint(0, 1000, (1, 32), device="cuda" if torch.cuda.is_available() else "cpu")
    with torch.no_grad():
        logits = model(ids).logits
    out["logits"] = [list(logits.shape), bool(torch.isfinite(logits).all())]
except Exception as e:
    out["error"] = [type(e).__name__, str(e)[:400]]
if torch.cuda.is_initialized():
    out["max_reserved"] = torch.cuda.max_memory_reserved()
print(json.dumps(out))
"""
STUDENT_CAP = (  # (d): a student's own hard cap of the quota's size, in a process without the extension
    "import torch\n"
    "if torch.cuda.is_available():\n"
    "    torch.cuda.set_per_process_memory_fraction({quota} / torch.cuda.get_device_properties(0).total_memory)\n"
)


def last_json(text: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return {}


def save_model(directory: str) -> dict:
    """(c)'s model with random weights, saved here (CPU) so that kernels load it as from a hub."""
    import torch
    import transformers

    start = time.monotonic()
    model = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**SMALL), torch_dtype=torch.float16)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(directory)
    del model
    return {"params": params, "bytes_fp16": 2 * params, "seconds": round(time.monotonic() - start, 1)}


def without_extension(path: str, card_uuid: str | None) -> dict:
    """(d): the loading code in a plain python3 (no GPUSHARE_* variables, so no bootstrap), with a student's
    hard cap of QUOTA_MIB applied by set_per_process_memory_fraction."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("GPUSHARE_", "XLA_", "CUPY_", "PYTORCH_CUDA_ALLOC"))
    }
    if card_uuid:
        env["CUDA_VISIBLE_DEVICES"] = card_uuid
    code = STUDENT_CAP.format(quota=QUOTA_MIB * MiB) + LOAD.format(path=path)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=540)
    return {"rc": r.returncode, **last_json(r.stdout), "stderr": r.stderr[-1500:]}


async def start_kernel() -> tuple:
    km = AsyncKernelManager(kernel_name="python3")
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=120)
    return km, kc


def within(value, low: float, high: float) -> bool:
    return isinstance(value, (int, float)) and low <= value <= high


def imported_without_context(k: dict) -> bool:
    return (k.get("import") or {}).get("error") is None and k.get("mib_after_import") == 0


def check_torch(k: dict, checks: dict) -> None:
    v, quota = k.get("views") or {}, QUOTA_MIB * MiB
    before, after, props = v.get("before") or [0, 0], v.get("after_1g") or [0, 0], v.get("props") or [0, "", 0, False]
    checks["torch: import creates no CUDA context"] = "import" in k and imported_without_context(k)
    checks["torch: mem_get_info() total is the quota"] = before[1] == quota and after[1] == quota
    checks["torch: free is the quota less memory_reserved() after 1 GiB"] = after[0] == quota - v.get("reserved", -1)
    checks["torch: get_device_properties(0).total_memory is the quota, other attributes the device's"] = (
        props[0] == quota and bool(props[1]) and props[2] > 0 and props[3] is True
    )
    child = v.get("child") or [0, 0]
    checks["torch: a child process (!python) sees the quota too"] = child[1] == quota and 0 < child[0] <= quota
    nvml = v.get("nvml") or [0, 0, 0]
    checks["NVML in the kernel: total is the reservation (quota + reserve)"] = (
        nvml[0] == (QUOTA_MIB + RESERVE_MIB) * MiB
    )
    checks["NVML in the kernel: used is the kernel's own NVML use (within 64 MiB)"] = nvml[1] > 0 and within(
        nvml[1] / MiB, k.get("mib_after_views", -1e9) - 64, k.get("mib_after_views", -1e9) + 64
    )
    entry = ((k.get("report") or {}).get("frameworks") or {}).get("torch") or {}
    checks["torch: the report lists its views"] = set(entry.get("views") or ()) == {
        "torch.cuda.get_device_properties",
        "torch.cuda.mem_get_info",
    }


def check_cupy(k: dict, checks: dict) -> None:
    v, quota = k.get("views") or {}, QUOTA_MIB * MiB
    checks["cupy: import creates no CUDA context"] = "import" in k and imported_without_context(k)
    after, device, array_device = (v.get(x) or [0, 0] for x in ("after_1g", "device", "array_device"))
    checks["cupy: runtime.memGetInfo() total is the quota, free the quota less the pool"] = after == [
        quota - v.get("pool", -1),
        quota,
    ]
    checks["cupy: Device().mem_info and an array's device.mem_info say the same"] = (
        after[1] == quota and device == after == array_device
    )


def check_jax(k: dict, checks: dict) -> None:
    v = k.get("views") or {}
    checks["jax: import creates no CUDA context"] = "import" in k and imported_without_context(k)
    checks["jax: memory_stats() bytes_limit is the quota (within 64 MiB below it)"] = v.get(
        "platform"
    ) == "gpu" and within(v.get("bytes_limit"), (QUOTA_MIB - 64) * MiB, (QUOTA_MIB + 1) * MiB)


def check_hf(k: dict, plain: dict, checks: dict) -> None:
    quota = QUOTA_MIB * MiB
    plan, load = k.get("plan") or {}, k.get("load") or {}
    placed = plan.get("placed_bytes") or {}
    checks["(b) accelerate get_max_memory() gives the GPU at most the quota"] = within(
        (plan.get("max_memory") or {}).get("0"), 1, quota
    )
    checks[
        "(b) infer_auto_device_map: the ~6 B model goes partly to the GPU (within the quota), the rest to the CPU"
    ] = plan.get("model_bytes", 0) > quota and 0 < placed.get("0", 0) <= quota and placed.get("cpu", 0) > 0
    checks["(c) device_map='auto' loads the ~2.7 B model and runs a forward pass"] = (
        "error" not in load and (load.get("logits") or [0, False])[1] is True
    )
    checks["(c) the allocator's peak stays within the quota"] = within(load.get("max_reserved"), 1, quota)
    checks["(c) NVML use of the kernel <= quota + reserve"] = within(
        k.get("mib_after_load"), 1, QUOTA_MIB + RESERVE_MIB
    )
    checks["(d) without the extension get_max_memory() plans for the whole card"] = within(
        (plain.get("max_memory") or {}).get("0"), 4 * quota, float("inf")
    )
    error = plain.get("error") or ["", ""]
    checks["(d) without the extension it runs out of memory at the student's cap"] = (
        error[0] == "OutOfMemoryError" or "out of memory" in error[1].lower()
    )


async def run_kernels(result: dict, usage, path: str) -> None:
    """Start the four kernels, run their cells, keep every figure in ``result['kernels']``."""
    cells = {
        "torch": (TORCH_IMPORT, TORCH_VIEWS),
        "cupy": (CUPY_IMPORT, CUPY_VIEWS),
        "jax": (JAX_IMPORT, JAX_VIEWS),
        "hf": ("import torch, accelerate, transformers\nprint(accelerate.__version__, transformers.__version__)", None),
    }
    kernels = {name: await start_kernel() for name in cells}
    result["kernel_pids"] = {name: km.provisioner.pid for name, (km, _) in kernels.items()}
    try:
        for name, (km, kc) in kernels.items():
            k = result["kernels"][name] = {"kernel_id": km.kernel_id}
            first, views = cells[name]
            r = await execute(kc, first, timeout=300)
            await asyncio.sleep(0.5)
            k["import"] = {"stdout": r["stdout"][-300:], "error": r["error"]}
            k["mib_after_import"] = usage(km)
            if views:
                r = await execute(kc, views, timeout=300)
                await asyncio.sleep(0.5)
                k["views"], k["views_error"] = last_json(r["stdout"]), r["error"]
                k["views_stderr"] = r["stderr"][-800:]
                k["mib_after_views"] = usage(km)
        km, kc = kernels["hf"]
        k = result["kernels"]["hf"]
        r = await execute(kc, PLAN.format(config=BIG), timeout=300)
        k["plan"], k["plan_error"] = last_json(r["stdout"]), r["error"]
        r = await execute(kc, LOAD.format(path=path), timeout=540)
        await asyncio.sleep(0.5)
        k["load"], k["load_error"], k["load_stderr"] = last_json(r["stdout"]), r["error"], r["stderr"][-1500:]
        k["mib_after_load"] = usage(km)
        for name, (km, _) in kernels.items():
            result["kernels"][name]["report"] = read_reports(report_dir(), km.kernel_id)
    finally:
        for km, kc in kernels.values():
            kc.stop_channels()
            await km.shutdown_kernel(now=True)


def versions() -> dict:
    out = {}
    for name in ("torch", "jax", "cupy", "accelerate", "transformers", "pynvml"):
        try:
            out[name] = getattr(__import__(name), "__version__", "?")
        except Exception as e:
            out[name] = f"not importable: {e}"
    return out


async def main(out_path: str) -> int:
    handle, uuid, head = check_header(
        "bench/gpu/check_views.py: the GPU's size seen inside kernels started by the gpushare provisioner",
        QUOTA_MIB,
        RESERVE_MIB,
    )
    total = head["card_total_mib"]
    result: dict = {
        **head,
        "versions": versions(),
        "configs": {"plan": BIG, "load": SMALL},
        "kernels": {},
        "checks": {},
    }
    with tempfile.TemporaryDirectory(prefix="gpushare-views-") as model_dir:
        result["saved_model"] = save_model(model_dir)
        print("saved (c)'s model:", result["saved_model"], flush=True)
        result["without_extension"] = without_extension(model_dir, uuid)  # first, while the card is free
        print(
            "(d) without the extension:",
            {k: v for k, v in result["without_extension"].items() if k != "stderr"},
            flush=True,
        )

        manager = install_quota_manager(SimulatedBackend([total]) if SMOKE else NvmlBackend(), QUOTA_MIB, RESERVE_MIB)

        def usage(km) -> int:
            used = nvml_used_by_pid(handle)
            return sum(used.get(p, 0) for p in tree_pids(km.provisioner.pid))

        try:
            await run_kernels(result, usage, model_dir)
        finally:
            manager.close()
    k, checks = result["kernels"], result["checks"]
    check_torch(k.get("torch") or {}, checks)
    check_cupy(k.get("cupy") or {}, checks)
    check_jax(k.get("jax") or {}, checks)
    check_hf(k.get("hf") or {}, result["without_extension"], checks)
    ok = all(checks.values())
    result["all_ok"] = ok
    for name, passed in checks.items():
        print(("PASS " if passed else "(smoke: needs a GPU) FAIL " if SMOKE else "FAIL ") + name)
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1, default=str)
    print("figures in", out_path)
    return 0 if ok or SMOKE else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "check_views.json")))
