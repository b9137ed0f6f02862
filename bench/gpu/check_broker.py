"""The multi-user broker on a real GPU: a root broker on NVML, two students' Jupyter servers.

Run as root on a GPU machine, from a checkout every user can read (the carried wheels installed,
see device_env.sh):

    python3 bench/gpu/check_broker.py out.json

Two Unix users are created, each runs a real `jupyter server` that reserves through the broker
(GpuShareApp.broker_socket). Each starts a kernel with an 8 GiB quota and allocates 3 GiB in it
with PyTorch. Checks: the broker lists the real card(s); the host-wide reserved total equals the two
reservations; alice's own /api/gpushare/host names neither bob nor his kernel while showing his
total; `jupyter gpushare status --json` (root: an admin) shows both kernels with their NVML use;
nothing is taken as used outside reservations (both kernels' processes lie in their leases' trees);
a third kernel past alice's per-user limit is refused with the limit in the message; killing bob's
server and kernel reclaims his lease. GPUSHARE_CHECK_SMOKE=1 runs the plumbing on a simulated card.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import psutil  # noqa: E402
import websocket  # noqa: E402  (websocket-client, a jupyter_server dependency)
from servers import TOKEN, wait_until  # noqa: E402
from test_broker import Broker, UserServer, ensure_user, remove_user, root_traversable  # noqa: E402

from jupyter_gpushare.host.gpu import SimulatedBackend  # noqa: E402
from jupyter_gpushare.host.gpu.nvml import NvmlBackend  # noqa: E402
from jupyter_gpushare.ledger.attribution import unreserved_use  # noqa: E402
from jupyter_gpushare.ledger.ledger import read_ledger  # noqa: E402

SMOKE = os.environ.get("GPUSHARE_CHECK_SMOKE") == "1"  # the plumbing on a simulated 40 GiB card, no GPU
NVML = {"gpu_backend": "simulated", "simulated_cards": "40GiB"} if SMOKE else {"gpu_backend": "nvml"}
ALLOC = (
    "print('allocated (smoke)')"
    if SMOKE
    else (
        "import torch; x = torch.empty(3 * 2**30, dtype=torch.uint8, device='cuda'); x.fill_(1); "
        "torch.cuda.synchronize(); print('allocated', torch.cuda.memory_reserved() >> 20)"
    )
)


def gpu_and_driver() -> dict[str, str]:
    """The card and driver the run was on, as NVML names them."""
    import pynvml

    pynvml.nvmlInit()
    text = lambda v: v.decode() if isinstance(v, bytes) else v  # noqa: E731
    gpu = text(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0)))
    return {"gpu": gpu, "driver": text(pynvml.nvmlSystemGetDriverVersion())}


def execute(server: UserServer, kernel_id: str, code: str, timeout: float = 180) -> str:
    """Run ``code`` in a kernel over its websocket (as JupyterLab does); its stdout and errors."""
    ws = websocket.create_connection(
        f"ws://127.0.0.1:{server.port}/api/kernels/{kernel_id}/channels", header=[f"Authorization: token {TOKEN}"]
    )
    msg_id = f"check-{time.monotonic_ns()}"
    ws.send(json.dumps({
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "", "session": msg_id, "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell",
        "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {}, "allow_stdin": False},
    }))  # fmt: skip
    out, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        ws.settimeout(max(1, deadline - time.monotonic()))
        msg = json.loads(ws.recv())
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            out.append(content["text"])
        elif kind == "error":
            out.append(f"{content['ename']}: {content['evalue']}")
        elif kind == "status" and content["execution_state"] == "idle":
            break
    ws.close()
    return "".join(out).strip()


def main(path: str) -> int:
    base = Path(tempfile.mkdtemp(prefix="gpushare-gpu-broker-", dir="/tmp"))
    os.chmod(base, 0o755)
    run = os.getpid() % 100000
    users = {name: ensure_user(name) for name in (f"gsa{run}", f"gsb{run}")}
    alice_name, bob_name = users
    broker = Broker(base, gpu=NVML, limits={"max_total": "16GiB"})
    servers: dict[str, UserServer] = {}
    checks: dict[str, bool] = {}
    result: dict = {
        "host": platform.node(),
        "date": datetime.date.today().isoformat(),
        **({"gpu": "simulated (smoke run)"} if SMOKE else gpu_and_driver()),
        "checks": checks,
    }
    traverse = root_traversable()  # an interpreter under /root (pyenv) must be reachable by the users
    traverse.__enter__()
    try:
        broker.start()
        for name, user in users.items():
            servers[name] = UserServer(base, user, broker, gpu={**NVML, "default_quota": "8GiB"}).start()
        for s in servers.values():
            s.wait_ready()
        alice, bob = servers[alice_name], servers[bob_name]
        view = broker.admin_view()
        result["cards"] = view["cards"]
        checks["broker lists the real card(s)"] = bool(view["cards"]) and view["cards"][0]["simulated"] == SMOKE
        a1, b1 = alice.start_kernel(), bob.start_kernel()
        result["alloc"] = {alice_name: execute(alice, a1, ALLOC), bob_name: execute(bob, b1, ALLOC)}
        checks["both kernels allocated 3 GiB"] = all(v.startswith("allocated") for v in result["alloc"].values())
        view = broker.admin_view()
        reserved = sum(c["reserved_mib"] for c in view["cards"])
        checks["host-wide reserved = 2 x (8 GiB + reserve)"] = reserved == 2 * (8192 + view["context_reserve_mib"])
        host = alice.call("GET", "api/gpushare/host")
        text = json.dumps(host)
        result["alice_host_view"] = host
        checks["alice's view: no bob, no bob kernel"] = bob_name not in text and b1 not in text
        checks["alice's view: bob's total as others"] = sum(c["others_reserved_mib"] for c in host["cards"]) > 0
        time.sleep(2)  # a sampler tick
        status = subprocess.run(
            [sys.executable, "-m", "jupyter_gpushare.cli.main", "status", "--json", "--socket", broker.socket],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        result["status"] = json.loads(status.stdout) if status.returncode == 0 else status.stderr
        rows = {k["kernel_id"]: k for k in result["status"]["kernels"]} if status.returncode == 0 else {}
        result["status_use_mib"] = {k: rows[k].get("used_mib") for k in (a1, b1) if k in rows}
        checks["admin status: both kernels with NVML use >= 3 GiB"] = len(result["status_use_mib"]) == 2 and all(
            SMOKE or (v or 0) >= 3072 for v in result["status_use_mib"].values()
        )
        # Both kernels' processes lie in their leases' trees: nothing is taken as used outside reservations.
        result["status_outside"] = result["status"].get("outside") if status.returncode == 0 else None
        leases, _ = read_ledger(broker.ledger)
        backend = SimulatedBackend([40960]) if SMOKE else NvmlBackend()
        result["unreserved_mib"] = unreserved_use(backend.sample(), leases)
        checks["no GPU process outside the two kernels' trees"] = result["status_outside"] == [] and not any(
            result["unreserved_mib"].values()
        )
        a2 = alice.start_kernel()
        try:
            a3 = alice.start_kernel()
            result["limit_refusal"] = f"admitted {a3}"
        except Exception as e:  # urllib's HTTPError: the message the client would see
            result["limit_refusal"] = json.loads(e.read())["message"]  # type: ignore[attr-defined]
        checks["third 8 GiB kernel past alice's 16 GiB limit refused"] = "16 GiB" in result["limit_refusal"]
        kernel_pid = bob.kernel(b1)["pid"]
        bob.proc.send_signal(signal.SIGKILL)
        psutil.Process(kernel_pid).kill()
        t0 = time.monotonic()
        wait_until(lambda: b1 not in {k["kernel_id"] for k in broker.admin_view()["kernels"]}, 60, "bob's lease")
        result["reclaim_s"] = round(time.monotonic() - t0, 2)
        checks["killed server's lease reclaimed"] = True
        for kid in (a1, a2):
            alice.call("DELETE", f"api/kernels/{kid}")
    finally:
        for s in servers.values():
            s.stop()
        broker.stop()
        traverse.__exit__(None, None, None)
        result["logs"] = {p.name: p.read_text()[-3000:] for p in base.glob("*.log")}
        for name in users:
            remove_user(name)
        result["ok"] = all(checks.values())
        Path(path).write_text(json.dumps(result, indent=1))
    for check, ok in checks.items():
        print(("PASS " if ok else "FAIL ") + check)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
