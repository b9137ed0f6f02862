"""How long a kernel that holds the GPU takes to shut down, without jupyter-gpushare (issue 48: a class's hand-off).

A class's hand-off is the time from a job's end until the next kernel in line is granted its room, and most of it
is the ending kernel's shut-down (bench/README.md). This probe times that shut-down with none of this project's
code: plain ipykernel kernels started by jupyter_client's own provisioner, each holding ``--mib`` of the card
through PyTorch, as the study's job does; and, for the floor, a plain Python process that holds the same and exits.

    python3 bench/gpu/probe_shutdown.py OUT.json [--rounds 3] [--at-once 6] [--mib 5000]

Per round: one kernel alone, then ``--at-once`` kernels shut down together (a wave's end), each timed from the
shut-down's start until jupyter_client has seen its process gone; and a plain process timed from its "exit" to
its end. Every figure is kept.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone

from jupyter_client.manager import AsyncKernelManager
from jupyter_client.provisioning import KernelProvisionerFactory

PROVISIONER = ""  # the class that started the kernels: jupyter_client's own (LocalProvisioner), never this project's

HOLD = "import torch; x = torch.empty({n}, dtype=torch.uint8, device='cuda'); torch.cuda.synchronize(); print('held')"
HOLD_CPU = "x = bytearray({n}); print('held')"  # (--cpu: the probe's own smoke test, on a machine without a GPU)


async def started(mib: int) -> AsyncKernelManager:
    global PROVISIONER
    km = AsyncKernelManager(kernel_name="python3")
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=60)
        PROVISIONER = type(km.provisioner).__name__
        reply = await kc.execute_interactive(HOLD.format(n=mib << 20), timeout=120, output_hook=lambda msg: None)
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        kc.stop_channels()
    return km


async def shut(km: AsyncKernelManager) -> float:
    t = time.perf_counter()
    await km.shutdown_kernel()
    return time.perf_counter() - t


def plain_exit(mib: int) -> float:
    """A Python process that holds the card through PyTorch: from its last line to its end (CUDA's teardown)."""
    code = HOLD.format(n=mib << 20) + "; import sys; sys.stdout.flush(); sys.stdin.readline()"
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    t = time.perf_counter()
    p.communicate("\n", timeout=60)
    return time.perf_counter() - t


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--at-once", type=int, default=6)
    ap.add_argument("--mib", type=int, default=5000)
    ap.add_argument("--cpu", action="store_true")
    args = ap.parse_args()
    if args.cpu:
        global HOLD
        HOLD = HOLD_CPU
    KernelProvisionerFactory.instance().default_provisioner_name = "local-provisioner"  # (where this project is
    # installed, its configuration makes its own the default)
    rounds = []
    for r in range(args.rounds):
        alone = await shut(await started(args.mib))
        kms = await asyncio.gather(*(started(args.mib) for _ in range(args.at_once)))
        together = sorted(await asyncio.gather(*(shut(km) for km in kms)))
        plain = plain_exit(args.mib)
        rounds.append({"alone_s": round(alone, 3), "together_s": [round(x, 3) for x in together],
                       "plain_exit_s": round(plain, 3)})  # fmt: skip
        print(f"round {r + 1}: a kernel alone {alone:.2f} s; {args.at_once} together "
              f"{statistics.median(together):.2f} s median, {together[-1]:.2f} s at most; "
              f"a plain process's exit {plain:.2f} s", flush=True)  # fmt: skip
    gpu = (
        "none (--cpu)"
        if args.cpu
        else subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True
        ).stdout.strip()
    )
    doc = {"probe": "probe_shutdown", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "gpu": gpu,
           "mib": args.mib, "at_once": args.at_once, "provisioner": PROVISIONER, "rounds": rounds}  # fmt: skip
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    asyncio.run(main())
