"""Every private name of jupyter_client, jupyter_server and jupyter_core that jupyter-gpushare uses, because none
offers a public hook for what it does (checked against jupyter_client 8.x, jupyter_server 2.x, jupyter_core 5.x).
Each sits behind one function of ``server/seam/internals.py``, which says why; the websocket's sit in
``server/seam/connection.py``. A release without one would break or degrade a feature quietly; this test makes it
fail CI loudly.

- ``KernelManager._record_random_port_names`` (``record_random_ports``): the provisioner picks and holds a kernel's
  ports itself, so jupyter_client must learn which ports were random before they are set, or
  ``restart_kernel(newports=True)`` renews none of them.
- ``kernel._activity_stream`` (``restart_activity_watch``): after an automatic restart onto new ports,
  jupyter_server keeps watching the old iopub port; the provisioner closes that stream and starts the watch anew.
- ``MultiKernelManager._pending_kernels`` (``pending_kernel_ids``, ``forget_pending``): a kernel whose start has
  not finished is not in ``list_kernel_ids()``; without it, reconcile would release the reservation of a kernel
  that is still starting, and a failed start would leave a kernel the server's shutdown fails on.
- ``ZMQChannelsWebsocketConnection._register_session``, ``._open_sessions``, ``._open_sockets`` and
  ``._close_future`` (seam/connection.py): a websocket to a kernel that waits for a GPU is opened at once, before
  the kernel answers ``kernel_info``; it registers its session and its socket as jupyter_server's ``prepare`` and
  ``connect`` would, and undoes exactly that when it closes before the kernel runs. ``._send_status_message``: a
  page that connects to a busy kernel (reloaded while a cell waits for its GPU) is told "busy" as jupyter_server
  tells "restarting"; else it reads "unknown" until the cell ends (a busy kernel is not nudged).
- ``MappingKernelManager._kernel_start_kwargs`` (``start_kwargs``): a warm kernel is started with the start
  arguments the server's own policy adds to every kernel (its transport encryption).
- ``jupyter_core.utils._loop`` (``fresh_event_loop``): a forked worker's own event loop, where jupyter_core keeps
  the loop its blocking calls run on; without it the child shares its parent's loop's self-pipe and can sleep
  forever.
- ``kernels.handlers._kernel_id_regex`` (``KERNEL_ID``): the restart route we replace matches exactly the kernel
  ids jupyter_server's own routes match.
- ``SessionManager``'s ``session`` table and its ``kernel_id`` column (``has_session``): whether a notebook uses a
  kernel, read synchronously where the line decides a grant (the public ``cursor`` is the way in; the table is
  jupyter_server's own).
- ``ServerApp._signal_stop`` (``stop_cleanly_on_sigint``): where the server has no terminal, SIGINT (JupyterHub's
  first stop signal) stops it as SIGTERM does, with its cleanup, instead of Python's KeyboardInterrupt without one
  (tests/server/test_server_process.py shows the reservations given back).
"""

from __future__ import annotations

import inspect

from jupyter_client.manager import AsyncKernelManager
from jupyter_client.multikernelmanager import AsyncMultiKernelManager
from jupyter_core import utils
from jupyter_server.serverapp import ServerApp
from jupyter_server.services.kernels import handlers
from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection
from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager

from jupyter_gpushare.server.seam.internals import KERNEL_ID, has_session


def test_the_private_names_we_rely_on_are_still_there():
    assert callable(getattr(AsyncKernelManager, "_record_random_port_names", None))
    assert "_random_port_names" in inspect.getsource(AsyncKernelManager.cleanup_random_ports)
    assert "_pending_kernels" in AsyncMultiKernelManager.class_traits()
    watch = inspect.getsource(AsyncMappingKernelManager.start_watching_activity)
    assert "kernel._activity_stream = " in watch
    connection = ZMQChannelsWebsocketConnection
    assert inspect.iscoroutinefunction(connection._register_session)
    assert hasattr(connection._open_sockets, "add") and hasattr(connection._open_sockets, "discard")
    assert "_open_sessions" in inspect.getsource(connection) and "_close_future" in inspect.getsource(connection)
    assert list(inspect.signature(connection._send_status_message).parameters) == ["self", "status"]
    assert hasattr(utils, "_loop") and hasattr(utils._loop, "set")
    assert "transport_encryption" in inspect.getsource(AsyncMappingKernelManager._kernel_start_kwargs)
    assert handlers._kernel_id_regex == KERNEL_ID
    assert list(inspect.signature(ServerApp._signal_stop).parameters) == ["self", "sig", "frame"]
    assert "isatty" in inspect.getsource(ServerApp.init_signal)  # (SIGINT is left to Python's default without one)


async def test_the_session_table_we_read_is_still_there(jp_serverapp):
    sessions = jp_serverapp.session_manager
    session = await sessions.create_session(path="a.ipynb", kernel_id="k-1", type="notebook")
    assert has_session(sessions, "k-1") and not has_session(sessions, "k-2")
    await sessions.delete_session(session["id"])
    assert not has_session(sessions, "k-1")
