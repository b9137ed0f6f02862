"""Many users on one host, for tests: real Unix users, a real broker process, and Jupyter servers run as them.

Needs root (useradd, servers as other users); tests that use these helpers skip otherwise (``needs_root``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import urllib.error
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from jupyter_client import BlockingKernelClient
from servers import ServerProcess, wait_until

from jupyter_gpushare.broker import BrokerLedger

RUN = os.getpid() % 100000  # user names of this run: test runs on one machine may overlap
ALICE, BOB, STAFF, STAFF_GROUP = f"gsa{RUN}", f"gsb{RUN}", f"gsc{RUN}", f"gss{RUN}"
STUDENTS = (ALICE, BOB)
KERNEL = 2560  # 2 GiB quota + 512 MiB context reserve, on a 10 GiB card: four fit

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("useradd"),
    reason="needs root and useradd: runs Jupyter servers as three different Unix users",
)


# -- helpers ---------------------------------------------------------------------------------------


def ensure_user(name: str, group: str | None = None) -> pwd.struct_passwd:
    if group:
        subprocess.run(["groupadd", "-f", group], check=True)
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--no-create-home", "--shell", "/bin/sh", *(["-G", group] if group else []), name], check=True
        )
    return pwd.getpwnam(name)


def remove_user(name: str) -> None:
    subprocess.run(["userdel", name], capture_output=True)


def run_as(user: pwd.struct_passwd, home: Path, env: dict | None = None) -> dict:
    """Popen arguments that run a process as ``user`` with ``home`` as its HOME."""
    return {
        "user": user.pw_uid,
        "group": user.pw_gid,
        "extra_groups": os.getgrouplist(user.pw_name, user.pw_gid),
        "env": {**os.environ, "HOME": str(home), "USER": user.pw_name, "LOGNAME": user.pw_name,
                "JUPYTER_DATA_DIR": str(home / "data"), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
                "JUPYTER_CONFIG_DIR": str(home / "config"), "IPYTHONDIR": str(home / "ipython"), **(env or {})},
        "cwd": str(home),
    }  # fmt: skip


SIMULATED = {"gpu_backend": "simulated", "simulated_cards": "10GiB"}


class Broker:
    def __init__(
        self, base: Path, gpu: dict | None = None, limits: dict | None = None, extra: str = "", prefix: tuple = ()
    ):
        """``extra``: more config lines (Python), e.g. GpuShareBroker.tcp_address; ``prefix``: a command the
        broker runs under (another user, another /proc)."""
        self.base = base
        self.prefix = prefix
        gpu = SIMULATED if gpu is None else gpu
        limits = {"max_total": "4GiB"} if limits is None else limits
        self.socket = str(base / "run" / "broker.sock")
        self.ledger = str(base / "lib" / "ledger.sqlite")
        config = base / "broker_config.py"
        config.write_text(
            textwrap.dedent(
                f"""
                {"".join(f"c.GpuShareApp.{k} = {v!r}; " for k, v in gpu.items())}
                c.GpuShareApp.card_headroom = "0MiB"
                c.GpuShareApp.context_reserve = "512MiB"
                c.GpuShareBroker.socket_path = {self.socket!r}
                c.GpuShareBroker.ledger_path = {self.ledger!r}
                c.GpuShareBroker.reap_interval = 0.5
                c.GpuShareBroker.default_limits = {limits!r}
                c.GpuShareBroker.group_limits = {{{STAFF_GROUP!r}: {{"max_total": None}}}}
                """
            )
            + textwrap.dedent(extra)
        )
        self.config = str(config)
        self.proc: subprocess.Popen | None = None

    def start(self) -> Broker:
        self.log = open(self.base / "broker.log", "a+")
        self.proc = subprocess.Popen(
            [*self.prefix, sys.executable, "-m", "jupyter_gpushare.cli.main", "broker", f"--config={self.config}"],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # stop() signals the group: the broker, also under a prefix
        )
        wait_until(lambda: self._answers(), timeout=60, what="the broker to listen")
        return self

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"broker exited {self.proc.returncode}:\n{self.output()}")
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(self.socket)
                return True
            except OSError:
                return False

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(20)
        self.log.close()

    def admin_view(self) -> dict:
        client = BrokerLedger(self.socket)
        try:
            return client.view()
        finally:
            client.close()


class UserServer(ServerProcess):
    """A `jupyter server` running as one Unix user, reserving through the broker."""

    def __init__(self, base: Path, user: pwd.struct_passwd, broker: Broker, gpu: dict | None = None):
        self.user = user
        self.gpu = SIMULATED if gpu is None else gpu
        self.name = f"server-{user.pw_name}"
        self.home = base / user.pw_name
        self.home.mkdir(exist_ok=True)
        (self.home / "root").mkdir(exist_ok=True)
        os.chown(self.home, user.pw_uid, user.pw_gid)
        os.chown(self.home / "root", user.pw_uid, user.pw_gid)
        os.chmod(self.home, 0o700)
        self.broker = broker

    def start(self) -> UserServer:
        settings = {
            "broker_socket": self.broker.socket, "card_headroom": "0MiB", "context_reserve": "512MiB",
            "default_quota": "2GiB", "reconcile_interval": "0.5", "on_full": "reject", **self.gpu,
        }  # fmt: skip
        self.launch(
            self.home.parent, [f"--ServerApp.root_dir={self.home / 'root'}"], settings, **run_as(self.user, self.home)
        )
        return self

    def start_kernel(self) -> str:
        return self.call("POST", "api/kernels", {"name": "python3"})["id"]

    def refused(self) -> tuple[int, str]:
        with pytest.raises(urllib.error.HTTPError) as e:
            self.start_kernel()
        return e.value.code, json.loads(e.value.read())["message"]

    def kernel(self, kernel_id: str) -> dict:
        return next(k for k in self.call("GET", "api/gpushare/kernels")["kernels"] if k["kernel_id"] == kernel_id)


def run_in_kernel(server: UserServer, kernel_id: str, code: str) -> str:
    """Run ``code`` in a kernel of ``server`` (as its user, in its process) and return what it printed."""
    client = BlockingKernelClient(connection_file=str(server.home / "runtime" / f"kernel-{kernel_id}.json"))
    client.load_connection_file()
    # No heartbeat: a client without a kernel manager calls a kernel dead once it misses heartbeats for a second,
    # which one that is still starting does on a loaded host ("Kernel died before replying to kernel_info")
    client.start_channels(hb=False)
    try:
        client.wait_for_ready(timeout=60)
        out: list[str] = []
        reply = client.execute_interactive(
            textwrap.dedent(code),
            timeout=60,
            output_hook=lambda m: out.append(m["content"].get("text", "")) if m["msg_type"] == "stream" else None,
        )
        assert reply["content"]["status"] == "ok", reply["content"]
        return "".join(out)
    finally:
        client.stop_channels()


def as_user(user: pwd.struct_passwd, home: Path, code: str) -> dict:
    """Run Python as ``user`` and return the JSON it prints last."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60, **run_as(user, home)
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- the host: broker + three users' servers ----------------------------------------------------------


TRAVERSE_STATE = "/tmp/.gpushare-test-root-traverse.json"


@contextlib.contextmanager
def root_traversable():
    """Let other users reach the interpreter under /root/.pyenv (o+x on /root) while this runs.

    Test runs may overlap (several people, one machine): the first to start records /root's mode,
    the last to finish restores it; holders are tracked by pid, so a crashed run does not pin it.
    """

    def update(change):
        with open(TRAVERSE_STATE + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                with open(TRAVERSE_STATE) as f:
                    state = json.load(f)
            except (OSError, ValueError):
                state = {"mode": stat.S_IMODE(os.stat("/root").st_mode), "pids": []}
            state["pids"] = [p for p in state["pids"] if psutil.pid_exists(p)]
            change(state["pids"])
            if state["pids"]:
                os.chmod("/root", state["mode"] | 0o001)
                with open(TRAVERSE_STATE, "w") as f:
                    json.dump(state, f)
            else:
                os.chmod("/root", state["mode"])
                with contextlib.suppress(OSError):
                    os.unlink(TRAVERSE_STATE)

    update(lambda pids: pids.append(os.getpid()))
    try:
        yield
    finally:
        update(lambda pids: pids.remove(os.getpid()) if os.getpid() in pids else None)


@contextlib.contextmanager
def shared_scratch(prefix: str) -> Iterator[Path]:
    """A scratch directory every user can read, while other users can reach this interpreter."""
    with root_traversable():
        base = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
        os.chmod(base, 0o755)
        try:
            yield base
        finally:
            shutil.rmtree(base, ignore_errors=True)


def stop_all_kernels(servers) -> None:
    for server in servers.values():
        for k in server.call("GET", "api/kernels"):
            server.call("DELETE", f"api/kernels/{k['id']}")


def reserved(broker: Broker) -> int:
    return broker.admin_view()["cards"][0]["reserved_mib"]


@contextlib.contextmanager
def running_host(
    prefix: str, staff: bool = True, gpu: dict | None = None, **broker_args
) -> Iterator[tuple[Broker, dict[str, UserServer]]]:
    """A broker (``broker_args``: see Broker) and a Jupyter server for each of the students (and, with ``staff``,
    STAFF in STAFF_GROUP), each run as its own Unix user; all gone afterwards."""
    with shared_scratch(prefix) as base:
        users = {name: ensure_user(name) for name in STUDENTS}
        if staff:
            users[STAFF] = ensure_user(STAFF, STAFF_GROUP)
        broker = Broker(base, **broker_args)
        servers: dict[str, UserServer] = {}
        try:
            broker.start()
            servers = {name: UserServer(base, user, broker, gpu=gpu).start() for name, user in users.items()}
            for server in servers.values():
                server.wait_ready()
            yield broker, servers
        finally:
            for server in servers.values():
                server.stop()
            broker.stop()
            for name in users:
                remove_user(name)
            if staff:
                subprocess.run(["groupdel", STAFF_GROUP], capture_output=True)
