"""Kernel start time with and without the GPU-quota provisioner, side by side in one run.

Starts real ipykernel kernels through jupyter_client (as the server does), alternating between
the stock LocalProvisioner and GpuShareProvisioner on a simulated card, and times each from the
start request until the kernel answers (wait_for_ready). Target: at most 5% slower.

    python bench/bench_kernel_start.py [--rounds 15] [--json bench/results/kernel_start.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone

from jupyter_client import AsyncKernelManager
from jupyter_client.provisioning import KernelProvisionerFactory
from traitlets.config import Config

from jupyter_gpushare.server.manager import process_manager


async def start_once(provisioner: str, config: Config) -> float:
    KernelProvisionerFactory.instance().default_provisioner_name = provisioner
    km = AsyncKernelManager(kernel_name="python3", config=config)
    t0 = time.perf_counter()
    await km.start_kernel()
    client = km.client()
    client.start_channels()
    await client.wait_for_ready(timeout=60)
    elapsed = time.perf_counter() - t0
    client.stop_channels()
    await km.shutdown_kernel(now=False)
    return elapsed


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="gpushare-bench-")
    os.environ["JUPYTER_RUNTIME_DIR"] = os.path.join(tmp, "runtime")
    config = Config()
    config.GpuShareApp.gpu_backend = "simulated"
    config.GpuShareApp.simulated_cards = "80GiB"
    config.GpuShareApp.ledger_path = os.path.join(tmp, "ledger.sqlite")
    times: dict[str, list[float]] = {"local-provisioner": [], "gpushare-provisioner": []}
    await start_once("local-provisioner", config)  # warm the file cache once, not timed
    await start_once("gpushare-provisioner", config)
    for i in range(args.rounds):
        order = list(times) if i % 2 == 0 else list(reversed(times))
        for name in order:
            times[name].append(await start_once(name, config))
    manager = process_manager()
    if manager:
        manager.close()
    med = {name: statistics.median(v) * 1000 for name, v in times.items()}
    ratio = med["gpushare-provisioner"] / med["local-provisioner"]
    print(f"kernel start until ready, {args.rounds} rounds each, alternating (median ms):")
    for name, v in times.items():
        ms = sorted(x * 1000 for x in v)
        print(f"  {name:22s} median {med[name]:7.1f}  min {ms[0]:7.1f}  max {ms[-1]:7.1f}")
    print(f"  ratio gpushare/local  {ratio:.3f}  ({(ratio - 1) * 100:+.1f}%; target <= +5%)")
    if args.json:
        result = {
            "benchmark": "kernel_start",
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}",
            "rounds": args.rounds,
            "median_ms": med,
            "ratio": ratio,
            "samples_ms": {k: [round(x * 1000, 1) for x in v] for k, v in times.items()},
        }
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
