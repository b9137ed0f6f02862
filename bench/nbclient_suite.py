"""nbclient's own test suite, run with jupyter-gpushare's provisioner as every kernel's default, or without it.

nbclient (and papermill on it) starts kernels through jupyter_client, also from forked workers
(test_many_parallel_notebooks): with our provisioner as the default that once hung, because a forked worker
inherited the parent's manager and its SQLite connection. Its suite is a real program's tests, not ours.

    python bench/nbclient_suite.py OUT.json [--runs 1]    # both ways, side by side: the time ratio
Used by tests/launch/test_nbclient_suite.py (with the provisioner only).

The suite's source comes from the nbclient sdist of the installed version (pip download: nbclient's wheel
has no tests); its test-only dependencies go into a virtualenv that sees this environment's packages, so
they do not change the environment our own tests run in.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _sdist  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# nbclient's [test] extra, less what our own [test] extra brings (pytest, ipykernel, nbconvert, ...)
SUITE_DEPS = ("pytest-asyncio>=1.3.0", "flaky", "ipywidgets", "testpath", "xmltodict")
# A card large enough that nbclient's parallel tests never wait in the queue: they test nbclient, not the queue
GPUSHARE = {"gpu_backend": "simulated", "simulated_cards": "64GiB", "default_quota": "512MiB",
            "context_reserve": "512MiB", "card_headroom": "0MiB"}  # fmt: skip


def prepare(workdir: Path) -> tuple[Path, Path]:
    """nbclient's source tree (its tests) and a Python that has its test dependencies: (python, source)."""
    import nbclient

    return _sdist.prepare("nbclient", nbclient.__version__, SUITE_DEPS, workdir)


def run(python: Path, src: Path, workdir: Path, gpushare: bool, timeout: float = 900) -> dict:
    """One run of nbclient's suite; with ``gpushare``, our provisioner is every kernel's default (a simulated
    card, a ledger of its own). Returns the counts, the seconds it took, the failures and the ledger's state."""
    run_dir = workdir / ("with-gpushare" if gpushare else "without")
    config = run_dir / "config"
    config.mkdir(parents=True, exist_ok=True)
    ledger = run_dir / "ledger.sqlite"
    ledger.unlink(missing_ok=True)
    # Without: jupyter_client's own default, named (the wheel's .pth would otherwise make ours the default).
    env = _sdist.suite_env(JUPYTER_DEFAULT_PROVISIONER_NAME="local-provisioner")
    env.update(
        JUPYTER_CONFIG_DIR=str(config),
        JUPYTER_DATA_DIR=str(run_dir / "data"),
        JUPYTER_RUNTIME_DIR=str(run_dir / "runtime"),
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")])),  # this checkout's code
    )
    if gpushare:
        settings = {**GPUSHARE, "ledger_path": str(ledger)}
        (config / "jupyter_server_config.json").write_text(json.dumps({"GpuShareApp": settings}))
        env["JUPYTER_DEFAULT_PROVISIONER_NAME"] = "gpushare-provisioner"
    # (nbclient's own config turns warnings into errors; pytest-asyncio 1.x warns at start where the loop scope is unset)
    cmd = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
           "-o", "asyncio_default_fixture_loop_scope=function", "tests"]  # fmt: skip
    t0 = time.monotonic()
    try:
        out = subprocess.run(cmd, cwd=src, env=env, capture_output=True, text=True, timeout=timeout)
        text, rc = out.stdout + out.stderr, out.returncode
    except subprocess.TimeoutExpired as e:
        text, rc = f"{e.stdout or ''}{e.stderr or ''}\nTIMED OUT after {timeout} s", None
        text = text if isinstance(text, str) else text.decode(errors="replace")
    seconds = round(time.monotonic() - t0, 1)
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)", text)}
    leases = reaped = None
    if gpushare and ledger.exists():
        from jupyter_gpushare.ledger.ledger import Ledger

        # a kernel the suite leaves running (cleanup_kc=False) ends soon after the suite's process (ipykernel
        # polls its parent); its lease is then a dead holder's, which the next reservation reaps. What is
        # still left once those kernels had 20 s to end was held for nobody.
        book, reaped, deadline = Ledger(str(ledger)), 0, time.monotonic() + 20
        while True:
            reaped += len(book.reap())
            leases = len(book.leases())
            if not leases or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    return {
        "gpushare": gpushare,
        "rc": rc,
        "seconds": seconds,
        "counts": counts,
        "failures": re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.M),
        "ledger_used": ledger.exists() if gpushare else None,
        "leases_reaped": reaped,
        "leases_left": leases,
        "tail": text[-3000:],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="JSON file for the figures")
    ap.add_argument("--runs", type=int, default=1, help="pairs of runs (without, then with the provisioner)")
    ap.add_argument("--workdir", default="/tmp/gpushare-nbclient-suite")
    args = ap.parse_args()
    workdir = Path(args.workdir)
    python, src = prepare(workdir)
    runs = []
    for i in range(args.runs):
        for gpushare in (False, True):
            r = run(python, src, workdir, gpushare)
            print(f"run {i + 1} {'with' if gpushare else 'without'} the provisioner: {r['counts']} in {r['seconds']} s"
                  f"{'; failures: ' + ', '.join(r['failures']) if r['failures'] else ''}", flush=True)  # fmt: skip
            runs.append({k: v for k, v in r.items() if k != "tail"} | {"run": i + 1})
    pairs = [(a["seconds"], b["seconds"]) for a, b in zip(runs[::2], runs[1::2], strict=True)]
    ratios = [round(b / a, 2) for a, b in pairs]
    print(f"time with / without the provisioner: {ratios} (target: at most 1.5)")
    doc = {"what": "nbclient's own test suite, with and without jupyter-gpushare's provisioner as the default",
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": f"{os.cpu_count()} CPUs",
           "nbclient": src.name, "runs": runs, "ratios": ratios}  # fmt: skip
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
