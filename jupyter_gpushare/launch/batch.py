"""Kernels that programs start outside a Jupyter server: nbclient, papermill, ``jupyter execute``, nbconvert,
``jupyter console``.

Such a program has no server to hold its kernels' reservations, no sidebar to show a wait and no reconcile task to
give back what it forgets, so the provisioner does that inside the program (provisioner.py), with what is here:

- ``program_config``: the running program's own config and command line (``jupyter execute
  --GpuShareApp.default_quota=3GiB``), which nbclient's KernelManager, created without a parent, does not carry;
- ``WaitProgress``: a kernel that waits for a GPU says on stderr where it stands, when that changes and at
  least every PROGRESS_EVERY_S, so that a batch job's log shows it is waiting, not hung;
- ``until_ctrl_c``: Ctrl-C while it waits ends the wait; the provisioner gives the place up and says so in one
  line, and the program ends as on any Ctrl-C, without a traceback (``said``);
- ``not_started``: a kernel the rules refuse, or whose wait ends without a GPU, ends the program the same way:
  one line on stderr, no traceback, and an exit status of its own (``EXIT_CODES``, docs/admin-guide.md);
- ``end_at_exit``: what the program still holds as it exits is given back then (``jupyter console`` asks its
  kernel to shut down and exits, without the provisioner's cleanup).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Awaitable
from typing import Any, Protocol, TypeVar

from jupyter_client.provisioning import KernelProvisionerFactory
from traitlets.config import Application, Config

from ..config.settings import settings_from
from ..config.sources import load_config
from ..core.policy import PolicyError, format_mib
from ..ledger.ledger import Waiting
from ..server.manager import QuotaManager, build_manager
from ..server.records import KernelRecord
from ..server.services import ProgramStarts, Services

T = TypeVar("T")
# Our entry point's name (pyproject.toml): every program's default provisioner, through this variable, which the
# wheel's jupyter_gpushare_provisioner.pth sets unless it is set (and the server extension, for its server).
DEFAULT_ENV = KernelProvisionerFactory.default_provisioner_name_env  # JUPYTER_DEFAULT_PROVISIONER_NAME
PROGRESS_EVERY_S = 15.0  # a kernel in line says where it stands at least this often, changed or not
EXIT_GRACE_S = 2.0  # how long an exiting program waits for the kernels it still holds to end before it ends them


def program_config(own: Config) -> tuple[Config, str | None]:
    """The config of the program that starts a kernel outside a server: its running traitlets Application's
    (``jupyter execute``'s and ``jupyter nbconvert``'s files and command line), then the provisioner's ``own``
    (its KernelManager's). Returns it, and the program's name when the program's config has GpuShareApp settings
    (to say where the settings came from)."""
    config = Config()
    name = None
    if Application.initialized():
        app = Application.instance()
        config.merge(app.config)
        if "GpuShareApp" in app.config:
            name = app.name
    config.merge(own)
    return config, name


class WaitProgress:
    """Where each kernel in line stands, said on the program's stderr (it has no other place to say it): at once,
    whenever its place or the reason it waits changes, and every PROGRESS_EVERY_S in between."""

    def __init__(self) -> None:
        self._said: dict[str, tuple[tuple[Any, ...], float]] = {}

    def __call__(self, rec: KernelRecord, got: Waiting) -> None:
        """The ledger's latest answer for a kernel in line (QuotaManager.on_wait, at each answer)."""
        now, key = time.monotonic(), (got.position, got.need_mib, got.reason)
        last = self._said.get(rec.kernel_id)
        if last is not None and last[0] == key and now - last[1] < PROGRESS_EVERY_S:
            return
        self._said[rec.kernel_id] = (key, now)
        left = f", at most {max(0, round(got.gives_up_at - time.time()))} s more" if got.gives_up_at else ""
        reason = f" ({got.reason})" if got.reason else ""
        _say(
            f"kernel {rec.kernel_id[:8]} ({rec.path or rec.kernel_name}) waits for a GPU: #{got.position} in line, "
            f"needs {format_mib(got.need_mib)}, {format_mib(got.free_mib)} unreserved now{left}{reason}."
        )


class StoppedWaiting(Exception):
    """Ctrl-C ended a kernel's wait for a GPU (``until_ctrl_c``): the caller gives its place up, then raises
    ``said(...)``."""


async def until_ctrl_c(waiting: Awaitable[T]) -> T:
    """``waiting``'s result, unless Ctrl-C (SIGINT) comes first: then ``waiting`` is cancelled and StoppedWaiting
    raised. The program's own SIGINT handler is put back either way (and still runs where asyncio relays the
    signal to it: nbclient's cleans the kernel up). In a thread other than the main one signals are not this
    code's to take: it only awaits."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(waiting)
    stopped = loop.create_future()

    def stop() -> None:
        if not stopped.done():
            stopped.set_result(None)

    def on_sigint(signum: int, frame: Any) -> None:
        loop.call_soon_threadsafe(stop)

    if threading.current_thread() is not threading.main_thread():
        return await task
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)  # None: not set from Python
    if not stopped.done():
        return task.result()
    task.cancel()
    if task.done() and not task.cancelled():
        task.exception()  # (retrieved: it ended as it was stopped, and is not logged as never retrieved)
    raise StoppedWaiting()


# A program whose kernel was not started ends with one of these (Ctrl-C: 130, as on any Ctrl-C).
EXIT_CODES = {
    "settings": 2,  # the settings are wrong (the line names the setting): the admin's, or the program's options
    "refused": 3,  # a rule refused it: a quota past a limit, a per-user limit, no room where the admin says reject
    "timeout": 4,  # it waited in line as long as kernels may wait here (queue_timeout)
    "taken-out": 5,  # an admin took it out of the line
}


def not_started(line: str, code: str | None) -> SystemExit:
    """Say ``line`` on stderr and return the SystemExit to raise: the program ends with ``EXIT_CODES``' status for
    the refusal's ``code`` (an event's ``refused-timeout``, ``refused-taken-out``, any other rule's), without a
    traceback; nothing runs at its exit but the give-back of what it holds."""
    _say(line)
    kind = (code or "").removeprefix("refused-")
    return SystemExit(EXIT_CODES.get(kind, EXIT_CODES["refused"]))


def said(line: str) -> KeyboardInterrupt:
    """Say ``line`` on stderr, and return the KeyboardInterrupt to raise for it: a program that catches those
    catches it; one that does not ends as on any Ctrl-C (exit status 130), without a traceback: the line said it
    all."""
    global _quiet_hook_installed
    _say(line)
    error = KeyboardInterrupt(line)
    error._gpushare_said = True  # type: ignore[attr-defined]
    if not _quiet_hook_installed:
        previous = sys.excepthook

        def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
            if not getattr(value, "_gpushare_said", False):
                previous(kind, value, tb)

        sys.excepthook = hook
        _quiet_hook_installed = True
    return error


_quiet_hook_installed = False


def _say(line: str) -> None:
    sys.stderr.write(f"jupyter-gpushare: {line}\n")
    sys.stderr.flush()


class EndsAtExit(Protocol):
    """A kernel's provisioner that can give back what its kernel holds, once, as the program exits."""

    def end_at_exit(self, deadline: float) -> None: ...


_ending: weakref.WeakSet[Any] = weakref.WeakSet()  # provisioners outside a server, while their kernels may hold
_ending_pid: int | None = None  # the process that registered the exit hook (a forked child inherits the list)


def end_at_exit(provisioner: EndsAtExit) -> None:
    """Give back what ``provisioner``'s kernel still holds when this program exits (atexit; nothing if its cleanup
    ran before). The kernels get EXIT_GRACE_S together to end by themselves (``jupyter console`` asked its kernel
    to; ipykernel ends when its parent does anyway), then are ended."""
    global _ending_pid
    if _ending_pid != os.getpid():
        _ending.clear()
        _ending_pid = os.getpid()
        atexit.register(_end_all)
    _ending.add(provisioner)


def _end_all() -> None:
    if _ending_pid != os.getpid():
        return  # a forked child that exits normally: its parent's kernels are the parent's
    deadline = time.monotonic() + EXIT_GRACE_S
    for provisioner in list(_ending):
        provisioner.end_at_exit(deadline)


def program_manager(traits: Config, log: logging.Logger, who: str) -> QuotaManager:
    """The manager of a program's kernels: the server's settings files, then what this user's running Jupyter
    server runs with (its command line too: a simulated card set once on `jupyter lab`'s is every program's), then
    the program's own config and command line (batch.program_config). Its kernels wait for their grant in their
    start, and say where they stand on stderr. Bad settings end the program with one line that names the setting
    (batch.not_started)."""
    program, name = program_config(traits)
    config, sources = load_config(over=program, running=True)
    if name:
        sources.append(f"the options of {name}")
    try:
        manager = build_manager(settings_from(config), log, Services(starts=ProgramStarts(WaitProgress())))
    except PolicyError as e:
        raise not_started(f"{who} was not started: {e}", "settings") from None
    log.info("jupyter-gpushare: settings from %s", ", ".join(sources) or "no config file (the defaults)")
    return manager


def end_by(process: Any, pgid: int | None, deadline: float) -> None:
    """Wait until ``deadline`` for a kernel's ``process`` to end (it was asked to, or ipykernel sees its parent
    gone), then end it: its process group where it has its own session (the kernel and its children)."""
    if process is None or process.poll() is not None:
        return
    try:
        process.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):  # (it ended meanwhile)
            if pgid and pgid != os.getpgrp():
                os.killpg(pgid, signal.SIGKILL)
            else:
                process.kill()
        process.wait(5)
