"""Every private name of jupyter_client, jupyter_server and jupyter_core that jupyter-gpushare uses, because none
offers a public hook for what it does (checked against jupyter_client 8.x, jupyter_server 2.x, jupyter_core 5.x),
and why. A release without one would break or degrade a feature quietly; this test makes it fail CI loudly.

- ``KernelManager._record_random_port_names`` (ports.HeldPorts._pick_ports): the provisioner picks and holds a
  kernel's ports itself, so jupyter_client must learn which ports were random before they are set, or
  ``restart_kernel(newports=True)`` renews none of them.
- ``kernel._activity_stream`` (ports.HeldPorts._watch_activity_on_new_ports): after an automatic restart onto new
  ports, jupyter_server keeps watching the old iopub port; the provisioner closes that stream and starts the
  watch anew (the public ``start_watching_activity``). The public ``stop_watching_activity`` is not used: it
  also ends a server restart's pending kernel_info wait.
- ``MultiKernelManager._pending_kernels`` (app._reconcile_forever, provisioner._forget_failed_start): a kernel
  whose start has not finished is not in ``list_kernel_ids()``; without it, reconcile would release the
  reservation of a kernel that is still starting.
- ``ZMQChannelsWebsocketConnection._register_session``, ``._open_sessions``, ``._open_sockets`` and
  ``._close_future`` (connection.WaitingKernelConnection): a websocket to a kernel that waits for a GPU is
  opened at once, before the kernel answers ``kernel_info``; it registers its session and its socket as
  jupyter_server's ``prepare`` and ``connect`` would, and undoes exactly that when it closes before the kernel
  runs (jupyter_server's own ``disconnect`` expects channels that were never opened).
- ``MappingKernelManager._kernel_start_kwargs`` (warm.WarmPool._start): a warm kernel is started with the start
  arguments the server's own policy adds to every kernel (its transport encryption), so that its connection is the
  one a notebook's kernel would have; where it is missing, the pool starts with none added, as older servers do.
- ``jupyter_core.utils._loop`` (manager._fresh_event_loop): a forked worker's own event loop, where
  jupyter_core keeps the loop its blocking calls run on; without it the child shares its parent's loop's
  self-pipe and can sleep forever.
"""

from __future__ import annotations

import inspect

from jupyter_client.manager import AsyncKernelManager
from jupyter_client.multikernelmanager import AsyncMultiKernelManager
from jupyter_core import utils
from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection
from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager


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
    assert hasattr(utils, "_loop") and hasattr(utils._loop, "set")
    assert "transport_encryption" in inspect.getsource(AsyncMappingKernelManager._kernel_start_kwargs)
