"""Parking through a real jupyter-server on a real GPU: the line, the parking and the driver's checkpoint together.

Run on a GPU machine after `source bench/gpu/device_env.sh` (a real jupyter-server with the extension on NVML,
real kernels, as root):

    python3 bench/gpu/check_park_server.py OUT_DIR [--runs 3] [--cached]

Each kernel's quota is 45% of the card, so two fit and a third waits. Per run: notebook A allocates 4 GiB
of known data with PyTorch and goes idle; notebook B runs a long cell (busy: not parked); notebook C opens and
waits in line. With
park_after = 5 s, the server parks A (the idle one): NVML must list A's process no more, and C is granted and
allocates 30% of the card. Then A is asked back (POST .../resume; in a browser its next cell does it, tests/server/
test_parking.py), waits in line while B and C hold the card, and is restored once B's notebook is closed: its
data must be intact, in the same process. Every run is recorded: OUT_DIR/check_park_server-runN.json.

``--cached``: A also allocates 4 GiB of scratch and frees it without ``empty_cache()``, so that PyTorch's allocator
keeps it (about 8.8 GiB on the card): the server must ask the kernel to give the cache back before the park
(the ``parked`` event's ``trimmed``), and move only the 4 GiB in use (``parked_mib``, ``park_s``).
Recorded as OUT_DIR/check_park_server-cached-runN.json.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_escapes import Server, nvml_use, run  # noqa: E402

SETTINGS = {"gpu_backend": "nvml", "default_quota": "45%", "park_after": 5.0, "queue_timeout": 300,
            "over_quota_action": "notify"}  # fmt: skip
ALLOC = (
    "import torch, os\n"
    "x = torch.arange(4 * 2**30 // 4, device='cuda', dtype=torch.float32) % 9973\n"
    "torch.cuda.empty_cache(); torch.cuda.synchronize()\n"
    "print(float(x[::4096].double().sum()), os.getpid())"
)


CACHED = (  # 4 GiB more that PyTorch's allocator keeps after the tensor is freed
    "s = torch.empty(4 * 2**30 // 4, device='cuda'); s.fill_(1); del s; torch.cuda.synchronize()\n"
    "print(torch.cuda.memory_reserved() // 2**20, torch.cuda.memory_allocated() // 2**20)"
)


def session(server: Server, path: str) -> tuple[str, str]:
    s = server.call("POST", "api/sessions", {"path": path, "type": "notebook", "name": path,
                                              "kernel": {"name": "python3"}})  # fmt: skip
    return s["id"], s["kernel"]["id"]


def state(server: Server, kid: str) -> str | None:
    return next(
        (k["state"] for k in server.call("GET", "api/gpushare/kernels")["kernels"] if k["kernel_id"] == kid), None
    )


def wait_state(server: Server, kid: str, wanted: str, timeout: float = 120) -> float:
    t0 = time.monotonic()
    while state(server, kid) != wanted:
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"{kid} not {wanted} within {timeout} s (it is {state(server, kid)})")
        time.sleep(0.1)
    return round(time.monotonic() - t0, 2)


def one_run(work: Path, cached: bool) -> dict:
    server = Server(work, SETTINGS)
    out: dict = {}
    try:
        sa, a = session(server, "a.ipynb")
        sb, b = session(server, "b.ipynb")
        kc = server.client(a)
        status, said = run(kc, ALLOC)
        checksum, pid = said.split()
        if cached:
            status, said = run(kc, CACHED)
            out["a_torch_reserved_allocated_mib"] = [int(v) for v in said.split()]
        out.update(a_pid=int(pid), a_used_mib=nvml_use().get(int(pid)), checksum_before=float(checksum))
        kb = server.client(b)
        kb.execute("import time; time.sleep(3600)")  # B is busy: A (idle, 4 GiB on the card) is the one to park
        t0 = time.monotonic()
        sc, c = session(server, "c.ipynb")
        out["c_state_at_open"] = state(server, c)
        out["a_parked_after_s"] = wait_state(server, a, "parked")
        out["c_running_after_s"] = round(
            time.monotonic() - t0 - out["a_parked_after_s"] + wait_state(server, c, "running"), 2
        )
        time.sleep(1.0)
        out["a_used_parked_mib"] = nvml_use().get(int(pid))  # None: NVML lists it no more
        status, said = run(
            server.client(c),
            "import torch; n = int(0.3 * torch.cuda.get_device_properties(0).total_memory) // 4\n"
            "y = torch.ones(n, device='cuda'); torch.cuda.synchronize(); print(y.numel() == n, n * 4 // 2**20)",
        )
        out["c_alloc_status"], out["c_alloc_said"] = status, said.strip()
        out["c_allocated_30pct"] = status == "ok" and said.split()[:1] == ["True"]
        resumed: dict = {}
        ask = threading.Thread(target=lambda: resumed.update(server.call("POST", f"api/gpushare/kernels/{a}/resume")))
        t1 = time.monotonic()
        ask.start()
        out["a_queued_to_resume_after_s"] = wait_state(server, a, "queued")
        time.sleep(2.0)
        server.call("DELETE", f"api/sessions/{sb}")
        t2 = time.monotonic()
        ask.join(180)
        out["a_state_after_resume"] = resumed.get("state")
        out["a_waited_s"] = round(t2 - t1, 2)
        out["a_running_after_b_closed_s"] = round(time.monotonic() - t2, 2)
        status, said = run(kc, "print(float(x[::4096].double().sum()), os.getpid())")
        checksum, pid_after = said.split()
        out.update(checksum_after=float(checksum), same_pid=int(pid_after) == out["a_pid"],
                   data_intact=float(checksum) == out["checksum_before"], a_used_after_mib=nvml_use().get(int(pid)))  # fmt: skip
        out["events_a"] = [{k: e.get(k) for k in ("kind", "message", "params")} for e in server.events(a)]
        out["parking"] = server.call("GET", "api/gpushare/cards")["parking"]
        for sid in (sa, sc):
            server.call("DELETE", f"api/sessions/{sid}")
    except Exception as e:  # noqa: BLE001 (recorded)
        out["error"] = f"{type(e).__name__}: {e}"
        out["server_log_tail"] = (work / "server.log").read_text()[-3000:]
        with contextlib.suppress(Exception):
            out["events_a"] = [{k: e.get(k) for k in ("kind", "message", "params")} for e in server.events(a)]
    finally:
        server.stop()
    return out


@contextlib.contextmanager
def recorded(server: Server, work: Path, out: dict):
    """One run's body against ``server``: a failure is recorded in ``out`` with the server's log tail; then, always,
    the events of the kernel the body names (``watched["c"] = kernel_id``) and the server's stop."""
    watched: dict = {}
    try:
        yield watched
    except Exception as e:  # noqa: BLE001 (recorded)
        out["error"] = f"{type(e).__name__}: {e}"
        out["server_log_tail"] = (work / "server.log").read_text()[-3000:]
    finally:
        with contextlib.suppress(Exception):
            out["events_c"] = [{k: e.get(k) for k in ("kind", "message")} for e in server.events(watched["c"])]
        server.stop()


def card_meta(settings: dict) -> dict:
    """What every recorded run says of where it ran: card 0's name, the driver, the date, the server's settings."""
    import pynvml

    pynvml.nvmlInit()
    name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
    return {"gpu": name if isinstance(name, str) else name.decode(), "driver": pynvml.nvmlSystemGetDriverVersion(),
            "date": datetime.date.today().isoformat(), "settings": settings}  # fmt: skip


def record_runs(
    out: str, runs: int, stem: str, meta: dict, one_run: Callable[[Path], dict], quiet: tuple, first: int = 1
) -> None:
    """Run ``one_run`` ``runs`` times, each in a fresh folder; every run recorded as OUT/STEM-runN.json (N from
    ``first``: runs of several calls), and printed as one line without the ``quiet`` keys."""
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for n in range(first, first + runs):
        with tempfile.TemporaryDirectory() as work:
            result = {**meta, "run": n, **one_run(Path(work))}
        (out_dir / f"{stem}-run{n}.json").write_text(json.dumps(result, indent=1))
        print(json.dumps({k: v for k, v in result.items() if k not in quiet}), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cached", action="store_true", help="A keeps 4 GiB more in PyTorch's cache (module docstring)")
    args = ap.parse_args()
    stem = f"check_park_server{'-cached' if args.cached else ''}"
    meta = {**card_meta(SETTINGS), "cached": args.cached}
    record_runs(args.out, args.runs, stem, meta, lambda work: one_run(work, args.cached),
                ("events_a", "server_log_tail", "settings"))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
