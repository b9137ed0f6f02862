"""TensorFlow in a kernel that waits for its GPU, on a real GPU through a real jupyter-server: its import runs while
the kernel waits (``_gpushare_wait.IMPORTS_FIRST``), and at the grant its cell goes on with TensorFlow on its quota.

Run on a GPU machine after `source bench/gpu/device_env.sh` and then `source /tmp/tfgpu-env.sh` (TensorFlow's GPU
build, ../shared/tools/tf-gpu), as root:

    python3 bench/gpu/check_tf_wait.py OUT_DIR [--runs 3] [--label after]

The control, the code before (where TensorFlow imports only after the grant), from its own folder: the server runs
``python -m jupyter_server`` in the working directory, which ``python -m`` puts first on sys.path:

    cd bench/gpu/before && PYTHONPATH=$PWD:/tmp/site:/tmp/tfsite:/tmp/tfdeps \
        python3 ../check_tf_wait.py OUT_DIR --label before

Each kernel's quota is 45% of the card, so two fit. Per run: notebooks A and B hold the card (PyTorch allocates 30%
of it in each); C opens (#1 in line) and runs a TensorFlow cell. The check reads C's /proc/<pid>/maps: whether
TensorFlow's library is mapped while C waits; after ``SETTLE_S`` (TensorFlow's import takes 9-14 s there) it
closes A's notebook and times C's cell from that moment: when its import returned, and when its first GPU use was
done. The cell lists the GPUs, reads its logical device's limit, allocates 60% of its quota (must fit) and 130%
(must be refused), and NVML lists C's process. Every run is recorded: OUT_DIR/check_tf_wait-LABEL-runN.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_escapes import SIMULATE, Server, nvml_use, run  # noqa: E402
from check_first_use import TAKE  # noqa: E402
from check_join import SETTINGS  # noqa: E402
from check_park_server import card_meta, record_runs, recorded, session, state  # noqa: E402

SETTLE_S = 25.0
TF_CELL = """
import json, os, time
imported = time.time()
import tensorflow as tf
imported = (imported, time.time())
gpus = tf.config.list_physical_devices('GPU')
limit = [c.memory_limit for c in tf.config.get_logical_device_configuration(gpus[0])] if gpus else None
quota = int(os.environ.get('GPUSHARE_QUOTA_MIB') or 0)
tries = {}
for share in (0.6, 1.3):
    try:
        with tf.device('/GPU:0'):
            t = tf.ones((int(quota * share) * 2**18,), tf.float32)
            float(tf.reduce_sum(t).numpy())
        tries[share] = 'ok'
        del t
    except Exception as e:
        tries[share] = type(e).__name__
print('TF', json.dumps({'pid': os.getpid(), 'imported': imported, 'done': time.time(), 'gpus': len(gpus),
                        'limit_mib': limit, 'quota_mib': quota, 'tries': tries, 'mode': os.environ.get('GPUSHARE_MODE'),
                        'version': tf.__version__}))
"""


def mapped(pid: int, library: str) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return library in f.read()


def one_run(work: Path) -> dict:
    settings = {**SETTINGS, "gpu_backend": "simulated", "simulated_cards": "80GiB"} if SIMULATE else SETTINGS
    server = Server(work, settings)
    out: dict = {}
    with recorded(server, work, out) as watched:
        sa, a = session(server, "a.ipynb")
        sb, b = session(server, "b.ipynb")
        for name, kid in (("a", a), ("b", b)):
            status, said = run(server.client(kid), TAKE if not SIMULATE else "print('TOOK')", timeout=300)
            out[f"{name}_took"] = status == "ok" and "TOOK" in said
        sc, c = session(server, "c.ipynb")
        watched["c"] = c
        kc = server.client(c)
        status, said = run(kc, "import os; print(os.getpid())")
        pid = out["c_pid"] = int(said.split()[-1])
        got: dict = {}
        cell = threading.Thread(target=lambda: got.update(zip(("status", "said"), run(kc, TF_CELL, timeout=300))))
        t0 = time.time()
        cell.start()
        seen = None
        while time.time() - t0 < SETTLE_S:
            if seen is None and mapped(pid, "libtensorflow_framework"):
                seen = round(time.time() - t0, 2)
            time.sleep(0.2)
        out["tf_mapped_while_waiting_after_s"] = seen
        out["c_state_at_release"] = state(server, c)
        released = time.time()
        server.call("DELETE", f"api/sessions/{sa}")
        cell.join(300)
        out["cell_status"] = got.get("status")
        line = next((x for x in (got.get("said") or "").splitlines() if x.startswith("TF ")), "")
        if line:
            said = json.loads(line[3:])
            out.update(said, same_pid=said["pid"] == pid)
            out["import_returned_after_release_s"] = round(said["imported"][1] - released, 2)
            out["first_use_done_after_release_s"] = round(said["done"] - released, 2)
            out["cell_s"] = round(said["done"] - t0, 2)
        else:
            out["cell_said"] = (got.get("said") or "")[-1500:]
        out["c_nvml_mib"] = nvml_use().get(pid)
        for sid in (sb, sc):
            server.call("DELETE", f"api/sessions/{sid}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--label", default="after")
    args = ap.parse_args()
    meta = {"simulated": True, "settings": SETTINGS} if SIMULATE else card_meta(SETTINGS)
    record_runs(args.out, args.runs, f"check_tf_wait-{args.label}", meta, one_run, ("events_c", "server_log_tail"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
