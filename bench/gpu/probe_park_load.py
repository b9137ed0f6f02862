"""What slows a wave change's parks: 8 PyTorch processes parked side by side, alone and beside other work.

In the 4x idle class, a park's checkpoint took 0.6-0.8 s (median) where the kernels next in line imported PyTorch
after their grant, and 0.9-2.3 s where they had imported it while waiting and so set up CUDA at once after their
grant (bench/README.md, "Where the class's time over its ideal goes"). This probe parks 8 processes that each hold
about 1 GiB on the card (a context and a 512 MiB tensor, the allocator's cache emptied: what a trimmed study
kernel holds), with the product's checkpointer (host/checkpoint.py, one helper per park, 8 threads), while 8 other
processes, started at the same moment, do nothing (``alone``), ``import torch`` with every GPU hidden (``imports``:
kernels coming near the front of the line), set up CUDA with PyTorch already imported (``cuda-starts``: kernels
just granted), or spin on the CPU for 3 s (``cpu``). Then it resumes the 8 and checks their data. 3 rounds of
each, in turn.
    python3 bench/gpu/probe_park_load.py OUT.json
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from jupyter_gpushare.host.checkpoint import CheckpointError, DriverCheckpoint  # noqa: E402

HOLDER = r"""
import sys, torch
x = torch.arange(2**27, device="cuda", dtype=torch.float32) % 9973  # 512 MiB
torch.cuda.empty_cache(); torch.cuda.synchronize()
want = float(x.double().sum().item())
print("ready", flush=True)
for line in sys.stdin:
    print("same" if float(x.double().sum().item()) == want else "changed", flush=True)
"""
LOAD = {
    "alone": "pass",
    "imports": "import os; os.environ['CUDA_VISIBLE_DEVICES'] = ''; import torch",
    "cuda-starts": "torch.ones(1, device='cuda'); torch.cuda.synchronize()",
    "cpu": "import time\nend = time.time() + 3\nwhile time.time() < end: pass",
}
LOADER = r"""
import sys, time
if sys.argv[1] == "cuda-starts":
    import torch
print("ready", flush=True)
sys.stdin.readline()
t = time.perf_counter()
exec(sys.argv[2])
print(round(time.perf_counter() - t, 3), flush=True)
"""


def spawn(code: str, *args: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def one_round(checkpointer: DriverCheckpoint, holders: list[subprocess.Popen], load: str) -> dict:
    loaders = [spawn(LOADER, load, LOAD[load]) for _ in range(8)]
    for p in loaders:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()

    def park(p: subprocess.Popen) -> dict:
        t = time.perf_counter()
        try:
            steps = checkpointer.park([p.pid], 5.0)
        except CheckpointError as e:
            return {"error": str(e)}
        return {**steps, "park_s": round(time.perf_counter() - t, 3)}

    with ThreadPoolExecutor(8) as pool:
        parks = list(pool.map(park, holders))
    load_s = [float(p.communicate()[0].strip() or "nan") for p in loaders]
    time.sleep(1)
    with ThreadPoolExecutor(8) as pool:
        resumes = list(pool.map(lambda p: checkpointer.resume([p.pid]), holders))
    intact = []
    for p in holders:
        assert p.stdin is not None and p.stdout is not None
        p.stdin.write("check\n")
        p.stdin.flush()
        intact.append(p.stdout.readline().strip())
    return {"load": load, "parks": parks, "resumes": resumes, "load_s": load_s, "intact": intact}


def main() -> None:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()  # fmt: skip
    checkpointer = DriverCheckpoint()
    if checkpointer.probed():
        raise SystemExit(f"cannot park here: {checkpointer.probed()}")
    holders = [spawn(HOLDER) for _ in range(8)]
    out = {"gpu": gpu, "date": time.strftime("%Y-%m-%d"), "rounds": []}
    try:
        for _ in range(3):
            for load in LOAD:
                r = one_round(checkpointer, holders, load)
                out["rounds"].append(r)
                ck = sorted(p.get("checkpoint", float("nan")) for p in r["parks"])
                print(load, "checkpoint s", ck, "load s", r["load_s"], set(r["intact"]), flush=True)
    finally:
        Path(sys.argv[1]).write_text(json.dumps(out, indent=1))
        for p in holders:
            p.kill()


if __name__ == "__main__":
    threading.excepthook = lambda args: print("thread failed:", args.exc_value, file=sys.stderr)
    main()
