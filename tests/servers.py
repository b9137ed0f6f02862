"""Whole `jupyter server` processes for tests: start one, call its REST API, stop it."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

TOKEN = "gpushare-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def running(pid: int) -> bool:
    """Whether a process runs: not gone, and not a zombie waiting to be reaped (either may happen at any moment)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_until(predicate, timeout: float = 30, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


class ServerProcess:
    """A `jupyter server` subprocess with jupyter-gpushare, its log in a file."""

    name = "server"
    proc: subprocess.Popen | None = None
    command: tuple[str, ...] = ("-m", "jupyter_server")  # (after the interpreter)

    def launch(self, log_dir: Path, args: list[str], settings: dict[str, str], **popen) -> None:
        """Start it with ``args`` and ``--GpuShareApp.<k>=<v>`` for each setting, on a free port and that port only:
        a port taken meanwhile (by a kernel of a test beside this one) fails its start, and ``wait_ready`` starts it
        again on another. (With Jupyter's port retries it took the next port, and this asked a kernel's ZMQ socket
        on its own: BadStatusLine, seen in CI.)"""
        self._launched = (log_dir, args, settings, popen)
        self.port = free_port()
        self.log = open(Path(log_dir) / f"{self.name}-{self.port}.log", "w+")
        self.proc = subprocess.Popen(
            [sys.executable, *self.command, f"--port={self.port}", "--ServerApp.port_retries=0",
             f"--IdentityProvider.token={TOKEN}", "--ServerApp.open_browser=False", *args,
             *(f"--GpuShareApp.{k}={v}" for k, v in settings.items())],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, **popen,
        )  # fmt: skip

    def wait_ready(self, timeout: float = 90):
        def ready() -> bool:
            if self.proc.poll() is not None:
                said = self.output()
                if f"The port {self.port} is already in use" not in said:
                    raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n{said}")
                self.log.close()
                self.launch(*self._launched[:3], **self._launched[3])
                return False
            try:
                self.call("GET", "api/status")
                return True
            except (urllib.error.URLError, ConnectionError, http.client.HTTPException):
                return False

        wait_until(ready, timeout, f"{self.name} to answer")
        return self

    def kernel_processes(self) -> list:
        """The server's child processes that are kernels (or stand-ins), by command line.

        Other children (JupyterLab may run npm or git) can exit at any moment: one that is gone,
        or a zombie not yet reaped, is not a kernel and is skipped. A kernel's command line reads empty
        while it execs (the stand-in becomes the kernel; CI saw a waiting kernel missed so): read it again.
        """
        found = []
        for child in psutil.Process(self.proc.pid).children():
            command = ""
            for _ in range(50):
                try:
                    command = " ".join(child.cmdline())
                except psutil.Error:
                    break
                if command:
                    break
                time.sleep(0.02)
            if "ipykernel" in command:
                found.append(child)
        return found

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def call(self, method: str, path: str, body: dict | None = None):
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/{path}", method=method, headers={"Authorization": f"token {TOKEN}"},
            data=json.dumps(body).encode() if body is not None else None,
        )  # fmt: skip
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read() or b"null")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


class SimulatedServer(ServerProcess):
    """A `jupyter server` subprocess with the extension on a simulated card."""

    def __init__(self, tmp_path, *args: str):
        settings = {
            "ledger_path": str(tmp_path / "ledger.sqlite"), "gpu_backend": "simulated", "simulated_cards": "10GiB",
            "card_headroom": "0MiB", "context_reserve": "512MiB", "default_quota": "2GiB", "reconcile_interval": "0.5",
        }  # fmt: skip
        for arg in args:  # --GpuShareApp.x=y replaces the default above
            key, _, value = arg.removeprefix("--GpuShareApp.").partition("=")
            settings[key] = value
        env = {
            **os.environ,
            "JUPYTER_DATA_DIR": str(tmp_path / "data"),
            "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
            "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
        }
        (tmp_path / "root").mkdir(exist_ok=True)
        self.launch(tmp_path, ["--allow-root", f"--ServerApp.root_dir={tmp_path / 'root'}"], settings, env=env)
