"""Memory used outside reservations, on a real GPU: a script run outside any kernel (as from a
terminal) holds 30 GiB of the card; the next kernel is placed as if that memory were reserved.

Run on a GPU machine after `source bench/gpu/device_env.sh` (no Jupyter server needed:
jupyter_client's AsyncMultiKernelManager with the gpushare provisioner, the QuotaManager on the
NVML backend, the real Sampler wired as app.py wires it):

    JUPYTER_DATA_DIR=$(mktemp -d) JUPYTER_RUNTIME_DIR=$(mktemp -d) python3 bench/gpu/check_outside.py out.json

Steps, with quotas of 30 GiB (+ 1 GiB context reserve) on one card of about 80 GiB:
  1. kernel A starts and fills 28 GiB with PyTorch;
  2. a script outside Jupyter fills 30 GiB with PyTorch;
  3. kernel B is refused: by reservations alone it would fit (80 - 31 GiB), but the script's memory
     counts as taken; the message says how much such processes use;
  4. the same start with that accounting switched off (as before this feature): B is admitted,
     and filling its 28 GiB fails with CUDA out-of-memory;
  5. the script exits; B is admitted and fills its 28 GiB.
Checks: what the admission takes as used outside reservations (sampler.unreserved_use over the
ledger's leases) equals NVML's figure for the script's process (kernel A's are not in it); 3, 4 and
5 as said.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.dirname(os.path.abspath(__file__))]

import pynvml  # noqa: E402
from _manager import install_quota_manager  # noqa: E402
from check_usage import execute, nvml_by_pid  # noqa: E402
from jupyter_client.multikernelmanager import AsyncMultiKernelManager  # noqa: E402

from jupyter_gpushare.host.gpu.nvml import NvmlBackend  # noqa: E402
from jupyter_gpushare.ledger.attribution import unreserved_use  # noqa: E402
from jupyter_gpushare.server.sampler import Readings, Sampler, UsageSnapshot  # noqa: E402

QUOTA_MIB, RESERVE_MIB = 30 * 1024, 1024
INTERVAL_S = 0.5
FILL = "import torch; x = torch.empty({gib} * 2**30, dtype=torch.uint8, device='cuda'); x.fill_(1); torch.cuda.synchronize(); print('filled', flush=True)"  # fmt: skip
SCRIPT = FILL.format(gib=30) + "; import time; time.sleep(600)"


async def start(mkm, result: dict, step: str):
    """Start a kernel; (kernel id, client) or (None, None) with the refusal recorded."""
    try:
        kid = await mkm.start_kernel(kernel_name="python3")
    except Exception as e:
        result["steps"][step] = {"admitted": False, "error": str(e)}
        return None, None
    kc = mkm.get_kernel(kid).client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=120)
    result["steps"][step] = {"admitted": True, "kernel_id": kid}
    return kid, kc


async def main(path: str) -> int:
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    text = lambda v: v.decode() if isinstance(v, bytes) else v  # noqa: E731
    result: dict = {
        "what": "bench/gpu/check_outside.py: memory used outside reservations is taken when placing kernels",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": text(pynvml.nvmlDeviceGetName(h)),
        "driver": text(pynvml.nvmlSystemGetDriverVersion()),
        "python": platform.python_version(),
        "card_total_mib": pynvml.nvmlDeviceGetMemoryInfo(h).total // 2**20,
        "quota_mib": QUOTA_MIB,
        "context_reserve_mib": RESERVE_MIB,
        "steps": {},
        "checks": {},
    }
    backend = NvmlBackend()
    manager = install_quota_manager(backend, QUOTA_MIB, RESERVE_MIB)
    mkm = AsyncMultiKernelManager()
    readings = manager.services.readings
    sampler = Sampler(manager, INTERVAL_S, loop=asyncio.get_running_loop(), readings=readings)  # as app.py makes it
    sampler.start()
    checks, steps = result["checks"], result["steps"]
    script = None
    try:
        _, a = await start(mkm, result, "1 kernel A")
        steps["1 kernel A"]["run"] = await execute(a, FILL.format(gib=28))
        script = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, text=True)
        steps["2 script"] = {"pid": script.pid, "stdout": script.stdout.readline().strip()}
        await asyncio.sleep(4 * INTERVAL_S)
        uuid = manager.cards[0].uuid
        leases = await manager.ledger.on(lambda ledger: ledger.leases())
        outside = unreserved_use(sampler.latest_samples(), leases).get(uuid)
        steps["2 script"].update(outside_mib=outside, nvml_script_mib=nvml_by_pid(backend).get(script.pid))
        checks["what is taken as used outside reservations is NVML's figure for the script"] = (
            outside == steps["2 script"]["nvml_script_mib"] and outside >= 30 * 1024
        )

        kid, _ = await start(mkm, result, "3 kernel B, outside use counted")
        error = steps["3 kernel B, outside use counted"].get("error", "")
        checks["B is refused, told what processes without a reservation use"] = (
            kid is None and "hold no reservation" in error
        )

        sampler.readings = Readings()  # as before this feature: the manager reads nothing of the card
        readings.publish(UsageSnapshot())
        kid, b = await start(mkm, result, "4 kernel B, outside use not counted")
        if b is not None:
            run = await execute(b, FILL.format(gib=28))
            steps["4 kernel B, outside use not counted"]["run"] = run
            checks["without the accounting, B is admitted and runs out of memory"] = "OutOfMemoryError" in (
                run["error"] or ""
            )
            b.stop_channels()
            await mkm.shutdown_kernel(kid, now=True)
        sampler.readings = readings

        script.kill()
        script.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(
            p.pid == script.pid for s in sampler.latest_samples() for p in s.processes
        ):
            await asyncio.sleep(INTERVAL_S)
        kid, b = await start(mkm, result, "5 kernel B after the script exits")
        if b is not None:
            run = await execute(b, FILL.format(gib=28))
            steps["5 kernel B after the script exits"]["run"] = run
            checks["after the script exits, B is admitted and fills its 28 GiB"] = "filled" in run["stdout"]
        else:
            checks["after the script exits, B is admitted and fills its 28 GiB"] = False
    finally:
        if script is not None:
            script.kill()
        sampler.stop()
        await mkm.shutdown_all(now=True)
        manager.close()
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))
    return 0 if checks and all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1])))
