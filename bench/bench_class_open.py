"""A class that opens at once (issue 48, item 3): where the time from the first request to the first grants goes.

NOTEBOOKS notebooks are opened through CONNECTIONS connections, as one browser per student would not but a class's
burst through a proxy does (POST /api/sessions, then each kernel's websocket and a cell `1 + 1`), on a real
`jupyter server` with the extension and a simulated card with room for all. For each notebook: its request's time
in the client's queue, its request to the server's answer (the kernel listed, its grant decided), and its answer to
the first cell's result. The server's own events give each grant's time. Warm kernels on and off, side by side in
one run (`--warm N` for the warm server's pool; `--warm-imports torch`: a third server whose warm kernels have
imported PyTorch, GpuShareApp.warm_imports). Prints the medians and the first and last grant, from the first
request.

    python bench/bench_class_open.py [--notebooks 32] [--connections 6] [--warm 32] [--rounds 2] [--json OUT] [--gpu]
                                     [--warm-imports torch]

``--gpu`` (a GPU machine): the real cards through NVML, 2 GiB quotas, and after the first cell a first GPU operation
(``torch.ones(1, device='cuda')``, PyTorch's import included, unless a warm kernel imported it ahead): open -> its
answer too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from _kernels import kernels_with
from _report import report
from bench_warm_start import HEADERS, open_and_run, stop, warm_and_cold
from tornado.httpclient import AsyncHTTPClient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from servers import SimulatedServer, wait_until  # noqa: E402

# A first GPU operation (--gpu), and the kernel's word that PyTorch is capped at its quota (a notebook whose cap
# did not hold, as PyTorch imported warm might not, fails the run)
GPU_OP = (
    "import torch, _gpushare_report as r; torch.ones(1, device='cuda').sum().item(); "
    "t = r.STATE['frameworks'].get('torch', {}); assert t.get('capped'), t; t['limit_mib']"
)


async def a_class(server: SimulatedServer, count: int, connections: int, tag: str, gpu: str | None = None) -> dict:
    """Open ``count`` notebooks through ``connections`` at once; each one's figures, and the grants' times; with
    ``gpu``, each notebook's open to that cell's answer too."""
    gate = asyncio.Semaphore(connections)
    t0 = time.perf_counter()
    wall0 = time.time()

    async def student(i: int) -> dict:
        async with gate:
            queued = time.perf_counter() - t0
            seconds, session_id, gpu_s = await open_and_run(server.port, f"{tag}-{i:02d}.ipynb", gpu)
        return {"queued_s": queued, "open_to_cell_s": seconds, "open_to_gpu_op_s": gpu_s, "session": session_id}

    students = await asyncio.gather(*(student(i) for i in range(count)))
    all_done = time.perf_counter() - t0
    r = await AsyncHTTPClient().fetch(
        f"http://127.0.0.1:{server.port}/api/gpushare/events?since={wall0}", headers=HEADERS
    )
    grants = sorted(e["time"] - wall0 for e in json.loads(r.body)["events"] if e["kind"] == "reserved")
    for s in students:
        server.call("DELETE", f"api/sessions/{s.pop('session')}")
    return {"students": students, "grants_s": grants, "all_done_s": all_done}


def warmed(server: SimulatedServer, name: str) -> int:
    """How many of the server's kernels are warm: started, and (warm-imports) PyTorch's library loaded."""
    return kernels_with(server.proc.pid, "libtorch" if name == "warm-imports" else None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--notebooks", type=int, default=32)
    ap.add_argument("--connections", type=int, default=6)
    ap.add_argument("--warm", type=int, default=32, help="the warm server's warm_kernels")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warm-imports", help="a third server, whose warm kernels import these (comma-separated)")
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument("--gpu", action="store_true", help="on the real cards (NVML), 2 GiB quotas, and a first GPU "
                    "operation after the first cell")  # fmt: skip
    args = ap.parse_args()
    gpu = GPU_OP if args.gpu else None
    if args.gpu:
        servers = warm_and_cold(args.warm, "nvml", "--GpuShareApp.default_quota=2GiB", warm_imports=args.warm_imports)
    else:
        servers = warm_and_cold(args.warm, "80GiB", warm_imports=args.warm_imports)
    figures: dict = {"date": time.strftime("%Y-%m-%d"), "host": platform.node(), "cpus": os.cpu_count(),
                     "notebooks": args.notebooks, "connections": args.connections, "warm_kernels": args.warm,
                     "warm_imports": args.warm_imports, "runs": {name: [] for name in servers}}  # fmt: skip
    try:
        for r in range(args.rounds):
            for name in list(servers) if r % 2 == 0 else list(servers)[::-1]:
                server = servers[name]
                if name != "cold":
                    wait_until(lambda s=server, n=name: warmed(s, n) >= args.warm, 600, "the warm pool to fill")
                time.sleep(2.0)
                run = asyncio.run(a_class(server, args.notebooks, args.connections, f"r{r}-{name}", gpu))
                students = run["students"]
                to_gpu = [s["open_to_gpu_op_s"] for s in students if s["open_to_gpu_op_s"] is not None]
                figures["runs"][name].append({
                    "first_grant_s": round(run["grants_s"][0], 3) if run["grants_s"] else None,
                    "last_grant_s": round(run["grants_s"][-1], 3) if run["grants_s"] else None,
                    "open_to_cell_median_s": round(statistics.median(s["open_to_cell_s"] for s in students), 3),
                    "open_to_cell_max_s": round(max(s["open_to_cell_s"] for s in students), 3),
                    "all_answered_s": round(run["all_done_s"], 3),
                    "open_to_gpu_op_median_s": round(statistics.median(to_gpu), 3) if to_gpu else None,
                    "open_to_gpu_op_max_s": round(max(to_gpu), 3) if to_gpu else None,
                })  # fmt: skip
                if args.json:  # each run kept as it comes (a run cut short by a time limit keeps the ones done)
                    Path(args.json).write_text(json.dumps(figures, indent=1))
    finally:
        stop(servers)
    report(figures, args.json)


if __name__ == "__main__":
    main()
