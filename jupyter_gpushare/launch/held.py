"""A kernel start held until its GPU reservation is granted: the kernel exists at once, its process runs later.

Jupyter's start of a kernel (``POST /api/sessions``, ``POST /api/kernels``) answers as soon as the kernel's
process is launched. When the kernel must wait in line, the provisioner launches a stand-in instead of the
kernel (standin.py: the kernel's own command, working directory, process session and environment, waiting on
a pipe), so that the start answers at once with the kernel listed, its session made, and its id known to every
client, and no HTTP request is held open while it waits. Once the reservation is granted, ``release`` writes the
kernel's whole environment (the grant's card, quota and framework caps) to the pipe and the stand-in becomes the
kernel (``execve``: same pid). A wait that ends without a grant, or a shut-down, closes the pipe: the stand-in
exits at once.

``started`` is what a websocket to the kernel waits on (connection.py): True once the kernel runs, False if it
never will.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

STANDIN = str(Path(__file__).with_name("standin.py"))


def standin_command(groups: list[str], fd: str, cmd: list[str]) -> list[str]:
    """standin.py's command line: enter ``groups`` (cgroup.procs files), then wait on the pipe ``fd`` for the
    grant, or (``fd`` "-") become the kernel ``cmd`` at once."""
    entering = [arg for procs in groups for arg in ("--cgroup", procs)]
    return [sys.executable, "-I", "-S", STANDIN, *entering, fd, *cmd]


class HeldStart:
    """One kernel's held start: the pipe to its stand-in and the environment it will run with."""

    def __init__(self) -> None:
        self._read_fd: int | None = None
        self._write_fd: int | None = None
        self.env: dict[str, str] = {}
        self.launched_at: float | None = None  # (monotonic) when the stand-in was launched
        self.started: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    def command(self, cmd: list[str], kwargs: dict[str, Any], groups: list[str]) -> tuple[list[str], dict[str, Any]]:
        """The stand-in's command and launch arguments, for the kernel's ``cmd`` and ``kwargs`` (jupyter_client's
        launch_kernel: the same working directory, session and environment); it enters ``groups`` first."""
        self._read_fd, self._write_fd = os.pipe()
        self.env = kwargs.get("env") or dict(os.environ)
        kwargs = {**kwargs, "env": self.env, "pass_fds": (*kwargs.get("pass_fds", ()), self._read_fd)}
        return standin_command(groups, str(self._read_fd), cmd), kwargs

    def launched(self) -> None:
        """The stand-in runs: close our copy of its end of the pipe (its exit then closes it for good)."""
        if self.launched_at is None:
            self.launched_at = time.monotonic()
        if self._read_fd is not None:
            os.close(self._read_fd)
            self._read_fd = None

    async def release(self, env_update: dict[str, str]) -> None:
        """Turn the stand-in into the kernel, with its environment (as launched: launch_kernel adds to it) updated
        by the grant's."""
        if self._write_fd is None:
            raise RuntimeError("the kernel's held start has ended")
        data = json.dumps({**self.env, **env_update}).encode()
        fd, self._write_fd = self._write_fd, None
        try:
            await asyncio.get_running_loop().run_in_executor(None, _write_all, fd, data)
        finally:
            os.close(fd)
        if not self.started.done():
            self.started.set_result(True)

    def end(self) -> None:
        """The kernel will not run: the stand-in reads end of file and exits; websockets waiting on it close."""
        if self._read_fd is not None:
            os.close(self._read_fd)
            self._read_fd = None
        if self._write_fd is not None:
            os.close(self._write_fd)
            self._write_fd = None
        if not self.started.done():
            self.started.set_result(False)

    @property
    def waiting(self) -> bool:
        return not self.started.done()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BrokenPipeError:
            return  # the stand-in is gone (shut down meanwhile): the kernel's exit says the rest
        view = view[written:]
