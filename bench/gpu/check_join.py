"""Join again in place on a real GPU: a kernel whose wait ended without a GPU joins the line again, keeps its
variables and its process, and its PyTorch then runs on the card it is granted.

Run on a GPU machine after `source bench/gpu/device_env.sh` (a real jupyter-server with the extension on NVML,
real kernels, as root):

    python3 bench/gpu/check_join.py OUT_DIR [--runs 3]

Each kernel's quota is 45% of the card, so two fit and a third waits. Per run: notebooks A and B hold the card; C
opens and waits, runs a CPU cell (a variable), stops waiting (it runs on without a GPU), and joins again
(``POST .../join``): the same process back in line. A cell of C that uses PyTorch waits for the grant; A's notebook
closes, and the cell goes on: the variable is kept, the pid is the same, PyTorch sees the card (its size is the
quota's view), allocates 30% of the card, and NVML lists C's process with that memory. Every run is recorded:
OUT_DIR/check_join-runN.json.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_escapes import Server, nvml_use, run  # noqa: E402
from check_park_server import card_meta, record_runs, recorded, session, state, wait_state  # noqa: E402

SETTINGS = {"gpu_backend": "nvml", "default_quota": "45%", "park_after": 0, "queue_timeout": 300,
            "over_quota_action": "notify"}  # fmt: skip
GPU_CELL = (
    "import torch, os\n"
    "n = int(0.3 * torch.cuda.get_device_properties(0).total_memory) // 4\n"
    "y = torch.ones(n, device='cuda'); torch.cuda.synchronize()\n"
    "print('JOINED', kept, os.getpid(), torch.cuda.get_device_name(0).replace(' ', '_'),"
    " torch.cuda.mem_get_info()[1] // 2**20, n * 4 // 2**20, os.environ.get('GPUSHARE_MODE'))"
)


def one_run(work: Path) -> dict:
    server = Server(work, SETTINGS)
    out: dict = {}
    with recorded(server, work, out) as watched:
        sa, a = session(server, "a.ipynb")
        sb, b = session(server, "b.ipynb")
        sc, c = session(server, "c.ipynb")
        watched["c"] = c
        out["c_state_at_open"] = state(server, c)
        kc = server.client(c)
        status, said = run(kc, "kept = 'mine'; import os; print(os.getpid())")
        out["c_pid"] = int(said.split()[-1])
        server.call("DELETE", f"api/gpushare/kernels/{c}")  # stop waiting
        out["c_after_stop"] = wait_state(server, c, "cpu")
        t0 = time.monotonic()
        joined = server.call("POST", f"api/gpushare/kernels/{c}/join")
        out["join_s"] = round(time.monotonic() - t0, 3)
        out["c_state_after_join"] = joined.get("state")
        waited_then_released(server, kc, c, sa, out)
        for sid in (sb, sc):
            server.call("DELETE", f"api/sessions/{sid}")
    return out


def waited_then_released(server: Server, kc, kernel_id: str, holder: str, out: dict) -> None:
    """Run GPU_CELL in kernel ``kernel_id`` (client ``kc``) while the card is full: it must wait; then close the
    session ``holder`` (a notebook that holds the card), and read what the cell did once it went on."""
    got: dict = {}
    cell = threading.Thread(target=lambda: got.update(zip(("status", "said"), run(kc, GPU_CELL, timeout=300))))
    cell.start()
    time.sleep(3.0)
    out["cell_waiting"] = cell.is_alive()
    out["c_state_while_waiting"] = state(server, kernel_id)
    server.call("DELETE", f"api/sessions/{holder}")
    t1 = time.monotonic()
    cell.join(300)
    out["cell_after_release_s"] = round(time.monotonic() - t1, 2)
    read_cell(server, kernel_id, got, out)


def read_cell(server: Server, kernel_id: str, got: dict, out: dict) -> None:
    """What GPU_CELL printed in kernel ``kernel_id`` (``got``: its status and output), and what the server and NVML
    say of that kernel now, into ``out``."""
    out["cell_status"] = got.get("status")
    line = next((x for x in (got.get("said") or "").splitlines() if x.startswith("JOINED")), "")
    out["cell_said"] = line
    fields = line.split()
    if len(fields) == 8:
        _, kept, pid, name, total, alloc, mode = fields[:7]
        out.update(kept=kept, same_pid=int(pid) == out["c_pid"], device=name, torch_total_mib=int(total),
                   allocated_mib=int(alloc), mode=mode)  # fmt: skip
    rec = next(k for k in server.call("GET", "api/gpushare/kernels")["kernels"] if k["kernel_id"] == kernel_id)
    out.update(c_state=rec["state"], c_quota_mib=rec.get("quota_mib"), c_reserved_mib=rec.get("reserved_mib"))
    out["c_nvml_mib"] = nvml_use().get(out["c_pid"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    record_runs(
        args.out, args.runs, "check_join", card_meta(SETTINGS), one_run, ("events_c", "server_log_tail", "settings")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
