"""The JupyterLab extension: TypeScript unit tests (node's test runner) and browser tests.

The browser tests start a real JupyterLab on a simulated 10 GiB card (labextension/ui-tests/
start-lab.sh) and drive it in the system Chromium with Playwright (no browser download). They
need Node.js, /usr/bin/chromium (or $CHROMIUM), the built extension installed (pip install .
builds it) and `jlpm install` in labextension/ and labextension/ui-tests/ (done here when
missing, from the committed yarn.lock files). Each test skips with the reason when a tool is missing.

test_host_view_through_a_broker also needs root: it creates Unix users, starts a real broker and
their Jupyter servers (tests/broker/test_broker.py's helpers) and opens a student's and an admin's
JupyterLab (labextension/ui-tests/host-tests/).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
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


# What a failed browser run says: Playwright's own lines, what the page showed where a test failed, and the server's
# timeline while it ran (its extension's events, kernels started, restarted and shut down, warnings and errors): the
# log's tail alone is the next spec's (CI stop 54 failed in a spec whose server log was gone from it).
TIMELINE = re.compile(r"GpuShareExtension|Kernel (started|restarted|shutdown)|Traceback|Error|\[[WE] ")
STAMP = re.compile(r"^\[WebServer\] \[\w (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")


def _playwright(jlpm: list[str], args: list[str], cwd: Path, env: dict, timeout: float) -> tuple[int, str, str]:
    """Run Playwright's tests: its exit code, its own output, and what to say if it failed."""
    report = cwd / "test-results" / "report.json"
    report.unlink(missing_ok=True)
    r = subprocess.run([*jlpm, "playwright", "test", "--reporter=list,json", *args], cwd=cwd,
                       env={**env, "PLAYWRIGHT_JSON_OUTPUT_FILE": str(report)}, capture_output=True, text=True,
                       timeout=timeout)  # fmt: skip
    lines = (r.stdout + r.stderr).splitlines()
    own = "\n".join(line for line in lines if not line.startswith("[WebServer]"))
    windows = _failed_windows(report)
    timeline = [
        line[:240]
        for line in lines
        if TIMELINE.search(line)
        and (m := STAMP.match(line))
        and (not windows or any(a <= m.group(1) <= b for a, b in windows))
    ]
    pages = [f"--- {p.parent.name}:\n{p.read_text()[-4000:]}" for p in sorted(cwd.glob("test-results/*/page.txt"))]
    said = "\n".join([own[-6000:], "--- what the page showed:", *pages[:2],
                      "--- the server's timeline while the failed tests ran:", "\n".join(timeline)[-10000:]])  # fmt: skip
    return r.returncode, r.stdout, said


def _failed_windows(report: Path) -> list[tuple[str, str]]:
    """The times (the server log's local "YYYY-MM-DD HH:MM:SS") from each failed test's start to its end."""
    try:
        suites = json.loads(report.read_text())["suites"]
    except (OSError, ValueError, KeyError):
        return []
    out, todo = [], list(suites)
    while todo:
        suite = todo.pop()
        todo += suite.get("suites", [])
        for spec in suite.get("specs", []):
            for test in spec.get("tests", []):
                for result in test.get("results", []):
                    if result.get("status") in ("failed", "timedOut", "interrupted"):
                        start = datetime.datetime.fromisoformat(result["startTime"].replace("Z", "+00:00")).astimezone()
                        end = start + datetime.timedelta(milliseconds=result.get("duration", 0) + 1000)
                        out.append((f"{start:%Y-%m-%d %H:%M:%S}", f"{end:%Y-%m-%d %H:%M:%S}"))
    return out


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


@pytest.mark.timeout(1500)  # the whole spec: 5-10 minutes on a loaded 2-core CI machine
def test_browser():
    """Real JupyterLab + system Chromium, a student's day (labextension/ui-tests/tests/gpushare.spec.ts,
    described in docs/ui.md): queued banner and a cell run while waiting, admission, quota limits, over quota said
    the same by the panel, the status bar and a notification, a rename, stop waiting, dark theme and
    contrast, an idle tab's requests, error states, the host section's reads."""
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
        rc, stdout, said = _playwright(jlpm, [], UI, env, 1500)
    assert rc == 0, said
    assert " passed" in stdout, said


@pytest.mark.timeout(600)
@pytest.mark.parametrize("config", ["playwright-enforce.config.js", "playwright-first-use.config.js"])
def test_browser_with_other_settings(config):
    """A JupyterLab with other settings, and the specs for them: a policy that interrupts a kernel 2 s over its
    reservation (labextension/ui-tests/enforce-tests/interrupt.spec.ts: the interrupted cell's output says why,
    with the figures and what to do, beside its KeyboardInterrupt); line_place = 'first-use'
    (first-use-tests/first-use.spec.ts: a notebook holds no GPU until its first GPU import, which waits in line
    in its cell and goes on in the same kernel)."""
    jlpm = _need_node()
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install -y chromium (or set CHROMIUM=/path)")
    test_labextension_is_installed()
    _install(jlpm, UI)
    with tempfile.TemporaryDirectory(prefix="gpushare-ui-") as root:
        env = {
            **os.environ, "GPUSHARE_UI_PORT": str(_free_port()), "GPUSHARE_UI_ROOT": root, "PYTHON": sys.executable,
            "CHROMIUM": CHROMIUM, "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD": "1", "CI": os.environ.get("CI", "1"),
        }  # fmt: skip
        rc, stdout, said = _playwright(jlpm, ["--config", config], UI, env, 600)
    assert rc == 0, said
    assert " passed" in stdout, said


# -- the host view through a broker: a student's page and an admin's page ------------------------------


NOTEBOOK = {
    "cells": [],
    "metadata": {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}},
    "nbformat": 4,
    "nbformat_minor": 5,
}


def _post(server, path: str, body: dict, timeout: float) -> dict:
    """POST to a server's API with a longer wait than ServerProcess.call (a queued kernel's start)."""
    import urllib.request

    from servers import TOKEN

    req = urllib.request.Request(
        f"http://127.0.0.1:{server.port}/{path}",
        method="POST",
        headers={"Authorization": f"token {TOKEN}"},
        data=json.dumps(body).encode(),
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _open_notebook(server, name: str, timeout: float = 60) -> str:
    """A notebook file and a session (kernel) for it on ``server``; returns the kernel id."""
    server.call("PUT", f"api/contents/{name}", {"type": "notebook", "format": "json", "content": NOTEBOOK})
    body = {"path": name, "name": name, "type": "notebook", "kernel": {"name": "python3"}}
    return _post(server, "api/sessions", body, timeout)["kernel"]["id"]


@pytest.fixture
def broker_host(ui_tests_dir):
    """A real broker (root) and the Jupyter servers of three new Unix users: 'other' (whose kernels
    reach the host queue when the card is full), 'student' and 'admin' (in admin_users)."""
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("needs root and useradd: runs Jupyter servers as three different Unix users")
    test_labextension_is_installed()
    from multiuser import Broker, UserServer, ensure_user, remove_user, shared_scratch

    class QueueingServer(UserServer):
        """on_full=queue: a kernel that finds the card full waits in the host queue."""

        def launch(self, log_dir, args, settings, **popen):
            super().launch(log_dir, args, {**settings, "on_full": "queue"}, **popen)

    run = os.getpid() % 100000  # names of this run (runs may overlap on one machine)
    names = {"other": f"gshvo{run}", "student": f"gshvs{run}", "admin": f"gshva{run}"}
    with shared_scratch("gpushare-ui-host-") as base:
        users = {role: ensure_user(name) for role, name in names.items()}
        # simulated 10 GiB card, 512 MiB context reserve, max_total 4GiB per user
        broker = Broker(base, extra=f"c.GpuShareBroker.admin_users = [{names['admin']!r}]\n")
        servers = {}
        try:
            broker.start()
            for role, user in users.items():
                servers[role] = (QueueingServer if role == "other" else UserServer)(base, user, broker).start()
            for server in servers.values():
                server.wait_ready()
            yield broker, servers, names
        finally:
            for server in servers.values():
                server.stop()
            broker.stop()
            for name in names.values():
                remove_user(name)


def test_host_view_through_a_broker(broker_host, ui_tests_dir):
    """A student's JupyterLab in Chromium: the "This host" section shows the other users' total on
    the card and their queued kernel as "another user's kernel", and neither the page's text, its
    HTML (tooltips, data attributes) nor any reply it gets holds another user's name, kernel id or
    notebook name. An admin's JupyterLab shows the per-user table, every kernel and whose kernel waits."""
    import threading

    from servers import TOKEN, wait_until

    broker, servers, names = broker_host
    other, student, admin = servers["other"], servers["student"], servers["admin"]
    run = os.getpid() % 100000
    thesis, draft = f"private-thesis-{run}.ipynb", f"private-draft-{run}.ipynb"
    # 2 GiB + 512 MiB each on 10 GiB: other 2.5 + admin 5.0 + student 2.5 fill the card
    other_kernel = _open_notebook(other, thesis)
    admin_kernels = [admin.start_kernel(), admin.start_kernel()]
    _open_notebook(student, "mine.ipynb")
    assert broker.admin_view()["cards"][0]["unreserved_mib"] == 0

    def start_waiting() -> None:
        """other's second notebook: its kernel waits in the host queue, and its session request with it."""
        with contextlib.suppress(Exception):  # still waiting when its server stops at the end
            _open_notebook(other, draft, timeout=600)

    threading.Thread(target=start_waiting, daemon=True).start()
    queue = wait_until(lambda: broker.admin_view()["queue"], timeout=60, what="other's kernel to wait in the queue")
    assert [(q["user"], q["kernel_name"]) for q in queue] == [(names["other"], "python3")]
    queued_kernel = queue[0]["kernel_id"]
    # each server said its kernel's notebook to the broker: the admin's server reads it (once its reading has it)
    seen = wait_until(lambda: (v := admin.call("GET", "api/gpushare/host"))["queue"] and v, 30, "the admin's line")
    assert {k["kernel_id"]: k["notebook"] for k in seen["kernels"] if k["user"] == names["other"]} == {
        other_kernel: thesis
    }, seen["kernels"]
    assert [q["notebook"] for q in seen["queue"]] == [draft], seen["queue"]

    ids = [other_kernel, queued_kernel, *admin_kernels]
    secrets = [names["other"], names["admin"], thesis, draft, *ids, *(k[:8] for k in ids)]
    env = {
        **os.environ,
        "GPUSHARE_HOST_STUDENT_URL": f"http://127.0.0.1:{student.port}/lab?token={TOKEN}",
        "GPUSHARE_HOST_ADMIN_URL": f"http://127.0.0.1:{admin.port}/lab?token={TOKEN}",
        "GPUSHARE_HOST_SECRETS": json.dumps(secrets),
        "GPUSHARE_HOST_OTHER": names["other"],
        "GPUSHARE_HOST_THESIS": thesis,
        "GPUSHARE_HOST_DRAFT": draft,
        "GPUSHARE_HOST_USERS": json.dumps(
            {names["other"]: [1, "2.5 GiB"], names["student"]: [1, "2.5 GiB"], names["admin"]: [2, "5 GiB"]}
        ),
        "CHROMIUM": CHROMIUM,
        "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD": "1",
        "CI": os.environ.get("CI", "1"),
    }
    jlpm = _need_node()
    rc, stdout, said = _playwright(jlpm, ["--config", "playwright-host.config.js"], Path(ui_tests_dir), env, 600)
    assert rc == 0, said
    assert "3 passed" in stdout, said
    # The admin took other's waiting kernel out of the line (host.spec.ts): other's own server said so, with who
    # and why, and the kernel runs on without a GPU.
    told = wait_until(
        lambda: [e for e in other.call("GET", "api/gpushare/events")["events"]
                 if e["kernel_id"] == queued_kernel and e["kind"] == "teacher-remove"],
        timeout=30, what="other's server to tell its student",
    )  # fmt: skip
    assert told[0]["params"]["by"] == names["admin"] and told[0]["params"]["why"] == "the lab is over for today"
    assert other.call("GET", f"api/gpushare/kernels/{queued_kernel}")["state"] == "cpu"
