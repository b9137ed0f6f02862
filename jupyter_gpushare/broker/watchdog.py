"""The broker's watchdog: the over-quota policy of a multi-user host, run by root, out of every student's reach.

A student's server runs its own over-quota policy (enforce.py), but the student controls that server: they
can stop it, or start one without the extension's settings. The broker reads the driver itself, so here the
same rules (overuse.py) hold whatever the student does: each sweep finds every lease's processes (the kernel's
cgroup, or its process tree; procs.lease_use), what they use beyond the lease, and how much of that other
leases had reserved:

- memory taken from other kernels' reservations is acted on at once: the child processes that hold it are
  ended (SIGKILL) where that is enough, else the kernel itself is ended (SIGKILL to its process group and to
  every process of it on a GPU), and its Jupyter server restarts it on the same reservation, as after a crash;
- other over-use keeps the grace (counted over a window of twice the grace), then ``protect`` (the default)
  ends the children that hold it, or interrupts the kernel (SIGINT to its process group) and ends it if that
  freed nothing; alone on its card, it is only logged (its over-use is counted as taken in admission either
  way); ``interrupt``: interrupt it; ``restart``: end it (as above); ``notify``: log only.

Every action is logged with the figures. Only processes the reading attributes to the lease are signalled, and
the kernel only while its (pid, start time) is the one the lease recorded. While any kernel is over its lease,
``hurry`` says to read the driver every overuse.FAST_INTERVAL_S.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Sequence
from typing import Callable

from ..core.overuse import OverUseJudge, Verdict
from ..core.policy import format_mib
from ..host.gpu import DeviceSample
from ..ledger.attribution import LeaseUse, lease_excesses, lease_use
from ..ledger.ledger import Lease

ACTIONS = ("protect", "notify", "interrupt", "restart")


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
        self.judge = OverUseJudge(action, grace_s)
        self.hurry = False  # some kernel is over its lease: read the driver often

    def sweep(
        self, samples: Sequence[DeviceSample], leases: Sequence[Lease], use: LeaseUse | None = None
    ) -> list[tuple[str, str]]:
        """Judge every lease on one reading; (kernel id, action) for each action taken. ``use``: the reading
        already split by lease (procs.lease_use), if the caller has it."""
        use = use if use is not None else lease_use(samples, leases)
        if use is None:
            return []
        excesses = lease_excesses(samples, leases, use)
        self.hurry = bool(excesses)
        by_id = {lease.kernel_id: lease for lease in leases}
        taken = []
        for verdict in self.judge.judge(self.clock(), excesses, present=by_id):
            self._act(by_id[verdict.kernel_id], verdict)
            taken.append((verdict.kernel_id, verdict.action))
        return taken

    def _act(self, lease: Lease, verdict: Verdict) -> None:
        excess = verdict.excess
        figures = ", ".join(f"{format_mib(mib)} on {card}" for card, mib in excess.over.items())
        what = f"kernel {lease.kernel_id} of {lease.user} uses {figures} beyond its lease"
        if verdict.why == "theft":
            what += f", {format_mib(excess.stolen_mib)} of it reserved by other kernels"
        elif verdict.why == "escalate":
            what += ", and the interrupt freed nothing"
        else:
            what += f", for {verdict.over_s:.0f} s"
        kernel = lease.kernel if lease.kernel is not None and lease.kernel.alive() else None
        action = verdict.action
        if action == "notify" or (kernel is None and action == "interrupt"):
            self.log.warning("jupyter-gpushare broker: %s (over_quota_action %s: logged)", what, self.action)
            return
        if action == "interrupt":
            assert kernel is not None  # (no kernel to interrupt: logged above)
            self._signal(kernel.pid, signal.SIGINT, group=not lease.adopted)
            self.log.warning("jupyter-gpushare broker: %s: interrupted", what)
            return
        if action == "stop":
            for pid in verdict.pids:
                self._signal(pid, signal.SIGKILL, group=False)
            self.log.warning(
                "jupyter-gpushare broker: %s: ended its processes %s that held it", what, list(verdict.pids)
            )
            return
        if kernel is not None:
            self._signal(kernel.pid, signal.SIGKILL, group=not lease.adopted)
        pids = sorted({pid for pid, _card, _mib in excess.processes})
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
