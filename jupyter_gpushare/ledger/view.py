"""What each caller may see of the host's reservations: built once, read by the broker, a server's REST API and
the CLI.

A student sees their own kernels and waiters in detail and other users only as anonymous per-card totals;
an admin sees everything. Owns the host view's shape and a card's parts (``card_segments``); it reads the
ledger's records and never changes them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..core.policy import Policy, UserLimits
from ..core.words import render
from ..host.gpu import Card
from .ledger import Lease, ProcessRef, Waiter
from .reservations import Reservations

SEGMENTS = ("mine", "others", "over", "outside", "headroom", "free")  # a card's parts, in the bar's order (words.py)


class Viewer(Protocol):
    """Who looks: a broker caller (broker.identity.Caller), or a server's own user."""

    @property
    def user(self) -> str: ...

    @property
    def admin(self) -> bool: ...


ANONYMOUS = ProcessRef(0, 0.0)


def anonymous_leases(leases: Sequence[Lease]) -> list[Lease]:
    """Other users' leases folded into one nameless lease per card (its quota is their total)."""
    totals: dict[tuple[str, int], int] = {}
    for lease in leases:
        key = (lease.card_uuid, lease.card_index)
        totals[key] = totals.get(key, 0) + lease.reserved_mib
    return [Lease("", uuid, index, total, 0, "", "", ANONYMOUS, None, 0.0) for (uuid, index), total in totals.items()]


@dataclass(frozen=True)
class CardRow:
    """A card with what the leases on it reserve, what is left for new kernels, and whether the admin lets kernels
    use it."""

    card: Card
    usable_mib: int
    reserved_mib: int
    allowed: bool

    @classmethod
    def of(cls, card: Card, on_card: Sequence[Lease], policy: Policy) -> CardRow:
        """``card`` with the leases ``on_card``."""
        reserved = sum(lease.reserved_mib for lease in on_card)
        return cls(card, policy.usable_mib(card.total_mib), reserved, policy.card_allowed(card.uuid, card.index))

    @property
    def uuid(self) -> str:
        return self.card.uuid

    @property
    def unreserved_mib(self) -> int:
        return max(0, self.usable_mib - self.reserved_mib)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.card.to_dict(),
            "usable_mib": self.usable_mib,
            "reserved_mib": self.reserved_mib,
            "unreserved_mib": self.unreserved_mib,
            "allowed": self.allowed,
        }


def view_for(
    caller: Viewer,
    leases: Sequence[Lease],
    waiters: Sequence[Waiter],
    cards: Sequence[Card],
    policy: Policy,
    limits: UserLimits | None = None,
    now: float | None = None,
    notebooks: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """What ``caller`` may see of the host: cards, kernels, users and the queue. ``notebooks``: each kernel's
    notebook (kernel id -> path, as its server said), given for an admin: each kernel and place in line says it.

    A student (not ``caller.admin``) sees their own kernels and waiters in detail, other users only
    as an anonymous total per card (``others_reserved_mib``) and nameless queue places; no other
    user's name, kernel id or kernel name appears anywhere in the result. An admin sees every kernel.
    """
    now = time.time() if now is None else now
    mine = [lease for lease in leases if caller.admin or lease.user == caller.user]
    card_rows = []
    for card in cards:
        on_card = [lease for lease in leases if lease.card_uuid == card.uuid]
        own = sum(lease.reserved_mib for lease in on_card if lease.user == caller.user)
        row = CardRow.of(card, on_card, policy).to_json()
        row.update(mine_reserved_mib=own, others_reserved_mib=row["reserved_mib"] - own)
        card_rows.append({**row, "segments": card_segments(row, own, by_user=True)})
    labels = {card.uuid: card.label for card in cards}
    kernels = [
        {
            "kernel_id": lease.kernel_id,
            "kernel_name": lease.kernel_name,
            "user": lease.user,
            "card_index": lease.card_index,
            "card_uuid": lease.card_uuid,
            "card_label": labels.get(lease.card_uuid, f"GPU {lease.card_index}"),
            "quota_mib": lease.quota_mib,
            "reserve_mib": lease.reserve_mib,
            "reserved_mib": lease.reserved_mib,
            "server_pid": lease.owner.pid if isinstance(lease.owner, ProcessRef) else None,
            "kernel_pid": lease.kernel.pid if lease.kernel else None,
            "age_s": round(now - lease.created, 1),
            "notebook": (notebooks or {}).get(lease.kernel_id),
        }
        for lease in mine
    ]
    users: dict[str, dict[str, int]] = {}
    for lease in mine:
        row = users.setdefault(lease.user, {"kernels": 0, "quota_mib": 0, "reserved_mib": 0})
        row["kernels"] += 1
        row["quota_mib"] += lease.quota_mib
        row["reserved_mib"] += lease.reserved_mib
    queue = []
    biggest = max((c.total_mib for c in cards if policy.card_allowed(c.uuid, c.index)), default=0)
    for position, w in enumerate(waiters, start=1):
        visible = caller.admin or w.user == caller.user
        quota_mib = w.quota.resolve(biggest) if w.quota is not None and visible else None
        queue.append(
            {
                "position": position,
                "mine": w.user == caller.user,
                "kernel_id": w.kernel_id if visible else None,
                "kernel_name": w.kernel_name if visible else None,
                "notebook": (notebooks or {}).get(w.kernel_id) if visible else None,
                "user": w.user if visible else None,
                "quota_mib": quota_mib,  # a share of a card: on the largest card
                "need_mib": None if quota_mib is None else quota_mib + policy.context_reserve_mib,
                "waited_s": round(now - w.created, 1),
            }
        )
    return {
        "user": caller.user,
        "admin": caller.admin,
        "limits": limits.to_dict() if limits is not None else None,
        "limits_use": limits_use(limits, users.get(caller.user), cards),
        "context_reserve_mib": policy.context_reserve_mib,
        "cards": card_rows,
        "users": [{"user": name, **row} for name, row in sorted(users.items())],
        "kernels": kernels,
        "queue": queue,
    }


def limits_use(limits: UserLimits | None, mine: dict[str, int] | None, cards: Sequence[Card]) -> dict[str, Any] | None:
    """How much of their per-user limits the user holds, in numbers, and whether one is reached (the next kernel,
    or a larger quota, would be refused): the sum of their kernels' quotas (the CUDA context reserve is not
    counted, as the limits do not count it) against ``max_total`` (a share read against the largest card), their
    GPU kernels against ``max_kernels``. None without limits."""
    if limits is None:
        return None
    biggest = max((card.total_mib for card in cards), default=0)
    held, kernels = (mine or {}).get("quota_mib", 0), (mine or {}).get("kernels", 0)
    max_total = limits.max_total.resolve(biggest) if limits.max_total is not None and biggest else None
    max_kernel = limits.max_kernel.resolve(biggest) if limits.max_kernel is not None and biggest else None
    full = (max_total is not None and held >= max_total) or (
        limits.max_kernels is not None and kernels >= limits.max_kernels
    )
    return {"quota_mib": held, "max_total_mib": max_total, "max_kernel_mib": max_kernel, "kernels": kernels,
            "max_kernels": limits.max_kernels, "full": full}  # fmt: skip


def host_view(
    ledger: Reservations | None,
    user: str,
    cards: Sequence[Card],
    policy: Policy,
    leases: Sequence[Lease] | None = None,
    waiters: Sequence[Waiter] | None = None,
) -> dict[str, Any] | None:
    """The host view for a server's API, whichever ledger it has (call it on the ledger thread): what its
    user may see (``Reservations.caller``: through a broker, their own kernels and others as totals; in their
    own ledger file, all of it). ``leases`` and ``waiters``: the ledger's, when the caller has just read them.
    Raises LedgerError while the broker is down; None when there is no ledger."""
    if ledger is None:
        return None
    who, admin, limits = ledger.caller()
    leases = ledger.leases() if leases is None else leases
    waiters = ledger.waiters() if waiters is None else waiters
    notebooks = ledger.kernel_notebooks() if admin and who is not None else None  # (a broker's admin)
    return view_for(_Me(who or user, admin), leases, waiters, cards, policy, limits, notebooks=notebooks)


@dataclass(frozen=True)
class _Me:
    """A server's own user, as its ledger says it may see."""

    user: str
    admin: bool


def card_segments(
    card: Mapping[str, Any], mine_mib: int, by_user: bool = False, over_mib: int = 0
) -> list[dict[str, Any]]:
    """The card's memory as the bar shows it, each part clamped to what is left of the card, so they add up
    to its total; ``mine_mib`` is what this server's own kernels reserve on it (a kernel restarting with a new
    quota is still its own), or with ``by_user`` (the host view) what all the caller's kernels reserve, the
    rest being other users'. ``over_mib``: what this server's kernels use past their reservations, part of the
    card's use without a reservation (``outside_mib``), said as over-use rather than as no one's."""
    total = max(0, int(card["total_mib"]))
    reserved = int(card.get("reserved_mib") or 0)
    outside = int(card.get("outside_mib") or 0)
    over = min(max(0, over_mib), outside)
    wanted = {
        "mine": mine_mib,
        "others": reserved - mine_mib,
        "over": over,
        "outside": outside - over,
        "headroom": total - int(card.get("usable_mib", total)),
    }
    left, out = total, []
    for key in SEGMENTS:
        mib = left if key == "free" else max(0, min(int(wanted[key]), left))
        left -= mib
        words = "other_users" if by_user and key == "others" else key  # (the host view splits by user)
        label = render(f"segment.{words}.label", {})
        title = render(f"segment.{words}.title", {"size_mib": mib})
        out.append({"key": key, "label": label, "mib": mib, "title": title})
    return out
