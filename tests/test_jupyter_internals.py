"""The three private names of jupyter_client and jupyter_server that jupyter-gpushare uses, because neither
offers a public hook for what they do (checked against jupyter_client 8.x and jupyter_server 2.x). Each use is
guarded (getattr) so that a release without it degrades rather than breaks; this test makes such a release
fail CI loudly instead, so the degradation is never silent.

- ``KernelManager._record_random_port_names`` (provisioner._pick_ports): the provisioner picks and holds a
  kernel's ports itself, so jupyter_client must learn which ports were random before they are set, or
  ``restart_kernel(newports=True)`` renews none of them.
- ``kernel._activity_stream`` (provisioner._watch_activity_on_new_ports): after an automatic restart onto new
  ports, jupyter_server keeps watching the old iopub port; the provisioner closes that stream and starts the
  watch anew (the public ``start_watching_activity``). The public ``stop_watching_activity`` is not used: it
  also ends a server restart's pending kernel_info wait.
- ``MultiKernelManager._pending_kernels`` (app._reconcile_forever, provisioner._forget_failed_start): a kernel
  whose start has not finished is not in ``list_kernel_ids()``; without it, reconcile would release the
  reservation of a kernel that is still starting.
"""

from __future__ import annotations

import inspect

from jupyter_client.manager import AsyncKernelManager
from jupyter_client.multikernelmanager import AsyncMultiKernelManager
from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager


def test_the_private_names_we_rely_on_are_still_there():
    assert callable(getattr(AsyncKernelManager, "_record_random_port_names", None))
    assert "_random_port_names" in inspect.getsource(AsyncKernelManager.cleanup_random_ports)
    assert "_pending_kernels" in AsyncMultiKernelManager.class_traits()
    watch = inspect.getsource(AsyncMappingKernelManager.start_watching_activity)
    assert "kernel._activity_stream = " in watch
