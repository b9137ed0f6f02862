"""Theft met by its victims: a 4 GiB kernel takes 20 GiB while its neighbours' reservations fill the card, and the
neighbours then allocate inside their own quotas. Run on a GPU machine after `source bench/gpu/device_env.sh`
(a real jupyter-server with the extension on NVML, real kernels; as root, so the kernels' cgroups can be made):

    python3 bench/gpu/check_theft.py OUT.json [--ways env-i,cupy-raw,daemon]

Set-up, at the product's defaults (over_quota_action 'protect', 30 s grace, 1 s readings, kernel cgroups on):
the test kernel has a 4 GiB quota; three neighbour kernels (a kernelspec whose quota the config sets) reserve the
rest of the card and sit idle with their CUDA context. For each way, a new test kernel takes 20 GiB:

  env-i     a PyTorch child started with `env -i` (no caps, every card visible)
  cupy-raw  `cupy.cuda.runtime.malloc` in the kernel's own process (no allocator cap applies)
  daemon    a double-forked `env -i` PyTorch daemon in a session of its own (out of the kernel's process tree)

and the neighbours allocate their reservation less 2 GiB at +5, +10 and +15 s after the attack starts, and hold it
until +18 s, so that the three blocks and an unstopped theft do not fit on the card together. A check that can fail:
the victims allocate after the theft, and ``--control`` (over_quota_action 'notify': nothing acts on the theft)
shows that they then run out of memory. Recorded per way: whether and when the attacker's
20 GiB was allocated, when it was gone from the card (NVML, every 0.1 s), what the kernel's events say, and each
neighbour's allocation (ok, or its out-of-memory error). ``neighbour_oom`` counts the failed ones over all ways.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_escapes import SIMULATE, Server, card_zero, run  # noqa: E402

NEIGHBOURS = 3
ATTACK_GIB = 20
OFFSETS = (5.0, 10.0, 15.0)  # when each neighbour allocates, after the attack starts
ALLOC = (
    "import sys, time, torch\n"
    "try:\n"
    "    x = torch.empty({gib} * 2**30, dtype=torch.uint8, device='cuda'); x.fill_(1); torch.cuda.synchronize()\n"
    "    print('ALLOCATED', time.time(), flush=True)\n"
    "except Exception as e:\n"
    "    print('FAILED', time.time(), type(e).__name__, str(e)[:300].replace(chr(10), ' '), flush=True); sys.exit(3)\n"
    "time.sleep(60)\n"
)
WAYS = {
    "env-i": "import subprocess, sys\np = subprocess.Popen(['env', '-i', sys.executable, '-c', ALLOC], stdout=open(LOG, 'w'))\nprint(p.pid)",
    "cupy-raw": (
        "import os, time, cupy\ntry:\n    _raw = cupy.cuda.runtime.malloc(GIB * 2**30); open(LOG, 'w').write(f'ALLOCATED {time.time()}\\n')\n"
        "except Exception as e:\n    open(LOG, 'w').write(f'FAILED {time.time()} {type(e).__name__} {e}\\n')\nprint(os.getpid())"
    ),
    "daemon": (
        "import os, sys\nr, w = os.pipe()\n"
        "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        os.write(w, str(os.getpid()).encode()); os.close(w)\n"
        "        fd = os.open(LOG, os.O_WRONLY | os.O_CREAT | os.O_TRUNC); os.dup2(fd, 1)\n"
        "        os.execve('/usr/bin/env', ['env', '-i', sys.executable, '-c', ALLOC], {})\n    os._exit(0)\n"
        "os.close(w)\nprint(int(os.read(r, 20)))"
    ),
}
# A neighbour: its CUDA context at once, then (one cell per way) its reservation less 2 GiB at a given time.
NEIGHBOUR_START = "import json, time, torch\ntorch.zeros(1, device='cuda'); torch.cuda.synchronize(); print('ready')"
NEIGHBOUR_ALLOC = """
import json, time, torch
time.sleep(max(0.0, {at} - time.time()))
got = {{"at": round(time.time() - {t0}, 2), "mib": {mib}}}
try:
    y = torch.empty({mib} * 2**20, dtype=torch.uint8, device="cuda"); y.fill_(3); torch.cuda.synchronize()
    got["ok"] = True
    time.sleep(max(0.0, {until} - time.time()))  # held until the last neighbour has tried: the blocks add up
    del y
except Exception as e:
    got["ok"] = False
    got["error"] = f"{{type(e).__name__}}: {{str(e)[:300]}}"
torch.cuda.empty_cache()
print(json.dumps(got))
"""


def card_reading() -> tuple[int, dict[int, int]]:
    """(free MiB, pid -> MiB) of card 0, by NVML."""
    import pynvml

    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    free = pynvml.nvmlDeviceGetMemoryInfo(h).free // 2**20
    procs = {p.pid: (p.usedGpuMemory or 0) // 2**20 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}
    return free, procs


def attack(server: Server, neighbours: list, neighbour_mib: int, way: str, work: Path) -> dict:
    kid = server.kernel()
    kc = server.client(kid)
    run(kc, "import torch; print('ready')")  # a kernel that has imported its framework, as students' have
    log = work / f"{way}.log"
    t0 = time.time() + 1.0
    for i, nkc in enumerate(neighbours):
        nkc.execute(NEIGHBOUR_ALLOC.format(at=t0 + OFFSETS[i], t0=t0, mib=neighbour_mib, until=t0 + max(OFFSETS) + 3))
    time.sleep(max(0.0, t0 - time.time()))
    prelude = f"ALLOC = {ALLOC.format(gib=ATTACK_GIB)!r}\nLOG = {str(log)!r}\nGIB = {ATTACK_GIB}\n"
    status, text = run(kc, prelude + WAYS[way])
    record: dict = {"way": way, "gib": ATTACK_GIB, "cell": status, "cell_output": text.strip()[-300:]}
    try:
        pid = int(next(line for line in text.split("\n") if line.strip().isdigit()))
    except StopIteration:
        pid = None
        record["error"] = "no pid printed"
    record["pid"] = pid
    peak, held_until, trace = 0, None, []
    while time.time() - t0 < max(OFFSETS) + 8:
        free, procs = card_reading()
        use = procs.get(pid, 0) if pid else 0
        trace.append((round(time.time() - t0, 2), free, use))
        if use >= 1024:
            peak, held_until = max(peak, use), time.time()
        time.sleep(0.1)
    said = log.read_text() if log.exists() else ""
    allocated_at = None
    if said.startswith("ALLOCATED"):
        allocated_at = float(said.split()[1])
    outcomes = []
    for nkc in neighbours:
        reply = nkc.get_shell_msg(timeout=60)
        out = ""
        while True:
            try:
                msg = nkc.get_iopub_msg(timeout=2)
            except Exception:
                break
            if msg["msg_type"] == "stream":
                out += msg["content"]["text"]
        line = next((x for x in out.splitlines() if x.startswith("{")), None)
        outcomes.append(
            json.loads(line) if line else {"ok": False, "error": f"no result ({reply['content']['status']})"}
        )
    events = [
        {"t": round(e["time"] - t0, 2), "kind": e["kind"], "why": e.get("why"), "stolen_mib": e.get("stolen_mib"),
         "message": e["message"][:200]}
        for e in server.events(kid) if e["time"] >= t0 - 1
    ]  # fmt: skip
    record.update(
        {
            "attacker_said": said.strip()[:300],
            "attacker_allocated_after_s": round(allocated_at - t0, 2) if allocated_at else None,
            "attacker_peak_mib": peak,
            "stolen_memory_free_after_s": round(held_until - allocated_at + 0.1, 2)
            if allocated_at and held_until
            else None,
            "kernel_events": events,
            "neighbours": outcomes,
            "neighbour_oom": sum(1 for o in outcomes if not o.get("ok")),
            "card_trace": trace[::5],
        }
    )
    kc.stop_channels()
    server.call("DELETE", f"api/kernels/{kid}")
    time.sleep(3)
    return record


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--ways", default=",".join(WAYS))
    parser.add_argument(
        "--control",
        action="store_true",
        help="the same with over_quota_action 'notify' (nothing acts on the theft): the neighbours must run out of "
        "memory, or the check could not fail",
    )
    args = parser.parse_args()
    out = Path(args.out)
    total, device = card_zero()
    headroom, reserve = 1024, 640
    neighbour_quota = (total - headroom - (4096 + reserve)) // NEIGHBOURS - reserve - 16
    neighbour_mib = neighbour_quota + reserve - 2048  # their reservation less 2 GiB
    work = Path(tempfile.mkdtemp(prefix="theft-"))
    result: dict = {
        "what": "bench/gpu/check_theft.py: a 4 GiB kernel takes 20 GiB, then its neighbours allocate inside their quotas",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "python": platform.python_version(),
        "settings": "defaults: over_quota_action protect, over_quota_grace 30 s, sample_interval 1 s, kernel_cgroups auto",
        "neighbour_quota_mib": neighbour_quota,
        "neighbour_alloc_mib": neighbour_mib,
        "ways": [],
    }
    settings = {
        "gpu_backend": "nvml", "ledger_path": str(work / "ledger.sqlite"), "default_quota": "4GiB",
        "on_full": "reject", "idle_timeout": 0, "kernel_quotas": {"neighbour": f"{neighbour_quota}MiB", "nogpu": "0MiB"},
    }  # fmt: skip
    if args.control:
        settings["over_quota_action"] = "notify"
        result["settings"] = "control: over_quota_action notify (nothing acts on the theft); the rest defaults"
    if SIMULATE:
        settings.update(gpu_backend="simulated", simulated_cards=f"{total}MiB")
    server = Server(work, settings)
    try:
        result["enforcement"] = server.call("GET", "api/gpushare/state").get("enforcement")
        kids = [server.kernel("neighbour") for _ in range(NEIGHBOURS)]
        clients = [server.client(k) for k in kids]
        for kc in clients:
            run(kc, NEIGHBOUR_START)
        for way in args.ways.split(","):
            record = attack(server, clients, neighbour_mib, way, work)
            result["ways"].append(record)
            brief = {
                k: record.get(k)
                for k in ("way", "attacker_allocated_after_s", "stolen_memory_free_after_s", "neighbour_oom")
            }
            brief["actions"] = [
                (e["t"], e["kind"], e["why"]) for e in record["kernel_events"] if e["kind"] != "reserved"
            ]
            print(json.dumps(brief), flush=True)
        result["neighbour_oom"] = sum(r["neighbour_oom"] for r in result["ways"])
        result["neighbour_pids_unchanged"] = [server.call("GET", f"api/gpushare/kernels/{k}")["pid"] for k in kids]
        print("neighbour_oom:", result["neighbour_oom"], flush=True)
    finally:
        server.stop()
        shutil.copy(work / "server.log", out.with_suffix(".server.log"))
        out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
