"""One student floods the broker; another student's kernel starts must not notice.

A real broker process (`jupyter gpushare broker`, as root) on a simulated 16 GiB card, and two Unix users
made for the run. The victim's client (one process, its own uid, standing for a Jupyter server) runs
reserve -> release cycles and times every reserve round trip. The flooder (other processes, the other uid)
opens connections as fast as it can, far past the per-user cap (held ones stay open; refused ones are
opened again at once), and on every connection it holds sends requests back to back without waiting
(malformed ones too, which the broker must answer and may log).

Three phases, measured one after the other in one run: the victim alone, under the flood of connections,
and under eight connections sending the largest requests the broker takes (a ~60 KB release_owned_except,
then one of ~990 KB), which cost it work to read, parse and answer.
Printed side by side with their ratio; also how many connections and requests the flooder got through,
and how much the broker's log grew. Target: under the flood, the victim's reserve p99 stays under 50 ms.
Needs root (useradd; the broker runs as root).

    python bench/bench_broker_flood.py [--cycles 400] [--flooders 4] [--seconds 20]
                                       [--json bench/results/broker-flood-<machine>-<date>.json]

With ``--before <source tree>`` (a checkout of the code before a change: ``git worktree add /tmp/before <commit>``),
the victim alone and under the flood of connections are measured for the broker of that tree and of this one,
alternated over ``--rounds`` rounds in one run, and printed side by side with the ratio this / before: the honest
path's cost of a change.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import socket
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _root_broker import as_user, root_broker  # noqa: E402

VICTIM, FLOODER = f"gsv{os.getpid() % 100000}", f"gsf{os.getpid() % 100000}"


def victim(sock: str, cycles: int, out) -> None:
    as_user(VICTIM)
    from jupyter_gpushare.broker import BrokerLedger
    from jupyter_gpushare.core.policy import Size
    from jupyter_gpushare.ledger.ledger import Lease, Request

    ledger = BrokerLedger(sock)
    ledger.hello()
    latencies, granted = [], 0
    for i in range(cycles):
        kid = f"victim-{os.getpid()}-{i}"
        t0 = time.perf_counter()
        got = ledger.reserve(Request(kid, Size(mib=1024)), None, [], wait=False)
        latencies.append(time.perf_counter() - t0)
        if isinstance(got, Lease):
            granted += 1
            ledger.release(kid)
        time.sleep(0.005)  # a server's pace: kernels start, not a tight loop
    out.put({"latencies": latencies, "granted": granted})


SMALL = (b'{"op": "hello"}\n' * 20 + b'{"op": "reserve", "args": {"kernel_id": "x", "mib": -1}}\n' + b"not json\n") * 5


# Requests as large as the broker takes, which cost it work to parse and answer: the keep list of a
# release_owned_except just under the line limit, and one of ~990 KB (the old limit was 1 MiB).
def _keep(count: int) -> bytes:
    ids = [f"{i:08x}-0000-4000-8000-{i:012x}" for i in range(count)]  # kernel ids as Jupyter makes them
    return (json.dumps({"op": "release_owned_except", "args": {"keep": ids}}) + "\n").encode()


LARGE = _keep(1_400) + _keep(25_000)  # ~56 KB, and ~1 MB (under the old 1 MiB line limit)


def answered_flooder(sock: str, seconds: float, out, lines: list[bytes]) -> None:
    """One connection that sends ``lines`` back to back, reading each answer (a dropped connection is opened
    again), as a program of the flooder's would."""
    as_user(FLOODER)
    opened = sent = answered = received = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(sock)
                opened += 1
                f = s.makefile("rb")
                while time.monotonic() < deadline:
                    for line in lines:
                        s.sendall(line)
                        sent += len(line)
                        reply = f.readline()
                        if not reply:
                            raise ConnectionError
                        answered += 1
                        received += len(reply)
        except OSError:
            time.sleep(0.01)
    out.put({"opened": opened, "refused_or_closed": opened, "bytes_sent": sent, "answered": answered,
             "bytes_received": received, "held_at_end": 0})  # fmt: skip


# ``view`` with the flooder's 2,000 history rows: each answer lists every notebook of theirs (issue 33, attack #2)
VIEW = [b'{"op": "view"}\n']


def flooder(sock: str, seconds: float, out, kind: str = "small") -> None:
    """``kind``: "small" (connections past the cap, requests without reading), "large" or "view" (answered)."""
    if kind in ("large", "view"):
        return answered_flooder(sock, seconds, out, LARGE.splitlines(keepends=True) if kind == "large" else VIEW)
    as_user(FLOODER)
    held: list[socket.socket] = []
    opened = refused = sent = 0
    burst = SMALL
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            s = socket.socket(socket.AF_UNIX)
            s.setblocking(False)
            s.connect(sock)
            opened += 1
            held.append(s)
        except OSError:
            refused += 1
            s.close()
        for s in list(held):  # write without reading: the broker must not buffer without bound for us
            try:
                sent += s.send(burst)
            except BlockingIOError:
                pass
            except OSError:  # refused (over the cap) or closed by the broker
                held.remove(s)
                s.close()
                refused += 1
    out.put({"opened": opened, "refused_or_closed": refused, "bytes_sent": sent, "held_at_end": len(held)})


def history_rows(ledger_path: Path, user: str, count: int) -> None:
    """``count`` recorded runs of ``user``'s (the per-user cap is 2,000), written into the broker's ledger as its
    record_peak would: one notebook per five runs, each run a kernel of its own."""
    import sqlite3

    now = time.time()
    db = sqlite3.connect(ledger_path, timeout=30)
    with db:
        db.executemany(
            "INSERT OR REPLACE INTO peaks (kernel_id, run, user, kernel_name, path, peak_mib, reserved_mib, recorded,"
            " need_mib, failed) VALUES (?,?,?,?,?,?,?,?,?,?)",
            [(f"flood-{i}", "", user, "python3", f"work/notebook-{i // 5:04d}.ipynb", 1000 + i, 4096, now - i, 1200, 0)
             for i in range(count)],
        )  # fmt: skip
    db.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def phase(sock: str, cycles: int, flooders: int, seconds: float, kind: str = "small") -> dict:
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    floods = [ctx.Process(target=flooder, args=(sock, seconds, out, kind)) for _ in range(flooders)]
    for p in floods:
        p.start()
    if floods:
        time.sleep(2)  # the flood is at full strength before the victim starts
    v = ctx.Process(target=victim, args=(sock, cycles, out))
    v.start()
    results = [out.get(timeout=600) for _ in range(1 + len(floods))]
    for p in [v, *floods]:
        p.join(60)
    vict = next(r for r in results if "latencies" in r)
    ms = [x * 1000 for x in vict["latencies"]]
    return {
        "reserve_ms": {"p50": statistics.median(ms), "p99": percentile(ms, 99), "max": max(ms)},
        "granted": vict["granted"],
        "cycles": cycles,
        "flooders": [r for r in results if "opened" in r],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cycles", type=int, default=400)
    ap.add_argument("--flooders", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument(
        "--broker-nice", type=int, default=-10, help="GpuShareBroker.nice (default -10, the broker's own; 0: none)"
    )
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--before", help="a source tree of the code before: compare its broker with this one's")
    ap.add_argument("--rounds", type=int, default=2, help="with --before: rounds of before, then this (default 2)")
    args = ap.parse_args()
    settings = f"""
        c.GpuShareApp.gpu_backend = "simulated"
        c.GpuShareApp.simulated_cards = "16GiB"
        c.GpuShareApp.card_headroom = "0MiB"
        c.GpuShareApp.context_reserve = "512MiB"
        c.GpuShareBroker.nice = {args.broker_nice}
        """
    if args.before:
        return before_after(args, settings)
    with root_broker("bench_broker_flood", (VICTIM, FLOODER), settings) as broker:
        sock = broker.socket
        quiet = phase(sock, args.cycles, 0, args.seconds)
        log_before = os.path.getsize(broker.log_path)
        flood = phase(sock, args.cycles, args.flooders, args.seconds)
        log_growth = os.path.getsize(broker.log_path) - log_before
        large = phase(sock, args.cycles, 8, args.seconds, "large")  # eight connections of large requests
        history_rows(broker.ledger_path, FLOODER, 2000)
        views = phase(sock, args.cycles, 8, args.seconds, "view")  # eight connections asking `view`
    q, f, g, v = quiet["reserve_ms"], flood["reserve_ms"], large["reserve_ms"], views["reserve_ms"]
    print(f"{'victim reserve':<22}{'alone':>10}{'under flood':>14}{'ratio':>8}{'large requests':>16}{'ratio':>8}"
          f"{'view flood':>12}{'ratio':>8}")  # fmt: skip
    for key in ("p50", "p99", "max"):
        print(
            f"{key + ' (ms)':<22}{q[key]:>10.2f}{f[key]:>14.2f}{f[key] / q[key]:>8.2f}{g[key]:>16.2f}{g[key] / q[key]:>8.2f}"
            f"{v[key]:>12.2f}{v[key] / q[key]:>8.2f}"
        )
    print(f"large requests: {sum(r['bytes_sent'] for r in large['flooders']) / 1e6:.1f} MB sent on 8 connections, "
          f"{sum(r['answered'] for r in large['flooders'])} answered")  # fmt: skip
    print(f"target p99 < 50 ms under large requests: {'MET' if g['p99'] < 50 else 'NOT MET'}")
    print(
        f"view flood: {sum(r['answered'] for r in views['flooders'])} views answered on 8 connections, "
        f"{sum(r['bytes_received'] for r in views['flooders']) / 1e6:.1f} MB received, with 2,000 history rows"
    )
    print(f"target p99 < 50 ms under the view flood: {'MET' if v['p99'] < 50 else 'NOT MET'}")
    opened = sum(r["opened"] for r in flood["flooders"])
    sent = sum(r["bytes_sent"] for r in flood["flooders"])
    print(f"broker priority: nice {args.broker_nice}")
    print(f"flooders: {args.flooders} processes, {opened} connections opened, {sent / 1e6:.1f} MB of requests sent")
    print(f"broker log grew {log_growth / 1024:.1f} KiB during the flood")
    print(f"target p99 < 50 ms under flood: {'MET' if f['p99'] < 50 else 'NOT MET'}")
    result = {
        "machine": platform.node(), "cpus": os.cpu_count(), "date": datetime.now(timezone.utc).isoformat(),
        "broker_nice": args.broker_nice, "flooders": args.flooders, "quiet": quiet, "flood": flood, "log_growth_bytes": log_growth, "p99_ratio": f["p99"] / q["p99"],
        "large_requests": large, "large_p99_ratio": g["p99"] / q["p99"],
        "view_flood": views, "view_p99_ratio": v["p99"] / q["p99"],
    }  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


def before_after(args: argparse.Namespace, settings: str) -> None:
    """The victim's reserve alone and under the flood, for the broker of ``args.before`` and of this tree, alternated
    over ``args.rounds`` rounds; each side's worst round is the one compared."""
    got: dict[str, list[dict]] = {"before": [], "this": []}
    for _ in range(args.rounds):
        for label, source in (("before", args.before), ("this", None)):
            with root_broker("bench_broker_flood", (VICTIM, FLOODER), settings, source=source) as broker:
                quiet = phase(broker.socket, args.cycles, 0, args.seconds)
                flood = phase(broker.socket, args.cycles, args.flooders, args.seconds)
            got[label].append({"alone": quiet["reserve_ms"], "flood": flood["reserve_ms"]})
            print(f"{label:<7} alone p99 {quiet['reserve_ms']['p99']:.2f} ms, under flood p99 "
                  f"{flood['reserve_ms']['p99']:.2f} ms", flush=True)  # fmt: skip
    print(f"{'victim reserve (worst round)':<30}{'before':>10}{'this':>10}{'this/before':>13}")
    worst = {}
    for where in ("alone", "flood"):
        for key in ("p50", "p99"):
            b, t = (max(r[where][key] for r in got[side]) for side in ("before", "this"))
            worst[f"{where}_{key}"] = {"before": b, "this": t, "ratio": t / b}
            print(f"{where + ' ' + key + ' (ms)':<30}{b:>10.2f}{t:>10.2f}{t / b:>13.2f}")
    result = {
        "machine": platform.node(), "cpus": os.cpu_count(), "date": datetime.now(timezone.utc).isoformat(),
        "before": args.before, "rounds": got, "worst": worst, "flooders": args.flooders, "cycles": args.cycles,
    }  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
