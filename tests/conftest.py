"""Shared fixtures: a real jupyter-server (pytest-jupyter) with the extension on a simulated card."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import pytest
from jupyter_client.provisioning import KernelProvisionerFactory
from jupyter_server.serverapp import ServerApp

from jupyter_gpushare.server.manager import process_manager, use_in_process

# ci_cpu (bench/): with CI_CPU_LOG set, each test's wall time and CPU go to that file (.ci/run sums them)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
pytest_plugins = ("pytest_jupyter.jupyter_server", "ci_cpu")

# A kernel record's move the life table does not know is a bug: in the tests (and the servers they start) it
# raises, where a real server logs it and goes on (server/life.py).
os.environ["GPUSHARE_STRICT_LIFE"] = "1"

# The tests mirror the package: tests/<folder>/ tests jupyter_gpushare/<folder>/ (and tests/ui/ the sidebar in a
# browser). Markers by folder, then by what a test needs (setup.cfg lists them; the README's quick subset leaves
# them out).
FOLDER_MARKERS = {
    "ui": "browser",  # drives JupyterLab or Notebook 7 in Chromium
    "bootstrap": "kernel",  # real frameworks imported in real kernel processes
    "launch": "kernel",  # real kernels and the real programs that start them (jupyter execute, papermill, …)
}
SERVER_FIXTURES = {"jp_serverapp", "jp_fetch", "gpushare"}  # a real jupyter-server in the test's process
# The slowest files, longest first (CI's durations, 2026-11-29: 300-600 s, 180-370 s, 130-250 s, 180 s, 140-200 s,
# 85-140 s, 120 s, 140 s): in the README's parallel run they start first, one per process, and the short ones fill
# in around them. In collection order they came last (pytest-xdist orders files by their count of tests, and these
# have few), so the run's end waited on them alone.
SLOWEST_FIRST = (
    "ui/test_ui.py",
    "launch/test_jupyter_server_suite.py",
    "launch/test_nbclient_suite.py",
    "server/test_proxy.py",
    "test_bench_study.py",
    "ui/test_notebook7.py",
    "host/test_hub.py",
    "launch/test_batch_clients.py",
)


def pytest_configure(config):
    """Keep the collection's order (SLOWEST_FIRST) when pytest-xdist hands files out (``--dist loadfile``)."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items):
    """``browser`` and ``kernel`` by folder (FOLDER_MARKERS), ``root`` for tests skipped unless run as root (Unix
    users, cgroups, mounts, namespaces), ``server`` for tests that run a jupyter-server in their process."""
    tests = Path(__file__).resolve().parent
    first = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: first.get(item.path.resolve().relative_to(tests).as_posix(), len(first)))
    for item in items:
        folder = item.path.resolve().relative_to(tests).parts[0]
        if folder in FOLDER_MARKERS:
            item.add_marker(FOLDER_MARKERS[folder])
        if any("root" in str(m.kwargs.get("reason", "")) for m in item.iter_markers("skipif")):
            item.add_marker(pytest.mark.root)
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.server)


GIB = 1024


@pytest.fixture
def gpushare_config():
    """GpuShareApp settings for the test server; tests update this dict before the server starts."""
    return {
        "gpu_backend": "simulated",
        "simulated_cards": "10GiB",
        "card_headroom": "0MiB",
        "context_reserve": "512MiB",
        "default_quota": "2GiB",
        "reconcile_interval": 0.5,
    }


@pytest.fixture
def ledger_file(tmp_path):
    return str(tmp_path / "ledger" / "ledger.sqlite")


@pytest.fixture
def jp_server_config(gpushare_config, ledger_file):
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_gpushare": True}, "allow_unauthenticated_access": False},
        "GpuShareApp": {"ledger_path": ledger_file, **gpushare_config},
    }


@pytest.fixture(autouse=True)
def jp_server_cleanup(jp_asyncio_loop):
    """pytest-jupyter's own cleanup (same name: this one is used), with the server's instance cleared whatever the
    cleanup raised. Theirs lets through an error other than RuntimeError (jupyter_client raises InvalidStateError
    for a kernel shut down while it restarts) before ``clear_instance``: every later test on that worker then got
    the old server and its kernels, and one failure became 22. Kernels the failed cleanup left are killed."""
    yield
    app = ServerApp.instance()
    try:
        jp_asyncio_loop.run_until_complete(app._cleanup())
    except Exception:
        for km in list(getattr(getattr(app, "kernel_manager", None), "_kernels", {}).values()):
            process = getattr(km.provisioner, "process", None)
            if process is not None and process.poll() is None:
                process.kill()
        raise
    finally:
        if hasattr(app, "kernel_manager"):
            app.kernel_manager.context.destroy()
        ServerApp.clear_instance()


@pytest.fixture(autouse=True)
def _fresh_singletons():
    """Each test gets a new QuotaManager and provisioner factory (both are process-wide)."""
    yield
    manager = process_manager()
    if manager is not None:
        manager.close()
    use_in_process(None)
    KernelProvisionerFactory.clear_instance()


@pytest.fixture
def gpushare(jp_fetch, jp_serverapp):
    """A small client for the REST API of the running test server."""

    class Client:
        async def get(self, path: str):
            r = await jp_fetch("api", "gpushare", *path.split("/"), method="GET")
            return json.loads(r.body)

        async def start_kernel(self, name: str = "python3"):
            """A kernel without a notebook (POST /api/kernels); it answers at once, admitted or in line."""
            r = await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": name}))
            return json.loads(r.body)["id"]

        async def open_notebook(self, path: str, name: str = "python3") -> tuple[str, str]:
            """A notebook's kernel, started as JupyterLab does (POST /api/sessions): (session id, kernel id)."""
            body = {"path": path, "type": "notebook", "name": path.rsplit("/", 1)[-1], "kernel": {"name": name}}
            r = await jp_fetch("api", "sessions", method="POST", body=json.dumps(body))
            session = json.loads(r.body)
            return session["id"], session["kernel"]["id"]

        async def close_notebook(self, session_id: str):
            await jp_fetch("api", "sessions", session_id, method="DELETE")

        async def state_of(self, kernel_id: str):
            rec = await self.kernel(kernel_id)
            return rec["state"] if rec else None

        async def stop_kernel(self, kernel_id: str):
            await jp_fetch("api", "kernels", kernel_id, method="DELETE")

        async def kernel(self, kernel_id: str):
            kernels = (await self.get("kernels"))["kernels"]
            return next((k for k in kernels if k["kernel_id"] == kernel_id), None)

        async def wait_for(self, predicate, timeout: float = 30.0, what: str = "condition"):
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                value = await predicate()
                if value:
                    return value
                await asyncio.sleep(0.1)
            raise AssertionError(f"timed out waiting for {what}")

    return Client()


@pytest.fixture
def kernel_ws(jp_http_port, jp_base_url, jp_auth_header):
    """Open a kernel's websocket as JupyterLab does (jp_ws_fetch's fixed 20 s request timeout is too short while
    tens of kernels start on 2 cores)."""
    from kernels import TIMEOUT
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    async def connect(kernel_id: str, session_id: str):
        url = f"ws://localhost:{jp_http_port}{jp_base_url}api/kernels/{kernel_id}/channels?session_id={session_id}"
        request = HTTPRequest(url, headers=jp_auth_header, connect_timeout=TIMEOUT, request_timeout=TIMEOUT)
        return await websocket_connect(request)

    return connect


@pytest.fixture
def skip_time(monkeypatch):
    """Steps the monotonic time of the server in this process forward: its line, parking and enforcer read time
    through server/clock.py's SYSTEM, so a wait for one of their timers (a kernel nobody wants, a wait nobody
    watches) costs a test no real time. ``skip_time(s)`` moves it ``s`` seconds on; the wall clock stays real (the
    ledger's deadlines and Jupyter's activity times are on it)."""
    from jupyter_gpushare.server.clock import SYSTEM

    skipped = [0.0]
    monkeypatch.setattr(SYSTEM, "mono", lambda: time.monotonic() + skipped[0])

    def skip(seconds: float) -> None:
        skipped[0] += seconds

    return skip


def broker_in_process(tmp_path, cards: str = "10GiB"):
    """A broker set up with its ledger open, on simulated ``cards``, without its socket."""
    from traitlets.config import Config

    from jupyter_gpushare.broker import GpuShareBroker

    c = Config()
    c.GpuShareApp.gpu_backend, c.GpuShareApp.simulated_cards = "simulated", cards
    c.GpuShareApp.card_headroom, c.GpuShareApp.context_reserve = "0MiB", "512MiB"
    c.GpuShareBroker.ledger_path = str(tmp_path / "lib" / "ledger.sqlite")
    broker = GpuShareBroker(config=c)
    broker.setup()
    broker._ledger = broker._open_ledger()
    return broker


@pytest.fixture
def inproc(tmp_path):
    """A broker's request handling without its socket: callers are given, not read from a socket."""
    from jupyter_gpushare.broker import Caller
    from jupyter_gpushare.ledger.ledger import ProcessRef

    broker = broker_in_process(tmp_path)
    me = ProcessRef.me()
    callers = {
        "alice": Caller("alice", 5001, process=me),
        "bob": Caller("bob", 5002, process=me),
        "admin": Caller("root", 0, admin=True, process=me),
    }
    yield broker, callers
    broker._ledger.close()


@pytest.fixture(scope="session")
def ui_tests_dir():
    """labextension/ui-tests with its node_modules (Playwright, driving Debian's Chromium): installed
    from the committed yarn.lock when missing. Skips when Node.js, jlpm or Chromium is missing."""
    import os
    import shutil
    import subprocess
    from pathlib import Path

    ui = Path(__file__).resolve().parent.parent / "labextension" / "ui-tests"
    chromium = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    jlpm = shutil.which("jlpm")
    if shutil.which("node") is None or jlpm is None:
        pytest.skip("needs Node.js and jlpm (pip install jupyterlab) for the browser tests")
    if not os.path.exists(chromium):
        pytest.skip(f"no Chromium at {chromium}: apt-get install -y chromium (or set CHROMIUM=/path)")
    if not (ui / "node_modules" / "playwright-core").is_dir():
        subprocess.run([jlpm, "install"], cwd=ui, check=True, timeout=600)
    return ui
