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

Every such kernel also gets the write end of a second pipe, ``GPUSHARE_ASK_FD``, for what it says to the server, one
line each. A kernel that asks at its first GPU use (line_place = 'first-use': ``GPUSHARE_MODE=standby``) writes
``ask`` there at its first GPU framework import, and then waits for the grant as a kernel in line does; the server
reads that pipe (``listen``) and puts the kernel in line. A Python kernel granted its GPU through the pipe keeps it
open: while others wait, the server may ask it to give the GPU back if it has not used it (``stand_by``); it
answers ``standby`` (it holds no GPU now, and asks again at its next GPU use) or ``kept:<why>``. Its first GPU
framework import says ``using`` (as an ``ask`` does): it is not asked from then on. Any other line is the kernel's
own business and is dropped, and past ASK_LIMIT bytes of them the pipe is closed.

A parked kernel (parking.py) hears ``{"parked": {...}}`` (its place in line once it waits to come back) and then
``{"back": {}}`` on the grant pipe, and says ``resume`` on its ask pipe at its next cell or comm message, whichever
client sent it (``on_resume``).

A wait that ended without a GPU keeps the pipe open: the kernel may join the line again in place (``rejoin``;
the kernel agrees first, ``_gpushare_wait.can_rejoin``), and its next wait and grant come through the same pipe.

``started`` is what a websocket to the kernel waits on (seam/connection.py): True once the kernel runs, False if it
never will. A kernel that runs while it waits has started.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ..bootstrap import _gpushare_env as names

STANDIN = str(Path(__file__).with_name("standin.py"))
ASK = b"ask"  # the kernel asks for its GPU (its ask pipe)
STANDBY, KEPT = b"standby", b"kept:"  # its answers when asked to stand by
USING = b"using"  # its first GPU framework import began: it will not stand by (its own word: only it loses by it)
RESUME = b"resume"  # parked, it is wanted: a cell or a comm message of any client (its own word: it asks for itself)
READY = b"ready"  # a warm kernel took its hand-over (``hand_over``)
CELL = b"cell:"  # the cell that waits for the GPU: {"msg_id", "hash" of its code, "count"} (_gpushare_wait._tell_cell)
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

    def __init__(self) -> None:
        self._read_fd: int | None = None
        self._write_fd: int | None = None
        self._ask_read: int | None = None  # what the kernel says (GPUSHARE_ASK_FD)
        self._ask_write: int | None = None
        self._ask_seen = b""  # a line the kernel has not ended yet
        self._ask_junk = 0  # bytes of lines that were neither an ask nor an answer
        self._on_ask: Callable[[], None] | None = None
        self._on_resume: Callable[[], None] | None = None
        self._on_stood_by: Callable[[], Awaitable[None]] | None = None
        self._standby: tuple[asyncio.Future[str], dict[str, str]] | None = None  # asked to stand by: answer, env
        self._standing = False  # it agreed, and the server is not done with it yet (an ask waits till then)
        self._ask_deferred = False
        self._ask_loop: asyncio.AbstractEventLoop | None = None  # where the ask pipe is read (``listen``)
        # it said a GPU framework import began (``using``, or an ``ask``): it is not asked to stand by
        self.using = False
        self._last: bytes = b""
        self._ended = False
        self.env: dict[str, str] = {}  # the kernel's environment as launched
        self.launched_at: float | None = None  # (monotonic) when the kernel was launched
        self.started: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._ready: asyncio.Future[bool] | None = None  # a warm kernel's answer to its hand-over
        self._on_cell: Callable[[dict[str, Any] | None], None] | None = None
        self._cell_said = -1.0  # (monotonic) when the kernel last said its waiting cell

    def command(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The kernel's launch arguments (jupyter_client's launch_kernel) with the pipe's read end passed to it and
        named in its environment."""
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)  # a kernel that does not read never blocks the server
        self.env = {**(kwargs.get("env") or os.environ), names.GRANT_FD: str(self._read_fd)}
        self._ask_read, self._ask_write = os.pipe()
        os.set_blocking(self._ask_read, False)
        self.env[names.ASK_FD] = str(self._ask_write)
        passed = (*kwargs.get("pass_fds", ()), self._read_fd, self._ask_write)
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

    def listen(
        self,
        on_ask: Callable[[], None],
        on_stood_by: Callable[[], Awaitable[None]] | None = None,
        on_resume: Callable[[], None] | None = None,
        on_cell: Callable[[dict[str, Any] | None], None] | None = None,
    ) -> None:
        """Call ``on_ask`` (on the event loop) each time the kernel asks for its GPU, and await ``on_stood_by`` once
        it agreed to stand by (``stand_by``); an ask meanwhile waits until that is done. ``on_resume``: the kernel,
        parked, is wanted. ``on_cell``: the cell that waits for the GPU (its message id, its code's hash, its number;
        None: not a cell the kernel could say)."""
        self._on_ask, self._on_stood_by, self._on_resume, self._on_cell = on_ask, on_stood_by, on_resume, on_cell
        if self._ask_read is not None and self._ask_loop is None:
            self._ask_loop = asyncio.get_running_loop()
            self._ask_loop.add_reader(self._ask_read, self._read_ask)

    def _read_ask(self) -> None:
        assert self._ask_read is not None  # (the reader is removed with it)
        try:
            data = os.read(self._ask_read, ASK_LIMIT)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        *lines, self._ask_seen = (self._ask_seen + data).split(b"\n")
        said = [line for line in lines if not self._heard(line)]
        if not data or self._ask_junk + len(self._ask_seen) >= ASK_LIMIT:  # closed (the kernel is gone); or junk
            self._stop_asks()
        for line in said:
            if line != ASK:
                self._answered(line[:200].decode("ascii", "replace"))
            elif self._standing:
                self._ask_deferred = True
            elif self._on_ask is not None:
                self._on_ask()

    def _heard(self, line: bytes) -> bool:
        """Take one line the kernel said, unless it is an ask or an answer to ``stand_by`` (False: the caller
        acts on it once the whole read is taken); a line of no word of ours counts against ASK_LIMIT."""
        self.using = self.using or line in (USING, ASK)
        if line == ASK or line == STANDBY or line.startswith(KEPT):
            return False
        if line == RESUME:
            if self._on_resume is not None:
                self._on_resume()
        elif line == READY:
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(True)
        elif line.startswith(CELL) and len(line) < 300:
            now = time.monotonic()  # (one a second at most: a kernel that says more is not heard more often)
            if self._on_cell is not None and now - self._cell_said >= 1.0:
                self._cell_said = now
                self._on_cell(_cell(line[len(CELL) :]))
        elif line != USING:
            self._ask_junk += len(line) + 1
        return True

    def _answered(self, said: str) -> None:
        """The kernel's answer to ``stand_by``; one nobody asked for changes nothing."""
        asked, self._standby = self._standby, None
        if asked is None or asked[0].done():
            return
        answer, env = asked
        if said != STANDBY.decode():
            answer.set_result(said)
            return
        self.env, self._last, self._standing = env, b"", True
        asyncio.ensure_future(self._stood_by(answer))

    async def _stood_by(self, answer: asyncio.Future[str]) -> None:
        try:
            if self._on_stood_by is not None:
                await self._on_stood_by()
        finally:
            self._standing = False
            answer.set_result(STANDBY.decode())
            if self._ask_deferred:
                self._ask_deferred = False
                if self._on_ask is not None:
                    self._on_ask()

    def _stop_asks(self) -> None:
        fd, self._ask_read = self._ask_read, None
        if fd is not None:
            if self._ask_loop is not None:
                self._ask_loop.remove_reader(fd)
            os.close(fd)

    @property
    def answers(self) -> bool:
        """Whether the kernel can still say something (its ask pipe is open and listened to)."""
        return self._ask_read is not None and self._ask_loop is not None

    def say(self, message: dict[str, Any]) -> None:
        """Tell the kernel one thing (``{"parked": ...}``, ``{"back": {}}``) on its grant pipe; nothing when the pipe
        is gone or full (a kernel that does not read it loses only its own news)."""
        if self._write_fd is None:
            return
        try:
            os.write(self._write_fd, (json.dumps(message, sort_keys=True) + "\n").encode())
        except (BlockingIOError, BrokenPipeError):
            pass

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

    def _changes(self, granted: dict[str, str]) -> dict[str, str | None]:
        """What ``granted`` (kernel_env.py's variables) changes in the kernel's environment as it is now, with the
        GPUSHARE_* variables it no longer has (as null)."""
        changes: dict[str, str | None] = {k: v for k, v in granted.items() if self.env.get(k) != v}
        changes.update({k: None for k in self.env if k.startswith("GPUSHARE_") and k not in granted})
        changes.pop(names.GRANT_FD, None)
        changes.pop(names.ASK_FD, None)
        return changes

    async def release(self, granted: dict[str, str], keep: bool = False) -> None:
        """Hand the kernel its grant: what ``granted`` (the grant's variables, kernel_env.py) changes in its
        environment. A GPU's grant closes the pipe, unless ``keep`` (the server may ask the kernel to stand by
        later); a wait that ended without one keeps it, for a wait again in place (``rejoin``)."""
        if self._write_fd is None:
            raise RuntimeError("the kernel's wait for a GPU has ended")
        changes = self._changes(granted)
        data = (json.dumps({"grant": changes}) + "\n").encode()
        final = granted.get(names.MODE) == "gpu" and not keep
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

    async def hand_over(self, env: dict[str, str], cwd: str, connection_file: str, pipe: bool, timeout: float) -> bool:
        """Make this warm kernel a notebook's: its whole environment ``env`` (a fresh start's, pipes aside), working
        directory and connection file, set inside it before it answers ``ready``. ``pipe`` false: the pipe is closed
        after (nothing more will come through it). False when it did not answer within ``timeout`` (it is then of no
        use: the caller ends it)."""
        if self._write_fd is None:
            return False
        if self._ask_loop is None:
            self.listen(lambda: None)
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        given = {"env": env, "launched": self.env, "cwd": cwd, "connection_file": connection_file, "pipe": pipe}
        data = (json.dumps({"handover": given}) + "\n").encode()
        fd = self._write_fd
        try:
            os.set_blocking(fd, True)
            await asyncio.wait_for(loop.run_in_executor(None, _write_all, fd, data), timeout)
            await asyncio.wait_for(asyncio.shield(self._ready), timeout)
        except asyncio.TimeoutError:
            return False
        finally:
            if self._write_fd is not None:
                os.set_blocking(fd, False)
        self.env = {k: v for k, v in env.items() if k not in (names.GRANT_FD, names.ASK_FD)}
        if not pipe:
            self.end()
        return True

    async def stand_by(self, standby: dict[str, str], timeout: float) -> str:
        """Ask the kernel to give its GPU back and stand by (``standby``: kernel_env.py's variables of a kernel that
        asks at its first GPU use). "standby" once it agreed and ``listen``'s ``on_stood_by`` is done; else what it
        said ("kept:<why>"), or "cannot" (no pipe to it, or no answer within ``timeout``: one that comes later
        still stands it by)."""
        if self._write_fd is None or not self.answers or self._standby is not None or self._standing:
            return "cannot"
        changes = self._changes(standby)
        try:
            os.write(self._write_fd, (json.dumps({"standby": changes}) + "\n").encode())  # (whole: under PIPE_BUF)
        except (BlockingIOError, BrokenPipeError):
            return "cannot"
        answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._standby = (answer, {k: v for k, v in {**self.env, **changes}.items() if v is not None})
        try:
            return await asyncio.wait_for(asyncio.shield(answer), timeout)
        except asyncio.TimeoutError:
            return "cannot"

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


def _cell(raw: bytes) -> dict[str, Any] | None:
    """A waiting cell as the kernel said it (``CELL``), checked: its message id, code hash and number, or None."""
    try:
        said = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(said, dict):
        return None
    msg_id, code, count = said.get("msg_id"), said.get("hash"), said.get("count")
    if not (isinstance(msg_id, str) and 0 < len(msg_id) <= 100 and msg_id.isprintable()):
        return None
    if not (isinstance(code, str) and len(code) == 8 and all(c in "0123456789abcdef" for c in code)):
        return None
    if not (count is None or (isinstance(count, int) and not isinstance(count, bool) and 0 <= count < 10**9)):
        return None
    return {"msg_id": msg_id, "hash": code, "count": count}


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BrokenPipeError:
            return  # the kernel is gone (shut down meanwhile): its exit says the rest
        view = view[written:]
