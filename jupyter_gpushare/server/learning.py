"""Quotas learned from history, for one server's kernels: at a start, what earlier runs of the kernel's notebook
teach (and the quota, where the admin's policy follows it); at a stop, the run's peak, recorded for the next.

The rules are history.py's (no I/O); the runs live in the ledger's ``peaks`` table, reached through the ledger
worker; a kernel's own figures (its allocators' peaks, an out-of-memory error) come from its reports.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, Callable, Protocol

from ..core.history import HistoryRules, Run, history_key, learned_quota, lookup, need_of, retry_quota_mib
from ..core.policy import CardView, Policy, Size, format_mib
from ..host.gpu import Card
from ..host.reports import report_dir, run_figures
from ..ledger.ledger import LedgerError
from .ledger_worker import LedgerWorker
from .records import KernelRecord, Tells, Writes
from .sampler import KernelUsage


class Registry(Tells, Writes, Protocol):
    """What learning needs of the kernels' registry: its records, to note what it learned on one, and to say it."""

    records: dict[str, KernelRecord]


class Learning:
    """What a server's kernels learn from their notebooks' earlier runs, and teach the next ones."""

    def __init__(
        self,
        rules: HistoryRules,
        policy: Policy,
        ledger: LedgerWorker,
        user: str,
        blocking: Callable[..., Awaitable[Any]],
        log: logging.Logger,
        kernels: Registry,
    ):
        """``blocking``: runs a blocking function off the IOLoop (reading a kernel's reports); ``kernels``: the
        registry, which notes what is learned on a kernel's record and records the events."""
        self.rules, self.policy, self.ledger, self.user, self.blocking, self.log, self.kernels = (
            rules, policy, ledger, user, blocking, log, kernels
        )  # fmt: skip

    async def at_start(self, rec: KernelRecord, quota: Size, cards: Sequence[CardView]) -> tuple[Size, str | None]:
        """What earlier runs of the kernel's notebook teach, noted on its record (shown, and told to the kernel), and
        the quota: the learned one when the admin's policy says so and nothing more explicit chose it
        (history.learned_quota). Returns the quota and, when it was learned, from what."""
        key = history_key(rec.path)
        self.kernels.update(rec, learned_peak_mib=None, learned_from=None)
        if key is None or not self.rules.kept:
            return quota, None
        try:
            found = await self.ledger.on(
                lambda ledger: lookup(ledger, self.user, rec.kernel_name, key, self.rules, rec.kernel_id)
            )
        except LedgerError as e:  # history is advice: a kernel starts without it
            self.log.info("jupyter-gpushare: no history for %r: %s", key, e)
            return quota, None
        got, limits, held = found or (None, None, 0)
        if got is None:
            return quota, None
        self.kernels.update(rec, learned_peak_mib=got.peak_mib, learned_from=got.source)
        if not self.rules.enabled or rec.quota_source != "default":
            return quota, None
        learned = learned_quota(self.policy, got, self.rules.margin, cards, limits, held)
        self.kernels.update(rec, quota=learned, quota_source="learned")
        return learned, "a run that ran out of memory" if got.failed else f"peak {format_mib(got.peak_mib)}"

    async def at_stop(self, rec: KernelRecord, usage: KernelUsage | None, card: Card | None) -> None:
        """Record the peak GPU memory of a kernel's process that held a reservation (``usage``: the sampler's NVML
        reading, CUDA context included) as it shuts down or restarts: once per process, and only a measured
        peak. ``card``: the card it held, whose size bounds what the run teaches."""
        key = history_key(rec.path)
        if rec.lease is None or key is None or usage is None or not self.rules.kept:
            return
        if usage.pid != rec.pid or not usage.peak_mib or rec.recorded_pid == rec.pid:
            return  # another process's reading, nothing measured (or nothing used), or recorded already
        self.kernels.update(rec, recorded_pid=rec.pid)
        alloc, oom = await self.blocking(run_figures, report_dir(), rec.kernel_id, rec.run_started)
        peak, quota = int(usage.peak_mib), rec.lease.quota_mib
        need = need_of(peak, alloc, quota, oom is not None, self.rules.margin, self.policy.context_reserve_mib)
        run = Run(peak, min(need, card.total_mib) if card else need, oom is not None)
        kernel_id = rec.kernel_id
        await self.ledger.quietly(
            f"record_peak({kernel_id})", lambda ledger: ledger.record_peak(kernel_id, key, run, self.rules)
        )

    def saw_reports(self, reports: Mapping[str, Any]) -> None:
        """The kernels' reports, as a snapshot read them (Snapshots.on_reports): an out-of-memory error one tells is
        noted (``at_oom``)."""
        for kernel_id, report in reports.items():
            rec = self.kernels.records.get(kernel_id)
            if rec is not None:
                self.at_oom(rec, (report or {}).get("oom"))

    def at_oom(self, rec: KernelRecord, framework: str | None) -> None:
        """A kernel's report says a framework ran out of memory: offer the quota to restart with (the sidebar's
        "Restart with ..."; the notebook learns it too, at_stop)."""
        if framework is None or rec.oom == framework or rec.lease is None or rec.card is None:
            return
        most = self.policy.largest_quota_mib(rec.card.total_mib)
        retry = min(retry_quota_mib(rec.lease.quota_mib), most)
        self.kernels.update(rec, oom=framework, retry_quota_mib=retry)
        self.kernels.event(
            "out-of-memory", rec.kernel_id, framework=framework, quota_mib=rec.lease.quota_mib, retry_mib=retry
        )
