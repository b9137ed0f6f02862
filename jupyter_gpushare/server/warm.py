"""Warm kernels: kernels started ahead of time, so that a notebook that opens gets a running one at once.

Each server keeps ``GpuShareApp.warm_kernels`` kernels of each kernelspec of ``warm_kernelspecs`` (the default
kernelspec when none is named). A warm kernel is started as any kernel of the server is, through the server's own
kernel manager class and its provisioner (ours), except that it is nobody's yet:

- it holds no GPU reservation and has no record in the registry; its card is hidden and closed to its cgroup
  (``GPUSHARE_MODE=warm``); it runs at idle CPU priority (host/priority.py), so starting and refilling the pool costs
  the kernels that compute nothing;
- it has run its kernelspec's start-up and imported ``warm_imports`` (of the GPU frameworks, only PyTorch's code runs:
  the notebook's own import waits for the GPU; _gpushare_wait.WARM_FIRST);
- its ports are its own, and held (the provisioner's ``hold_ports``).

When a notebook's kernel is launched, the provisioner takes a warm kernel of its kernelspec (``take``) and checks that
it is one its own start would have made: the same kernelspec, the same command, the same environment but for what
is each kernel's own (its notebook's path, its grant). Then, through the kernel's pipe, the kernel's environment,
working directory and connection file are set as its own start would have set them, and its cgroup is renamed to
the kernel's (launch/provisioner.py, ``_hand_over_warm``). Anything else (another kernelspec, a changed one, a warm
kernel that died or did not answer) ends that warm kernel and starts a fresh one: never a wrong kernel.

The pool fills, and refills after each hand-over, with as many kernels at once as half the CPUs (``fill_at_once``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jupyter_client.manager import AsyncKernelManager
from jupyter_core.utils import ensure_async

from .seam.internals import start_kwargs

if TYPE_CHECKING:  # (not at run time: batch programs import this through the provisioner, and jupyter_server's
    # kernel manager brings jupyter_events, whose jsonschema builds its IRI parsers: ~2-3 CPU s at each start)
    from jupyter_server.services.kernels.kernelmanager import MappingKernelManager

WARM_MARK = "gpushare_warm"  # the attribute that marks a kernel manager whose kernel is warm (the provisioner reads it)
READY_S = 60.0  # how long a warm kernel may take to answer its first kernel_info
ANSWER_S = 5.0  # how long a warm kernel may take to take its hand-over


@dataclass
class WarmKernel:
    """One kernel of the pool: its kernel manager (whose provisioner launched it), once it answered."""

    km: AsyncKernelManager  # the server's kernel manager class (jupyter_server's ServerKernelManager)
    kernel_name: str
    spec: dict[str, Any] = field(default_factory=dict)  # its kernelspec as it was when it started


class WarmPool:
    """The server's warm kernels, by kernelspec."""

    def __init__(
        self,
        kernels: MappingKernelManager,
        count: int,
        names: list[str],
        imports: list[str],
        root_dir: str,
        log: logging.Logger,
    ):
        """``kernels``: the server's MappingKernelManager; ``names``: the kernelspecs kept warm ([]: its default)."""
        self.kernels, self.count, self.imports, self.root_dir, self.log = kernels, count, imports, root_dir, log
        self.names = list(names) or [kernels.default_kernel_name]
        self.ready: dict[str, list[WarmKernel]] = {name: [] for name in self.names}
        self._filling: dict[str, asyncio.Task[None]] = {}
        self._stopped = False
        self.handed_over = 0  # (for the tests and the log) kernels given to notebooks
        self.discarded = 0  # warm kernels ended instead of handed over (mismatch, dead, no answer)

    def start(self) -> None:
        """Fill the pool (on the server's loop)."""
        for name in self.names:
            self._fill(name)

    def _fill(self, name: str) -> None:
        if self.count and not self._stopped and name not in self._filling:
            self._filling[name] = asyncio.ensure_future(self._fill_up(name))

    async def _fill_up(self, name: str) -> None:
        try:
            for dead in [w for w in self.ready[name] if not _alive(w)]:  # (no restarter watches them)
                self.ready[name].remove(dead)
                self.log.warning("jupyter-gpushare: a warm %s kernel had died; another is started", name)
                self.discarded += 1
                asyncio.ensure_future(self._end(dead))
            while not self._stopped and len(self.ready[name]) < self.count:
                at_once = min(self.count - len(self.ready[name]), fill_at_once())
                started = await asyncio.gather(*(self._start(name) for _ in range(at_once)))
                warm = [w for w in started if w is not None]
                if self._stopped:
                    await asyncio.gather(*(self._end(w) for w in warm))
                    return
                self.ready[name].extend(warm)
                if len(warm) < at_once:
                    return  # said in the log; tried again at the next hand-over
        finally:
            self._filling.pop(name, None)

    async def _start(self, name: str) -> WarmKernel | None:
        kernels = self.kernels
        warm_id = f"warm-{uuid.uuid4()}"
        extra = {"kernel_spec_manager": kernels.kernel_spec_manager} if kernels.kernel_spec_manager else {}
        km = kernels.kernel_manager_factory(
            connection_file=os.path.join(kernels.connection_dir, f"kernel-{warm_id}.json"),
            parent=kernels,
            log=kernels.log,
            kernel_name=name,
            **extra,
        )
        setattr(km, WARM_MARK, True)
        km.autorestart = False  # a warm kernel that dies is replaced at its hand-over (``take``), never restarted
        try:
            spec = km.kernel_spec.to_dict()
            await km.start_kernel(kernel_id=warm_id, **start_kwargs(kernels, env=dict(os.environ), cwd=self.root_dir))
            client = km.client()
            client.start_channels()
            try:
                await client.wait_for_ready(timeout=READY_S)
            finally:
                client.stop_channels()
        except Exception as e:  # noqa: BLE001 (a kernelspec that cannot start: said, and no pool for it)
            self.log.warning("jupyter-gpushare: a warm %s kernel could not be started: %s", name, e)
            await self._shut_down(km)
            return None
        return WarmKernel(km, name, spec)

    def take(self, kernel_name: str) -> WarmKernel | None:
        """A warm kernel of ``kernel_name`` that is still alive, out of the pool (the pool refills); None: none."""
        found = None
        pool = self.ready.get(kernel_name, [])
        while pool and found is None:
            warm = pool.pop(0)
            if _alive(warm):
                found = warm
            else:
                self.log.warning("jupyter-gpushare: a warm %s kernel had died; another is started", kernel_name)
                self.discard(warm)
        if kernel_name in self.ready:
            self._fill(kernel_name)
        return found

    async def handed(self, warm: WarmKernel) -> None:
        """``warm`` is a notebook's kernel now: the pool's kernel manager, which let go of its process, pipe and
        ports, closes what is its own (its control socket, its connection file: the kernel's is the notebook
        kernel's now)."""
        self.handed_over += 1
        await self._shut_down(warm.km)

    def discard(self, warm: WarmKernel) -> None:
        """End a warm kernel that is not handed over (it died, did not answer, or matched no start)."""
        self.discarded += 1
        asyncio.ensure_future(self._end(warm))
        self._fill(warm.kernel_name)

    async def _end(self, warm: WarmKernel) -> None:
        await self._shut_down(warm.km)

    async def _shut_down(self, km: AsyncKernelManager) -> None:
        try:
            if km.has_kernel:
                await km.shutdown_kernel(now=True)
            else:
                await ensure_async(km.cleanup_resources())
        except Exception as e:  # noqa: BLE001 (gone already)
            self.log.debug("jupyter-gpushare: a warm kernel's shutdown: %s", e)

    async def stop(self) -> None:
        """The server stops: no refill, and every warm kernel ends."""
        self._stopped = True
        filling = list(self._filling.values())  # (not cancelled midway: a kernel half started would be left running;
        if filling:  # each ends the kernel it was starting once it sees the pool stopped)
            await asyncio.wait(filling, timeout=READY_S)
        warm = [w for pool in self.ready.values() for w in pool]
        for pool in self.ready.values():
            pool.clear()
        await asyncio.gather(*(self._end(w) for w in warm), return_exceptions=True)


def fill_at_once() -> int:
    """How many warm kernels start at once: half the CPUs this server may use (they start at idle priority, so the
    kernels that compute lose nothing; one at a time, 32 kernels importing PyTorch took minutes on 16 cores)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 2
    return max(1, cpus // 2)


def _alive(warm: WarmKernel) -> bool:
    process = getattr(warm.km.provisioner, "process", None)  # (a LocalProvisioner's Popen)
    return bool(warm.km.has_kernel) and process is not None and process.poll() is None
