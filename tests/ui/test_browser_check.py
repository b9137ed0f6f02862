"""JupyterLab's own browser check passes with the extension installed, so a broken bundle fails CI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent  # (the tests folder, where the helper lives)
CHECK = HERE / "browser_check_system_chromium.py"


def test_jupyterlab_browser_check_with_the_extension(tmp_path, ui_tests_dir):
    env = {
        **os.environ,
        "JUPYTER_DATA_DIR": str(tmp_path / "data"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"),
    }
    out = subprocess.run(
        [sys.executable, str(CHECK), "--allow-root", f"--ServerApp.root_dir={tmp_path}", "--GpuShareApp.gpu_backend=simulated",
         "--GpuShareApp.simulated_cards=10GiB", f"--GpuShareApp.ledger_path={tmp_path / 'ledger.sqlite'}"],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    log = out.stdout + out.stderr
    assert out.returncode == 0 and "Exiting normally" in log, log[-5000:]
    assert "jupyter_gpushare | extension was successfully loaded" in log
