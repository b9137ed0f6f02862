"""Kernel launch hook: reserve -> environment -> launch -> keep across restarts -> release.

Made the server-wide default provisioner by the config file shipped in the wheel, so every
kernel started by JupyterLab, Notebook 7, nbclient or papermill gets a quota with no kernelspec
edited. The reservation is decided only in ``cleanup(restart)``, which is the one call that gets
the right restart flag (jupyter_client#1061).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from jupyter_client.provisioning import LocalProvisioner
from jupyter_core.paths import jupyter_runtime_dir
from traitlets import Unicode

from .kernel_env import kernel_env
from .manager import Grant, QuotaManager, QuotaUnavailable
from .policy import PolicyError, parse_size


class GpuShareProvisioner(LocalProvisioner):
    """A LocalProvisioner that holds a GPU reservation for its kernel."""

    quota = Unicode(
        "",
        config=True,
        help="GPU memory quota for kernels of this kernelspec ('8GiB', '25%'); set it in the kernelspec's "
        "metadata.kernel_provisioner.config. Empty (default): the server's GpuShareApp.default_quota.",
    )

    _grant: Grant | None = None
    _watching_death = False

    def _manager(self) -> QuotaManager:
        manager = QuotaManager.current()
        if manager is None:  # started outside a Jupyter server (nbclient, papermill): build one from config
            from .app import build_manager

            manager = build_manager(self.config, self.log)
            QuotaManager.install(manager)
        return manager

    @property
    def _kernel_name(self) -> str:
        return getattr(self.parent, "kernel_name", "") or self.kernel_spec.display_name

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        kwargs = await super().pre_launch(**kwargs)  # after this, kwargs["env"] always exists
        manager = self._manager()
        env = kwargs["env"]
        language = (self.kernel_spec.language or "").lower()
        rec = manager.record(self.kernel_id, self._kernel_name, language)
        rec.path = self._notebook_path(env.get("JPY_SESSION_NAME")) or rec.path
        keep = (
            self._grant is not None
            and self._grant.mode == "gpu"
            and rec.pending_quota is None
            and rec.lease is not None
        )
        if not keep:
            if self._grant is not None and self._grant.mode == "gpu":
                await manager.release(self.kernel_id, "quota changed", forget=False)
            try:
                requested = parse_size(self.quota, f"{self._kernel_name} kernelspec quota") if self.quota else None
                self._grant = await manager.admit(self.kernel_id, self._kernel_name, language, requested)
            except PolicyError as e:
                self._forget_failed_start()
                raise QuotaUnavailable(str(e), status=400) from e
            except BaseException:
                self._forget_failed_start()
                raise
        try:
            env.update(
                kernel_env(
                    self._grant,
                    self.kernel_id,
                    language == "python",
                    env,
                    report_dir(),
                    manager.max_quota_mib(self._grant),
                )
            )
        except BaseException:
            await self._release("failed to start")
            raise
        return kwargs

    async def launch_kernel(self, cmd: list[str], **kwargs: Any):
        try:
            return await super().launch_kernel(cmd, **kwargs)
        except BaseException:
            await self._release("failed to launch")  # a failed Popen never reaches cleanup()
            self._forget_failed_start()
            raise

    async def post_launch(self, **kwargs: Any) -> None:
        await super().post_launch(**kwargs)
        await self._manager().attach(self.kernel_id, self.pid)
        if not self._watching_death and hasattr(self.parent, "add_restart_callback"):
            # Past the restart limit the server drops the kernel without cleanup(): release then.
            self.parent.add_restart_callback(self._kernel_died, "dead")
            self._watching_death = True

    def _notebook_path(self, session_name: str | None) -> str | None:
        """The session's notebook, relative to the server's root (as JupyterLab opens it)."""
        root = getattr(getattr(self.parent, "parent", None), "root_dir", None)
        if not session_name or not root:
            return session_name
        rel = os.path.relpath(session_name, root)
        return session_name if rel.startswith("..") else rel.replace(os.sep, "/")

    def _forget_failed_start(self) -> None:
        """jupyter_client keeps a kernel whose start failed in ``_pending_kernels``, and the server's
        shutdown then fails on it (404). Drop it once the failure has propagated."""
        multi = getattr(self.parent, "parent", None)
        pending = getattr(multi, "_pending_kernels", None)
        if isinstance(pending, dict):
            kernel_id = self.kernel_id
            asyncio.get_running_loop().call_soon(lambda: pending.pop(kernel_id, None))

    def _kernel_died(self) -> None:
        asyncio.ensure_future(self._release("died past its restart limit"))

    async def cleanup(self, restart: bool = False) -> None:
        await super().cleanup(restart=restart)
        if not restart:
            await self._release("shut down")

    async def _release(self, why: str) -> None:
        self._grant = None
        await self._manager().release(self.kernel_id, why)


def report_dir() -> str:
    """Where kernels write what their frameworks were capped at (read by the server)."""
    path = os.path.join(jupyter_runtime_dir(), "gpushare")
    os.makedirs(path, exist_ok=True)
    return path
