"""A warm kernel's two launches (server/warm.py): its own, ahead of time, as nobody's; and a notebook's, which takes it.

``warm_pre_launch`` starts a kernel of the pool: no admission and no record, its GPU hidden (``GPUSHARE_MODE=warm``), a
pipe for its hand-over (held.py), and ``warm_imports`` named for the bootstrap. ``warm_kernel`` finds, for a
notebook's launch, a warm kernel that is the one this launch would start; ``take_warm`` makes it the notebook's.
"""

from __future__ import annotations

import os
from typing import Any

from ..bootstrap._gpushare_env import WARM_IMPORTS
from ..host import priority
from ..host.reports import report_dir
from ..server.records import Grant, QuotaUnavailable
from ..server.warm import ANSWER_S, WARM_MARK, WarmKernel
from .held import HeldStart
from .kernel_env import GRANT_VARIABLES, drop_inherited, kernel_env
from .port import KernelPort
from .ports import HeldPorts


def start_of(cmd: list[str], env: dict[str, str], km: Any) -> tuple[list[str], dict[str, str]]:
    """What a kernel's launch sets that stays for its life: its command (its connection file named alike) and its
    environment, less what is each kernel's own (its notebook's path, its grant's variables, its parent's pid)."""
    own = {"JPY_SESSION_NAME", "JPY_PARENT_PID", *GRANT_VARIABLES}
    named = ["{connection_file}" if arg == km.connection_file else arg for arg in cmd]
    return named, {k: v for k, v in env.items() if k not in own and not k.startswith("GPUSHARE_")}


class WarmStarts(HeldPorts):
    """The provisioner's part that starts a warm kernel and hands one over (the provisioner's own parts it uses are
    named here)."""

    _grant: Grant | None
    _held: HeldStart | None
    _launched: tuple[list[str], dict[str, str]]

    def _manager(self) -> KernelPort:
        raise NotImplementedError

    @property
    def _kernel_name(self) -> str:
        return getattr(self.parent, "kernel_name", "") or self.kernel_spec.display_name

    @property
    def _who(self) -> str:
        return f"kernel {self.kernel_id[:8]} ({self._kernel_name})"

    @property
    def _python(self) -> bool:
        """A Python kernel: it runs the bootstrap (the GPU waits, the stand-by)."""
        return (self.kernel_spec.language or "").lower() == "python"

    def listen(self, held: HeldStart) -> None:
        raise NotImplementedError

    @property
    def _warm(self) -> bool:
        """A kernel started ahead of time for the server's warm pool (server/warm.py): nobody's yet."""
        return bool(getattr(self.parent, WARM_MARK, False))

    async def warm_pre_launch(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """A warm kernel's launch arguments: its ports, its pipe, its environment (no GPU: its grant is its notebook's)."""
        self._grant = Grant("warm")
        kwargs = await self._pick_ports(**kwargs)
        drop_inherited(kwargs["env"])
        self._held = HeldStart()
        kwargs["env"].update(kernel_env(self._grant, self.kernel_id, self._python, kwargs["env"], report_dir()))
        pool = self._manager().warm
        if pool is not None and pool.imports:
            kwargs["env"][WARM_IMPORTS] = ",".join(pool.imports)
        return kwargs

    def warm_kernel(self) -> WarmKernel | None:
        """A warm kernel of the server's pool that is the one this launch would start: the same kernelspec, command and
        environment, but for what is each kernel's own. One that is not is ended (and said in the log, with what
        changed)."""
        pool = None if self._warm or not self._python else self._manager().warm
        warm = pool.take(self._kernel_name) if pool is not None else None
        if pool is None or warm is None:
            return None
        theirs = _launcher(warm)
        (cmd, env), (own_cmd, own_env) = start_of(*theirs._launched, warm.km), start_of(*self._launched, self.parent)
        changed = sorted(k for k in {*env, *own_env} if env.get(k) != own_env.get(k))
        if warm.spec != self.kernel_spec.to_dict():
            differs: str | None = "its kernelspec"
        elif cmd != own_cmd:
            differs = "its command"
        else:
            differs = f"the environment ({', '.join(changed[:5])})" if changed else None
        if differs is None:
            return warm
        self.log.info(
            "jupyter-gpushare: a warm kernel was started before %s changed: %s starts fresh", differs, self._who
        )
        pool.discard(warm)
        return None

    async def take_warm(self, warm: WarmKernel, kwargs: dict[str, Any]) -> Any:
        """Make ``warm``'s kernel ``self``'s: its environment, working directory and connection file as this launch
        would have set them, then its cgroups and (granted now) its card. Returns the warm kernel's connection info
        (ports, key), which the KernelManager takes (``_reconcile_connection_info``); None: it did not answer, or its
        group could not be the kernel's, and it was ended."""
        manager, theirs, km = self._manager(), _launcher(warm), self.parent
        pool, held, grant = manager.warm, theirs._held, self._grant
        assert pool is not None and held is not None and grant is not None and km is not None
        env = dict(kwargs.get("env") or os.environ)
        env["JPY_PARENT_PID"] = str(os.getpid())  # (as jupyter_client's launcher sets it)
        cwd = str(kwargs.get("cwd") or os.getcwd())
        keep = self._held is not None  # (a fresh start would give it a pipe)
        if not await held.hand_over(env, cwd, km.connection_file, keep, ANSWER_S):
            self.log.warning("jupyter-gpushare: a warm kernel did not take its hand-over: %s starts fresh", self._who)
            pool.discard(warm)
            return None
        try:
            await manager.adopt(theirs.kernel_id, self.kernel_id, grant)
        except (OSError, QuotaUnavailable) as e:
            self.log.warning("jupyter-gpushare: a warm kernel's cgroup could not be its own (%s): %s starts fresh", e,
                             self._who)  # fmt: skip
            pool.discard(warm)
            return None
        self.process, self.pid, self.pgid, self.cwd = theirs.process, theirs.pid, theirs.pgid, cwd
        self.take_ports(theirs)
        self.connection_info = theirs.connection_info
        # the warm kernel's manager lets go of all of it (its clean-up then closes only its own sockets and file)
        theirs.process, theirs._held, theirs.ports_cached = None, None, False
        await pool.handed(warm)
        fresh, self._held = self._held, held if keep else None
        if fresh is not None and not fresh.started.done():
            fresh.started.set_result(True)  # (a websocket that waits on it: the kernel runs)
        if keep:
            self.listen(held)
        if grant.mode != "queued" and self.pid:  # it waited warm at idle priority (in line, it does until its grant)
            await manager.blocking(priority.restore, self.pid)  # (off the loop: it walks the kernel's threads in /proc)
        return self.connection_info


def _launcher(warm: WarmKernel) -> WarmStarts:
    """The provisioner that launched a warm kernel (ours: the pool starts its kernels through it)."""
    provisioner = warm.km.provisioner
    assert isinstance(provisioner, WarmStarts)
    return provisioner
