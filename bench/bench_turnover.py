"""Turnover: from a notebook closing to the next kernel in line holding its reservation, side by side.

Two real jupyter-servers share one ledger (one simulated 10 GiB card; each kernel reserves 4.5 GiB). A notebook of
server A waits in line while one notebook of each server fills the card. Then either A's own notebook closes (A
serves its line at once: event-driven) or B's does. Two ways of sharing, one after the other in one run: a ledger
file (A sees B's release at its next poll of the ledger, every 0.5 s), and the host's broker (a real
`jupyter gpushare broker`: it tells A at once, through the watch A holds, server/room_watch.py). Per trial: the
seconds from the DELETE of the session until A's API says the waiting kernel is running.

    python bench/bench_turnover.py OUT.json [--trials 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_broker import start_broker  # noqa: E402  (a bench script beside this one)

TOKEN = "bench-turnover"
SETTINGS = {"gpu_backend": "simulated", "simulated_cards": "10GiB", "card_headroom": "0MiB",
            "context_reserve": "512MiB", "default_quota": "4GiB", "park_after": 0}  # fmt: skip


class Server:
    def __init__(self, work: Path, port: int, ledger: Path | str) -> None:
        """``ledger``: the ledger file, or the broker's socket."""
        for sub in ("config", "data", "runtime", "root"):
            (work / sub).mkdir(parents=True, exist_ok=True)
        shared = {"ledger_path": str(ledger)} if isinstance(ledger, Path) else {"broker_socket": ledger}
        (work / "config" / "jupyter_server_config.json").write_text(json.dumps({"GpuShareApp": {**SETTINGS, **shared}}))
        env = {**os.environ, "JUPYTER_CONFIG_DIR": str(work / "config"), "JUPYTER_DATA_DIR": str(work / "data"),
               "JUPYTER_RUNTIME_DIR": str(work / "runtime")}  # fmt: skip
        self.port, self.log = port, open(work / "server.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", f"--port={port}", f"--IdentityProvider.token={TOKEN}",
             "--ServerApp.open_browser=False", "--allow-root", f"--ServerApp.root_dir={work / 'root'}"],
            stdout=self.log, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
        deadline = time.monotonic() + 90
        while True:
            try:
                self.call("GET", "api/status")
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((work / "server.log").read_text()[-2000:]) from None
                time.sleep(0.2)

    def call(self, method: str, path: str, body: dict | None = None):
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/{path}", method=method,
                                     headers={"Authorization": f"token {TOKEN}"},
                                     data=json.dumps(body).encode() if body is not None else None)  # fmt: skip
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read() or b"null")

    def open(self, path: str) -> tuple[str, str]:
        s = self.call("POST", "api/sessions", {"path": path, "type": "notebook", "name": path,
                                               "kernel": {"name": "python3"}})  # fmt: skip
        return s["id"], s["kernel"]["id"]

    def state(self, kid: str) -> str | None:
        kernels = self.call("GET", "api/gpushare/kernels")["kernels"]
        return next((k["state"] for k in kernels if k["kernel_id"] == kid), None)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def until(server: Server, kid: str, state: str, timeout: float = 30.0) -> float:
    t0 = time.monotonic()
    while server.state(kid) != state:
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"{kid} not {state} in {timeout} s")
        time.sleep(0.01)
    return time.monotonic() - t0


def trial(a: Server, b: Server, n: int, closer: str) -> float:
    fill_a, _ = a.open(f"fill-a-{n}.ipynb")
    fill_b, _ = b.open(f"fill-b-{n}.ipynb")
    waiting, kid = a.open(f"wait-{n}.ipynb")
    until(a, kid, "queued")
    time.sleep(1.0)
    server, session = (a, fill_a) if closer == "own" else (b, fill_b)
    t0 = time.monotonic()
    server.call("DELETE", f"api/sessions/{session}")
    until(a, kid, "running")
    seconds = time.monotonic() - t0
    for s, sid in ((a, waiting), (a, fill_a), (b, fill_b)):
        if not (s is server and sid == session):
            s.call("DELETE", f"api/sessions/{sid}")
    return round(seconds, 3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--trials", type=int, default=10)
    args = ap.parse_args()
    times: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        broker, sock = start_broker(
            str(work), 'c.GpuShareApp.simulated_cards = "10GiB"\nc.GpuShareApp.context_reserve = "512MiB"\n'
        )
        try:
            for shared, ledger in (("file", work / "ledger.sqlite"), ("broker", sock)):
                a = Server(work / f"a-{shared}", 18700 + os.getpid() % 100, ledger)
                b = Server(work / f"b-{shared}", 18800 + os.getpid() % 100, ledger)
                try:
                    for n in range(args.trials):
                        for closer in ("own", "other"):  # alternating, so both see the same machine
                            times.setdefault(f"{shared}_{closer}", []).append(
                                trial(a, b, n * 2 + (closer == "other"), closer)
                            )
                finally:
                    a.stop()
                    b.stop()
        finally:
            broker.terminate()
            broker.wait(30)
    medians = {k: statistics.median(v) for k, v in times.items()}
    result = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "seconds": times, "median_s": medians,
              "ratio_own_over_other": round(medians["file_own"] / medians["file_other"], 2),
              "ratio_broker_other_over_file_other": round(medians["broker_other"] / medians["file_other"], 2)}  # fmt: skip
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k.startswith(("median", "ratio"))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
