"""Broker reserve latency and throughput: 20 client processes (standing for 20 Jupyter servers) at once.

A real broker process (`jupyter gpushare broker`) on one simulated 16 GiB card; each client opens its own
connection (so the broker sees 20 different server processes), and does reserve -> hold -> release
cycles of 1-2 GiB quotas, timing every reserve round trip. Only ~8 kernels fit, so the clients
contend. Overbooking is checked two ways: every client adds what it was granted to a shared tally
before it releases (the tally can only under-count what the ledger holds, so tally > card =
overbooked), and a monitor polls the broker's admin view throughout.

Two phases: bursts (all clients reserve at the same instant, then release; the target applies here)
and saturation (every client in a closed reserve -> hold -> release loop: throughput, and latency
that includes queueing behind the other 19).

Target: p99 reserve latency in bursts under 50 ms, zero overbooking.

Transports, measured one after the other in one run: the Unix socket (servers on the host), plain TCP
and TLS (servers in containers, each connection identified by a JupyterHub token that a real
JupyterHub checks once per connection; its proxy is tests/hub's configurable-http-proxy). The ratios
to the Unix socket are printed side by side.

    python bench/bench_broker.py [--clients 20] [--ops 200] [--transports unix,tcp,tls]
                                 [--json bench/results/broker-<machine>-<date>.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from datetime import datetime, timezone
from pathlib import Path

CARD_MIB = 16384
RESERVE_MIB = 512


def client(where: dict, seed: int, ops: int, rounds: int, barrier, start, tally, lock, peak, out) -> None:
    from jupyter_gpushare.broker import BrokerLedger
    from jupyter_gpushare.core.policy import Size
    from jupyter_gpushare.ledger.ledger import Lease, Request

    rng = random.Random(seed)
    ledger = BrokerLedger(**where)
    ledger.hello()  # connect before the start line
    # Phase 1, bursts: every client reserves at the same instant (a class opening its notebooks).
    burst = []
    for r in range(rounds):
        barrier.wait()
        kid = f"burst-{seed}-{r}"
        t0 = time.perf_counter()
        got = ledger.reserve(Request(kid, Size(mib=rng.choice([1024, 2048]))), None, [], wait=False)
        burst.append(time.perf_counter() - t0)
        if isinstance(got, Lease):
            with lock:
                tally.value += got.reserved_mib
                peak.value = max(peak.value, tally.value)
        barrier.wait()
        if isinstance(got, Lease):
            with lock:
                tally.value -= got.reserved_mib
            ledger.release(kid)
    # Phase 2, saturation: back-to-back reserve -> hold -> release, no pause between cycles.
    latencies, granted, waited = [], 0, 0
    out.put("bursts done")
    start.wait()
    t_start = time.monotonic()
    for i in range(ops):
        kid = f"bench-{seed}-{i}"
        t0 = time.perf_counter()
        got = ledger.reserve(Request(kid, Size(mib=rng.choice([1024, 2048]))), None, [], wait=False)
        latencies.append(time.perf_counter() - t0)
        if isinstance(got, Lease):
            granted += 1
            with lock:
                tally.value += got.reserved_mib
                peak.value = max(peak.value, tally.value)
            time.sleep(rng.uniform(0, 0.004))  # the kernel "runs"
            with lock:
                tally.value -= got.reserved_mib
            ledger.release(kid)
        else:
            waited += 1
    out.put(
        {
            "burst": burst,
            "latencies": latencies,
            "granted": granted,
            "refused": waited,
            "t_start": t_start,
            "t_end": time.monotonic(),
        }
    )


def monitor(sock: str, stop, out) -> None:
    from jupyter_gpushare.broker import BrokerLedger

    ledger = BrokerLedger(sock)
    samples, worst = 0, 0
    while not stop.is_set():
        card = ledger.view()["cards"][0]
        worst = max(worst, card["reserved_mib"] - card["usable_mib"])
        samples += 1
        time.sleep(0.005)
    out.put({"samples": samples, "worst_over_mib": worst})


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))] * 1000


def start_broker(base: str, extra: str = "") -> tuple[subprocess.Popen, str]:
    """A real `jupyter gpushare broker` on one simulated card; (process, its Unix socket) once it listens."""
    sock, config = os.path.join(base, "run", "broker.sock"), os.path.join(base, "broker_config.py")
    with open(config, "w") as f:
        f.write(
            textwrap.dedent(
                f"""
                c.GpuShareApp.gpu_backend = "simulated"
                c.GpuShareApp.simulated_cards = "{CARD_MIB}MiB"
                c.GpuShareApp.card_headroom = "0MiB"
                c.GpuShareApp.context_reserve = "{RESERVE_MIB}MiB"
                c.GpuShareBroker.socket_path = {sock!r}
                c.GpuShareBroker.ledger_path = {os.path.join(base, "lib", "ledger.sqlite")!r}
                c.GpuShareBroker.default_limits = {{"max_total": "64GiB", "max_kernels": 1000}}  # checked on every reserve
                """
            )
            + textwrap.dedent(extra)
        )
    broker = subprocess.Popen(
        [sys.executable, "-m", "jupyter_gpushare.cli.main", "broker", f"--config={config}"], stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 60
    while True:
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(sock)
                return broker, sock
            except OSError:
                if time.monotonic() > deadline or broker.poll() is not None:
                    raise SystemExit("the broker did not start") from None
                time.sleep(0.1)


def measure(where: dict, admin_sock: str, args) -> dict:
    """Both phases with ``args.clients`` client processes connecting as ``where`` says."""
    ctx = multiprocessing.get_context("fork")
    start, stop, out, mon_out = ctx.Event(), ctx.Event(), ctx.Queue(), ctx.Queue()
    barrier = ctx.Barrier(args.clients)
    tally, peak, lock = ctx.Value("q", 0, lock=False), ctx.Value("q", 0, lock=False), ctx.Lock()
    ps = [
        ctx.Process(target=client, args=(where, s, args.ops, args.rounds, barrier, start, tally, lock, peak, out))
        for s in range(args.clients)
    ]
    mon = ctx.Process(target=monitor, args=(admin_sock, stop, mon_out))
    for p in ps:
        p.start()
    mon.start()
    for _ in ps:
        assert out.get(timeout=600) == "bursts done"
    start.set()
    results = [out.get(timeout=600) for _ in ps]
    wall = max(r["t_end"] for r in results) - min(r["t_start"] for r in results)
    stop.set()
    watch = mon_out.get(timeout=60)
    for p in [*ps, mon]:
        p.join()

    latencies = [x for r in results for x in r["latencies"]]
    burst = [x for r in results for x in r["burst"]]
    granted = sum(r["granted"] for r in results)
    report = {
        "reserve_calls": len(latencies),
        "granted": granted,
        "refused_no_room": sum(r["refused"] for r in results),
        "burst_latency_ms": {
            "what": "reserve round trip when all clients call at the same instant",
            "calls": len(burst),
            "p50": round(pct(burst, 50), 2),
            "p90": round(pct(burst, 90), 2),
            "p99": round(pct(burst, 99), 2),
            "max": round(max(burst) * 1000, 2),
        },
        "saturation_latency_ms": {
            "what": "reserve round trip with every client in a closed loop (queueing at the broker included)",
            "p50": round(pct(latencies, 50), 2),
            "p90": round(pct(latencies, 90), 2),
            "p99": round(pct(latencies, 99), 2),
            "max": round(max(latencies) * 1000, 2),
            "mean": round(statistics.mean(latencies) * 1000, 2),
        },
        "throughput": {
            "reserve_per_s": round(len(latencies) / wall, 1),
            "calls_per_s": round((len(latencies) + granted) / wall, 1),  # reserves + releases
            "wall_s": round(wall, 2),
        },
        "overbooking": {
            "client_tally_peak_mib": peak.value,
            "card_usable_mib": CARD_MIB,
            "client_tally_over": max(0, peak.value - CARD_MIB),
            "monitor_samples": watch["samples"],
            "monitor_worst_over_mib": max(0, watch["worst_over_mib"]),
        },
    }
    report["target_met"] = (
        report["burst_latency_ms"]["p99"] < 50
        and report["overbooking"]["client_tally_over"] == 0
        and report["overbooking"]["monitor_worst_over_mib"] == 0
    )
    return report


def hub_for_tokens(base: str):
    """A real JupyterHub (tests/host/test_hub.py's, with its proxy), a token of one of its users and the
    broker's own token; RuntimeError with the reason when no Hub can run here."""
    tests = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests")
    sys.path.insert(0, tests)
    try:
        from test_hub import ALICE, BROKER_TOKEN, Hub

        hub = Hub(Path(base), "", Path(base) / "unused-ca.pem", "nobody").start()
    except Exception as e:  # no jupyterhub, no Node.js for its proxy
        raise RuntimeError(f"no JupyterHub here ({type(e).__name__}: {str(e)[:200]})") from e
    token = hub.api("POST", f"users/{ALICE}/tokens", {"note": "gpushare bench"})["token"]
    return hub, token, BROKER_TOKEN


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--ops", type=int, default=200, help="saturation cycles per client")
    ap.add_argument("--rounds", type=int, default=50, help="bursts (all clients at once)")
    ap.add_argument("--transports", default="unix,tcp,tls")
    ap.add_argument("--json")
    args = ap.parse_args()
    transports = [t for t in args.transports.split(",") if t]
    unknown = set(transports) - {"unix", "tcp", "tls"}
    if unknown:
        raise SystemExit(f"--transports: unknown {sorted(unknown)}; choose from unix, tcp, tls")

    base = tempfile.mkdtemp(prefix="gpushare-bench-broker-")
    hub = None
    sections: dict[str, dict] = {}
    try:
        if {"tcp", "tls"} & set(transports):
            os.makedirs(os.path.join(base, "hub"))
            try:
                hub, token, broker_token = hub_for_tokens(os.path.join(base, "hub"))
            except RuntimeError as e:
                sections.update({t: {"skipped": str(e)} for t in transports if t != "unix"})
                transports = [t for t in transports if t == "unix"]
        for transport in transports:
            folder = os.path.join(base, transport)
            os.makedirs(folder)
            extra, where = "", {}
            if transport != "unix":
                from tls import make_certificates  # tests/tls.py (on the path since hub_for_tokens)

                port = free_port()
                extra = f"""
                    c.GpuShareBroker.tcp_address = "127.0.0.1:{port}"
                    c.GpuShareBroker.hub_api_url = {hub.api_url!r}
                    c.GpuShareBroker.hub_api_token = {broker_token!r}
                """
                where = {"path": f"{transport}://127.0.0.1:{port}", "token": token}
                if transport == "tls":
                    tls = make_certificates(Path(folder))
                    extra += f"""
                    c.GpuShareBroker.tcp_certfile = {str(tls["cert"])!r}
                    c.GpuShareBroker.tcp_keyfile = {str(tls["key"])!r}
                    """
                    where["ca_file"] = str(tls["ca"])
            broker, sock = start_broker(folder, extra)
            try:
                sections[transport] = measure(where or {"path": sock}, sock, args)
            finally:
                broker.terminate()
                broker.wait(20)
            burst = sections[transport]["burst_latency_ms"]
            print(f"{transport:5s} burst p50 {burst['p50']:6.2f} ms  p99 {burst['p99']:6.2f} ms  "
                  f"throughput {sections[transport]['throughput']['reserve_per_s']:7.1f} reserve/s  "
                  f"target met: {sections[transport]['target_met']}", flush=True)  # fmt: skip
    finally:
        if hub is not None:
            hub.stop()

    ratios = {}
    if "burst_latency_ms" in sections.get("unix", {}):
        for t in ("tcp", "tls"):
            if "burst_latency_ms" in sections.get(t, {}):
                u, o = sections["unix"], sections[t]
                ratios[f"{t}/unix"] = {
                    "burst_p50": round(o["burst_latency_ms"]["p50"] / u["burst_latency_ms"]["p50"], 2),
                    "burst_p99": round(o["burst_latency_ms"]["p99"] / u["burst_latency_ms"]["p99"], 2),
                    "throughput": round(o["throughput"]["reserve_per_s"] / u["throughput"]["reserve_per_s"], 2),
                }
    report = {
        "benchmark": "broker reserve round trip, clients at once, per transport",
        "machine": {
            "node": platform.node(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "clients": args.clients,
        "ops_per_client": args.ops,
        "card_mib": CARD_MIB,
        "transports": sections,
        "ratios_to_unix_socket": ratios,
        "target_met": all(v.get("target_met", True) for v in sections.values()),
    }
    print(json.dumps(report, indent=2))
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    main()
