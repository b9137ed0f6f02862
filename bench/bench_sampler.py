"""Sampler and usage-API costs with 200 kernels, against jupyter-resource-usage on the same server.

    python bench/bench_sampler.py [out.json]

1. Sampler tick: the fake NVML lists one GPU process per kernel (the child of a real two-process
   tree, ``sh -c 'sleep & wait'``) plus 20 processes of nobody; the real Sampler attributes them.
   Cold (first tick: every ancestry walked) and warm (cached by (pid, create_time)) figures.
2. API latency and IOLoop lag: a real jupyter-server in this process, with the 200 kernels'
   records, its sampler thread at 1 s, and one real ipykernel kernel. 10 client processes poll
   once a second, first GET /api/gpushare/kernels (the 200-kernel list), then jupyter-resource-
   usage's GET /api/metrics/v1/kernel_usage/get_usage/<kernel_id> (one kernel: it asks the kernel
   over its control channel). The lag probe sleeps 10 ms on the server's loop and records overshoot.
Targets: tick < 5 ms, p99 < 10 ms, lag < 5 ms. Prints the figures side by side; writes JSON.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

N_KERNELS, N_OTHERS, N_CLIENTS, POLL_S, PHASE_S = 200, 20, 10, 1.0, 20.0
TOKEN = "bench-token"
# BENCH_WITHOUT_RESOURCE_USAGE=1: only this extension on the server (isolates the IOLoop lag it causes)
WITH_RU = os.environ.get("BENCH_WITHOUT_RESOURCE_USAGE") != "1"


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 3) if values else float("nan")


def summary(values: list[float]) -> dict:
    return {
        "n": len(values),
        "p50": pct(values, 0.5),
        "p99": pct(values, 0.99),
        "max": round(max(values), 3) if values else None,
    }


# -- client process --------------------------------------------------------------------------------


def client_main(url: str, duration: float) -> None:
    """Poll url once a second for duration seconds; print latencies (ms) as JSON."""
    import http.client
    from urllib.parse import urlparse

    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    out, errors = [], 0
    end = time.monotonic() + duration
    time.sleep(POLL_S * (os.getpid() % 97) / 97)  # spread the clients over the second
    while time.monotonic() < end:
        t0 = time.perf_counter()
        try:
            conn.request("GET", u.path, headers={"Authorization": f"token {TOKEN}"})
            r = conn.getresponse()
            r.read()
            if r.status != 200:
                errors += 1
        except Exception:
            errors += 1
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        out.append((time.perf_counter() - t0) * 1000)
        time.sleep(max(0.0, POLL_S - (time.perf_counter() - t0)))
    print(json.dumps({"ms": out, "errors": errors}))


# -- trees and the tick ------------------------------------------------------------------------------


def spawn_trees(n: int) -> list[tuple[subprocess.Popen, int]]:
    trees = []
    for _ in range(n):
        p = subprocess.Popen(["sh", "-c", "sleep 900 & echo $!; wait"], stdout=subprocess.PIPE, text=True)
        trees.append((p, int(p.stdout.readline())))
    return trees


def fill(manager, trees) -> None:
    fake = manager.backend.fake
    for i, (p, child) in enumerate(trees):
        rec = manager.record(f"bench-{i:03d}", "python3", "python")
        rec.state, rec.pid = "running", p.pid
        fake.add_process(child, 500 + i, utilization=i % 3 * 10)
    for j in range(N_OTHERS):
        fake.add_process(4_000_000 + j, 100)  # no such process: somebody else's, or gone


def bench_tick(trees) -> dict:
    from jupyter_gpushare.core.policy import Policy, Size
    from jupyter_gpushare.host.gpu import SimulatedBackend
    from jupyter_gpushare.server.manager import QuotaManager
    from jupyter_gpushare.server.sampler import Sampler

    d = tempfile.mkdtemp()
    manager = QuotaManager(
        Policy(default_quota=Size(mib=1024)), SimulatedBackend([1024 * 1024]), os.path.join(d, "l.sqlite")
    )
    try:
        fill(manager, trees)
        sampler = Sampler(manager)
        t0 = time.perf_counter()
        snap = sampler.tick()
        cold = (time.perf_counter() - t0) * 1000
        assert sum(1 for k in snap.kernels.values() if k.used_mib) == len(trees), "attribution failed"
        warm = []
        for _ in range(200):
            t0 = time.perf_counter()
            sampler.tick()
            warm.append((time.perf_counter() - t0) * 1000)
        return {
            "kernels": len(trees),
            "gpu_processes": len(trees) + N_OTHERS,
            "cold_ms": round(cold, 3),
            "warm_ms": summary(warm),
        }
    finally:
        manager.close()


# -- server ---------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def poll(url: str, duration: float) -> tuple[list[float], int]:
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--client", url, str(duration), stdout=asyncio.subprocess.PIPE
        )
        for _ in range(N_CLIENTS)
    ]
    ms, errors = [], 0
    for p in procs:
        out, _ = await p.communicate()
        data = json.loads(out)
        ms += data["ms"]
        errors += data["errors"]
    return ms, errors


async def lag_probe(stop: asyncio.Event, lags: list[float]) -> None:
    while not stop.is_set():
        t0 = time.perf_counter()
        await asyncio.sleep(0.01)
        lags.append((time.perf_counter() - t0) * 1000 - 10)


async def phase(url: str) -> dict:
    lags: list[float] = []
    stop = asyncio.Event()
    probe = asyncio.ensure_future(lag_probe(stop, lags))
    ms, errors = await poll(url, PHASE_S)
    stop.set()
    await probe
    return {"latency_ms": summary(ms), "errors": errors, "loop_lag_ms": summary(lags)}


async def bench_server(trees) -> dict:
    from jupyter_server.serverapp import ServerApp

    from jupyter_gpushare.server.manager import process_manager

    root = tempfile.mkdtemp()
    os.environ["JUPYTER_RUNTIME_DIR"] = tempfile.mkdtemp()
    port = free_port()
    config = {
        "ServerApp": {
            "jpserver_extensions": {"jupyter_gpushare": True, "jupyter_resource_usage": WITH_RU},
            "port": port,
            "open_browser": False,
            "root_dir": root,
            "log_level": "WARN",
            "allow_root": True,
        },
        "IdentityProvider": {"token": TOKEN},
        "GpuShareApp": {
            "gpu_backend": "simulated",
            "simulated_cards": "1024GiB",
            "ledger_path": os.path.join(root, "ledger.sqlite"),
            "sample_interval": float(os.environ.get("BENCH_SAMPLE_INTERVAL", "1.0")),
            "idle_timeout": 0,
            "over_quota_action": "notify",
        },
    }
    from traitlets.config import Config

    app = ServerApp.instance(config=Config(config))
    app.initialize(argv=[])
    app.start_app()
    await app._post_start()
    base = f"http://127.0.0.1:{port}"
    manager = process_manager()
    fill(manager, trees)

    import urllib.request

    req = urllib.request.Request(
        f"{base}/api/kernels", data=b'{"name": "python3"}', method="POST", headers={"Authorization": f"token {TOKEN}"}
    )
    loop = asyncio.get_running_loop()
    kid = json.loads((await loop.run_in_executor(None, urllib.request.urlopen, req)).read())["id"]
    await asyncio.sleep(3)  # a few sampler ticks; the kernel settles
    size = len(
        await loop.run_in_executor(
            None,
            lambda: urllib.request.urlopen(
                urllib.request.Request(f"{base}/api/gpushare/kernels", headers={"Authorization": f"token {TOKEN}"})
            ).read(),
        )
    )
    sampler = app.web_app.settings["gpushare_sampler"]
    ours = await phase(f"{base}/api/gpushare/kernels")
    ours["reply_bytes"] = size
    ours["kernels_listed"] = len(manager.records)
    ours["sampler_tick_ms_in_server"] = round(sampler.snapshot.tick_ms, 3)
    theirs = await phase(f"{base}/api/metrics/v1/kernel_usage/get_usage/{kid}") if WITH_RU else ours
    theirs["kernels_listed"] = 1
    idle_lags: list[float] = []
    stop = asyncio.Event()
    probe = asyncio.ensure_future(lag_probe(stop, idle_lags))
    await asyncio.sleep(5)
    stop.set()
    await probe
    for rec_id in [k for k in manager.records if k.startswith("bench-")]:
        manager.records.pop(rec_id, None)
    await app.kernel_manager.shutdown_all()
    await app._cleanup()
    return {
        "gpushare_kernels": ours,
        "resource_usage_kernel_usage": theirs,
        "loop_lag_no_clients_ms": summary(idle_lags),
    }


async def main(path: str) -> None:
    trees = spawn_trees(N_KERNELS)
    try:
        tick = bench_tick(trees)
        server = await bench_server(trees)
    finally:
        for p, _child in trees:
            subprocess.run(["pkill", "-P", str(p.pid)], check=False)
            p.kill()
            p.wait()
    import jupyter_resource_usage

    ours, theirs = server["gpushare_kernels"], server["resource_usage_kernel_usage"]
    result = {
        "what": "bench/bench_sampler.py",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
            "note": "shared machine: other engineers' test suites ran at the same time (see load average)",
        },
        "jupyter_resource_usage": jupyter_resource_usage.__version__,
        "clients": N_CLIENTS,
        "poll_s": POLL_S,
        "phase_s": PHASE_S,
        "sampler_tick": tick,
        **server,
        "targets": {"tick_ms": 5, "p99_ms": 10, "lag_ms": 5},
    }
    result["meets"] = {
        "tick": tick["warm_ms"]["p50"] < 5,
        "p99": ours["latency_ms"]["p99"] < 10,
        "lag": ours["loop_lag_ms"]["p99"] < 5,
    }
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print(
        f"sampler tick, {tick['kernels']} kernels / {tick['gpu_processes']} GPU processes: cold {tick['cold_ms']} ms, warm p50 {tick['warm_ms']['p50']} ms p99 {tick['warm_ms']['p99']} ms"
    )
    print(f"{'':38} {'gpushare /kernels (200)':>24} {'resource-usage get_usage (1)':>30} {'ratio':>7}")
    for label, key in (
        ("latency p50 ms", ("latency_ms", "p50")),
        ("latency p99 ms", ("latency_ms", "p99")),
        ("latency max ms", ("latency_ms", "max")),
        ("IOLoop lag p50 ms", ("loop_lag_ms", "p50")),
        ("IOLoop lag p99 ms", ("loop_lag_ms", "p99")),
    ):
        a, b = ours[key[0]][key[1]], theirs[key[0]][key[1]]
        print(f"{label:38} {a:>24} {b:>30} {a / b if b else float('nan'):>7.2f}")
    print(
        f"errors: ours {ours['errors']}, theirs {theirs['errors']}; loop lag without clients p99 {server['loop_lag_no_clients_ms']['p99']} ms"
    )
    print("meets targets:", result["meets"])


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client_main(sys.argv[2], float(sys.argv[3]))
    else:
        asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "bench_sampler.json"))
