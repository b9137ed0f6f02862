"""Framework caps on a real GPU: kernels started through the provisioner, checked with NVML.

Run on a GPU machine (no Jupyter server needed: jupyter_client's AsyncKernelManager with our
provisioner, the QuotaManager on the NVML backend):

    JUPYTER_DATA_DIR=$(mktemp -d) JUPYTER_RUNTIME_DIR=$(mktemp -d) python bench/gpu/check_caps.py out.json

Three kernels share the card, one per framework (PyTorch, JAX, CuPy), each with QUOTA_MIB:
1. ``import <framework>`` creates no CUDA context (NVML lists no process for the kernel's pid);
2. an allocation under the quota succeeds; NVML shows the kernel at most quota + context reserve;
3. a second allocation that passes the quota fails with the framework's OOM error in that kernel
   only, followed by the jupyter-gpushare note; the kernel and its neighbours keep working;
4. a child process of the PyTorch kernel (``!python train.py``) is capped too;
5. the kernels' reports reach the manager's snapshot; shutting down removes them.
Prints a summary and writes everything to the JSON file named on the command line.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.dirname(os.path.abspath(__file__))]

import pynvml  # noqa: E402
from _manager import SMOKE, check_header, install_quota_manager  # noqa: E402
from jupyter_client.manager import AsyncKernelManager  # noqa: E402

from jupyter_gpushare.host.gpu import SimulatedBackend  # noqa: E402
from jupyter_gpushare.host.gpu.nvml import NvmlBackend  # noqa: E402
from jupyter_gpushare.host.reports import report_dir  # noqa: E402

QUOTA_MIB = 4096
RESERVE_MIB = 1024
GIB = 2**30

FRAMEWORKS = {
    "torch": {
        "import": "import torch",
        "under": "x = torch.empty(3 * 2**30, dtype=torch.uint8, device='cuda'); x.fill_(1); print(int(x[:10].sum()))",
        "over": "y = torch.empty(2 * 2**30, dtype=torch.uint8, device='cuda')",
        "still": "print(int((x[:1000] + 1).sum()))",
        "expect": "OutOfMemoryError",
    },
    "jax": {
        "import": "import jax, jax.numpy as jnp",
        "under": "x = jnp.ones((3 * 2**30,), dtype=jnp.uint8); print(int(x[:10].sum()))",
        "over": "y = jnp.ones((2 * 2**30,), dtype=jnp.uint8); y.block_until_ready()",
        "still": "print(int((x[:1000] + 1).sum()))",
        "expect": "RESOURCE_EXHAUSTED",
    },
    "cupy": {
        "import": "import cupy",
        "under": "x = cupy.ones((3 * 2**30,), dtype=cupy.uint8); print(int(x[:10].sum()))",
        "over": "y = cupy.ones((2 * 2**30,), dtype=cupy.uint8)",
        "still": "print(int((x[:1000] + 1).sum()))",
        "expect": "OutOfMemoryError",
    },
}

CHILD = (
    "import subprocess, sys\n"
    "code = \"import torch; a = torch.empty(3 * 2**30, dtype=torch.uint8, device='cuda'); "
    "b = torch.empty(2 * 2**30, dtype=torch.uint8, device='cuda')\"\n"
    "r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)\n"
    "print('child rc', r.returncode); print(r.stderr[-1500:])"
)


def nvml_used_by_pid(handle) -> dict[int, int]:
    """MiB used on the card by each process (compute and graphics)."""
    out: dict[int, int] = {}
    if handle is None:  # SMOKE run without a GPU
        return out
    for fn in (pynvml.nvmlDeviceGetComputeRunningProcesses, pynvml.nvmlDeviceGetGraphicsRunningProcesses):
        try:
            for p in fn(handle):
                used = p.usedGpuMemory
                out[p.pid] = out.get(p.pid, 0) + (used // 2**20 if isinstance(used, int) else 0)
        except pynvml.NVMLError:
            pass
    return out


def tree_pids(pid: int) -> set[int]:
    import psutil

    try:
        p = psutil.Process(pid)
        return {pid} | {c.pid for c in p.children(recursive=True)}
    except psutil.Error:
        return {pid}


async def execute(kc, code: str, timeout: float = 180) -> dict:
    msg_id = kc.execute(code)
    out = {"stdout": "", "stderr": "", "error": None}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = await kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            out[content["name"]] += content["text"]
        elif kind == "error":
            out["error"] = {
                "ename": content["ename"],
                "evalue": content["evalue"][:500],
                "traceback_lines": len(content["traceback"]),
            }
        elif kind == "status" and content["execution_state"] == "idle":
            return out
    out["error"] = {"ename": "Timeout", "evalue": f"no reply in {timeout} s", "traceback_lines": 0}
    return out


async def main(path: str) -> int:
    handle, _, head = check_header(
        "bench/gpu/check_caps.py: framework caps in kernels started by the gpushare provisioner", QUOTA_MIB, RESERVE_MIB
    )
    total = head["card_total_mib"]
    result: dict = {
        **head,
        "kernels": {},
        "checks": {},
    }
    for name in ("torch", "jax", "cupy"):
        try:
            mod = __import__(name)
            result[f"{name}_version"] = getattr(mod, "__version__", "?")
        except Exception as e:
            result[f"{name}_version"] = f"not importable: {e}"

    backend = SimulatedBackend([total]) if SMOKE else NvmlBackend()
    manager = install_quota_manager(backend, QUOTA_MIB, RESERVE_MIB)

    kernels = {}
    for fw in FRAMEWORKS:
        km = AsyncKernelManager(kernel_name="python3")
        await km.start_kernel()
        kc = km.client()
        kc.start_channels()
        await kc.wait_for_ready(timeout=120)
        kernels[fw] = (km, kc)
    checks = result["checks"]

    def usage(fw: str) -> int:
        used = nvml_used_by_pid(handle)
        return sum(used.get(p, 0) for p in tree_pids(kernels[fw][0].provisioner.pid))

    for fw, (km, kc) in kernels.items():
        env = await execute(
            kc, "import os; print(os.environ.get('GPUSHARE_QUOTA_MIB'), os.environ.get('CUDA_VISIBLE_DEVICES'))"
        )
        k = result["kernels"][fw] = {"pid": km.provisioner.pid, "kernel_id": km.kernel_id, "env": env["stdout"].split()}
        r = await execute(kc, FRAMEWORKS[fw]["import"])
        time.sleep(0.5)
        k["import_error"] = r["error"]
        k["mib_after_import"] = usage(fw)
        checks[f"{fw}: import creates no CUDA context"] = r["error"] is None and k["mib_after_import"] == 0

    for fw, (_km, kc) in kernels.items():
        k = result["kernels"][fw]
        r = await execute(kc, FRAMEWORKS[fw]["under"])
        time.sleep(0.5)
        k["under"] = r
        k["mib_after_under"] = usage(fw)
        k["nvml_processes_mib"] = nvml_used_by_pid(handle)
        checks[f"{fw}: 3 GiB under a 4 GiB quota succeeds"] = r["error"] is None
        checks[f"{fw}: NVML use <= quota + reserve after 3 GiB"] = 0 < k["mib_after_under"] <= QUOTA_MIB + RESERVE_MIB

    for fw, (_km, kc) in kernels.items():
        k = result["kernels"][fw]
        r = await execute(kc, FRAMEWORKS[fw]["over"])
        time.sleep(0.5)
        k["over"] = {"error": r["error"], "note": r["stderr"][-800:]}
        k["mib_after_over"] = usage(fw)
        err = r["error"] or {}
        checks[f"{fw}: +2 GiB past the quota fails with its OOM error"] = (
            FRAMEWORKS[fw]["expect"] in f"{err.get('ename')} {err.get('evalue')}"
        )
        checks[f"{fw}: the OOM is followed by the gpushare note"] = (
            "[jupyter-gpushare]" in r["stderr"] and f"{QUOTA_MIB} MiB" in r["stderr"]
        )
        checks[f"{fw}: NVML use <= quota + reserve after the OOM"] = k["mib_after_over"] <= QUOTA_MIB + RESERVE_MIB
        for other, (_, okc) in kernels.items():  # this kernel and every neighbour still compute
            s = await execute(okc, FRAMEWORKS[other]["still"])
            checks[f"{other}: still works after the OOM in the {fw} kernel"] = (
                s["error"] is None and s["stdout"].strip() == "2000"
            )

    r = await execute(kernels["torch"][1], CHILD)
    result["kernels"]["torch"]["child"] = r["stdout"][-1500:]
    checks["torch: a child process of the kernel is capped too (OOM past the quota)"] = (
        "child rc 1" in r["stdout"] and "OutOfMemoryError" in r["stdout"]
    )

    snap = await manager.snapshot()
    result["snapshot_frameworks"] = {k["kernel_id"]: k.get("frameworks") for k in snap["kernels"]}
    for fw, (km, _) in kernels.items():
        entry = (result["snapshot_frameworks"].get(km.kernel_id) or {}).get(fw) or {}
        checks[f"{fw}: the server's snapshot says capped at the quota"] = (
            entry.get("capped") is True and entry.get("limit_mib") == QUOTA_MIB
        )

    from jupyter_gpushare.host.reports import read_reports

    for fw, (km, _) in kernels.items():
        result["kernels"][fw]["report"] = read_reports(report_dir(), km.kernel_id)
    reserved = manager.ledger_path
    for _fw, (km, kc) in kernels.items():
        kc.stop_channels()
        await km.shutdown_kernel(now=False)
    left = [n for n in os.listdir(report_dir()) if n.endswith(".json")]
    checks["shutdown removes the report files"] = left == []
    result["ledger"] = reserved
    manager.close()

    ok = all(checks.values())
    result["all_ok"] = ok
    for name, passed in checks.items():
        print(("PASS " if passed else "FAIL ") + name)
    for fw, k in result["kernels"].items():
        print(fw, {key: k.get(key) for key in ("mib_after_import", "mib_after_under", "mib_after_over")})
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=str)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "check_caps.json")))
