"""Programs that start kernels outside a Jupyter server get quotas by default: real `jupyter execute`,
`jupyter nbconvert --execute`, papermill and `jupyter console` processes, real kernels, a simulated card, the
real SQLite ledger.

What must hold: once the package is installed, these programs' kernels hold a reservation with nothing else set
(no environment variable, no kernelspec edited), and `jupyter execute`'s and nbconvert's own --GpuShareApp
options apply; a default provisioner chosen in the environment is kept; a kernel of another language reserves
nothing, and a kernel on a host without a GPU starts without one and says so. A kernel in line says where it
stands every PROGRESS_EVERY_S; Ctrl-C there gives its place up in one line of output, and a wait that ends
without a GPU says why in one line and an exit status of its own; `jupyter console` gives its
kernel's reservation back as it exits. A terminal job finds the host's broker at its default socket.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from multiuser import Broker, needs_root
from servers import wait_until

from jupyter_gpushare.broker import DEFAULT_SOCKET
from jupyter_gpushare.core.addresses import PROVISIONER_NAME
from jupyter_gpushare.launch.batch import DEFAULT_ENV, EXIT_CODES, PROGRESS_EVERY_S
from jupyter_gpushare.ledger.ledger import Ledger

ROOT = Path(__file__).resolve().parent.parent.parent
SHOW = "import os; print(os.environ.get('GPUSHARE_MODE'), os.environ.get('GPUSHARE_QUOTA_MIB'))"
CARD = ["--GpuShareApp.gpu_backend=simulated", "--GpuShareApp.simulated_cards=24GiB"]
# ipykernel's log of an interrupt that lands inside a shell handler. papermill asks for kernel_info after the last
# cell and shuts down on the reply; jupyter_client interrupts a kernel before its shutdown request. A kernel slow to
# leave that handler (a loaded host) logs this line, with jupyter_client's own provisioner as well:
# test_papermills_own_race_is_upstream shows it. (CI met it, and another of ipykernel's at its exit: its control
# thread flushing stdout through a pipe its main thread had closed, "Socket operation on non-socket".)
UPSTREAM_RACE = "[IPKernelApp] ERROR | KeyboardInterrupt caught in kernel."
KERNEL_STDERR_TO = (
    "import os, sys; fd = os.open(sys.argv.pop(1), os.O_WRONLY | os.O_CREAT | os.O_APPEND); os.dup2(fd, 2); "
    "from ipykernel import kernelapp; kernelapp.launch_new_instance()"
)


def kernel_stderr_to(tmp_path: Path, path: Path) -> str:
    """A Python kernelspec of the user's whose kernel writes its stderr to ``path``: what a program says is then its
    own and ours, not the kernel's races at its exit (UPSTREAM_RACE). Returns its name, one of its own: in a virtual
    environment jupyter_core finds the environment's python3 before the user's."""
    name = "python3-stderr-apart"
    spec = tmp_path / "data" / "kernels" / name
    spec.mkdir(parents=True)
    argv = [sys.executable, "-c", KERNEL_STDERR_TO, str(path), "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "Python 3", "language": "python"}))
    return name


@pytest.fixture
def user(tmp_path):
    """A user's Jupyter directories (no config file) and an environment with no provisioner chosen in it: what a
    user of a fresh install has. Returns (directory, environment, ledger file)."""
    env = {k: v for k, v in os.environ.items() if k != DEFAULT_ENV}
    for name in ("config", "data", "runtime"):
        env[f"JUPYTER_{name.upper()}_DIR"] = str(tmp_path / name)
        (tmp_path / name).mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell(SHOW))
    nbformat.write(nb, tmp_path / "nb.ipynb")
    return tmp_path, env, tmp_path / "ledger.sqlite"


def run(env: dict, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*args], env=env, cwd=cwd, capture_output=True, text=True, timeout=180)


def shown(path: Path) -> str:
    """What the notebook's one cell printed (in one output or several: the kernel sends its stdout in pieces when a
    print comes later than its flush interval)."""
    outputs = nbformat.read(path, 4).cells[0].outputs
    return "".join(o["text"] for o in outputs if o["output_type"] == "stream").strip()


def write_config(directory: Path, **settings) -> None:
    (directory / "config" / "jupyter_server_config.json").write_text(json.dumps({"GpuShareApp": settings}))


def test_the_installed_package_makes_ours_every_programs_default_unless_one_is_chosen(user):
    tmp_path, env, _ = user
    ask = [sys.executable, "-c", f"import os; print(os.environ.get({DEFAULT_ENV!r}))"]
    assert run(env, *ask, cwd=tmp_path).stdout.strip() == PROVISIONER_NAME  # (the wheel's .pth, at every start)
    assert run({**env, DEFAULT_ENV: "local-provisioner"}, *ask, cwd=tmp_path).stdout.strip() == "local-provisioner"
    shipped = (ROOT / "jupyter-config" / "site-packages" / "jupyter_gpushare_provisioner.pth").read_text()
    assert f'os.environ.setdefault("{DEFAULT_ENV}", "{PROVISIONER_NAME}")' in shipped


def test_jupyter_execute_reserves_with_its_own_options_and_nothing_else_set(user):
    tmp_path, env, ledger = user
    out = run(env, "jupyter", "execute", *CARD, "--GpuShareApp.default_quota=3GiB",
              f"--GpuShareApp.ledger_path={ledger}", "--output", "out", "nb.ipynb", cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert shown(tmp_path / "out.ipynb") == "gpu 3072"
    assert "settings from the options of jupyter-execute" in out.stderr
    assert Ledger(ledger).leases() == []  # given back at the end


def test_jupyter_nbconvert_execute_reserves_with_its_own_options(user):
    tmp_path, env, ledger = user
    out = run(env, "jupyter", "nbconvert", "--to", "notebook", "--execute", *CARD, "--GpuShareApp.default_quota=2GiB",
              f"--GpuShareApp.ledger_path={ledger}", "--output", "out", "nb.ipynb", cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert shown(tmp_path / "out.ipynb") == "gpu 2048"
    assert Ledger(ledger).leases() == []


def test_papermill_reserves_with_the_servers_settings(user):
    tmp_path, env, ledger = user
    if not shutil.which("papermill"):
        pytest.skip("papermill is not installed (it is in the test extra)")
    write_config(
        tmp_path, gpu_backend="simulated", simulated_cards="24GiB", default_quota="5GiB", ledger_path=str(ledger)
    )
    out = run(env, "papermill", "-k", "python3", "nb.ipynb", "out.ipynb", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert shown(tmp_path / "out.ipynb") == "gpu 5120"
    assert Ledger(ledger).leases() == []


def test_a_simulated_card_set_once_on_the_servers_command_line_is_every_programs(user):
    """The README's quick start: `jupyter lab --GpuShareApp.simulated_cards=24GiB` on a machine without a GPU. A
    `jupyter execute` in a terminal beside it, with nothing set, reserves on that simulated card: it reads what
    this user's running server runs with (after the config files, before its own options). Without a server it
    has no GPU here."""
    tmp_path, env, ledger = user
    alone = run(env, "jupyter", "execute", f"--GpuShareApp.ledger_path={ledger}", "--output", "out", "nb.ipynb",
                cwd=tmp_path)  # fmt: skip
    if shown(tmp_path / "out.ipynb").startswith("gpu"):
        pytest.skip("this host has a GPU")
    assert alone.returncode == 0 and shown(tmp_path / "out.ipynb") == "cpu None", alone.stderr
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", "--allow-root", "--no-browser", "--port=0",
         "--GpuShareApp.simulated_cards=24GiB", "--GpuShareApp.default_quota=3GiB",
         f"--GpuShareApp.ledger_path={ledger}"],
        env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        published = tmp_path / "runtime" / "gpushare"
        wait_until(lambda: any(published.glob("settings-*.json")), timeout=120, what="the server's settings")
        out = run(env, "jupyter", "execute", "--output", "out", "nb.ipynb", cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        assert shown(tmp_path / "out.ipynb") == "gpu 3072"
        assert f"the running Jupyter server (pid {server.pid})" in out.stderr
    finally:
        server.terminate()
        server.wait(30)


def test_a_default_chosen_in_the_environment_is_kept(user):
    tmp_path, env, ledger = user
    env = {**env, DEFAULT_ENV: "local-provisioner"}
    out = run(env, "jupyter", "execute", *CARD, f"--GpuShareApp.ledger_path={ledger}", "--output", "out", "nb.ipynb",
              cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert shown(tmp_path / "out.ipynb") == "None None"  # jupyter_client's own provisioner: no reservation
    assert "jupyter-gpushare" not in out.stderr

    # Chosen in the program's config instead (which jupyter_client does not give nbclient's provisioner factory).
    out = run(user[1], "jupyter", "execute", *CARD, "--KernelProvisionerFactory.default_provisioner_name=local-provisioner",
              f"--GpuShareApp.ledger_path={ledger}", "--output", "out", "nb.ipynb", cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert shown(tmp_path / "out.ipynb") == "None None"
    assert not ledger.exists()


def test_a_kernel_of_another_language_reserves_nothing(user):
    tmp_path, env, ledger = user
    spec = tmp_path / "data" / "kernels" / "other"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "Other", "language": "julia"}))
    out = run(env, "jupyter", "execute", *CARD, f"--GpuShareApp.ledger_path={ledger}", "--kernel_name=other",
              "--output", "out", "nb.ipynb", cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert shown(tmp_path / "out.ipynb") == "none None"


def test_on_a_host_without_a_gpu_the_kernel_starts_without_one_and_says_why(user):
    tmp_path, env, ledger = user
    out = run(env, "jupyter", "execute", f"--GpuShareApp.ledger_path={ledger}", "--output", "out", "nb.ipynb",
              cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    if shown(tmp_path / "out.ipynb").startswith("gpu"):
        pytest.skip("this host has a GPU")
    assert shown(tmp_path / "out.ipynb") == "cpu None"
    assert "Started without a GPU: this server has none (" in out.stderr, out.stderr  # and why, as the server knows


@contextlib.contextmanager
def a_full_card(tmp_path: Path, env: dict, ledger: Path, **settings) -> Iterator[None]:
    """A 4 GiB card of which another `jupyter execute`'s kernel holds 3 GiB (+ its context) while this runs;
    ``settings`` (a broker's socket, where ``ledger`` is the broker's) too."""
    write_config(tmp_path, gpu_backend="simulated", simulated_cards="4GiB", default_quota="3GiB", card_headroom="0MiB",
                 ledger_path=str(ledger), **settings)  # fmt: skip
    holder_nb = nbformat.v4.new_notebook()
    holder_nb.cells.append(nbformat.v4.new_code_cell("import time; time.sleep(600)"))
    nbformat.write(holder_nb, tmp_path / "holder.ipynb")
    holder = subprocess.Popen(["jupyter", "execute", "holder.ipynb"], env=env, cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        wait_until(
            lambda: ledger.exists() and len(Ledger(ledger).leases()) == 1, timeout=120, what="the holder's lease"
        )
        yield
    finally:
        os.killpg(holder.pid, signal.SIGTERM)
        try:
            holder.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(holder.pid, signal.SIGKILL)
            holder.wait(30)


@pytest.mark.timeout(300)
def test_a_waiting_client_says_where_it_stands_and_ctrl_c_leaves_the_line_in_one_line(user):
    tmp_path, env, ledger = user
    waiter = None
    with a_full_card(tmp_path, env, ledger):
        try:
            err = tmp_path / "waiter.err"
            with open(err, "w") as f:
                waiter = subprocess.Popen(["jupyter", "execute", "nb.ipynb"], env=env, cwd=tmp_path,
                                          stdout=subprocess.DEVNULL, stderr=f)  # fmt: skip

            def places() -> list[str]:
                return [line for line in err.read_text().splitlines() if "waits for a GPU: #1 in line" in line]

            # Its place does not change (the holder holds on): it is said again all the same, every PROGRESS_EVERY_S.
            wait_until(lambda: len(places()) >= 2, timeout=60 + 2 * PROGRESS_EVERY_S, what="the place said twice")
            assert [w.kernel_id[:8] for w in Ledger(ledger).waiters()] == [places()[0].split()[2]]
            before = err.read_text().splitlines()
            waiter.send_signal(signal.SIGINT)
            assert waiter.wait(30) == -signal.SIGINT  # it ends as on any Ctrl-C: by SIGINT (130 in a shell)
            after = err.read_text().splitlines()[len(before) :]
            assert len(after) == 1, after
            assert "stopped waiting for a GPU (Ctrl-C): it left the line and was not started." in after[0]
            assert Ledger(ledger).waiters() == []  # its place was given up, not left to go stale
            assert len(Ledger(ledger).leases()) == 1  # and the holder's reservation is untouched
        finally:
            if waiter is not None and waiter.poll() is None:
                waiter.kill()


def _one_line(out: subprocess.CompletedProcess, code: str, says: str) -> None:
    """The program ended with EXIT_CODES[code] and said why in one line of ours: no traceback, no second telling,
    nothing from an exit hook."""
    ours = [line for line in out.stderr.splitlines() if "was not started" in line]
    assert out.returncode == EXIT_CODES[code], out.stderr
    assert len(ours) == 1 and says in ours[0], out.stderr
    assert "Traceback" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr


@pytest.mark.timeout(300)
def test_a_wait_that_ends_without_a_gpu_says_why_in_one_line_and_an_exit_status(user):
    """A terminal job whose wait ends (queue_timeout), that a rule refuses (on_full='reject'), or whose settings are
    wrong: one line that says why, and an exit status a shell script can test (batch.EXIT_CODES). It was about 150
    lines: the reason twice, two tracebacks and an exit hook's RuntimeError."""
    tmp_path, env, ledger = user
    with a_full_card(tmp_path, env, ledger):
        _one_line(run(env, "jupyter", "execute", "--GpuShareApp.queue_timeout=3", "nb.ipynb", cwd=tmp_path),
                  "timeout", "as long as kernels may wait here")  # fmt: skip
        _one_line(run(env, "jupyter", "nbconvert", "--to", "notebook", "--execute", "--GpuShareApp.on_full=reject",
                      "--output", "out", "nb.ipynb", cwd=tmp_path), "refused", "No GPU has room")  # fmt: skip
        if shutil.which("papermill"):
            write_config(tmp_path, gpu_backend="simulated", simulated_cards="4GiB", default_quota="lots",
                         ledger_path=str(ledger))  # fmt: skip
            _one_line(run(env, "papermill", "-k", "python3", "nb.ipynb", "out.ipynb", cwd=tmp_path),
                      "settings", "GpuShareApp.default_quota: 'lots' is not a size")  # fmt: skip
        assert Ledger(ledger).waiters() == [] and len(Ledger(ledger).leases()) == 1  # nothing left behind


@pytest.mark.timeout(300)
def test_a_terminal_job_an_admin_takes_out_of_the_line_ends_in_one_line_with_status_5(user):
    """A teacher's Take out (the ledger's `remove` ruling, as the host view makes it) of a `jupyter execute` that
    waits: the program says who took it out and why in one line, and ends with its own exit status."""
    tmp_path, env, ledger = user
    with a_full_card(tmp_path, env, ledger):
        err = tmp_path / "taken.err"
        with open(err, "w") as f:
            job = subprocess.Popen(["jupyter", "execute", "nb.ipynb"], env=env, cwd=tmp_path,
                                   stdout=subprocess.DEVNULL, stderr=f)  # fmt: skip
        try:
            wait_until(lambda: Ledger(ledger).waiters(), timeout=120, what="the job in line")
            Ledger(ledger).act(Ledger(ledger).waiters()[0].kernel_id, "remove", "prof", "the lab is closing")
            assert job.wait(60) == EXIT_CODES["taken-out"], err.read_text()
        finally:
            if job.poll() is None:
                job.kill()
        said = err.read_text()
        ours = [line for line in said.splitlines() if "was not started" in line]
        assert len(ours) == 1 and "prof" in ours[0] and "the lab is closing" in ours[0], said
        assert "Traceback" not in said and "Exception ignored" not in said, said
        assert Ledger(ledger).waiters() == [] and len(Ledger(ledger).leases()) == 1


def test_jupyter_console_gives_its_kernels_reservation_back_as_it_exits(user):
    pexpect = pytest.importorskip("pexpect")
    tmp_path, env, ledger = user
    if not shutil.which("jupyter-console"):
        pytest.skip("jupyter-console is not installed (it is in the test extra)")
    write_config(
        tmp_path, gpu_backend="simulated", simulated_cards="24GiB", default_quota="3GiB", ledger_path=str(ledger)
    )
    console = pexpect.spawn("jupyter", ["console", "--simple-prompt"], env=env, cwd=str(tmp_path), encoding="utf-8",
                            timeout=120)  # fmt: skip
    try:
        console.expect(r"In \[1\]")
        # jupyter_console shows its first prompt without checking that its IOPub subscription is connected (jupyter_
        # client's wait_for_ready does): a line sent at once on a loaded host can wait forever for an idle it missed
        time.sleep(2)
        console.sendline(SHOW)
        console.expect(r"In \[2\]")
        assert "gpu 3072" in console.before
        assert len(Ledger(ledger).leases()) == 1
        t0 = time.monotonic()
        console.sendline("exit")
        console.expect(pexpect.EOF)
    finally:
        console.close(force=True)
    assert console.exitstatus == 0
    assert Ledger(ledger).leases() == []  # given back by the console itself, not reaped later by someone else
    assert time.monotonic() - t0 < 30


@pytest.mark.timeout(300)
def test_jupyter_console_whose_kernel_waited_ends_cleanly(user):
    """A console whose kernel waited in line, then ran: `exit` gives the reservation back and ends with status 0, and
    nothing more is said (it printed an atexit traceback ending in "Event loop is closed")."""
    pexpect = pytest.importorskip("pexpect")
    tmp_path, env, ledger = user
    if not shutil.which("jupyter-console"):
        pytest.skip("jupyter-console is not installed (it is in the test extra)")
    with a_full_card(tmp_path, env, ledger):
        console = pexpect.spawn("jupyter", ["console", "--simple-prompt"], env=env, cwd=str(tmp_path),
                                encoding="utf-8", timeout=120)  # fmt: skip
        console.expect("waits for a GPU: #1 in line")
    try:
        console.expect(r"In \[1\]")
        time.sleep(2)  # (its IOPub subscription: see the test above)
        console.sendline("40 + 2")
        console.expect(r"In \[2\]")
        assert "42" in console.before
        console.sendline("exit")
        console.expect(pexpect.EOF)
        said = console.before
    finally:
        console.close(force=True)
    assert console.exitstatus == 0, said
    assert "Traceback" not in said and "Exception ignored" not in said and "Event loop is closed" not in said, said
    assert Ledger(ledger).leases() == []


@needs_root
@pytest.mark.timeout(400)
def test_papermill_through_a_broker_ends_as_soon_as_its_notebook_after_a_wait_and_a_refusal_in_one_line(user):
    """Through the host's broker (issue 47, item 5): papermill that waited in line ends as soon as its notebook did,
    as one that did not wait, with nothing said at exit by papermill or by us (the kernel's own stderr is kept apart:
    kernel_stderr_to). It idled about 25 s (the broker's watch, held by its client as it exited) and printed
    'ERROR | KeyboardInterrupt'. Refused by a rule, it says why in one line."""
    if not shutil.which("papermill"):
        pytest.skip("papermill is not installed (it is in the test extra)")
    tmp_path, env, _ = user
    kernel = kernel_stderr_to(tmp_path, tmp_path / "kernel.err")
    (tmp_path / "broker").mkdir()
    card = {"gpu_backend": "simulated", "simulated_cards": "4GiB", "default_quota": "3GiB"}
    broker = Broker(tmp_path / "broker", gpu=card, limits={})
    broker.start()
    papermill = ["papermill", "-k", kernel, "nb.ipynb", "out.ipynb"]
    try:
        with a_full_card(tmp_path, env, Path(broker.ledger), broker_socket=broker.socket):
            client = {**card, "card_headroom": "0MiB", "context_reserve": "512MiB", "broker_socket": broker.socket}
            write_config(tmp_path, **client, on_full="reject")
            _one_line(run(env, *papermill, cwd=tmp_path), "refused", "No GPU has room")
            write_config(tmp_path, **client)
            err = tmp_path / "waiter.err"
            with open(err, "w") as f:
                job = subprocess.Popen(papermill, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=f)
            wait_until(lambda: Ledger(broker.ledger).waiters(), timeout=120, what="papermill in line")
        freed = time.monotonic()  # (the holder ended as the card's block ended)
        assert job.wait(120) == 0, err.read_text()
        after_wait = time.monotonic() - freed
        said = err.read_text()
        assert shown(tmp_path / "out.ipynb") == "gpu 3072"
        t0 = time.monotonic()
        plain = run(env, *papermill, cwd=tmp_path)  # the same job, the card free: nothing to wait for
        assert plain.returncode == 0, plain.stderr
        alone = time.monotonic() - t0
    finally:
        broker.stop()
    assert "KeyboardInterrupt" not in said and "Traceback" not in said and "Exception ignored" not in said, said
    assert "IPKernelApp" in (tmp_path / "kernel.err").read_text() and "IPKernelApp" not in said  # (kept apart)
    # its grant comes within a reap of the holder's end (0.5 s here); then it runs as the job that did not wait
    assert after_wait < alone + 10, (after_wait, alone)


@pytest.mark.timeout(300)
def test_papermills_own_race_is_upstream(user):
    """The line UPSTREAM_RACE, which the test above keeps apart, comes from papermill, jupyter_client and ipykernel
    alone: a kernel that lingers in its kernel_info handler after the reply (as one descheduled on a loaded host
    does) logs it at papermill's exit with jupyter_client's own provisioner, and the same with ours."""
    if not shutil.which("papermill"):
        pytest.skip("papermill is not installed (it is in the test extra)")
    tmp_path, env, _ = user
    write_config(tmp_path, gpu_backend="simulated", simulated_cards="4GiB", default_quota="1GiB",
                 ledger_path=str(tmp_path / "ledger.sqlite"))  # fmt: skip
    (tmp_path / "lingers.py").write_text(
        "import time\n"
        "import ipykernel.kernelbase as kb\n"
        "reply = kb.Kernel.kernel_info_request\n"
        "async def kernel_info_request(self, *args):\n"
        "    await reply(self, *args)\n"
        "    time.sleep(0.5)\n"
        "kb.Kernel.kernel_info_request = kernel_info_request\n"
        "from ipykernel import kernelapp\n"
        "kernelapp.launch_new_instance()\n"
    )
    spec = tmp_path / "data" / "kernels" / "lingers"
    spec.mkdir(parents=True)
    argv = [sys.executable, str(tmp_path / "lingers.py"), "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "lingers", "language": "python"}))
    said = {}
    for provisioner in ("local-provisioner", PROVISIONER_NAME):
        out = run({**env, DEFAULT_ENV: provisioner}, "papermill", "-k", "lingers", "nb.ipynb", "out.ipynb",
                  cwd=tmp_path)  # fmt: skip
        assert out.returncode == 0, out.stderr
        said[provisioner] = UPSTREAM_RACE in out.stderr
    assert said == {"local-provisioner": True, PROVISIONER_NAME: True}, said


@needs_root
def test_a_terminal_job_finds_the_hosts_broker_at_its_default_socket(user):
    """On a JupyterHub the broker's socket is on the servers' command line (Spawner.args), which a student's
    terminal job does not see: it finds the broker at its default socket all the same, with nothing set.

    The broker and the job run in a mount namespace of their own, where a directory of this test's is bound over the
    default socket's: the host's real one is never touched, and tests run beside this one (pytest-xdist) never find
    this broker."""
    tmp_path, env, ledger = user
    home = os.path.dirname(DEFAULT_SOCKET)
    made_dir = not os.path.isdir(home)
    os.makedirs(home, exist_ok=True)
    (tmp_path / "broker").mkdir()
    (tmp_path / "run").mkdir(mode=0o755)
    holder = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "600"])
    namespace = ("nsenter", "-t", str(holder.pid), "-m")
    broker = Broker(tmp_path / "broker", extra=f"c.GpuShareBroker.socket_path = {DEFAULT_SOCKET!r}\n", prefix=namespace)
    broker.socket = str(tmp_path / "run" / os.path.basename(DEFAULT_SOCKET))  # (the same socket, seen from here)
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell(f"{SHOW}; from jupyter_gpushare.ledger.ledger import Ledger; "
                                              f"print(len(Ledger({broker.ledger!r}).leases()))"))  # fmt: skip
    nbformat.write(nb, tmp_path / "nb.ipynb")
    try:
        # (until unshare has made it, nsenter enters the host's own: a bind mount made then was the host's, and
        # every test beside this one found this broker at the default socket; seen in CI)
        mine = os.readlink("/proc/self/ns/mnt")
        wait_until(lambda: os.readlink(f"/proc/{holder.pid}/ns/mnt") != mine, what="the mount namespace")
        subprocess.run([*namespace, "mount", "--bind", str(tmp_path / "run"), home], check=True)
        broker.start()
        # The broker's card is simulated: the job is given the same simulated card (a server would be too).
        out = run(env, *namespace, f"--wd={tmp_path}", "jupyter", "execute", *CARD[:1], "--GpuShareApp.simulated_cards=10GiB",
                  "--GpuShareApp.default_quota=2GiB", f"--GpuShareApp.ledger_path={ledger}", "--output", "out",
                  "nb.ipynb", cwd=tmp_path)  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert shown(tmp_path / "out.ipynb").split() == ["gpu", "2048", "1"]  # its lease is in the broker's ledger
        assert not ledger.exists()  # and none in a ledger of its own
        assert not os.path.exists(DEFAULT_SOCKET)  # (the host's own default socket was never made)
    finally:
        broker.stop()
        holder.kill()
        holder.wait()
        if made_dir:
            os.rmdir(home)
