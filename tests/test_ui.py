"""The JupyterLab extension: TypeScript unit tests (node's test runner) and browser tests.

The browser tests start a real JupyterLab on a simulated 10 GiB card (labextension/ui-tests/
start-lab.sh) and drive it in the system Chromium with Playwright (no browser download). They
need Node.js, /usr/bin/chromium (or $CHROMIUM), the built extension installed (pip install .
builds it) and `jlpm install` in labextension/ and labextension/ui-tests/ (done here when
missing, from the committed yarn.lock files). Each test skips with the reason when a tool is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXT = ROOT / "labextension"
UI = EXT / "ui-tests"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def _jlpm() -> list[str] | None:
    if shutil.which("node") is None:
        return None
    jlpm = shutil.which("jlpm")
    return [jlpm] if jlpm else None


def _need_node() -> list[str]:
    jlpm = _jlpm()
    if jlpm is None:
        pytest.skip("Node.js and jlpm (pip install jupyter-builder or jupyterlab) are needed for the extension's tests")
    return jlpm


def _install(jlpm: list[str], where: Path) -> None:
    if not (where / "node_modules").is_dir():
        subprocess.run([*jlpm, "install"], cwd=where, check=True, timeout=600)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_typescript_unit_tests():
    """Size formatting, state mapping, the late-reply guard and event de-duplication."""
    jlpm = _need_node()
    _install(jlpm, EXT)
    r = subprocess.run([*jlpm, "test"], cwd=EXT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "# fail 0" in r.stdout


def test_labextension_is_installed():
    """The wheel put the prebuilt extension where JupyterLab finds it (no Node needed at install)."""
    from jupyter_core.paths import jupyter_path

    found = [Path(p) / "jupyter-gpushare" / "package.json" for p in jupyter_path("labextensions")]
    found = [p for p in found if p.is_file()]
    if not found:
        pytest.skip("the labextension is not installed: run `pip install .` (it builds the extension) first")
    meta = json.loads(found[0].read_text())
    assert meta["name"] == "jupyter-gpushare"
    assert meta["jupyterlab"]["_build"]["load"].startswith("static/remoteEntry.")


def test_browser():
    """Real JupyterLab + system Chromium: the lab loads without errors with the extension active
    (our equivalent of jupyterlab.browser_check, which would download a browser), kernels appear
    with quota bars, a third notebook queues, a quota change restarts the kernel and admits the
    queued one, the status bar reads 'GPU – / 3.0 GiB' / 'GPU queued #1', screenshots (light and
    dark) go to docs/img/, and the 50-kernel render time goes to bench/results/ui-render.json."""
    jlpm = _need_node()
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install -y chromium (or set CHROMIUM=/path)")
    test_labextension_is_installed()
    _install(jlpm, UI)
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="gpushare-ui-") as root:
        env = {
            **os.environ,
            "GPUSHARE_UI_PORT": str(port),
            "GPUSHARE_UI_ROOT": root,
            "PYTHON": sys.executable,
            "CHROMIUM": CHROMIUM,
            "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD": "1",
            "CI": os.environ.get("CI", "1"),
        }
        r = subprocess.run([*jlpm, "playwright", "test"], cwd=UI, env=env, capture_output=True, text=True, timeout=900)
    out = r.stdout[-8000:] + r.stderr[-4000:]
    assert r.returncode == 0, out
    assert " passed" in r.stdout, out
