"""What a Jupyter server's start and a batch program's provisioner cost in CPU, side by side in one run.

A class that logs in at once starts one jupyter-server per student beside the kernels that already compute. Each is
timed from its launch to its first answer (GET /api/status), with its CPU (the process's own and its children's):

- with every server extension installed here (JupyterLab, Notebook 7, ... and ours), and with ours alone;
- each of them again with jsonschema's IRI format checker ``rfc3987-syntax`` kept from loading (its import builds
  its parsers: jupyter_server issue 1559). jsonschema skips a format checker it cannot import, and no Jupyter schema
  uses those formats; installing ``rfc3987`` (GPL-3), which jsonschema prefers, has the same effect.

Then the import of our provisioner, which every jupyter_client program of the environment loads (`jupyter console`,
`jupyter kernel`, a script's KernelManager): its CPU, and whether it brought jupyter_server along.

    python bench/bench_server_start.py [--rounds 3] [--json bench/results/server_start-<date>.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
from bench_sampler import free_port  # (a bench script beside this one)

OTHERS = ("jupyterlab", "notebook", "jupyter_lsp", "jupyter_server_terminals", "notebook_shim", "nbclassic")
# the program run, with rfc3987-syntax kept from loading or not: an entry of None in sys.modules is an ImportError
SERVER = "import sys, runpy\nif {block}: sys.modules['rfc3987_syntax'] = None\nrunpy.run_module('jupyter_server', run_name='__main__')"
WAYS = {
    "every extension": (False, False),
    "every extension, no rfc3987-syntax": (False, True),
    "ours alone": (True, False),
    "ours alone, no rfc3987-syntax": (True, True),
}


def start_once(ours_alone: bool, block: bool) -> tuple[float, float]:
    """(wall s, CPU s) of one server's start to its first answer."""
    with tempfile.TemporaryDirectory() as d:
        port, env = free_port(), None
        if ours_alone:
            config = Path(d, "config")
            config.mkdir()
            extensions = {**dict.fromkeys(OTHERS, False), "jupyter_gpushare": True}
            (config / "jupyter_server_config.json").write_text(
                json.dumps({"ServerApp": {"jpserver_extensions": extensions}})
            )
            env = {**os.environ, "JUPYTER_CONFIG_DIR": str(config)}
        argv = [sys.executable, "-c", SERVER.format(block=block), f"--port={port}", "--ServerApp.port_retries=0",
                "--IdentityProvider.token=t", "--allow-root", "--ServerApp.open_browser=False",
                f"--ServerApp.root_dir={d}", "--GpuShareApp.gpu_backend=simulated",
                f"--GpuShareApp.ledger_path={d}/ledger.sqlite"]  # fmt: skip
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        try:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"the server exited with {proc.returncode}: {argv}")
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token=t", timeout=5).read()
                    break
                except OSError:
                    time.sleep(0.05)
            wall = time.monotonic() - t0
            cpu = psutil.Process(proc.pid).cpu_times()
            return wall, cpu.user + cpu.system + cpu.children_user + cpu.children_system
        finally:
            proc.terminate()
            proc.wait(30)


def provisioner_import() -> tuple[float, list[str]]:
    """CPU s of a fresh interpreter that imports our provisioner, and the heavy modules it brought."""
    code = (
        "import sys, jupyter_gpushare.launch.provisioner\n"
        "import json; print(json.dumps([m for m in ('jupyter_server', 'jupyter_events', 'jsonschema') if m in sys.modules]))"
    )
    before = psutil.Process().cpu_times()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    after = psutil.Process().cpu_times()
    cpu = after.children_user + after.children_system - before.children_user - before.children_system
    return cpu, json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    runs: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
    for _ in range(args.rounds):  # the ways interleaved, so that a change of the machine's load falls on all of them
        for way, (ours_alone, block) in WAYS.items():
            runs[way].append(start_once(ours_alone, block))
    imports = [provisioner_import() for _ in range(args.rounds)]
    medians = {way: {"wall_s": statistics.median(w for w, _ in r), "cpu_s": statistics.median(c for _, c in r)}
               for way, r in runs.items()}  # fmt: skip
    base = medians["every extension"]["cpu_s"]
    print(f"jupyter-server start to its first answer, median of {args.rounds} ({psutil.cpu_count()} CPUs)")
    for way, m in medians.items():
        print(f"  {way:38} wall {m['wall_s']:5.2f} s  CPU {m['cpu_s']:5.2f} s  CPU ratio {m['cpu_s'] / base:.2f}")
    cpu = statistics.median(c for c, _ in imports)
    print(f"our provisioner's import: CPU {cpu:.2f} s, brought {sorted(set(sum((b for _, b in imports), [])))}")
    if args.json:
        figures = {
            "date": time.strftime("%Y-%m-%d"),
            "cpus": psutil.cpu_count(),
            "python": platform.python_version(),
            "rounds": args.rounds,
            "runs": {way: [{"wall_s": round(w, 2), "cpu_s": round(c, 2)} for w, c in r] for way, r in runs.items()},
            "medians": medians,
            "provisioner_import_cpu_s": [round(c, 2) for c, _ in imports],
            "provisioner_import_brought": imports[0][1],
        }
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
