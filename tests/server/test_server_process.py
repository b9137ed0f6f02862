"""Whole Jupyter server processes: bad config, SIGKILL recovery, nbclient, no GPU, a corrupt ledger."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest
from servers import ServerProcess, running, wait_until
from servers import SimulatedServer as Server

pytestmark = pytest.mark.server  # starts jupyter servers as processes (README: the quick subset)


@pytest.mark.parametrize(
    "arg, expect",
    [
        (
            "--GpuShareApp.default_quota=4",
            "GpuShareApp.default_quota: '4' is not a size: add a unit, e.g. '4MiB' or '4GiB'",
        ),
        ("--GpuShareApp.card_headroom=lots", "GpuShareApp.card_headroom: 'lots' is not a size"),
        ("--GpuShareApp.simulated_cards=3xbig", "GpuShareApp.simulated_cards: 'big' is not a size"),
        ("--GpuShareApp.context_reserve=10%", "GpuShareApp.context_reserve: '10%' is a percentage"),
        (
            "--GpuShareApp.on_full=later",
            "The 'on_full' trait of a GpuShareApp instance expected any of ['queue', 'cpu', 'reject'], not the str 'later'",
        ),
        (
            "--GpuShareApp.line_place=first",
            "The 'line_place' trait of a GpuShareApp instance expected any of ['start', 'first-use'], not the str 'first'",
        ),
    ],
)
def test_bad_config_stops_the_server_with_the_setting_and_value(tmp_path, arg, expect):
    server = Server(tmp_path, arg)
    try:
        assert server.proc.wait(60) != 0
        assert expect in server.output()
    finally:
        server.stop()


def test_the_same_option_twice_stops_the_server_instead_of_running_without_the_extension(tmp_path):
    """traitlets refuses an option given twice with a ValueError inside the extension's set-up; jupyter-server
    would log it and run on without the extension: every kernel with every GPU. The server stops instead."""
    server = ServerProcess()
    server.launch(tmp_path, ["--allow-root", "--GpuShareApp.default_quota=2GiB", "--GpuShareApp.default_quota=3GiB",
                             "--GpuShareApp.gpu_backend=simulated", "--GpuShareApp.simulated_cards=10GiB"],
                  {}, env={**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")})  # fmt: skip
    try:
        assert server.proc.wait(60) != 0
        out = server.output()
        assert "default_quota only accepts one value" in out and "so the server stops" in out
    finally:
        server.stop()


def test_an_exception_at_load_stops_the_server(tmp_path):
    """Any failure while the extension is set up (here one injected into building its manager) stops the server
    with the reason, instead of leaving it running with no quota for anyone."""
    script = tmp_path / "inject.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            import jupyter_gpushare.server.app as app

            def broken(*args, **kwargs):
                raise RuntimeError("injected at load")

            app.build_manager = broken
            from jupyter_server.serverapp import main
            sys.exit(main())
            """
        )
    )
    log = open(tmp_path / "inject.log", "w+")
    proc = subprocess.Popen(
        [sys.executable, str(script), "--allow-root", "--port=0", "--ServerApp.open_browser=False",
         "--GpuShareApp.gpu_backend=simulated", "--GpuShareApp.simulated_cards=10GiB",
         f"--GpuShareApp.ledger_path={tmp_path / 'ledger.sqlite'}"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")},
    )  # fmt: skip
    try:
        assert proc.wait(60) != 0
        log.seek(0)
        out = log.read()
        assert (
            "jupyter-gpushare: cannot start: the extension could not be set up (RuntimeError: injected at load)" in out
        )
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()


def write_survivor_kernelspec(data_dir) -> None:
    """A Python kernel that does not exit with its server (ipykernel polls its parent only when
    JPY_PARENT_PID is set), standing for any kernel that outlives a crashed server."""
    spec = {
        "argv": [
            "/bin/sh",
            "-c",
            f'unset JPY_PARENT_PID; exec "{sys.executable}" -m ipykernel_launcher -f "$0"',
            "{connection_file}",
        ],
        "display_name": "survivor",
        "language": "python",
    }
    path = data_dir / "kernels" / "survivor"
    path.mkdir(parents=True)
    (path / "kernel.json").write_text(json.dumps(spec))


def reserved(server: Server) -> int:
    return server.call("GET", "api/gpushare/cards")["cards"][0]["reserved_mib"]


def test_sigkill_server_keeps_live_kernels_and_reclaims_dead_ones(tmp_path):
    write_survivor_kernelspec(tmp_path / "data")
    first = Server(tmp_path).wait_ready()
    try:
        dies = first.call("POST", "api/kernels", {"name": "python3"})["id"]
        lives = first.call("POST", "api/kernels", {"name": "survivor"})["id"]
        pids = {k["kernel_id"]: k["pid"] for k in first.call("GET", "api/gpushare/kernels")["kernels"]}
        assert reserved(first) == 2 * 2560
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
        wait_until(lambda: not running(pids[dies]), what="the ordinary kernel to exit with its server")
        assert running(pids[lives])
    finally:
        first.stop()
    second = Server(tmp_path).wait_ready()
    try:
        assert reserved(second) == 2560  # the surviving kernel keeps its reservation
        events = second.call("GET", "api/gpushare/events")["events"]
        assert [(e["kind"], e["kernel_id"]) for e in events if e["kind"] == "reclaimed"] == [("reclaimed", dies)]
        os.kill(pids[lives], signal.SIGKILL)
        wait_until(lambda: reserved(second) == 0, what="the survivor's lease to be reclaimed once it dies")
        events = second.call("GET", "api/gpushare/events")["events"]
        assert ("reclaimed", lives) in [(e["kind"], e["kernel_id"]) for e in events]
    finally:
        second.stop()


class InterruptibleServer(Server):
    """A server that takes SIGINT as a terminal's Ctrl-C or the Hub sends it, with Python's default handler, also
    where the tests run in the background of a shell: a background job ignores SIGINT, and its children inherit that
    (such a server ignores the Hub's SIGINT, and stops cleanly at the SIGTERM that follows it)."""

    command = ("-c", "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
               "sys.argv[0] = 'jupyter-server'; runpy.run_module('jupyter_server', run_name='__main__')")  # fmt: skip


def test_sigint_with_no_terminal_shuts_the_kernels_down_and_gives_their_reservations_back(tmp_path):
    """JupyterHub stops a server with SIGINT, and the server has no terminal: Jupyter left that signal to Python's
    KeyboardInterrupt, which exits without the server's cleanup, and each kernel's reservation stayed in the ledger
    until the broker reaped it. Now the server stops as on SIGTERM. The control: a server killed with SIGKILL leaves
    its kernel's lease in the ledger, read as the file is, with nobody reaping."""

    def leases() -> list[str]:
        with contextlib.closing(sqlite3.connect(tmp_path / "ledger.sqlite")) as db:
            return [row[0] for row in db.execute("SELECT kernel_id FROM leases")]

    def start_kernel() -> tuple[Server, str, int]:
        server = InterruptibleServer(tmp_path).wait_ready()
        kid = server.call("POST", "api/kernels", {"name": "python3"})["id"]
        pid = next(k["pid"] for k in server.call("GET", "api/gpushare/kernels")["kernels"] if k["kernel_id"] == kid)
        assert leases() == [kid] and running(pid)
        return server, kid, pid

    killed, kid, _ = start_kernel()
    try:
        killed.proc.send_signal(signal.SIGKILL)
        killed.proc.wait(10)
        assert leases() == [kid]  # the control: nothing gave it back
    finally:
        killed.stop()
    server, kid, pid = start_kernel()  # (its start reclaimed the dead server's lease)
    try:
        server.proc.send_signal(signal.SIGINT)
        try:
            assert server.proc.wait(60) == 0, server.output()
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the server did not stop within 60 s of SIGINT:\n{server.output()}") from None
        assert leases() == [], server.output()
        assert not running(pid)
        assert "SIGINT: the server stops" in server.output()
    finally:
        server.stop()


def test_nbclient_kernels_get_quotas_outside_the_server(tmp_path):
    """nbclient (and papermill) start kernels through jupyter_client: the provisioner works there too."""
    script = textwrap.dedent(
        f"""
        import nbformat
        from nbclient import NotebookClient
        from traitlets.config import Config
        from jupyter_gpushare.ledger.ledger import Ledger
        nb = nbformat.v4.new_notebook()
        nb.cells.append(nbformat.v4.new_code_cell("import os; print(os.environ.get('GPUSHARE_MODE'), os.environ.get('GPUSHARE_QUOTA_MIB'))"))
        nb.cells.append(nbformat.v4.new_code_cell("from jupyter_gpushare.ledger.ledger import Ledger; print(len(Ledger({str(tmp_path / "l.sqlite")!r}).leases()))"))
        c = Config()
        c.GpuShareApp.gpu_backend = "simulated"
        c.GpuShareApp.simulated_cards = "8GiB"
        c.GpuShareApp.default_quota = "3GiB"
        c.GpuShareApp.ledger_path = {str(tmp_path / "l.sqlite")!r}
        NotebookClient(nb, kernel_name="python3", config=c).execute()
        print("OUT", nb.cells[0].outputs[0]["text"].strip(), "|", nb.cells[1].outputs[0]["text"].strip())
        print("AFTER", len(Ledger({str(tmp_path / "l.sqlite")!r}).leases()))
        """
    )
    env = {
        **os.environ,
        "JUPYTER_DEFAULT_PROVISIONER_NAME": "gpushare-provisioner",
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"),
    }
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "OUT gpu 3072 | 1" in out.stdout  # the kernel held one lease while it ran
    assert "AFTER 0" in out.stdout  # and gave it back at shutdown
