"""The extension works in Notebook 7 too: it activates without errors, its panel shows the kernel, and a waiting
notebook reads as in JupyterLab (round 3: its banner at 200% zoom, its toolbar status, toasts by name, a safe
Stop waiting dialog), a teacher acts on it from the host view, a smaller quota keeps the GPU, and an over-quota interrupt says why in
the cell."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from servers import free_port, wait_until

UI = Path(__file__).resolve().parent.parent.parent / "labextension" / "ui-tests"
NOTEBOOK = {
    "cells": [],
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    "nbformat": 4,
    "nbformat_minor": 5,
}


def _need_browser() -> str:
    pytest.importorskip("notebook", minversion="7")
    chromium = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    if (
        shutil.which("node") is None
        or not os.path.exists(chromium)
        or not (UI / "node_modules" / "playwright-core").is_dir()
    ):
        pytest.skip(
            "needs Node.js, Debian's chromium and labextension/ui-tests/node_modules (tests/ui/test_ui.py installs it)"
        )
    return chromium


def _check(tmp_path, script: str, *settings: str, timeout: float = 180) -> tuple[subprocess.CompletedProcess, str]:
    """Notebook 7 on a simulated 10 GiB card with 3 GiB quotas (and ``settings``), the check ``script`` run on
    its page of nb.ipynb, for up to ``timeout`` seconds: (the script's run, the server's log)."""
    chromium = _need_browser()
    port = free_port()
    env = {
        **os.environ,
        "JUPYTER_DATA_DIR": str(tmp_path / "data"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"),
    }
    with open(tmp_path / "server.log", "w+") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "notebook", "--allow-root", "--no-browser", f"--port={port}", "--IdentityProvider.token=",
             "--ServerApp.password=", "--ServerApp.disable_check_xsrf=True", f"--ServerApp.root_dir={tmp_path}",
             "--JupyterNotebookApp.expose_app_in_browser=True", "--GpuShareApp.gpu_backend=simulated",
             "--GpuShareApp.simulated_cards=10GiB", "--GpuShareApp.default_quota=3GiB",
             f"--GpuShareApp.ledger_path={tmp_path / 'l.sqlite'}", *settings],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            wait_until(lambda: _answers(port), 60, "Notebook 7 to answer")
            out = subprocess.run(
                ["node", str(UI / script), f"http://127.0.0.1:{port}/notebooks/nb.ipynb", chromium],
                capture_output=True, text=True, timeout=timeout, cwd=UI,
            )  # fmt: skip
        finally:
            server.terminate()
            try:
                server.wait(15)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(15)
        log.seek(0)
        return out, log.read()


def test_notebook7_page_activates_the_extension_and_its_kernel_gets_a_quota(tmp_path):
    _need_browser()
    (tmp_path / "sub").mkdir()
    for name in ("nb.ipynb", "nb2.ipynb", "nb3.ipynb", "sub/nb.ipynb"):  # two fit the 10 GiB card, the third waits
        (tmp_path / name).write_text(json.dumps(NOTEBOOK))
    out, server_log = _check(
        tmp_path, "notebook7-check.js", "--GpuShareApp.over_quota_action=interrupt", "--GpuShareApp.over_quota_grace=2"
    )
    assert out.returncode == 0, out.stdout + out.stderr + server_log[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["errors"] == [] and result["quota_mib"] == 3072 and result["path"] == "nb.ipynb"
    assert "nb.ipynb" in result["panel"] and "simulated" in result["panel"].lower()
    # no status bar in Notebook 7: the notebook's toolbar shows its use against the reservation (3 GiB + context)
    assert re.fullmatch(r"GPU (–|0\.0) / \d+\.\d GiB", result["indicator"]), result["indicator"]
    # Round 3 in Notebook 7, on the waiting notebook's page at 200% zoom (notebook7-check.js, waitingNotebook)
    waiting = result["waiting"]
    assert waiting["banner"].startswith("Waiting for a GPU: #1 in line, needs 3.6 GiB"), waiting
    assert waiting["banner_lines"] <= 3.1 and waiting["spills"] == [], waiting
    assert waiting["indicator"] == "GPU #1 in line", waiting  # Notebook 7's only status says it waits
    assert waiting["kernel_status"] == "Python 3 (ipykernel) · waits for a GPU, #1 in line", waiting  # its own too
    uuid = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
    assert not any(uuid.search(t) for t in waiting["toasts"]), waiting["toasts"]
    assert any(t.startswith("nb3.ipynb: Waiting for a GPU") for t in waiting["toasts"]), waiting["toasts"]
    assert waiting["dialog_focus"] == "Keep waiting", waiting  # Enter is safe
    # The teacher takes the waiting kernel out of the line from the host view; its student's page says who and why
    teacher = result["teacher"]
    assert teacher["dialog_focus"] == "Cancel", teacher
    # the teacher's line names the kernel's notebook: its entry, its button's accessible name and its dialog (issue
    # 47, item 2: every entry read "your python3 kernel", and the buttons were told apart by position only)
    assert all("nb3.ipynb" in teacher[key] for key in ("entry", "button", "dialog")), teacher
    assert re.fullmatch(r"nb3\.ipynb: .+ took it out of the line: the lab is over for today\..*", teacher["told"]), (
        teacher
    )
    assert teacher["state"] == "cpu", teacher  # it runs on, without a GPU
    # A smaller quota from the panel keeps the GPU: the same kernel on the same card, never in line
    shrunk = result["shrunk"]
    assert shrunk["quota_mib"] == 2048 and shrunk["state"] == "running", shrunk
    assert shrunk["same_kernel"] and shrunk["same_card"], shrunk
    assert "queued" not in shrunk["states"] and shrunk["line_events"] == 0, shrunk
    # Two notebooks of one name: the panel and its buttons' accessible names say their paths
    same = result["same_name"]
    assert "nb.ipynb" in same["links"] and "sub/nb.ipynb" in same["links"], same
    assert any(label.endswith("for sub/nb.ipynb") for label in same["labels"]), same
    # Over its reservation, interrupted by the policy: the cell's output says why, beside its KeyboardInterrupt
    interrupted = result["interrupted"]
    assert interrupted["interrupts"] == 1 and len(interrupted["said"]) == 1, interrupted
    assert re.match(
        r"GPU memory quota: Interrupted: it used 3(\.0)? GiB, over its 2\.6 GiB reservation(, for \d+ (s|min))?\. "
        r"Free memory or ask for a larger quota\.", interrupted["said"][0],
    ), interrupted  # fmt: skip


def test_notebook7_with_first_use_shows_a_kernel_that_holds_no_gpu_until_its_first_gpu_import(tmp_path):
    """line_place = 'first-use' in Notebook 7 (notebook7-first-use.js): the toolbar's indicator and the panel say
    "GPU at first use"; a CPU cell leaves the kernel so; its first GPU import is granted in the same process."""
    (tmp_path / "nb.ipynb").write_text(json.dumps(NOTEBOOK))
    out, server_log = _check(tmp_path, "notebook7-first-use.js", "--GpuShareApp.line_place=first-use")
    assert out.returncode == 0, out.stdout + out.stderr + server_log[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["errors"] == [], result
    assert result["indicator"] == "GPU at first use" and result["badge"] == "GPU at first use", result
    assert (result["before"], result["after_cpu"]) == ("standby", "standby"), result
    pid = result["cpu"]
    assert result["gpu"] == f"({pid}, 'gpu', '3072')" and result["after"] == "running", result
    assert result["quota_mib"] == 3072, result


def _answers(port: int) -> bool:
    import urllib.request

    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=2)
        return True
    except OSError:
        return False


@pytest.mark.alone  # its kernels in line import PyTorch under SCHED_IDLE (host/priority.py): on 2 cores the other
# tests keep busy, they get almost no CPU, and the import ran past 180 s in CI runs 42 and 43 (79 s on its own)
@pytest.mark.timeout(600)
def test_notebook7_shows_a_held_cells_outcome_after_a_reload_and_a_wait_that_ends_in_one_line(tmp_path):
    """Issue 47, items 3, 4 and 6, in Notebook 7 (notebook7-round4.js): a page reloaded while its GPU cell waits
    shows the cell waiting, then its output and number once it ran; a cell whose wait is stopped shows the reason in
    one line, without the frames of the extension's code; a waiting notebook's page left alone polls nothing."""
    pytest.importorskip("torch")
    out, server_log = _check(tmp_path, "notebook7-round4.js", timeout=420)  # (its held cell alone may take 180 s)
    assert out.returncode == 0, out.stdout + out.stderr + server_log[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["errors"] == [], result
    held = result["held"]
    assert "*" in held["waiting_prompt"] and re.search(r"\[\d+\]", held["prompt"]), held
    assert "ran after the wait" in held["output"] and "the GPU is this kernel's now" in held["output"], held
    (ended,) = result["ended"]
    assert "this cell did not run: Stopped waiting for a GPU" in ended, ended
    assert "_gpushare" not in ended and "File " not in ended and len(ended.strip().splitlines()) <= 2, ended
    assert len(result["idle_requests"]) <= 1, result["idle_requests"]  # (it asked every 3 s: 10 in 30 s)


def test_notebook7_runs_a_parked_notebooks_cpu_cell_at_once(tmp_path):
    """Issue 47, item 1, in Notebook 7 (notebook7-parked.js): a parked notebook's cell run from its page answers at
    once, its variables kept, while its kernel waits in line for its GPU (a full card); the cell says so. It waited
    for the GPU with no word (67 s in the walk that found it)."""
    (tmp_path / "nb.ipynb").write_text(json.dumps(NOTEBOOK))
    out, server_log = _check(tmp_path, "notebook7-parked.js", "--GpuShareApp.park_after=0")
    assert out.returncode == 0, out.stdout + out.stderr + server_log[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["errors"] == [], result
    assert result["answered_s"] < 10 and result["state_then"] in ("parked", "queued"), result
    assert "this kernel was parked" in result["printed"] and "CPU work runs at once" in result["printed"], result
