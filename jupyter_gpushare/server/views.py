"""A server's REST views: its kernels and cards with the sampler's measurement, the admin's rules as numbers, and
what the server holds (``ServerState``: its cards, the host's line, its ledger). The host view any caller may see is
ledger/view.py."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

from ..core.policy import Policy, Size
from ..host.gpu import Card
from ..ledger.ledger import Lease, Waiter
from ..ledger.view import CardRow
from .records import KernelRecord
from .sampler import KernelUsage, UsageSnapshot

# -- the REST API's kernels and cards, with the sampler's measurement -----------------------------------


@dataclass(frozen=True, eq=False)
class KernelView:
    """One kernel of one snapshot, typed: its record as it was then (a copy: the registry goes on changing the
    live one), the time it was read at, its frameworks' own word (its reports), what the sampler measured of it, the
    enforcer's judgment of it and how it is held. The parts of the server read these; the API's JSON is made of
    them by ``to_json``, for the handlers alone."""

    record: KernelRecord
    now: float
    frameworks: Mapping[str, Any] | None = None
    usage: KernelUsage | None = None
    judged: str | None = None  # life.JUDGED: near_quota, over_quota or idle (a running kernel's only)
    held: Mapping[str, Any] | None = None  # Holding.held: how it is held, level by level

    @property
    def kernel_id(self) -> str:
        return self.record.kernel_id

    @property
    def state(self) -> str:
        """Its record's state; a running kernel's as the enforcer judged it, where it did."""
        return self.judged if self.record.state == "running" and self.judged else self.record.state

    def to_json(self) -> dict[str, Any]:
        """The API's kernel (openapi.yaml's ``Kernel``): its record's figures, its frameworks, the measured use
        (null where not measured), its state as judged, and how it is held. Made once per view; each call has a
        copy of its own (a handler adds to it)."""
        return dict(self._json)

    @cached_property
    def _json(self) -> dict[str, Any]:
        usage = self.usage
        return {
            **self.record.to_dict(self.now),
            "state": self.state,
            "frameworks": None if self.frameworks is None else dict(self.frameworks),
            "used_mib": usage.used_mib if usage else None,
            "peak_mib": usage.peak_mib if usage else None,
            "utilization": usage.utilization if usage else None,
            "processes": [p.to_dict() for p in usage.processes] if usage else [],
            "history": [list(p) for p in usage.history] if usage else [],
            "held": None if self.held is None else dict(self.held),
        }


def card_view(card: CardView, snap: UsageSnapshot) -> dict[str, Any]:
    """GET /api/gpushare/cards' card: its reservations with the measured use (null figures when not measured)."""
    usage = snap.cards.get(card.uuid)
    if usage is None:
        figures = dict.fromkeys(("used_mib", "used_by_kernels_mib", "used_by_others_mib", "free_mib", "utilization"))
        figures.update(mig=False, lost=False, errors={})
    else:
        figures = usage.figures()
    return {**card.to_json(), **figures}


def size_view(size: Size | None) -> dict[str, Any] | None:
    """A size as numbers: ``{"mib": 6144}``, or ``{"percent": 25}`` for a share of the kernel's card."""
    if size is None:
        return None
    return {"percent": size.percent} if size.percent is not None else {"mib": size.mib}


def config_view(p: Policy) -> dict[str, Any]:
    """The admin's rules a student may know: default, smallest and largest quota, the CUDA reserve, what a full
    card does. Sizes as numbers (``size_view``)."""
    return {
        "default_quota": size_view(p.default_quota),
        "max_quota": size_view(p.max_quota),
        "min_quota": size_view(p.min_quota),
        "context_reserve_mib": p.context_reserve_mib,
        "card_headroom": size_view(p.headroom),
        "on_full": p.on_full,
        "queue_timeout_s": None if p.queue_timeout_s == float("inf") else p.queue_timeout_s,
    }


@dataclass(frozen=True)
class CardView:
    """One card as this server sees it: what every lease it may see reserves on it (through a broker, other users'
    too), how many kernels hold those leases, and what processes without a lease use (None: not read)."""

    row: CardRow
    kernels: int
    outside_mib: int | None

    @property
    def uuid(self) -> str:
        return self.row.uuid

    def to_json(self) -> dict[str, Any]:
        return {**self.row.to_json(), "kernels": self.kernels, "outside_mib": self.outside_mib}


@dataclass(frozen=True)
class LinePlace:
    """A place in the host's line as this server may see it: its own kernels named (``mine``), others' not."""

    position: int
    kernel_id: str | None
    mine: bool
    quota_mib: int | None
    need_mib: int | None
    waited_s: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LedgerState:
    """Where this server's ledger is (a file, or the broker's socket), and why it cannot be used now, if not."""

    path: str | None = None
    broker: str | None = None
    error: str | None = None
    replaced: bool | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ServerState:
    """What this server holds, of one moment: its GPU backend (and why none, where there is none), its ledger, how
    it holds its kernels (``enforcement``: Holding.enforcement), its cards with what is reserved on them, and the
    host's line. The parts of the server read it; ``to_json`` is the API's shape, for the handlers alone."""

    backend: str | None = None
    simulated: bool | None = None
    reason: str | None = None
    ledger: LedgerState = LedgerState()
    enforcement: Mapping[str, Any] = field(default_factory=dict)
    cards: tuple[CardView, ...] = ()
    queue: tuple[LinePlace, ...] = ()

    def card(self, uuid: str) -> CardView | None:
        return next((c for c in self.cards if c.uuid == uuid), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "simulated": self.simulated,
            "reason": self.reason,
            "ledger": self.ledger.to_json(),
            "enforcement": dict(self.enforcement),
            "cards": [c.to_json() for c in self.cards],
            "queue": [q.to_json() for q in self.queue],
        }


def line_view(
    cards: Sequence[Card], policy: Policy, waiters: Sequence[Waiter], mine: set[str], now: float
) -> tuple[LinePlace, ...]:
    """The host's line, in which only this server's own kernels (``mine``) are named (``now``: the time the waits
    are read at)."""
    biggest = max((c.total_mib for c in cards if policy.card_allowed(c.uuid, c.index)), default=0)
    places = []
    for i, w in enumerate(waiters):
        quota_mib = w.quota.resolve(biggest) if w.quota is not None else None  # a share: on the largest card
        need_mib = None if quota_mib is None else quota_mib + policy.context_reserve_mib
        mine_ = w.kernel_id in mine
        waited = round(max(0.0, now - w.created), 1)  # (one that joined during the read: 0)
        places.append(LinePlace(i + 1, w.kernel_id if mine_ else None, mine_, quota_mib, need_mib, waited))
    return tuple(places)


def cards_view(
    cards: Sequence[Card], policy: Policy, leases: Sequence[Lease], outside: Mapping[str, int] | None
) -> tuple[CardView, ...]:
    """This server's cards, with what every lease it may see reserves on them and what processes without a lease
    use."""
    views = []
    for card in cards:
        on_card = [lease for lease in leases if lease.card_uuid == card.uuid]  # (through a broker: others' too)
        kernels = sum(not lease.anonymous for lease in on_card)
        views.append(
            CardView(
                CardRow.of(card, on_card, policy), kernels, outside.get(card.uuid) if outside is not None else None
            )
        )
    return tuple(views)
