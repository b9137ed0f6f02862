"""A running kernel's quota, changed without costing it its GPU.

A kernel's framework caps are set when its process starts, so a new quota applies at the kernel's next restart
(``pending_quota`` until then). What it holds on the card never goes through the line: a larger quota is reserved
at once from what the kernel's card has unreserved (ahead of the kernels in line: it holds the card already), or is
refused at once with the figures (``grow-no-room``) and nothing changes; a smaller one shrinks the same reservation
at the restart, on the same card. A kernel without a reservation (in line, parked, without a GPU) takes its new
quota through the line at its restart, as any start does (QuotaManager.admit). A kernel that has not asked yet
(``standby``, line_place = 'first-use') needs no restart: its first GPU use asks for the new quota.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Callable, Protocol

from ..core.policy import CardView, Policy, PolicyError, Size, format_mib, parse_size
from ..host.gpu import Card, DeviceSample
from ..ledger.ledger import Lease, LedgerError
from ..ledger.reservations import Reservations
from .ledger_worker import LedgerWorker
from .records import KernelRecord, Tells, Writes


class Registry(Tells, Writes, Protocol):
    """What a quota change needs of the kernels' registry (QuotaManager): the records, the admin's rules, the cards,
    the ledger, the last reading of the driver, and the student's events."""

    user: str
    policy: Policy
    cards: list[Card]
    records: dict[str, KernelRecord]
    ledger: LedgerWorker

    def card(self, uuid: str) -> Card | None: ...
    def card_views(self) -> list[CardView]: ...
    def latest_samples(self) -> Sequence[DeviceSample]: ...


class QuotaChanges:
    """Quota changes of one server's kernels (QuotaManager.quotas)."""

    def __init__(self, kernels: Registry, room_freed: Callable[[], None]) -> None:
        """``room_freed``: the line's (a smaller reservation leaves room for it)."""
        self.kernels, self.room_freed = kernels, room_freed

    def parse(self, typed: object) -> Size:
        """What a person typed for a quota, as the one parser reads it (policy.parse_size), with this server's
        figures in its reasons: the fix it suggests for a bare number is never below the minimum, and a size past
        any card is refused with the largest quota here, as a quota above the maximum is."""
        k = self.kernels
        biggest = max((c.total_mib for c in k.cards), default=0)
        try:
            return parse_size(typed, "quota", least_mib=k.policy.min_quota.resolve(biggest))
        except PolicyError as e:
            if e.code != "size-too-large" or not k.cards:
                raise
            most = max(k.policy.largest_quota_mib(c.total_mib) for c in k.cards)
            raise PolicyError(
                f"A quota of {str(typed)[:40]!r} is more than the largest a kernel may have here ({format_mib(most)}). "
                f"Ask for at most {format_mib(most)}.",
                "quota-above-max", most_mib=most,
            ) from e  # fmt: skip

    async def request(self, kernel_id: str, quota: Size) -> KernelRecord:
        """Ask for another quota for a kernel (the module's docstring says when it applies). PolicyError with the
        figures: ``grow-no-room``, or the limit of the admin's rules or the user's per-user limits that refuses it."""
        k = self.kernels
        rec = k.records[kernel_id]
        k.policy.check_quota(quota, k.card_views())
        card = k.card(rec.lease.card_uuid) if rec.lease is not None else None
        grows = card is not None and rec.lease is not None and quota.resolve(card.total_mib) > rec.lease.quota_mib
        if grows:
            assert card is not None
            grown = await self._resize(kernel_id, quota.resolve(card.total_mib))
            k.update(rec, lease=grown or rec.lease)
        else:
            await k.ledger.on(lambda ledger: self._check_limits(ledger, kernel_id, quota))
        k.update(
            rec, pending_quota=quota
        )  # exactly what the server took, applied as it is at the restart (or first use)
        # nothing reserved yet in standby: its first GPU use asks for it (manager.admit); else at the next restart
        code = "quota-at-first-use" if rec.state == "standby" else "quota-requested"
        k.event("quota-requested", kernel_id, code=code, quota_mib=rec.pending_quota_mib())
        return rec

    async def apply(self, kernel_id: str) -> None:
        """At a restart of a kernel that holds a reservation: its pending quota, on the same reservation (resized in
        place: a larger one was reserved when it was asked for). Should the ledger refuse now (a per-user limit
        changed, the broker is down), the kernel restarts with the quota it had, and the event says why."""
        k = self.kernels
        rec = k.records[kernel_id]
        quota, lease = rec.pending_quota, rec.lease
        card = k.card(lease.card_uuid) if lease is not None else None
        if quota is None or lease is None or card is None:
            return
        k.update(rec, pending_quota=None)
        asked_mib = quota.resolve(card.total_mib)
        try:
            k.update(rec, lease=await self._resize(kernel_id, asked_mib) or lease)
        except (PolicyError, LedgerError) as e:
            k.event("quota-kept", kernel_id, quota_mib=asked_mib, kept_mib=lease.quota_mib, why=str(e))
            return
        k.update(rec, quota=quota, quota_source="requested")
        applied = rec.lease
        assert applied is not None
        k.event("quota-applied", kernel_id, quota_mib=applied.quota_mib, reserved_mib=applied.reserved_mib)
        self.room_freed()

    async def _resize(self, kernel_id: str, quota_mib: int) -> Lease | None:
        """The kernel's reservation with ``quota_mib``, resized in place on the ledger (ledger.resize)."""
        k = self.kernels

        def resize(ledger: Reservations) -> Lease | None:
            outside = ledger.outside(k.latest_samples())
            return ledger.resize(kernel_id, quota_mib, k.policy, k.cards, outside=outside)

        return await k.ledger.run(k.ledger.must, resize)

    def _check_limits(self, ledger: Reservations, kernel_id: str, quota: Size) -> None:
        """On the ledger thread: the broker's per-user limits for this user, against the quotas of their other
        kernels. Nothing to check with an embedded ledger (no per-user limits) or while the broker is down (the
        restart then starts without a GPU and says why)."""
        k = self.kernels
        try:
            user, _admin, limits = ledger.caller()
            leases = ledger.leases() if limits is not None else []
        except LedgerError:
            return
        if limits is None:
            return
        user = user or k.user
        held = [x.quota_mib for x in leases if x.user == user and not x.anonymous and x.kernel_id != kernel_id]
        biggest = max((c.total_mib for c in k.cards), default=0)
        limits.check(user, quota.resolve(biggest), biggest, held)
