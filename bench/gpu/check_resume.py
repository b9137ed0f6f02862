"""Any demand brings a parked kernel back, on a real GPU, through a real jupyter-server (issue 46): each way a kernel
is wanted, met while another kernel waits in line.

Run on a GPU machine after `source bench/gpu/device_env.sh` (a real jupyter-server with the extension on NVML, real
kernels, as root):

    python3 bench/gpu/check_resume.py OUT_DIR [--runs 3]

Each kernel's quota is 45% of the card: two fit, a third waits. Per demand, notebook A allocates 4 GiB of known data
with PyTorch, B runs a long cell (busy: never parked), C opens and waits; with park_after = 3 s the server parks A
(idle) and grants C. Then A is wanted, one way per scenario:

- ``websocket``: a cell through the server's websocket, as JupyterLab sends it (the control);
- ``zmq``: a cell sent straight to A's own shell, as `jupyter console --existing` or an IDE does;
- ``comm``: a comm message on A's shell (a widget's);
- ``thread``: A runs a thread that makes a CUDA call every 3 s (a served model): it must never be parked;
- ``child``: A runs a child process that makes a CUDA call every 3 s: it must never be parked.

For the first three, C's notebook is closed 2 s after the demand (its room for A), and the demand is served when a
GPU call in A returns its data, intact, in the same process. For the last two, served means no CUDA call of the
thread or child waited more than 10 s while C waited. ``stranded`` counts the demands not served within 10 s.
Every run: OUT_DIR/check_resume-runN.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_escapes import TOKEN, Server, nvml_use, run  # noqa: E402
from check_park_server import session, state, wait_state  # noqa: E402

SETTINGS = {"gpu_backend": "nvml", "default_quota": "45%", "park_after": 3.0, "queue_timeout": 300,
            "over_quota_action": "notify"}  # fmt: skip
ALLOC = (
    "import torch, os, time\n"
    "x = torch.arange(4 * 2**30 // 4, device='cuda', dtype=torch.float32) % 9973\n"
    "torch.cuda.empty_cache(); torch.cuda.synchronize()\n"
    "print(float(x[::4096].double().sum()), os.getpid())"
)
CHECK = "print(float(x[::4096].double().sum()), os.getpid())"
# A background CUDA call every 3 s, each one's end written down: a thread of the kernel, or a child process of it.
THREAD = (
    "import threading\n"
    "def serve():\n"
    "    log = open({log!r}, 'a')\n"
    "    while True:\n"
    "        x[:1024].sum().item(); log.write(f'{{time.time()}}\\n'); log.flush(); time.sleep(3)\n"
    "threading.Thread(target=serve, name='model-server', daemon=True).start()"
)
CHILD_SCRIPT = (
    "import sys, time, torch\n"
    "x = torch.ones(2**20, device='cuda')\n"
    "log = open(sys.argv[1], 'a')\n"
    "while True:\n"
    "    x.sum().item(); log.write(f'{time.time()}\\n'); log.flush(); time.sleep(3)\n"
)
CHILD = "import subprocess, sys\nchild = subprocess.Popen([sys.executable, {script!r}, {log!r}])"
WAIT_S = 10.0  # a demand not served within this is stranded


def websocket_cell(server: Server, kid: str, code: str) -> float:
    """Send one cell through the server's websocket as JupyterLab does; seconds until its reply."""
    from jupyter_client.session import Session
    from tornado.websocket import websocket_connect

    async def go() -> float:
        session = Session()
        url = f"ws://127.0.0.1:{server.port}/api/kernels/{kid}/channels?session_id={session.session}"
        ws = await websocket_connect(url + f"&token={TOKEN}")
        msg = session.msg("execute_request", {"code": code, "silent": False, "store_history": True,
                                              "user_expressions": {}, "allow_stdin": False})  # fmt: skip
        msg["channel"] = "shell"
        t0 = time.monotonic()
        ws.write_message(json.dumps(msg, default=str))
        while True:
            raw = await asyncio.wait_for(ws.read_message(), 120)
            got = json.loads(raw)
            if got["parent_header"].get("msg_id") == msg["header"]["msg_id"] and got["msg_type"] == "execute_reply":
                ws.close()
                return round(time.monotonic() - t0, 2)

    return asyncio.run(go())


def ticks_gap(log: Path, since: float, until: float) -> float:
    """The longest time between two background CUDA calls' ends (and the window's ends) in [since, until]."""
    with contextlib.suppress(OSError):
        times = sorted(float(t) for t in log.read_text().split() if since <= float(t) <= until)
        points = [since, *times, until]
        return round(max(b - a for a, b in zip(points, points[1:])), 2)
    return until - since


def scenario(server: Server, work: Path, how: str) -> dict:
    out: dict = {"demand": how}
    sa, a = session(server, f"a-{how}.ipynb")
    sb, b = session(server, f"b-{how}.ipynb")
    sc = None
    kc = server.client(a)
    try:
        status, said = run(kc, ALLOC)
        checksum, pid = said.split()[-2:]
        out.update(a_pid=int(pid), checksum_before=float(checksum), a_used_mib=nvml_use().get(int(pid)))
        log = work / f"ticks-{how}.log"
        if how in ("thread", "child"):
            script = work / "child.py"
            script.write_text(CHILD_SCRIPT)
            status, said = run(kc, (THREAD if how == "thread" else CHILD).format(log=str(log), script=str(script)))
            out["background_started"] = status
        kb = server.client(b)
        # B holds GPU memory and is busy: A is the one a park takes (a kernel that never used its GPU stands by)
        kb.execute(
            "import torch, time; b = torch.ones(2**28, device='cuda'); torch.cuda.synchronize(); time.sleep(3600)"
        )
        t0 = time.time()
        sc, c = session(server, f"c-{how}.ipynb")
        if how in ("thread", "child"):  # never parked: its background calls go on while C waits
            time.sleep(15)
            out["a_state"] = state(server, a)
            out["c_state"] = state(server, c)
            out["longest_gap_s"] = ticks_gap(log, t0 + 1, time.time())
            out["served"] = out["a_state"] == "running" and out["longest_gap_s"] <= WAIT_S
            out["why_not_parked"] = [e.get("message") for e in server.events(a) if e.get("kind") == "park-failed"]
            return out
        out["a_parked_after_s"] = wait_state(server, a, "parked", timeout=40)
        wait_state(server, c, "running")
        time.sleep(3)
        out["a_used_parked_mib"] = nvml_use().get(int(pid))
        t1 = time.monotonic()
        if how == "websocket":
            import threading

            sent: dict = {}
            cell = threading.Thread(target=lambda: sent.update(s=websocket_cell(server, a, "y = 1; print('cpu ran')")))
            cell.start()
        elif how == "zmq":
            kz = server.client(a)
            kz.execute("y = 1; print('cpu ran')")
        else:
            kz = server.client(a)
            kz.shell_channel.send(kz.session.msg("comm_msg", {"comm_id": uuid.uuid4().hex, "data": {}}))
        out["a_queued_after_s"] = wait_state(server, a, "queued", timeout=30)
        time.sleep(2)
        server.call("DELETE", f"api/sessions/{sc}")
        sc = None
        wait_state(server, a, "running", timeout=60)
        status, said = run(kc, CHECK)
        out["served_s"] = round(time.monotonic() - t1, 2)
        checksum, pid_after = said.split()[-2:]  # (after the cell's one line, if it ran before the kernel heard back)
        out.update(checksum_after=float(checksum), same_pid=int(pid_after) == out["a_pid"],
                   data_intact=float(checksum) == out["checksum_before"], a_used_after_mib=nvml_use().get(int(pid)))  # fmt: skip
        out["served"] = out["served_s"] <= WAIT_S + 2 + 2 and out["data_intact"] and out["same_pid"]
        out["events_a"] = [{k: e.get(k) for k in ("kind", "message", "params")} for e in server.events(a)]
        return out
    finally:
        for sid in (sa, sb, sc):
            if sid is not None:
                with contextlib.suppress(Exception):
                    server.call("DELETE", f"api/sessions/{sid}")
        time.sleep(1)


def one_run(work: Path) -> dict:
    server = Server(work, SETTINGS)
    out: dict = {"scenarios": []}
    try:
        for how in ("websocket", "zmq", "comm", "thread", "child"):
            try:
                out["scenarios"].append(scenario(server, work, how))
            except Exception as e:  # noqa: BLE001 (recorded)
                out["scenarios"].append({"demand": how, "error": f"{type(e).__name__}: {e}", "served": False,
                                         "server_log_tail": (work / "server.log").read_text()[-3000:]})  # fmt: skip
    finally:
        server.stop()
    out["stranded"] = sum(not s.get("served") for s in out["scenarios"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import tempfile

    import pynvml

    pynvml.nvmlInit()

    for n in range(1, args.runs + 1):
        with tempfile.TemporaryDirectory() as tmp:
            result = one_run(Path(tmp))
        result.update(run=n, date=datetime.datetime.now(datetime.timezone.utc).isoformat())
        (args.out / f"check_resume-run{n}.json").write_text(json.dumps(result, indent=2) + "\n")
        print(f"run {n}: stranded {result['stranded']}:",
              [(s["demand"], s.get("served"), s.get("served_s", s.get("longest_gap_s")), s.get("error"))
               for s in result["scenarios"]], flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
