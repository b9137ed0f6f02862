"""The broker's watchdog: the over-quota policy of a multi-user host, run by root, out of every student's reach.

A student's server runs its own over-quota policy (enforce.py), but the student controls that server: they
can stop it, or start one without the extension's settings. The broker reads the driver itself, so here the
same rule holds whatever the student does: each sweep finds every lease's processes (the kernel's cgroup, or
its process tree; procs.lease_use) and what they use beyond the lease (past its reservation on its card, all
of it on another card; procs.over_use). A kernel over for ``grace_s``:

- ``protect`` (the default): on a card other leases share, interrupt it (SIGINT to its process group), and if it
  still holds the memory one grace later, end it: SIGKILL to its process group and to every process of it that
  holds GPU memory. Its Jupyter server restarts it on the same reservation, as after any crash. Alone on its
  card, it is only logged (its over-use is counted as taken in admission either way);
- ``interrupt``: interrupt it, once per grace while it stays over; ``restart``: end it (as above);
- ``notify``: log only.

Every action is logged with the figures. Only processes the reading attributes to the lease are signalled, and
the kernel only while its (pid, start time) is the one the lease recorded.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable

from ..gpu import DeviceSample
from ..ledger import Lease
from ..policy import format_mib
from ..procs import lease_use, over_use

ACTIONS = ("protect", "notify", "interrupt", "restart")


@dataclass
class _Over:
    since: float
    acted_at: float | None = None
    actions: int = 0


class Watchdog:
    def __init__(
        self,
        action: str,
        grace_s: float,
        log: logging.Logger,
        clock: Callable[[], float] = time.monotonic,
        signal_group: Callable[[int, int], None] = os.killpg,
        signal_process: Callable[[int, int], None] = os.kill,
    ) -> None:
        if action not in ACTIONS:
            raise ValueError(f"over_quota_action {action!r}: one of {', '.join(ACTIONS)}")
        self.action, self.grace_s, self.log, self.clock = action, grace_s, log, clock
        self._signal_group, self._signal_process = signal_group, signal_process
        self._over: dict[str, _Over] = {}

    def sweep(self, samples: Sequence[DeviceSample], leases: Sequence[Lease]) -> list[tuple[str, str]]:
        """Judge every lease on one reading; (kernel id, action) for each action taken."""
        use = lease_use(samples, leases)
        if use is None:
            return []
        now, taken = self.clock(), []
        per_card: dict[str, int] = {}
        for lease in leases:
            per_card[lease.card_uuid] = per_card.get(lease.card_uuid, 0) + 1
        for lease in leases:
            over = over_use(lease, use.kernels.get(lease.kernel_id, {}))
            if not over:
                self._over.pop(lease.kernel_id, None)
                continue
            state = self._over.setdefault(lease.kernel_id, _Over(since=now))
            due = now - (state.acted_at if state.acted_at is not None else state.since) >= self.grace_s
            if not due:
                continue
            action = self._choose(state, per_card.get(lease.card_uuid, 0) > 1)
            state.acted_at, state.actions = now, state.actions + 1
            self._act(lease, action, over, sorted(use.pids.get(lease.kernel_id, ())), now - state.since)
            taken.append((lease.kernel_id, action))
        for kernel_id in [k for k in self._over if k not in {lease.kernel_id for lease in leases}]:
            del self._over[kernel_id]
        return taken

    def _choose(self, state: _Over, shared: bool) -> str:
        if self.action != "protect":
            return self.action
        if not shared:
            return "notify"
        return "interrupt" if state.actions == 0 else "restart"

    def _act(self, lease: Lease, action: str, over: dict[str, int], pids: list[int], over_s: float) -> None:
        figures = ", ".join(f"{format_mib(mib)} on {card}" for card, mib in over.items())
        what = f"kernel {lease.kernel_id} of {lease.user} uses {figures} beyond its lease, for {over_s:.0f} s"
        kernel = lease.kernel if lease.kernel is not None and lease.kernel.alive() else None
        if action == "notify" or (kernel is None and action == "interrupt"):
            self.log.warning("jupyter-gpushare broker: %s (over_quota_action %s: logged)", what, self.action)
            return
        if action == "interrupt":
            assert kernel is not None  # (no kernel to interrupt: logged above)
            self._signal(kernel.pid, signal.SIGINT, group=True)
            self.log.warning("jupyter-gpushare broker: %s: interrupted", what)
            return
        if kernel is not None:
            self._signal(kernel.pid, signal.SIGKILL, group=True)
        for pid in pids:
            self._signal(pid, signal.SIGKILL, group=False)
        self.log.warning("jupyter-gpushare broker: %s: ended (processes %s); its server restarts it", what, pids)

    def _signal(self, pid: int, sig: int, group: bool) -> None:
        try:
            if group:
                self._signal_group(os.getpgid(pid), sig)
            else:
                self._signal_process(pid, sig)
        except OSError as e:  # gone meanwhile
            self.log.debug("jupyter-gpushare broker: signal %s to %s: %s", sig, pid, e)
