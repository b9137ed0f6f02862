"""Per-kernel GPU use on a real GPU: the sampler's figures against NVML, and the over-quota action.

Run on a GPU machine (no Jupyter server needed: jupyter_client's AsyncMultiKernelManager with the
gpushare provisioner, the QuotaManager on the NVML backend, the real Sampler and Enforcer):

    JUPYTER_DATA_DIR=$(mktemp -d) JUPYTER_RUNTIME_DIR=$(mktemp -d) python bench/gpu/check_usage.py out.json

Three kernels share the card (quota QUOTA_MIB + reserve RESERVE_MIB each):
  A: PyTorch allocates 1 GiB;
  B: CuPy allocates 512 MiB, and a child process of B (started from the kernel) allocates
     768 MiB with PyTorch;
  C: lifts its PyTorch cap and allocates 4 GiB, past its reservation.
Checks: the per-kernel figures the API serves (KernelView of the sampler snapshot) equal NVML's
per-process figures summed over each kernel's process tree (psutil), B's child included; the card's
split (kernels / others) adds up; C is detected and restarted (over_quota_grace = 0) within two
sampling intervals of its allocation. GPUSHARE_CHECK_SMOKE=1 runs the plumbing on a simulated card.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import platform
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.dirname(os.path.abspath(__file__))]

import psutil  # noqa: E402
import pynvml  # noqa: E402
from _manager import install_quota_manager  # noqa: E402
from jupyter_client.multikernelmanager import AsyncMultiKernelManager  # noqa: E402

from jupyter_gpushare.core.policy import EnforcePolicy  # noqa: E402
from jupyter_gpushare.host.gpu import SimulatedBackend  # noqa: E402
from jupyter_gpushare.host.gpu.nvml import NvmlBackend  # noqa: E402
from jupyter_gpushare.server.enforce import Enforcer  # noqa: E402
from jupyter_gpushare.server.sampler import Sampler  # noqa: E402
from jupyter_gpushare.server.views import KernelView  # noqa: E402

QUOTA_MIB, RESERVE_MIB = 2048, 1024
INTERVAL_S = 0.5
SMOKE = os.environ.get("GPUSHARE_CHECK_SMOKE") == "1"
MIB = 2**20

A_CODE = "import torch; x = torch.empty(2**30, dtype=torch.uint8, device='cuda'); x.fill_(1); torch.cuda.synchronize(); print('ok')"
B_CODE = (
    "import cupy, subprocess, sys\n"
    "x = cupy.ones((512 * 2**20,), dtype=cupy.uint8); cupy.cuda.Device().synchronize()\n"
    "code = \"import torch, time; y = torch.empty(768 * 2**20, dtype=torch.uint8, device='cuda'); y.fill_(1); "
    "torch.cuda.synchronize(); print('ok', flush=True); time.sleep(600)\"\n"
    "child = subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE, text=True)\n"
    "print('child', child.pid, child.stdout.readline().strip())"
)
C_CODE = (
    "import time\n"
    "try:\n"
    "    import torch\n"
    "    torch.cuda.set_per_process_memory_fraction(1.0)\n"
    "    z = torch.empty(4 * 2**30, dtype=torch.uint8, device='cuda'); z.fill_(1); torch.cuda.synchronize(); how = 'torch'\n"
    "except Exception as e:\n"
    "    import cupy\n"
    "    cupy.get_default_memory_pool().set_limit(size=0)\n"
    "    z = cupy.ones((4 * 2**30,), dtype=cupy.uint8); cupy.cuda.Device().synchronize(); how = 'cupy after ' + type(e).__name__\n"
    "print('allocated', repr(time.time()), how)"
)


async def execute(kc, code: str, timeout: float = 180) -> dict:
    msg_id = kc.execute(code)
    out = {"stdout": "", "error": None}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = await kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        except Exception:
            break
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            out["stdout"] += content["text"]
        elif kind == "error":
            out["error"] = f"{content['ename']}: {content['evalue'][:300]}"
        elif kind == "status" and content["execution_state"] == "idle":
            return out
    out["error"] = out["error"] or "timeout"
    return out


def nvml_by_pid(backend) -> dict[int, int]:
    """NVML's own per-process figures, read here independently of the backend (MiB)."""
    if SMOKE:
        return {pid: p["used_mib"] for d in backend.fake.devices for pid, p in d.processes.items()}
    out: dict[int, int] = {}
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        for fn in (pynvml.nvmlDeviceGetComputeRunningProcesses, pynvml.nvmlDeviceGetGraphicsRunningProcesses):
            try:
                for p in fn(h):
                    if isinstance(p.usedGpuMemory, int):
                        out[p.pid] = max(out.get(p.pid, 0), p.usedGpuMemory // MIB)
            except pynvml.NVMLError:
                pass
    return out


def tree(pid: int) -> set[int]:
    try:
        return {pid} | {c.pid for c in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return {pid}


async def main(path: str) -> int:
    if SMOKE:
        device, driver = "none (smoke run on a simulated card)", None
        backend = SimulatedBackend([81920])
    else:
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        device, driver = pynvml.nvmlDeviceGetName(h), pynvml.nvmlSystemGetDriverVersion()
        backend = NvmlBackend()
    result: dict = {
        "what": "bench/gpu/check_usage.py: per-kernel GPU use (sampler vs NVML) and the over-quota action",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device if isinstance(device, str) else device.decode(),
        "driver": driver if not isinstance(driver, bytes) else driver.decode(),
        "python": platform.python_version(),
        "quota_mib": QUOTA_MIB,
        "context_reserve_mib": RESERVE_MIB,
        "sample_interval_s": INTERVAL_S,
        "kernels": {},
        "checks": {},
    }
    manager = install_quota_manager(backend, QUOTA_MIB, RESERVE_MIB)
    mkm = AsyncMultiKernelManager()
    enforcer = Enforcer(manager, mkm, EnforcePolicy(over_grace_s=0.0, over_action="restart", idle_timeout_s=0))
    sampler = Sampler(manager, INTERVAL_S, loop=asyncio.get_running_loop(), on_sample=enforcer.on_sample)
    sampler.start()
    checks = result["checks"]
    kids, clients = {}, {}
    try:
        for name in "ABC":
            kid = await mkm.start_kernel(kernel_name="python3")
            kc = mkm.get_kernel(kid).client()
            kc.start_channels()
            await kc.wait_for_ready(timeout=120)
            kids[name], clients[name] = kid, kc
        fake_pids = {}
        for name, code in (("A", A_CODE), ("B", B_CODE)):
            r = await execute(clients[name], code)
            result["kernels"][name] = {"kernel_id": kids[name], "pid": manager.records[kids[name]].pid, "run": r}
            if SMOKE:
                fake_pids[name] = manager.records[kids[name]].pid
                backend.fake.add_process(fake_pids[name], 1640 if name == "A" else 1030)
                if name == "B" and "child" in r["stdout"]:
                    backend.fake.add_process(int(r["stdout"].split()[1]), 1380)
        await asyncio.sleep(3 * INTERVAL_S)

        # The API's figures against NVML's, summed over each kernel's process tree.
        for _attempt in range(5):
            snap = sampler.snapshot
            truth_all = nvml_by_pid(backend)
            rows = {}
            for name in "AB":
                rec = manager.records[kids[name]]
                judged = enforcer.states.get(rec.kernel_id)
                view = KernelView(rec, time.time(), usage=snap.kernels.get(rec.kernel_id), judged=judged).to_json()
                pids = tree(rec.pid)
                truth = {p: m for p, m in truth_all.items() if p in pids}
                rows[name] = {
                    "api_used_mib": view["used_mib"],
                    "nvml_tree_mib": sum(truth.values()),
                    "nvml_processes": truth,
                    "api_processes": view["processes"],
                    "state": view["state"],
                }
            if all(r["api_used_mib"] == r["nvml_tree_mib"] for r in rows.values()):
                break
            await asyncio.sleep(INTERVAL_S)
        for name, row in rows.items():
            result["kernels"][name].update(row)
            checks[f"{name}: API used_mib equals NVML summed over the kernel's tree"] = (
                row["api_used_mib"] == row["nvml_tree_mib"] > 0
            )
        checks["B: the child process is attributed to B"] = (
            len(rows["B"]["nvml_processes"]) == 2 and len(rows["B"]["api_processes"]) == 2
        )
        cards = []
        for uuid, c in snap.cards.items():
            cards.append(
                {
                    "uuid": uuid,
                    "total_mib": c.total_mib,
                    "used_mib": c.used_mib,
                    "used_by_kernels_mib": c.used_by_kernels_mib,
                    "used_by_others_mib": c.used_by_others_mib,
                    "free_mib": c.free_mib,
                    "utilization": c.utilization,
                    "errors": dict(c.errors),
                }
            )
        result["cards"] = cards
        checks["card: used_by_kernels = A + B"] = (
            cards[0]["used_by_kernels_mib"] == rows["A"]["api_used_mib"] + rows["B"]["api_used_mib"]
        )

        # Over quota: C lifts its cap and allocates past its reservation.
        pid_before = manager.records[kids["C"]].pid
        n_events = len(manager.events)
        r = await execute(clients["C"], C_CODE)
        if SMOKE:
            backend.fake.add_process(pid_before, 4700)
            r["stdout"] = f"allocated {time.time()!r} smoke"
        t_alloc = float(r["stdout"].split()[1]) if r["stdout"].startswith("allocated") else time.time()
        deadline = time.monotonic() + 30
        warning = action = None
        while time.monotonic() < deadline and action is None:
            new = list(manager.events)[n_events:]
            warning = warning or next(
                (e for e in new if e["kind"] == "over-quota" and e["kernel_id"] == kids["C"]), None
            )
            action = next((e for e in new if e["kind"] == "over-quota-restart" and e["kernel_id"] == kids["C"]), None)
            await asyncio.sleep(0.05)
        pid_after = manager.records[kids["C"]].pid
        result["kernels"]["C"] = {
            "kernel_id": kids["C"],
            "run": r,
            "pid_before": pid_before,
            "pid_after": pid_after,
            "warning": warning,
            "action": action,
            "detected_after_s": round(warning["time"] - t_alloc, 3) if warning else None,
            "restarted_after_s": round(action["time"] - t_alloc, 3) if action else None,
        }
        checks["C: over quota detected within two sampling intervals"] = (
            bool(warning) and warning["time"] - t_alloc <= 2 * INTERVAL_S
        )
        checks["C: restarted (new process), reservation kept"] = (
            bool(action) and pid_after != pid_before and manager.records[kids["C"]].lease is not None
        )
        if SMOKE:
            backend.fake.remove_process(pid_before)
        await asyncio.sleep(3 * INTERVAL_S)
        after = sampler.snapshot.kernels.get(kids["C"])
        result["kernels"]["C"]["used_mib_after_restart"] = after.used_mib if after else None
        checks["C: its memory is back after the restart"] = after is not None and after.used_mib == 0
        ticks = []
        for _ in range(20):
            ticks.append(sampler.tick().tick_ms)
        result["sampler_tick_ms"] = {
            "median": round(statistics.median(ticks), 3),
            "max": round(max(ticks), 3),
            "kernels": len(kids),
        }
    finally:
        sampler.stop()
        for kc in clients.values():
            kc.stop_channels()
        await mkm.shutdown_all(now=True)
        manager.close()
    result["events"] = [e for e in manager.events if e["kind"] not in ("reserved", "released")]
    ok = all(checks.values())
    result["ok"] = ok
    with open(path, "w") as f:
        json.dump(result, f, indent=2, default=str)
    for k, v in checks.items():
        print(("PASS " if v else "FAIL ") + k)
    print(
        json.dumps({k: result["kernels"][k].get("api_used_mib") for k in "AB"}),
        result["kernels"]["C"].get("detected_after_s"),
        result["kernels"]["C"].get("restarted_after_s"),
        result.get("sampler_tick_ms"),
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "check_usage.json")))
