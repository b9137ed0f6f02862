"""A program that starts a kernel, then forks workers that start kernels (a multiprocessing pool, a
ProcessPoolExecutor, papermill under a prefork worker): each worker gets its own manager and ledger connection,
never its parent's (whose ledger thread did not come along, and whose SQLite connection must not cross a fork).
Real kernels, jupyter_client's own start_new_kernel, our provisioner as the default."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

SCRIPT = textwrap.dedent(
    """
    import multiprocessing, os, time
    from concurrent.futures import ProcessPoolExecutor
    from jupyter_client.manager import start_new_kernel

    def one(_=None):
        from jupyter_gpushare.server.manager import process_manager
        t = time.monotonic()
        km, kc = start_new_kernel(kernel_name="python3", startup_timeout=60)
        mode = km.provisioner._grant.mode
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        return mode, os.getpid(), id(process_manager()), round(time.monotonic() - t, 2)

    if __name__ == "__main__":
        parent = one()
        with multiprocessing.get_context("fork").Pool(2) as pool:
            children = pool.map_async(one, range(2)).get(timeout=60)
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as ex:
            children.append(ex.submit(one).result(timeout=60))
        print("RESULT", [parent, *children], flush=True)
    """
)


def test_forked_workers_start_kernels_with_their_own_manager(tmp_path):
    config = tmp_path / "config"
    config.mkdir()
    settings = {"gpu_backend": "simulated", "simulated_cards": "10GiB", "default_quota": "1GiB",
                "card_headroom": "0MiB", "ledger_path": str(tmp_path / "ledger.sqlite")}  # fmt: skip
    (config / "jupyter_server_config.json").write_text(json.dumps({"GpuShareApp": settings}))
    (tmp_path / "fork_case.py").write_text(SCRIPT)
    env = {
        **os.environ,
        "JUPYTER_DEFAULT_PROVISIONER_NAME": "gpushare-provisioner",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),  # this checkout's code
        "JUPYTER_CONFIG_DIR": str(config),
        "JUPYTER_DATA_DIR": str(tmp_path / "data"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
    }
    done = subprocess.run(
        [sys.executable, str(tmp_path / "fork_case.py")], capture_output=True, text=True, timeout=150, env=env
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    results = eval(line.removeprefix("RESULT "))  # a list of tuples printed by the script above
    assert [mode for mode, *_ in results] == ["gpu"] * 4  # every one reserved through its own manager
    pids = {pid for _, pid, _, _ in results}
    assert len(pids) == 3 or len(pids) == 4  # the parent and its workers (a pool may reuse one for both maps)
    assert all(took < 30 for *_, took in results), results
