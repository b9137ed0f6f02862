"""Quotas learned from history, for one server's kernels: at a start, what earlier runs of the kernel's notebook
teach (and the quota, where the admin's policy follows it); at a stop, the run's peak, recorded for the next.

The rules are history.py's (no I/O); the runs live in the ledger's ``peaks`` table, reached through the ledger
worker; a kernel's own figures (its allocators' peaks, an out-of-memory error) come from its reports.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Sequence
from typing import Any, Callable

from ..core.history import HistoryRules, Run, history_key, learned_quota, lookup, need_of, retry_quota_mib
from ..core.policy import CardView, Policy, Size, format_mib
from ..core.words import FRAMEWORKS
from ..host.gpu import Card
from ..host.reports import report_dir, run_figures
from ..ledger.ledger import LedgerError
from .ledger_worker import LedgerWorker
from .records import KernelRecord
from .sampler import KernelUsage


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
        event: Callable[..., None],
    ):
        """``blocking``: runs a blocking function off the IOLoop (reading a kernel's reports); ``event``: records an
        event (QuotaManager.event)."""
        self.rules, self.policy, self.ledger, self.user, self.blocking, self.log, self.event = (
            rules, policy, ledger, user, blocking, log, event
        )  # fmt: skip

    async def at_start(self, rec: KernelRecord, quota: Size, cards: Sequence[CardView]) -> tuple[Size, str | None]:
        """What earlier runs of the kernel's notebook teach, noted on its record (shown, and told to the kernel), and
        the quota: the learned one when the admin's policy says so and nothing more explicit chose it
        (history.learned_quota). Returns the quota and, when it was learned, from what."""
        key, rec.learned_peak_mib, rec.learned_from = history_key(rec.path), None, None
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
        rec.learned_peak_mib, rec.learned_from = got.peak_mib, got.source
        if not self.rules.enabled or rec.quota_source != "default":
            return quota, None
        learned = learned_quota(self.policy, got, self.rules.margin, cards, limits, held)
        rec.quota, rec.quota_source = learned, "learned"
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
        rec.recorded_pid = rec.pid
        alloc, oom = await self.blocking(run_figures, report_dir(), rec.kernel_id, rec.run_started)
        peak, quota = int(usage.peak_mib), rec.lease.quota_mib
        need = need_of(peak, alloc, quota, oom is not None, self.rules.margin, self.policy.context_reserve_mib)
        run = Run(peak, min(need, card.total_mib) if card else need, oom is not None)
        kernel_id = rec.kernel_id
        await self.ledger.quietly(
            f"record_peak({kernel_id})", lambda ledger: ledger.record_peak(kernel_id, key, run, self.rules)
        )

    def at_oom(self, rec: KernelRecord, framework: str | None) -> None:
        """A kernel's report says a framework ran out of memory: offer the quota to restart with (the sidebar's
        "Restart with ..."; the notebook learns it too, at_stop)."""
        if framework is None or rec.oom == framework or rec.lease is None or rec.card is None:
            return
        most = self.policy.largest_quota_mib(rec.card.total_mib)
        rec.oom, rec.retry_quota_mib = framework, min(retry_quota_mib(rec.lease.quota_mib), most)
        self.event(
            "out-of-memory", rec.kernel_id,
            f"{FRAMEWORKS.get(framework, framework)} ran out of memory at a quota of {format_mib(rec.lease.quota_mib)}; restart with "
            f"{format_mib(rec.retry_quota_mib)} to run it with more.",
            framework=framework, quota_mib=rec.lease.quota_mib, retry_mib=rec.retry_quota_mib,
        )  # fmt: skip
