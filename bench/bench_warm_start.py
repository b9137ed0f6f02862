"""Open -> a first CPU cell's answer, with warm kernels and without (issue 48, item 2; GpuShareApp.warm_kernels).

Two real `jupyter server` processes with the extension, on a simulated card, run side by side: one keeps WARM warm
kernels, the other none. Each round opens NOTEBOOKS notebooks at once on each server in turn, as JupyterLab opens one
(POST /api/sessions, then the kernel's websocket and a cell `1 + 1`), timed from the request to the cell's answer;
the notebooks are closed, and the next round waits until the warm server's pool is full again (a class's students
do not all open their notebooks in the same second). Prints each run's seconds, the medians and the ratio, warm over
cold.

    python bench/bench_warm_start.py [--notebooks 1 4] [--rounds 5] [--json OUT]
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
from pathlib import Path

from _report import report
from jupyter_client.session import Session
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.websocket import websocket_connect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from servers import TOKEN, SimulatedServer, wait_until  # noqa: E402

HEADERS = {"Authorization": f"token {TOKEN}"}


async def open_and_run(port: int, path: str, gpu: str | None = None) -> tuple[float, str, float | None]:
    """Seconds from opening ``path`` to its first cell's answer, and its session's id; then, with ``gpu`` (a cell's
    code), seconds from opening it to that cell's answer too (a first GPU operation)."""
    t0 = time.perf_counter()
    body = {"path": path, "type": "notebook", "name": path, "kernel": {"name": "python3"}}
    r = await AsyncHTTPClient().fetch(
        f"http://127.0.0.1:{port}/api/sessions", method="POST", body=json.dumps(body), headers=HEADERS,
        request_timeout=120,
    )  # fmt: skip
    model = json.loads(r.body)
    kernel_id, session = model["kernel"]["id"], Session()
    url = f"ws://127.0.0.1:{port}/api/kernels/{kernel_id}/channels?session_id={session.session}"
    ws = await websocket_connect(HTTPRequest(url, headers=HEADERS))
    seconds = [await _answer(ws, session, code, t0) for code in ("1 + 1", gpu) if code is not None]
    ws.close()
    return seconds[0], model["id"], seconds[1] if gpu is not None else None


async def _answer(ws, session: Session, code: str, t0: float) -> float:
    """Run ``code`` on the kernel's websocket; seconds from ``t0`` to its result."""
    msg = session.msg("execute_request", {"code": code, "silent": False, "store_history": True,
                                          "user_expressions": {}, "allow_stdin": False})  # fmt: skip
    ws.write_message(json.dumps({**msg, "channel": "shell"}, default=str))
    while True:
        reply = json.loads(await asyncio.wait_for(ws.read_message(), 300))
        if reply["parent_header"].get("msg_id") != msg["header"]["msg_id"]:
            continue
        if reply["msg_type"] == "error":
            raise RuntimeError(f"{code!r}: {reply['content']['ename']}: {reply['content']['evalue']}")
        if reply["msg_type"] == "execute_result":
            return time.perf_counter() - t0


async def round_of(server: SimulatedServer, count: int, tag: str) -> list[float]:
    opened = await asyncio.gather(*(open_and_run(server.port, f"{tag}-{i}.ipynb") for i in range(count)))
    for _, session_id, _ in opened:
        server.call("DELETE", f"api/sessions/{session_id}")
    return [seconds for seconds, _, _ in opened]


def warm_and_cold(
    warm_kernels: int, card: str, *settings: str, warm_imports: str | None = None
) -> dict[str, SimulatedServer]:
    """Real servers on a simulated ``card`` with 1 GiB quotas, side by side: "warm" keeps ``warm_kernels``, "cold"
    none; with ``warm_imports`` (e.g. "torch"), a third, "warm-imports", keeps as many with those imported.
    ``settings`` (``--GpuShareApp.x=y``) replace those; ``card`` "nvml": the real cards instead."""
    tmp = Path(tempfile.mkdtemp(prefix="gpushare-warm-bench-"))
    cards = ["--GpuShareApp.gpu_backend=nvml"] if card == "nvml" else [f"--GpuShareApp.simulated_cards={card}"]
    kinds: list[tuple[str, int, list[str]]] = [("warm", warm_kernels, []), ("cold", 0, [])]
    if warm_imports:
        imports = [f"--GpuShareApp.warm_imports={name}" for name in warm_imports.split(",")]
        kinds.append(("warm-imports", warm_kernels, imports))
    servers = {}
    for name, count, own in kinds:
        (tmp / name).mkdir()
        servers[name] = SimulatedServer(
            tmp / name, *cards, "--GpuShareApp.default_quota=1GiB", f"--GpuShareApp.warm_kernels={count}", *settings,
            *own,
        ).wait_ready()  # fmt: skip
    return servers


def stop(servers: dict[str, SimulatedServer]) -> None:
    for server in servers.values():
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--notebooks", type=int, nargs="+", default=[1, 4], help="notebooks opened at once, per case")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    most = max(args.notebooks)
    servers = warm_and_cold(most, "64GiB")
    warm = servers["warm"]

    def pool_full() -> bool:  # (the warm server's kernels are its pool's once its notebooks are closed)
        return len(warm.kernel_processes()) >= most

    figures: dict = {"date": time.strftime("%Y-%m-%d"), "host": platform.node(), "cpus": os.cpu_count(),
                     "warm_kernels": most, "rounds": args.rounds, "cases": {}}  # fmt: skip
    try:
        for count in args.notebooks:
            runs: dict[str, list[float]] = {"warm": [], "cold": []}
            for r in range(args.rounds):
                for name in ("warm", "cold") if r % 2 == 0 else ("cold", "warm"):
                    wait_until(pool_full, 180, "the warm pool to fill")
                    time.sleep(1.0)  # (the closed notebooks' kernels are gone, the refill's imports done)
                    runs[name] += asyncio.run(round_of(servers[name], count, f"r{r}-{name}"))
            medians = {name: statistics.median(values) for name, values in runs.items()}
            figures["cases"][f"{count} at once"] = {
                "seconds": {name: [round(v, 3) for v in values] for name, values in runs.items()},
                "median_s": {name: round(v, 3) for name, v in medians.items()},
                "ratio_warm_over_cold": round(medians["warm"] / medians["cold"], 3),
            }
    finally:
        stop(servers)
    report(figures, args.json)


if __name__ == "__main__":
    main()
