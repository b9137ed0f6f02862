"""Park and resume, over and over, on a real GPU with the product's checkpointer (host/checkpoint.py): how fast, and
whether anything is ever lost or left locked (issue 46, items 3 and 4).

Run on a GPU machine from the repo root (PYTHONPATH=. ; nothing of Jupyter is needed):

    python3 bench/gpu/check_park_cycles.py speed OUT.json [--cycles 20] [--gib 4]
    python3 bench/gpu/check_park_cycles.py soak OUT.json [--holders 24] [--gib 1] [--cycles 1000] [--workers 4]

Each holder is a PyTorch process that keeps ``gib`` GiB of known data on card 0 (``empty_cache()`` done, as a park's
trim does) and answers "sum" on its stdin with a checksum of it, computed on the card.

- ``speed``: one 4 GiB holder, parked and resumed ``cycles`` times each way, side by side in one run, the two ways
  taking turns: ``one process a call`` (a fresh helper process per park and per resume, as the server did before:
  each attaches to the driver) and ``persistent`` (one helper for all calls, as the server does now). Per way: the
  medians of park and resume as the caller waits for them, the driver's own steps, and the restore rate.
- ``soak``: ``holders`` holders (a class), ``workers`` threads each with its own persistent helper, each cycle a
  random holder nobody moves: park, the card read until it shows the holder holding nothing, resume, and its
  checksum checked. Until ``cycles`` cycles are done or ``--seconds`` pass. Then the driver's state of every holder:
  anything but ``running`` is left locked.

One JSON file per call, every cycle's figures in it, the failed ones too.
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from jupyter_gpushare.host import checkpoint  # noqa: E402
from jupyter_gpushare.host.checkpoint import CheckpointError, DriverCheckpoint  # noqa: E402

HOLDER = r"""
import sys, torch
n = int(float(sys.argv[1]) * 2**30) // 4
x = torch.arange(n, device="cuda", dtype=torch.float32) % 9973
torch.cuda.empty_cache(); torch.cuda.synchronize()
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "sum":
        print(repr(float(x[::1024].double().sum().item())), flush=True)
"""


class Holder:
    def __init__(self, gib: float) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(gib)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)  # fmt: skip
        self.pid = self.proc.pid
        self.sum = 0.0

    def ready(self) -> Holder:
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "ready"
        self.sum = self.checksum()
        return self

    def checksum(self) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("sum\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def card_mib(pid: int) -> int:
    import pynvml

    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    return next(((p.usedGpuMemory or 0) >> 20 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)
                 if p.pid == pid), 0)  # fmt: skip


def freed(pid: int, within_s: float = 5.0) -> float | None:
    """Seconds until NVML shows the process holding at most 64 MiB (None: it did not)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < within_s:
        if card_mib(pid) <= 64:
            return round(time.perf_counter() - t0, 3)
        time.sleep(0.02)
    return None


class OneProcessACall:
    """The way before: a fresh helper process per call (``checkpoint.py park|resume``), each attaching to the
    driver."""

    def _call(self, *args: str) -> dict:
        out = subprocess.run([sys.executable, "-I", "-S", checkpoint.__file__, *args], capture_output=True, text=True,
                             timeout=300)  # fmt: skip
        reply = json.loads(out.stdout.strip().splitlines()[-1])
        if not reply.get("ok"):
            raise CheckpointError(reply.get("error"))
        return reply["seconds"]

    def park(self, pids: list[int], lock_timeout_s: float) -> dict:
        return self._call("park", str(int(lock_timeout_s * 1000)), *map(str, pids))

    def resume(self, pids: list[int]) -> dict:
        return self._call("resume", *map(str, pids))


def timed(fn, *args) -> tuple[float, dict]:
    t0 = time.perf_counter()
    steps = fn(*args)
    return round(time.perf_counter() - t0, 3), steps


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def speed(args) -> dict:
    holder = Holder(args.gib).ready()
    used = card_mib(holder.pid)
    ways = {"one process a call": OneProcessACall(), "persistent": DriverCheckpoint()}
    assert ways["persistent"].probed() is None, ways["persistent"].probed()
    cycles: list[dict] = []
    try:
        for i in range(args.cycles):
            for name in sorted(ways, reverse=i % 2 == 1):  # the two ways take turns going first
                way = ways[name]
                park_s, park_steps = timed(way.park, [holder.pid], 10.0)
                freed_s = freed(holder.pid)
                resume_s, resume_steps = timed(way.resume, [holder.pid])
                intact = holder.checksum() == holder.sum
                cycles.append({"way": name, "cycle": i, "park_s": park_s, "resume_s": resume_s, "freed_s": freed_s,
                               "park_steps": park_steps, "resume_steps": resume_steps, "intact": intact})  # fmt: skip
    finally:
        states = ways["persistent"].states([holder.pid])
        ways["persistent"].close()
        holder.close()
    out: dict = {"holder_used_mib": used, "cycles": cycles, "states_at_end": states, "ways": {}}
    for name in ways:
        mine = [c for c in cycles if c["way"] == name]
        restore = [c["resume_steps"]["restore"] for c in mine]
        out["ways"][name] = {
            "park_median_s": median([c["park_s"] for c in mine]),
            "resume_median_s": median([c["resume_s"] for c in mine]),
            "lock_median_s": median([c["park_steps"]["lock"] for c in mine]),
            "checkpoint_median_s": median([c["park_steps"]["checkpoint"] for c in mine]),
            "restore_median_s": median(restore),
            "unlock_median_s": median([c["resume_steps"]["unlock"] for c in mine]),
            "restore_gib_per_s": round(used / 1024 / statistics.median(restore), 2) if restore else None,
            "all_intact": all(c["intact"] for c in mine),
            "n": len(mine),
        }
    before, after = out["ways"]["one process a call"], out["ways"]["persistent"]
    out["ratio_park"] = round(before["park_median_s"] / after["park_median_s"], 2)
    out["ratio_resume"] = round(before["resume_median_s"] / after["resume_median_s"], 2)
    return out


def soak(args) -> dict:
    holders = [h.ready() for h in [Holder(args.gib) for _ in range(args.holders)]]  # (started at once)
    free = set(range(len(holders)))
    lock = threading.Lock()
    cycles: list[dict] = []
    deadline = time.monotonic() + args.seconds
    rng = random.Random(46)

    def work(w: int) -> None:
        checkpointer = DriverCheckpoint()
        assert checkpointer.probed() is None, checkpointer.probed()
        try:
            while True:
                with lock:
                    if len(cycles) >= args.cycles or time.monotonic() > deadline:
                        return
                    i = rng.choice(sorted(free))
                    free.discard(i)
                    cycles.append(record := {"worker": w, "holder": i})
                h = holders[i]
                try:
                    record["park_s"], _ = timed(checkpointer.park, [h.pid], 10.0)
                    record["freed_s"] = freed(h.pid)
                    record["resume_s"], _ = timed(checkpointer.resume, [h.pid])
                    record["intact"] = h.checksum() == h.sum
                except CheckpointError as e:
                    record["error"] = str(e)
                finally:
                    with lock:
                        free.add(i)
        finally:
            checkpointer.close()

    threads = [threading.Thread(target=work, args=(w,)) for w in range(args.workers)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = round(time.monotonic() - t0, 1)
    probe = DriverCheckpoint()
    probe.probed()
    states = probe.states([h.pid for h in holders])
    probe.close()
    alive = sum(h.proc.poll() is None for h in holders)
    for h in holders:
        h.close()
    done = [c for c in cycles if "intact" in c or "error" in c]
    return {
        "holders": args.holders, "gib_each": args.gib, "workers": args.workers, "seconds": seconds,
        "cycles_done": len(done),
        "stranded": sum(1 for c in done if "error" in c or c.get("freed_s") is None),
        "corrupted": sum(1 for c in done if c.get("intact") is False),
        "left_locked": sum(1 for s in states.values() if s != "running"),
        "holders_alive_at_end": alive,
        "park_median_s": median([c["park_s"] for c in done if "park_s" in c]),
        "resume_median_s": median([c["resume_s"] for c in done if "resume_s" in c]),
        "errors": sorted({c["error"] for c in done if "error" in c})[:10],
        "states_at_end": states, "cycles": cycles,
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("speed", "soak"))
    ap.add_argument("out")
    ap.add_argument("--gib", type=float, default=None)
    ap.add_argument("--cycles", type=int, default=None)
    ap.add_argument("--holders", type=int, default=24)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=420.0)
    args = ap.parse_args()
    args.gib = args.gib or (4.0 if args.what == "speed" else 1.0)
    args.cycles = args.cycles or (20 if args.what == "speed" else 1000)
    import pynvml

    pynvml.nvmlInit()
    name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
    meta = {"gpu": name if isinstance(name, str) else name.decode(), "driver": pynvml.nvmlSystemGetDriverVersion(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "what": args.what, "gib": args.gib}  # fmt: skip
    try:
        result = speed(args) if args.what == "speed" else soak(args)
    except Exception as e:  # noqa: BLE001 (recorded)
        result = {"error": f"{type(e).__name__}: {e}"}
    Path(args.out).write_text(json.dumps({**meta, **result}, indent=1))
    print(json.dumps({k: v for k, v in {**meta, **result}.items() if k not in ("cycles", "states_at_end")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
