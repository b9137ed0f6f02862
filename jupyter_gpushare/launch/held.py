"""A kernel that runs while its GPU waits: the kernel starts at once, the grant reaches it through a pipe.

Jupyter's start of a kernel (``POST /api/sessions``, ``POST /api/kernels``) answers as soon as the kernel's
process is launched. When the kernel must wait in line, the provisioner launches the kernel itself at once, with
every GPU hidden (``CUDA_VISIBLE_DEVICES=""``, its cgroup's cards closed) and the read end of a pipe in
``GPUSHARE_GRANT_FD``: CPU cells run while it waits. The kernel's bootstrap (``_gpushare_wait``) reads the pipe
in a thread; the first import of a GPU framework waits in its cell for the grant, saying its place in line.

What the pipe carries, one JSON object per line: ``{"wait": {...}}`` while the kernel is in line (its place,
what it needs, what is free; at most one a second, dropped when the kernel does not read them), then once
``{"grant": {...}}``, the variables the grant adds to the kernel's environment (its card, quota and caps; or, a
wait that ended without a GPU, ``GPUSHARE_MODE=cpu`` and the reason). The grant never restarts the kernel: the
same process, with its state, runs on with the card opened to it. End of file before a grant (the server shut
the kernel down, or is gone) leaves the GPU hidden.

A kernel that asks at its first GPU use (line_place = 'first-use': ``GPUSHARE_MODE=standby``) also gets the write
end of a second pipe, ``GPUSHARE_ASK_FD``: its first GPU framework import writes ``ask`` there, once, and then waits
for the grant as a kernel in line does. The server reads that pipe (``listen``) and puts the kernel in line; any
other bytes are the kernel's own business and are dropped, and past ASK_LIMIT of them the pipe is closed.

A wait that ended without a GPU keeps the pipe open: the kernel may join the line again in place (``rejoin``;
the kernel agrees first, ``_gpushare_wait.can_rejoin``), and its next wait and grant come through the same pipe.

``started`` is what a websocket to the kernel waits on (connection.py): True once the kernel runs, False if it
never will. A kernel that runs while it waits has started.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..bootstrap import _gpushare_env as names

STANDIN = str(Path(__file__).with_name("standin.py"))
ASK = b"ask"  # the one line the kernel writes on its ask pipe
ASK_LIMIT = 4096  # bytes read from a kernel's ask pipe before it is closed (a kernel that writes anything else)


def standin_command(groups: list[str], cmd: list[str], broker: tuple[str, str] | None = None) -> list[str]:
    """standin.py's command line: enter ``groups`` (cgroup.procs files), or (``broker``: its socket and the kernel's
    id) the group the host's broker owns for the kernel, then become the kernel ``cmd``."""
    entering = [arg for procs in groups for arg in ("--cgroup", procs)]
    if broker is not None:
        entering += ["--broker", *broker]
    return [sys.executable, "-I", "-S", STANDIN, *entering, *cmd]


class HeldStart:
    """One running kernel's wait for its GPU: the pipe that carries its place in line and then its grant."""

    def __init__(self, asks: bool = False) -> None:
        self._read_fd: int | None = None
        self._write_fd: int | None = None
        self._asks = asks  # the kernel asks at its first GPU use (GPUSHARE_ASK_FD)
        self._ask_read: int | None = None
        self._ask_write: int | None = None
        self._ask_seen = b""
        self._ask_loop: asyncio.AbstractEventLoop | None = None  # where the ask pipe is read (``listen``)
        self._last: bytes = b""
        self._ended = False
        self.env: dict[str, str] = {}  # the kernel's environment as launched
        self.launched_at: float | None = None  # (monotonic) when the kernel was launched
        self.started: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    def command(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The kernel's launch arguments (jupyter_client's launch_kernel) with the pipe's read end passed to it and
        named in its environment."""
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)  # a kernel that does not read never blocks the server
        self.env = {**(kwargs.get("env") or os.environ), names.GRANT_FD: str(self._read_fd)}
        passed = (*kwargs.get("pass_fds", ()), self._read_fd)
        if self._asks:
            self._ask_read, self._ask_write = os.pipe()
            os.set_blocking(self._ask_read, False)
            self.env[names.ASK_FD] = str(self._ask_write)
            passed += (self._ask_write,)
        return {**kwargs, "env": self.env, "pass_fds": passed}

    def launched(self) -> None:
        """The kernel runs: close our copy of its end of the pipe (its exit then closes it for good)."""
        if self.launched_at is None:
            self.launched_at = time.monotonic()
        for name in ("_read_fd", "_ask_write"):
            fd = getattr(self, name)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)
        if not self.started.done():
            self.started.set_result(True)

    def listen(self, on_ask: Callable[[], None]) -> None:
        """Call ``on_ask`` (on the event loop) when the kernel asks for its GPU, once; then stop listening."""
        if self._ask_read is not None:
            self._ask_loop = asyncio.get_running_loop()
            self._ask_loop.add_reader(self._ask_read, self._read_ask, on_ask)

    def _read_ask(self, on_ask: Callable[[], None]) -> None:
        assert self._ask_read is not None  # (the reader is removed with it)
        try:
            data = os.read(self._ask_read, ASK_LIMIT)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        self._ask_seen = (self._ask_seen + data)[-ASK_LIMIT:]
        asked = ASK in self._ask_seen.split(b"\n")[:-1]
        if asked or not data or len(self._ask_seen) >= ASK_LIMIT:  # asked; or closed (the kernel is gone); or junk
            self._stop_asks()
        if asked:
            on_ask()

    def _stop_asks(self) -> None:
        fd, self._ask_read = self._ask_read, None
        if fd is not None:
            if self._ask_loop is not None:
                self._ask_loop.remove_reader(fd)
            os.close(fd)

    def progress(self, place: dict[str, Any]) -> None:
        """Tell the kernel where it stands in line: only what changed, and nothing while the pipe is full (a line
        under PIPE_BUF is written whole or not at all; the next one says the same, newer)."""
        line = (json.dumps({"wait": place}, sort_keys=True) + "\n").encode()
        if line == self._last or self._write_fd is None:
            return
        try:
            os.write(self._write_fd, line)
            self._last = line
        except (BlockingIOError, BrokenPipeError):
            pass  # full (a kernel that does not read), or gone (shut down meanwhile: its exit says the rest)

    async def release(self, granted: dict[str, str]) -> None:
        """Hand the kernel its grant: what ``granted`` (the grant's variables, kernel_env.py) changes in its
        environment, and the GPUSHARE_* variables it no longer has (as null). A GPU's grant closes the pipe; a wait
        that ended without one keeps it, for a wait again in place (``rejoin``)."""
        if self._write_fd is None:
            raise RuntimeError("the kernel's wait for a GPU has ended")
        changes: dict[str, str | None] = {k: v for k, v in granted.items() if self.env.get(k) != v}
        changes.update({k: None for k in self.env if k.startswith("GPUSHARE_") and k not in granted})
        changes.pop(names.GRANT_FD, None)
        data = (json.dumps({"grant": changes}) + "\n").encode()
        final = granted.get(names.MODE) == "gpu"
        fd, self._write_fd = self._write_fd, None  # ours alone while it is written (``end`` may come meanwhile)
        try:
            os.set_blocking(fd, True)
            await asyncio.get_running_loop().run_in_executor(None, _write_all, fd, data)
        finally:
            if final or self._ended:
                os.close(fd)
            else:
                os.set_blocking(fd, False)
                self._write_fd = fd
        self.env = {k: v for k, v in {**self.env, **changes}.items() if v is not None}  # what the kernel has now
        if final:
            self.end()

    def rejoin(self) -> None:
        """Tell the kernel, whose wait ended without a GPU, that it waits again in place (it agreed first:
        ``_gpushare_wait.can_rejoin``); it sets the same variables as here."""
        if self._write_fd is None:
            raise RuntimeError("the kernel's pipe is closed")
        os.write(self._write_fd, b'{"rejoin": true}\n')  # (an empty pipe: the grant was read; PIPE_BUF is whole)
        self.env = {k: v for k, v in self.env.items() if k != names.REASON}
        self.env[names.MODE] = "queued"
        self._last = b""

    @property
    def open(self) -> bool:
        """Whether the pipe still reaches the kernel (it waits, or its wait ended without a GPU)."""
        return self._write_fd is not None

    def end(self) -> None:
        """No grant will come through the pipe (shut down, restarted, or granted already)."""
        self._ended = True
        self._stop_asks()
        for fd in (self._read_fd, self._write_fd, self._ask_write):
            if fd is not None:
                os.close(fd)
        self._read_fd = self._write_fd = self._ask_write = None
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
            return  # the kernel is gone (shut down meanwhile): its exit says the rest
        view = view[written:]
