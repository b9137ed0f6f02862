"""Escapes from a kernel's quota on a real GPU, with neighbours that hold the rest of the card.

Run on a GPU machine after `source bench/gpu/device_env.sh` (a real jupyter-server with the extension on
NVML, real kernels; as root, so the kernels' cgroups can be made):

    python3 bench/gpu/check_escapes.py OUT_DIR

Set-up: the test kernel has a 4 GiB quota; four "neighbour" kernels reserve the rest of the card
(kernel_quotas) and each holds its whole quota allocated (PyTorch) for the whole run, touching it every
0.2 s and counting any error. Over-quota grace 5 s, action 'protect' (the default: interrupt, then
restart on a shared card).

Attempts, one after another, each trying to allocate 10 GiB from the 4 GiB kernel:
  env-i      a child started with `env -i` (no caps in its environment, every card visible)
  isolated   a PyTorch child started with `python -I` (no site, no PYTHONPATH: no bootstrap)
  daemon     a double-forked child (re-parented to init: out of the kernel's process tree)
  cupy-raw   `cupy.cuda.runtime.malloc` in the kernel itself (no allocator cap applies)
then `env-i-5g` and `daemon-5g`: the same children asking 5 GiB, which the card has room for, to time the
watchdog (the daemon, in a session of its own, gets no interrupt: it takes the restart), and
`no-gpu`: a kernel started without a GPU (kernel_quotas 0MiB) unsets CUDA_VISIBLE_DEVICES and asks
torch.cuda.is_available().

Per attempt it records what was allocated (the child's own word and NVML), whether and how it was stopped
(its own out-of-memory error, the cap, card isolation, the watchdog's interrupt/restart, the cgroup's end)
and how fast, the kernel's events, and whether any neighbour saw an error. Everything goes to
OUT_DIR/check_escapes.json.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from jupyter_client import BlockingKernelClient  # noqa: E402

TOKEN = "check-escapes"
GIB = 2**30
NEIGHBOURS = 4
ALLOC = (
    "import sys, time, torch\n"
    "try:\n"
    "    x = torch.empty({gib} * 2**30, dtype=torch.uint8, device='cuda'); x.fill_(1); torch.cuda.synchronize()\n"
    "    print('ALLOCATED', flush=True)\n"
    "except Exception as e:\n"
    "    print('FAILED', type(e).__name__, str(e)[:300].replace(chr(10), ' '), flush=True); sys.exit(3)\n"
    "time.sleep(120)\n"
)
NEIGHBOUR = """
import json, threading, time, torch
state = {"errors": [], "touches": 0, "held_mib": 0}
def _hold():
    # The device's total is the kernel's quota, as the bootstrap shows it.
    n = int((torch.cuda.get_device_properties(0).total_memory - torch.cuda.memory_reserved()) * 0.97)
    x = torch.empty(n, dtype=torch.uint8, device="cuda"); x.fill_(1); torch.cuda.synchronize()
    state["held_mib"] = n // 2**20
    while True:
        try:
            y = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda"); y.fill_(2); x[:1].add_(1)
            torch.cuda.synchronize(); del y; state["touches"] += 1
        except Exception as e:
            state["errors"].append(f"{time.time():.1f} {type(e).__name__}: {str(e)[:200]}")
        time.sleep(0.2)
threading.Thread(target=_hold, daemon=True).start()
time.sleep(8)
print(json.dumps(state))
"""
ATTEMPTS = {
    "env-i": "import subprocess, sys\np = subprocess.Popen(['env', '-i', sys.executable, '-c', ALLOC], stdout=open(LOG, 'w'))\nprint(p.pid)",
    "isolated": "import subprocess, sys\np = subprocess.Popen([sys.executable, '-I', '-c', ALLOC], stdout=open(LOG, 'w'))\nprint(p.pid)",
    "daemon": (
        "import os, sys\nr, w = os.pipe()\n"
        "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        os.write(w, str(os.getpid()).encode()); os.close(w)\n"
        "        fd = os.open(LOG, os.O_WRONLY | os.O_CREAT | os.O_TRUNC); os.dup2(fd, 1)\n"
        "        os.execv(sys.executable, [sys.executable, '-c', ALLOC])\n    os._exit(0)\n"
        "os.close(w)\nprint(int(os.read(r, 20)))"
    ),
    "cupy-raw": (
        "import os, cupy\ntry:\n    _raw = cupy.cuda.runtime.malloc(GIB * 2**30); open(LOG, 'w').write('ALLOCATED\\n')\n"
        "except Exception as e:\n    open(LOG, 'w').write(f'FAILED {type(e).__name__} {e}\\n')\nprint(os.getpid())"
    ),
}


class Server:
    def __init__(self, work: Path, settings: dict):
        self.work = work
        for sub in ("config", "data", "runtime", "root"):
            (work / sub).mkdir(parents=True, exist_ok=True)
        self.env = {
            **os.environ,
            "JUPYTER_CONFIG_DIR": str(work / "config"),
            "JUPYTER_DATA_DIR": str(work / "data"),
            "JUPYTER_RUNTIME_DIR": str(work / "runtime"),
        }
        for name in ("neighbour", "nogpu"):  # kernelspecs whose quotas the config sets (kernel_quotas)
            spec = work / "data" / "kernels" / name
            spec.mkdir(parents=True, exist_ok=True)
            argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
            (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": name, "language": "python"}))
        (work / "config" / "jupyter_server_config.json").write_text(json.dumps({"GpuShareApp": settings}))
        self.port = 18000 + os.getpid() % 1000
        self.log = open(work / "server.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", f"--port={self.port}", f"--IdentityProvider.token={TOKEN}",
             "--ServerApp.open_browser=False", "--allow-root", f"--ServerApp.root_dir={work / 'root'}"],
            stdout=self.log, stderr=subprocess.STDOUT, env=self.env,
        )  # fmt: skip
        deadline = time.monotonic() + 90
        while True:
            try:
                self.call("GET", "api/status")
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((work / "server.log").read_text()[-3000:]) from None
                time.sleep(0.3)

    def call(self, method: str, path: str, body: dict | None = None):
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/{path}", method=method, headers={"Authorization": f"token {TOKEN}"},
            data=json.dumps(body).encode() if body is not None else None,
        )  # fmt: skip
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read() or b"null")

    def kernel(self, name: str = "python3") -> str:
        return self.call("POST", "api/kernels", {"name": name})["id"]

    def client(self, kid: str) -> BlockingKernelClient:
        kc = BlockingKernelClient(connection_file=str(self.work / "runtime" / f"kernel-{kid}.json"))
        kc.load_connection_file()
        kc.start_channels()
        deadline = time.monotonic() + 120
        while True:  # a client with no kernel manager takes a heartbeat not yet beating for a dead kernel
            try:
                kc.wait_for_ready(timeout=120)
                return kc
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def events(self, kid: str) -> list[dict]:
        return [e for e in self.call("GET", "api/gpushare/events")["events"] if e.get("kernel_id") == kid]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def run(kc: BlockingKernelClient, code: str, timeout: float = 120) -> tuple[str, str]:
    """(status, printed text) of one cell."""
    out: list[str] = []

    def hook(msg):
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append(f"{msg['content']['ename']}: {msg['content']['evalue']}")

    reply = kc.execute_interactive(code, output_hook=hook, timeout=timeout)
    return reply["content"]["status"], "".join(out)


SIMULATE = os.environ.get("CHECK_SIMULATE") == "1"  # the plumbing only, on a simulated card (no GPU here)


def nvml_use() -> dict[int, int]:
    if SIMULATE:
        return {}
    import pynvml

    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    return {p.pid: (p.usedGpuMemory or 0) // 2**20 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}


def attempt(server: Server, kid: str, name: str, code: str, gib: int, log: Path, watch_s: float) -> dict:
    """Start one attempt in the kernel ``kid`` and watch it for ``watch_s`` seconds."""
    kc = server.client(kid)
    prelude = f"ALLOC = {ALLOC.format(gib=gib)!r}\nLOG = {str(log)!r}\nGIB = {gib}\n"
    t0 = time.time()
    status, text = run(kc, prelude + code)
    kc.stop_channels()
    record: dict = {"attempt": name, "gib": gib, "cell": status, "cell_output": text.strip()[-400:]}
    try:
        pid = int(next(line for line in text.split("\n") if line.strip().isdigit()))  # (warnings may follow)
    except StopIteration:
        record["error"] = "no pid printed"
        return record
    record["pid"] = pid
    peak, gone_at, said = 0, None, ""
    while time.time() - t0 < watch_s:
        use = nvml_use().get(pid, 0)
        peak = max(peak, use)
        said = log.read_text() if log.exists() else ""
        alive = os.path.exists(f"/proc/{pid}") and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
        if said.startswith("FAILED") or not alive:
            gone_at = time.time() - t0
            break
        time.sleep(0.25)
    rec = server.call("GET", f"api/gpushare/kernels/{kid}")
    record.update(
        {
            "child_said": said.strip()[:300],
            "nvml_peak_mib": peak,
            "ended_after_s": round(gone_at, 1) if gone_at is not None else None,
            "kernel_state": rec["state"],
            "held": rec.get("held"),
            "events": [
                (round(e["time"] - t0, 1), e["kind"], e["message"][:160]) for e in server.events(kid) if e["time"] >= t0
            ],
        }
    )
    return record


def card_zero() -> tuple[int, str]:
    """Card 0's memory in MiB and what it is (name, memory, driver), by NVML."""
    if SIMULATE:
        return 81559, "simulated (the plumbing only)"
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    total = pynvml.nvmlDeviceGetMemoryInfo(h).total // 2**20
    text = lambda v: v.decode() if isinstance(v, bytes) else v  # noqa: E731
    return (
        total,
        f"{text(pynvml.nvmlDeviceGetName(h))} ({total} MiB), driver {text(pynvml.nvmlSystemGetDriverVersion())}",
    )


def main(out_dir: str) -> int:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    total, device = card_zero()
    # The test kernel: 4 GiB + 640 MiB; the neighbours: the rest of the card less 1 GiB headroom, in four.
    neighbour_quota = (total - 1024 - (4096 + 640)) // NEIGHBOURS - 640 - 16
    result: dict = {
        "what": "bench/gpu/check_escapes.py: escapes from a 4 GiB kernel, neighbours holding the rest of the card",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "python": platform.python_version(),
        "neighbour_quota_mib": neighbour_quota,
        "attempts": [],
    }
    from jupyter_gpushare.cli.doctor import diagnose

    result["doctor"] = [f.to_dict() for f in diagnose() if f.check.startswith("tier")]
    work = Path(tempfile.mkdtemp(prefix="escapes-"))
    settings = {
        "gpu_backend": "nvml", "ledger_path": str(work / "ledger.sqlite"), "default_quota": "4GiB",
        "over_quota_grace": 5, "sample_interval": 0.5, "on_full": "reject",
        "kernel_quotas": {"neighbour": f"{neighbour_quota}MiB", "nogpu": "0MiB"},
    }  # fmt: skip
    if SIMULATE:
        settings.update(gpu_backend="simulated", simulated_cards=f"{total}MiB")
    server = Server(work, settings)
    try:
        result["enforcement"] = server.call("GET", "api/gpushare/state").get("enforcement")
        neighbours = [server.kernel("neighbour") for _ in range(NEIGHBOURS)]
        clients = [server.client(k) for k in neighbours]
        for kc in clients:
            kc.execute(NEIGHBOUR)
        time.sleep(12)
        result["neighbours_start"] = [run(kc, "print(json.dumps(state))")[1].strip() for kc in clients]
        for name, gib, watch in [(n, 10, 25) for n in ATTEMPTS] + [("env-i", 5, 40), ("daemon", 5, 40)]:
            kid = server.kernel()
            log = work / f"{name}-{gib}.log"
            record = attempt(server, kid, name if gib == 10 else f"{name}-{gib}g", ATTEMPTS[name], gib, log, watch)
            record["card_after"] = server.call("GET", "api/gpushare/cards")["cards"][0]
            result["attempts"].append(record)
            print(json.dumps(record)[:600], flush=True)
            server.call("DELETE", f"api/kernels/{kid}")
            time.sleep(2)
        kid = server.kernel("nogpu")
        kc = server.client(kid)
        probe = (
            "import os\nos.environ.pop('CUDA_VISIBLE_DEVICES', None)\n"
            "for p in ('/dev/nvidiactl', '/dev/nvidia0'):\n"
            "    try:\n        os.close(os.open(p, os.O_RDWR)); print(p, 'opened')\n"
            "    except OSError as e:\n        print(p, e.strerror)\n"
            "import torch\nprint('cuda available:', torch.cuda.is_available())"
        )
        status, said = run(kc, probe)
        kc.stop_channels()
        result["no_gpu"] = {
            "cell": status,
            "output": said.strip()[-400:],
            "kernel": server.call("GET", f"api/gpushare/kernels/{kid}"),
        }
        print(json.dumps(result["no_gpu"])[:600], flush=True)
        result["neighbours_end"] = [run(kc, "print(json.dumps(state))")[1].strip() for kc in clients]
        errors = [json.loads(s)["errors"] for s in result["neighbours_end"] if s.startswith("{")]
        result["neighbour_errors"] = sum(len(e) for e in errors)
        print("neighbour errors:", result["neighbour_errors"], flush=True)
    finally:
        server.stop()
        shutil.copy(work / "server.log", out / "server.log")
        (out / "check_escapes.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
