"""The host's queue of kernels waiting for GPU room: who is served first, and who may pass whom.

Pure rules, no I/O: the ledger applies them inside its transaction (``Ledger.reserve``), to the waiters of
every server of the host, so every server and the broker order the line the same way.

- **In order, per card.** Kernels are served in the order they joined the line (their ticket). A kernel
  ahead in line that fits now takes its room first (it is granted at its next call, within half a second).
- **Backfill.** A kernel ahead that does not fit now does not hold back one behind it that fits: a
  2 GiB kernel is not kept waiting behind a 20 GiB one while the card has 5 GiB unreserved, and a kernel
  that may use only card 0 (a container's) holds no one back on card 1.
- **Aging.** A kernel that has waited ``Policy.overtake_limit_s`` is no longer passed by newer ones: the room it
  needs on the card where it lacks the least is kept for it (nothing new is placed there) until it fits, so a large
  kernel is not starved by a stream of small ones. Its other cards stay open.
- **Aging cannot be chained.** A kernel that has itself waited ``overtake_limit_s`` is held back by no one's kept
  room: no kernel in line waits for a fitting place longer than that because of others' aging. And a user's kernel
  that joins within ``queue_timeout_s`` of one of that user's waits ending without a grant (timed out, stopped,
  shut down) does not age before that timeout has passed (``Entry.ages_from``): two kernels re-joining in turn
  cannot keep a card aged for good.
- ``overtake_limit_s`` = 0 is first come, first served on each card: every kernel in line keeps its room at once,
  and no one passes.
- **Caps.** One user may have at most ``Policy.max_waiting`` kernels in line (``check_waiting``); waiting
  kernels also count against the broker's per-user limits (the ledger adds their quotas to what the user
  holds), so no one can queue past ``max_kernels`` or ``max_total``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ..core.policy import CardView, Policy, PolicyError, Size

if TYPE_CHECKING:
    pass


@dataclass(frozen=True)
class Entry:
    """One kernel in line (or asking to join it): what it asks for, where it may go, since when."""

    ticket: int
    kernel_id: str
    quota: Size
    user: str = ""
    created: float = 0.0  # when it joined the line (the ledger's clock)
    cards: frozenset[str] = field(default_factory=frozenset)  # the only cards it may use; empty: any allowed card
    ages_from: float | None = None  # when its aging starts (a re-join: later than ``created``); None: ``created``

    def aged(self, policy: Policy, now: float) -> bool:
        """Whether room is kept for it: it has waited its turn out on the aging clock (``ages_from``)."""
        limit = policy.overtake_limit_s
        return limit <= 0 or now - max(self.created, self.ages_from or 0.0) >= limit

    def held_by_none(self, policy: Policy, now: float) -> bool:
        """Whether it has itself waited ``overtake_limit_s`` (its own wait, re-join or not): then no one's kept
        room holds it back any longer."""
        limit = policy.overtake_limit_s
        return limit > 0 and now - self.created >= limit


def usable_cards(entry: Entry, views: Sequence[CardView], policy: Policy) -> list[CardView]:
    """The cards ``entry`` could ever be placed on: allowed by the admin (and its own card list), and big enough
    for its quota and the CUDA context reserve once empty."""
    return [
        v
        for v in views
        if policy.card_allowed(v.uuid, v.index)
        and (not entry.cards or v.uuid in entry.cards)
        and policy.need_mib(entry.quota, v.total_mib) <= policy.usable_mib(v.total_mib)
    ]


def choose_card(
    entry: Entry, ahead: Sequence[Entry], views: Sequence[CardView], policy: Policy, now: float
) -> CardView | None:
    """The card to place ``entry`` on now, or None while it must wait.

    ``ahead``: the kernels before it in line (lower tickets), in order. Each that fits now takes its room first;
    each that does not fit and is aged keeps the room it needs on the card where it lacks the least. ``entry``
    gets the best-fitting card of what is left (``Policy.place``); kept room does not hold back a kernel that has
    itself waited ``policy.overtake_limit_s``.
    """
    taken: dict[str, int] = {}  # card uuid -> room given to kernels ahead in this pass
    kept: dict[str, int] = {}  # card uuid -> room kept for aged kernels ahead that do not fit

    def left(e: Entry) -> list[CardView]:
        keeps = {} if e.held_by_none(policy, now) else kept
        cards = usable_cards(e, views, policy)
        return [replace(v, reserved_mib=v.reserved_mib + taken.get(v.uuid, 0) + keeps.get(v.uuid, 0)) for v in cards]

    for other in ahead:
        cards = left(other)
        card = policy.place(other.quota, cards)
        if card is not None:
            taken[card.uuid] = taken.get(card.uuid, 0) + policy.need_mib(other.quota, card.total_mib)
        elif cards and other.aged(policy, now):
            best = max(cards, key=lambda v: (v.room_mib(policy) - policy.need_mib(other.quota, v.total_mib), -v.index))
            kept[best.uuid] = kept.get(best.uuid, 0) + policy.need_mib(other.quota, best.total_mib)
    return policy.place(entry.quota, left(entry))


def ages_from(created: float, user_unserved: float | None, policy: Policy) -> float | None:
    """When a kernel that joins the line at ``created`` starts aging: one ``queue_timeout_s`` after its user's
    last wait that ended without a grant (``user_unserved``), where that was less than a timeout before; else
    None (from ``created``). Without a timeout or an overtake limit (either set to 0) there is no such rule."""
    if user_unserved is None or policy.overtake_limit_s <= 0 or not 0 < policy.queue_timeout_s < math.inf:
        return None
    until = user_unserved + policy.queue_timeout_s
    return until if created < until else None


def check_waiting(user: str, waiting: int, policy: Policy) -> None:
    """Refuse a new kernel in line for a user who already has ``waiting`` kernels in it, at the cap."""
    if policy.max_waiting and waiting >= policy.max_waiting:
        who = f"User {user!r} has" if user else "You have"
        raise PolicyError(
            f"{who} {waiting} kernel{'' if waiting == 1 else 's'} waiting for a GPU already, the most one user may have in line here. "
            "Stop waiting on one of them (the banner's Stop waiting, or shut its kernel down), or wait until "
            "one starts.",
            "user-max-waiting",
            waiting=waiting,
        )


# -- this server's kernels in line -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """What a kernel asks the ledger for."""

    kernel_id: str
    quota: Size
    user: str = ""
    kernel_name: str = ""
    path: str = field(default="", compare=False)  # its notebook (an admin's view names the kernel by it)
