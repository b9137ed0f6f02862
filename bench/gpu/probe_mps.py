"""What NVIDIA MPS gives a shared notebook host, measured: per-client pinned device-memory limits, the default
limit for a client that lost its environment, what NVML shows of MPS clients (the sampler attributes memory by
process), and what one client killed mid-work does to the next. Run as root on a GPU machine:

    python3 bench/gpu/probe_mps.py OUT.json

Each case is a fresh process (CuPy raw allocations, so no framework cap is involved). The daemon is started with
the default pipe and log directories (where a client whose environment was wiped looks) and stopped at the end.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time

CLIENT = """
import json, os, sys, time, cupy
got = {"env": os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), "allocs": []}
for gib in GIBS:
    try:
        p = cupy.cuda.runtime.malloc(int(gib * 2**30)); cupy.cuda.runtime.memset(p, 1, int(gib * 2**30))
        cupy.cuda.runtime.deviceSynchronize(); got["allocs"].append([gib, "ok"]); cupy.cuda.runtime.free(p)
    except Exception as e:
        got["allocs"].append([gib, f"{type(e).__name__}: {str(e)[:120]}"])
if HOLD:
    p = cupy.cuda.runtime.malloc(int(HOLD * 2**30)); cupy.cuda.runtime.memset(p, 1, int(HOLD * 2**30))
    print("HOLDING", os.getpid(), flush=True); time.sleep(30)
print(json.dumps(got), flush=True)
"""


def control(command: str) -> str:
    r = subprocess.run(["nvidia-cuda-mps-control"], input=command + "\n", capture_output=True, text=True, timeout=30)
    return (r.stdout + r.stderr).strip()


def client(gibs: list[float], env: dict | None = None, hold: float = 0, clean: bool = False) -> subprocess.Popen:
    code = f"GIBS = {gibs!r}\nHOLD = {hold!r}\n" + CLIENT
    environ = (
        {"PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", "")} if clean else dict(os.environ)
    )
    environ.update(env or {})
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environ
    )


def finish(p: subprocess.Popen) -> dict:
    out, _ = p.communicate(timeout=120)
    line = next((x for x in out.splitlines() if x.startswith("{")), None)
    return json.loads(line) if line else {"error": out[-600:], "rc": p.returncode}


def nvml_view() -> list:
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    out = []
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
        try:
            name = open(f"/proc/{p.pid}/comm").read().strip()
        except OSError:
            name = "?"
        out.append({"pid": p.pid, "comm": name, "used_mib": (p.usedGpuMemory or 0) // 2**20})
    return out


def main(path: str) -> int:
    result: dict = {
        "what": "bench/gpu/probe_mps.py",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    result["nvidia_smi"] = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    start = subprocess.run(["nvidia-cuda-mps-control", "-d"], capture_output=True, text=True, timeout=30)
    result["daemon_start"] = [start.returncode, (start.stdout + start.stderr).strip()]
    time.sleep(1)
    try:
        result["default_limit_set"] = control("set_default_device_pinned_mem_limit 0 8G")
        cases = {}
        cases["own_limit_2g"] = finish(client([1, 3], {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2G"}))
        cases["own_limit_16g_above_default"] = finish(client([6, 12], {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=16G"}))
        cases["no_env_default_8g"] = finish(client([6, 12], clean=True))
        holder = client([], {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=6G"}, hold=4)
        line = holder.stdout.readline()
        time.sleep(1)
        result["nvml_while_a_client_holds_4g"] = {"client": line.strip(), "processes": nvml_view()}
        holder.kill()
        holder.wait()
        time.sleep(1)
        cases["after_a_client_was_killed"] = finish(client([1]))
        result["server_list"] = control("get_server_list")
        result["cases"] = cases
    finally:
        result["quit"] = control("quit")
        time.sleep(2)
        result["after_quit_plain_client"] = finish(client([1]))
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1)[:4000])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
