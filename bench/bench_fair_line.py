"""A student games the line's aging; another student's kernel that fits must not wait past the overtake limit.

A real broker process (`jupyter gpushare broker`, as root) on a simulated 24 GiB card, and three Unix users made
for the run, each a process of its own uid standing for a Jupyter server (issue 33, attack #1):
- carol holds 20.5 GiB, leaving 3.5 GiB unreserved;
- alice keeps two 4 GiB kernels in line (they never fit), half a timeout apart, each joining again at once when
  the broker times it out, so that one of them has always waited its turn out;
- bob's 2 GiB kernels fit the free room: one after another, each asks every 0.25 s (a server asks every 0.5 s)
  until granted, is released a second later, and the next one comes.
Two phases in one run, side by side: bob with carol only (control), then with alice's re-joins. Printed per run:
bob's waits (p50, max) and the ratio of his longest wait to the overtake limit. Target: every wait of bob's at
most `queue_overtake_limit`, plus the interval at which his client asks (ASK_S: a grant is seen at the next ask);
under the old rule, up to nearly a whole `queue_timeout`.
Needs root (useradd; the broker runs as root).

    python bench/bench_fair_line.py [--overtake 6] [--runs 3] [--json bench/results/fair-line-<machine>-<date>.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _root_broker import as_user, root_broker  # noqa: E402

TAG = os.getpid() % 100000
CAROL, ALICE, BOB = f"gsc{TAG}", f"gsa{TAG}", f"gsb{TAG}"
GIB = 1024
ASK_S = 0.25  # how often bob's client asks the broker again while it waits


def _ledger(sock: str, user: str):
    as_user(user)
    from jupyter_gpushare.broker import BrokerLedger

    ledger = BrokerLedger(sock)
    ledger.hello()
    return ledger


def _request(kernel_id: str, gib: float):
    from jupyter_gpushare.core.policy import Size
    from jupyter_gpushare.ledger.ledger import Request

    return Request(kernel_id, Size(mib=int(gib * GIB)))


def carol(sock: str, ready, stop) -> None:
    """Holds 20.5 GiB for the whole phase (the lease lives as long as this process)."""
    from jupyter_gpushare.ledger.ledger import Lease

    ledger = _ledger(sock, CAROL)
    kid = f"carol-{os.getpid()}"
    got = ledger.reserve(_request(kid, 20.5), None, [], wait=False)
    assert isinstance(got, Lease), got
    ready.set()
    stop.wait()
    ledger.release(kid)


def alice(sock: str, timeout_s: float, stop, out) -> None:
    """Two 4 GiB kernels in line, half a timeout apart; each joins again at once when it is timed out."""
    ledger = _ledger(sock, ALICE)
    start = time.monotonic()
    joins = {f"alice-{os.getpid()}-1": 0.0, f"alice-{os.getpid()}-2": timeout_s / 2}
    rejoins = 0
    while not stop.is_set():
        for kid, at in joins.items():
            if time.monotonic() - start >= at:
                got = ledger.reserve(_request(kid, 4), None, [], wait=True)
                rejoins += bool(getattr(got, "expired", False))
        time.sleep(0.5)
    for kid in joins:
        ledger.cancel_wait(kid)
    out.put({"alice_rejoins": rejoins})


def bob(sock: str, start_after: float, seconds: float, out) -> None:
    from jupyter_gpushare.ledger.ledger import Lease

    ledger = _ledger(sock, BOB)
    time.sleep(start_after)
    end = time.monotonic() + seconds
    waits, expired, number = [], 0, 0
    while time.monotonic() < end:
        number += 1
        kid = f"bob-{os.getpid()}-{number}"
        joined = time.monotonic()
        while True:
            got = ledger.reserve(_request(kid, 2), None, [], wait=True)
            if isinstance(got, Lease):
                waits.append(time.monotonic() - joined)
                time.sleep(1.0)
                ledger.release(kid)
                break
            if got.expired:
                expired += 1
                break
            time.sleep(ASK_S)
        time.sleep(0.5)
    out.put({"waits": waits, "expired": expired})


def phase(sock: str, timeout_s: float, overtake_s: float, seconds: float, attack: bool) -> dict:
    ctx = multiprocessing.get_context("fork")
    out, ready, stop = ctx.Queue(), ctx.Event(), ctx.Event()
    holder = ctx.Process(target=carol, args=(sock, ready, stop))
    holder.start()
    if not ready.wait(30):
        raise SystemExit("carol's reservation was not granted: is the broker up?")
    procs = [ctx.Process(target=alice, args=(sock, timeout_s, stop, out))] if attack else []
    # bob starts once alice's first kernel has aged (the attack at full strength)
    procs.append(ctx.Process(target=bob, args=(sock, overtake_s + 1 if attack else 0, seconds, out)))
    for p in procs:
        p.start()
    procs[-1].join(seconds + timeout_s + 60)
    stop.set()
    results = {}
    for _ in procs:
        results.update(out.get(timeout=60))
    for p in [*procs, holder]:  # (each gives back what it holds: the next phase starts on an empty card)
        p.join(30)
    waits = results["waits"]
    return {
        "waits_s": [round(w, 3) for w in waits],
        "p50_s": statistics.median(waits) if waits else None,
        "max_s": max(waits) if waits else None,
        "expired": results["expired"],
        "alice_rejoins": results.get("alice_rejoins"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--overtake", type=float, default=6.0, help="queue_overtake_limit, s (timeout: 3x)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    overtake, timeout = args.overtake, 3 * args.overtake
    seconds = 4 * timeout  # several of alice's re-joins
    settings = f"""
        c.GpuShareApp.gpu_backend = "simulated"
        c.GpuShareApp.simulated_cards = "24GiB"
        c.GpuShareApp.card_headroom = "0MiB"
        c.GpuShareApp.context_reserve = "0MiB"
        c.GpuShareApp.queue_overtake_limit = {overtake}
        c.GpuShareApp.queue_timeout = {timeout}
        """
    runs = []
    with root_broker("bench_fair_line", (CAROL, ALICE, BOB), settings) as broker:
        for _ in range(args.runs):
            control = phase(broker.socket, timeout, overtake, seconds / 4, attack=False)
            attacked = phase(broker.socket, timeout, overtake, seconds, attack=True)
            runs.append({"control": control, "attack": attacked})
    print(f"overtake limit {overtake:g} s, queue timeout {timeout:g} s; bob's 2 GiB kernels, 3.5 GiB free")
    print(f"{'run':<5}{'control p50':>12}{'max':>8}{'attack p50':>12}{'max':>8}{'kernels':>9}{'expired':>9}"
          f"{'alice re-joins':>16}{'max/limit':>11}")  # fmt: skip
    met = True
    for i, r in enumerate(runs, 1):
        c, a = r["control"], r["attack"]
        ratio = (a["max_s"] or 0) / overtake
        met &= a["expired"] == 0 and a["max_s"] is not None and a["max_s"] <= overtake + ASK_S
        print(f"{i:<5}{c['p50_s']:>12.2f}{c['max_s']:>8.2f}{a['p50_s']:>12.2f}{a['max_s']:>8.2f}"
              f"{len(a['waits_s']):>9}{a['expired']:>9}{a['alice_rejoins']:>16}{ratio:>11.2f}")  # fmt: skip
    print(f"target: every wait of bob's at most the overtake limit (+{ASK_S:g} s, his asking interval), in every run: "
          f"{'MET' if met else 'NOT MET'}")  # fmt: skip
    if args.json:
        result = {
            "machine": platform.node(), "cpus": os.cpu_count(), "date": datetime.now(timezone.utc).isoformat(),
            "overtake_s": overtake, "timeout_s": timeout, "runs": runs, "met": met,
        }  # fmt: skip
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
