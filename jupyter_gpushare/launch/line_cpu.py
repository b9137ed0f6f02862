"""A kernel in line yields the CPU (host/priority.py): the provisioner's part that says when.

From its launch in line until its grant (or the end of its wait) the kernel runs under SCHED_IDLE, its session's group
at nice 19, so that its start, its framework's import and its CPU cells cost the kernels that compute nothing
(``GpuShareApp.line_cpu``). Where those keep every CPU busy, a kernel still starting gets almost no CPU, and
jupyter_server gives a client's websocket up when the kernel has not answered within ``kernel_info_timeout`` (60 s):
in a class of 88 on 16 cores five kernels in line were lost so (bench/README.md, run 33). So a client's wait bounds
the yield: once a client has waited a share of that timeout for the kernel's answer (server/seam/connection.py,
``HURRY_AT``), the kernel runs at normal priority until that client's connection is made (or given up), then yields
again while it still waits. Once per launch: a kernel that has started answers in milliseconds, and a student who
opens websocket after websocket to her kernel in line gains nothing past the first.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..host import priority
from .port import KernelPort


class LineCpu:
    """The kernel's CPU priority while it waits for a GPU (a part of the provisioner)."""

    pid: int | None
    kernel_id: str
    log: Any
    _yields = False  # it runs under SCHED_IDLE now: launched in line, not granted yet, not hurried
    _hurried = False  # a client's wait gave it normal priority once since its launch
    _cpu_lock: asyncio.Lock | None = None

    def _manager(self) -> KernelPort:
        raise NotImplementedError  # (the provisioner's)

    def _cpu(self) -> asyncio.Lock:
        """Changes to the kernel's priority, one at a time: a grant's lift never comes before a yield it follows."""
        if self._cpu_lock is None:
            self._cpu_lock = asyncio.Lock()
        return self._cpu_lock

    def yield_in_line(self, session_group: bool = True) -> None:
        """The kernel was launched in line (or warm): it yields the CPU until its grant or hand-over (where its
        priority can be given back). A warm kernel's session group is left at nice 0 (``session_group`` False), as
        before: a server that stops waits for a pool's kernel still starting, and local CI run 74, where warm kernels'
        groups yielded too, saw jupyter_server's own tests' clean-up time out there (likely that, not shown)."""
        self._hurried = False
        self._yields = bool(self.pid) and priority.yield_cpu(self.pid, session_group)  # type: ignore[arg-type]

    async def normal_cpu(self) -> None:
        """Granted, or it runs on without a GPU: normal priority again, for every thread of it and its children."""
        async with self._cpu():
            self._yields = False
            if self.pid:
                await self._manager().blocking(priority.restore, self.pid)

    async def hurry(self, waited_s: float) -> bool:
        """A client has waited ``waited_s`` for the kernel's answer while it yields: normal priority until
        ``unhurry`` (server/seam/connection.py says when). False where it does not yield, or was hurried before since
        its launch."""
        async with self._cpu():
            if not self._yields or self._hurried or not self.pid:
                return False
            self._yields, self._hurried = False, True
            await self._manager().blocking(priority.restore, self.pid)
        self.log.info(
            "jupyter-gpushare: kernel %s waits in line at idle CPU priority, and a client has waited %.0f s for its "
            "answer: it runs at normal priority until that client is connected",
            self.kernel_id,
            waited_s,
        )
        return True

    async def unhurry(self) -> None:
        """The client's connection is made or given up: the kernel yields again if it still waits in line."""
        async with self._cpu():
            if self._hurried and not self._yields and self.pid and self.waits_in_line():
                await self._manager().blocking(priority.yield_tree, self.pid)
                self._yields = True

    def waits_in_line(self) -> bool:
        raise NotImplementedError  # (the provisioner's)
