"""line_place = 'first-use' on a real GPU: a notebook's kernel holds nothing until its first GPU import, which asks
for its GPU, waits in its cell while the card is full, and goes on in the same process with PyTorch on its quota.

Run on a GPU machine after `source bench/gpu/device_env.sh` (a real jupyter-server with the extension on NVML,
real kernels, as root):

    python3 bench/gpu/check_first_use.py OUT_DIR [--runs 3]

Each kernel's quota is 45% of the card, so two fit. Per run: notebooks C, A and B open in that order (all
``standby``: nothing reserved); C runs a CPU cell (a variable); A and B import PyTorch and allocate, so they are
granted, though they opened after C; C's PyTorch cell then waits (``queued``, #1); A's notebook closes, and C's
cell goes on: the variable is kept, the pid is the same, PyTorch sees its quota's view of the card, allocates 30%
of the card, and NVML lists C's process with that memory. Every run is recorded: OUT_DIR/check_first_use-runN.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_escapes import Server, run  # noqa: E402
from check_join import SETTINGS, waited_then_released  # noqa: E402
from check_park_server import card_meta, record_runs, recorded, session, state  # noqa: E402

FIRST_USE = {**SETTINGS, "line_place": "first-use"}
TAKE = "import torch; x = torch.ones(2**28, device='cuda'); torch.cuda.synchronize(); print('TOOK')"


def one_run(work: Path) -> dict:
    server = Server(work, FIRST_USE)
    out: dict = {}
    with recorded(server, work, out) as watched:
        sc, c = session(server, "c.ipynb")
        watched["c"] = c
        sa, a = session(server, "a.ipynb")
        sb, b = session(server, "b.ipynb")
        out["states_at_open"] = [state(server, k) for k in (c, a, b)]
        out["reserved_at_open_mib"] = server.call("GET", "api/gpushare/cards")["cards"][0]["reserved_mib"]
        kc = server.client(c)
        status, said = run(kc, "kept = 'mine'; import os; print(os.getpid())")
        out["c_pid"] = int(said.split()[-1])
        out["c_state_after_cpu_cell"] = state(server, c)
        for name, kid in (("a", a), ("b", b)):
            t0 = time.monotonic()
            status, said = run(server.client(kid), TAKE, timeout=300)
            out[f"{name}_first_gpu_cell"] = {
                "status": status,
                "took": "TOOK" in said,
                "s": round(time.monotonic() - t0, 2),
            }
        waited_then_released(server, kc, c, sa, out)
        for sid in (sb, sc):
            server.call("DELETE", f"api/sessions/{sid}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    meta = card_meta(FIRST_USE)
    record_runs(args.out, args.runs, "check_first_use", meta, one_run, ("events_c", "server_log_tail", "settings"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
