"""The private names of jupyter_client, jupyter_server and jupyter_core that jupyter-gpushare uses, each behind one
function with the reason (none offers a public hook for it). ``tests/server/test_jupyter_internals.py`` pins every
one: checked against jupyter_client 8.x, jupyter_server 2.x and jupyter_core 5.x.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from typing import Any

# jupyter_server's pattern for a kernel id in its routes (``handlers._kernel_id_regex``): the restart route we
# replace (handlers.KernelRestartHandler) must match exactly the ids its own does.
KERNEL_ID = r"(?P<kernel_id>\w+-\w+-\w+-\w+-\w+)"


def pending_kernel_ids(kernels: Any) -> set[str]:
    """The kernels whose start has not finished (``MultiKernelManager._pending_kernels``): they are not in
    ``list_kernel_ids()`` yet, and reconcile must not release the reservation of a kernel that is still starting."""
    return set(getattr(kernels, "_pending_kernels", None) or ())


def forget_pending(kernels: Any, kernel_id: str) -> None:
    """jupyter_client keeps a kernel whose start failed in ``_pending_kernels``, and the server's shutdown then
    fails on it (404): drop it once the failure has propagated (on the next turn of the loop)."""
    pending = getattr(kernels, "_pending_kernels", None)
    if isinstance(pending, dict):
        asyncio.get_running_loop().call_soon(lambda: pending.pop(kernel_id, None))


def record_random_ports(kernel_manager: Any) -> None:
    """``KernelManager._record_random_port_names``: the provisioner picks and holds a kernel's ports itself
    (launch/ports.py), so jupyter_client must learn which were random before they are set, or
    ``restart_kernel(newports=True)`` renews none of them. A no-op after the first start."""
    kernel_manager._record_random_port_names()


def restart_activity_watch(kernel_manager: Any, kernel_id: str) -> None:
    """After an automatic restart onto new ports, jupyter_server keeps watching the old iopub port
    (``kernel._activity_stream``): close that stream and start the watch anew (the public
    ``start_watching_activity``). The public ``stop_watching_activity`` is not used: it also ends a server
    restart's pending kernel_info wait. Nothing for a kernel that is not jupyter_server's, or not watched yet."""
    multi = getattr(kernel_manager, "parent", None)
    stream = getattr(kernel_manager, "_activity_stream", None)
    if stream is None or multi is None or not hasattr(multi, "start_watching_activity"):
        return
    stream.close()
    multi.start_watching_activity(kernel_id)


def start_kwargs(kernels: Any, **kwargs: Any) -> dict[str, Any]:
    """The start arguments the server's own policy adds to every kernel (``MappingKernelManager._kernel_start_kwargs``:
    its transport encryption): a warm kernel (warm.py) is started with them, so that its connection is the one a
    notebook's kernel would have. Where it is missing, none are added, as older servers do."""
    add = getattr(kernels, "_kernel_start_kwargs", None)
    return add(**kwargs) if add is not None else kwargs


def has_session(sessions: Any, kernel_id: str) -> bool:
    """Whether a notebook (a session) uses the kernel, synchronously: the session manager's public ``cursor`` on its
    own ``session`` table (its async ``get_session`` cannot be awaited where the line decides a grant)."""
    row = sessions.cursor.execute("SELECT 1 FROM session WHERE kernel_id=?", (kernel_id,)).fetchone()
    return row is not None


def fresh_event_loop() -> None:
    """A forked child's event loop of its own, when none runs (asyncio's and ``jupyter_core.utils._loop``, where
    jupyter_core keeps the loop its blocking calls run on): the loop it inherited shares its self-pipe and its epoll
    instance with the parent and every sibling, so a wake-up that the manager's threads write for this process can
    be read by another's loop, and this one sleeps forever."""
    try:
        asyncio.get_running_loop()
        return
    except RuntimeError:
        pass
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        from jupyter_core import utils

        utils._loop.set(loop)
    except (ImportError, AttributeError):  # another jupyter_core: it asks asyncio, which now has this one
        pass


def stop_cleanly_on_sigint(serverapp: Any, log: Any) -> bool:
    """jupyter_server handles SIGINT only where its stdin is a terminal (``ServerApp.init_signal``). Elsewhere Python's
    default raises KeyboardInterrupt out of the loop ("Interrupted..."), and the server exits without its cleanup:
    its kernels are not shut down, and their GPU reservations wait for the broker's reap. JupyterHub stops a server
    with SIGINT, with no terminal (``LocalProcessSpawner.stop``; its own ``_handle_sigint`` override is installed
    only with a terminal). So where the default handler is in place, the first SIGINT stops the server as SIGTERM
    does (``ServerApp._signal_stop``); a second one exits at once, as before. A SIGINT ignored from the start (a
    server started in the background of a script) stays ignored. Returns whether the handler was installed."""
    in_main = threading.current_thread() is threading.main_thread()
    if not in_main or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return False
    stop = serverapp._signal_stop

    def on_sigint(sig: int, frame: Any) -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        log.warning("jupyter-gpushare: SIGINT: the server stops, shutting its kernels down so that their GPU "
                    "reservations are given back (SIGINT again to exit at once)")  # fmt: skip
        stop(sig, frame)

    signal.signal(signal.SIGINT, on_sigint)
    return True
