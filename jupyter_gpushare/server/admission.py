"""The rules of a kernel's start, without I/O: from what is asked, what the server knows of its cards and the
policy, the start it gets or its coded refusal.

QuotaManager.admit does the I/O around these and carries out what they say: it keeps the kernel's record, learns
its quota from earlier runs (learning.py), keeps its place in line, and asks the ledger, which places a request
best-fit on a card in one transaction across every server of the host (ledger.py, queue.choose_card). So a start is
judged in three steps, each a function here: ``plan`` (which quota, and whether the ledger is asked at all),
``check`` (the quota, once learned, against the admin's limits and the cards) and ``answer`` (what the ledger's
answer means: a grant, a place in line, a start without a GPU, or a refusal). Nothing here reads a clock, a file
or the ledger, or changes a record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, Union

from ..core.levels import check_required
from ..core.policy import CardView, Policy, PolicyError, Size
from ..host.gpu import Card
from ..ledger.file import LedgerError
from ..ledger.leases import Lease, Waiting
from .records import Grant, full_message, rule_figures

QuotaSource = Literal["default", "kernelspec", "requested"]  # (history.SOURCES adds "learned", at_start's)
NO_FIGURES: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True)
class StartRequest:
    """What a kernel's start asks for."""

    kernel_name: str
    language: str
    requested: Size | None = None  # its kernelspec's quota (None: the server's rules say)
    pending: Size | None = None  # the quota asked for through the API, applied at this (re)start
    restarting: bool = False  # a restart: refused, the kernel stays listed as 'failed' (the kernel is down now)


@dataclass(frozen=True)
class Cards:
    """What the server knows of its cards and how it holds kernels, as the start is judged."""

    cards: tuple[Card, ...]
    no_gpu_reason: str | None = None  # why there is no card (the backend's reason)
    level: str = "caps"  # the enforcement level a kernel started now gets (holding.py, levels.py)
    missing: str = ""  # what keeps kernels from the next level, in words
    closing: bool = False  # the server is shutting down

    def views(self) -> list[CardView]:
        """The cards as the policy sees them, nothing reserved (what a quota is checked against)."""
        return [CardView(c.uuid, c.index, c.total_mib) for c in self.cards]

    def card(self, uuid: str) -> Card | None:
        return next((c for c in self.cards if c.uuid == uuid), None)


@dataclass(frozen=True)
class Start:
    """The kernel starts now with ``grant``; without a GPU (``cpu``), ``why`` is the code of its 'no-gpu' event,
    with ``figures``. ``waited_s``: it was granted after that long in line (line.py), said first."""

    grant: Grant
    why: str = "no-gpu-ledger"
    figures: Mapping[str, Any] = field(default_factory=lambda: NO_FIGURES)
    waited_s: int | None = None


@dataclass(frozen=True)
class Queue:
    """The kernel joins the host's line, at the place the ledger gave it."""

    waiting: Waiting


@dataclass(frozen=True)
class Refusal:
    """The kernel does not start: ``message`` says why and what to do, ``code`` (words.CATALOGUE's ``event.<code>``)
    with ``figures`` names the rule; ``status`` is the HTTP status of the start's error; with ``keep`` a kernel that
    was restarting stays listed as 'failed'. ``kind``: the event's, 'cancelled' for a wait its owner stopped."""

    message: str
    status: int = 503
    code: str | None = None
    keep: bool = False
    figures: Mapping[str, Any] = field(default_factory=lambda: NO_FIGURES)
    cause: PolicyError | None = field(default=None, compare=False)  # the rule's own error, where one refused
    kind: str = "refused"


Outcome = Union[Start, Queue, Refusal]  # (not ``|``: a union of classes at run time needs Python 3.10)


@dataclass(frozen=True)
class Plan:
    """The first step's result: the quota the start asks for and where it comes from, and the outcome when the
    start is decided before the ledger is asked (None: ask it, once the quota is learned and checked)."""

    quota: Size | None
    source: QuotaSource
    outcome: Start | Refusal | None = None


def plan(request: StartRequest, cards: Cards, policy: Policy) -> Plan:
    """Which quota a start asks for (the API's pending one, the kernelspec's, the policy's for its kernelspec or
    language), and whether it is decided already: no quota for its kind of kernel, the server closing, no card,
    an enforcement level below the one required."""
    source: QuotaSource = "kernelspec" if request.requested is not None else "default"
    requested = request.requested
    if request.pending is not None:
        requested, source = request.pending, "requested"
    quota = policy.quota_for(request.kernel_name, request.language, requested)
    if quota is None:
        why = f"Kernels of {request.kernel_name or request.language!r} reserve no GPU memory here, so they see no GPU."
        return Plan(None, source, Start(Grant("none", reason=why)))
    if cards.closing:
        message = "The Jupyter server is shutting down; start the kernel again once it is back."
        return Plan(quota, source, Refusal(message, code="refused-closing"))
    if not cards.cards:
        none = cards.no_gpu_reason
        return Plan(quota, source, Start(Grant("cpu", reason=f"No GPU: {none}"), "no-gpu-none", {"reason": none}))
    try:
        check_required(cards.level, policy.required_level, cards.missing)
    except PolicyError as e:
        return Plan(quota, source, _refused(e, request, status=503))
    return Plan(quota, source)


def no_ledger(error: str | None) -> Start:
    """No reservation can be made now (the ledger cannot be opened, the broker is down): the kernel starts without a
    GPU, and says why."""
    return Start(Grant("cpu", reason=f"No GPU reservation could be made: {error}"))


def check(quota: Size, request: StartRequest, cards: Cards, policy: Policy) -> Refusal | None:
    """The quota (as learned) against the admin's limits and the cards: a refusal naming the rule, or None."""
    try:
        policy.check_quota(quota, cards.views())
    except PolicyError as e:
        return _refused(e, request)
    return None


def answer(
    got: Lease | Waiting | LedgerError | PolicyError, quota: Size, request: StartRequest, cards: Cards, policy: Policy
) -> Outcome:
    """What the ledger's answer to the start means: its lease (a grant on that card), a place in line (joined, a
    start without a GPU or a refusal, as ``on_full`` says), a ledger that cannot be used (a start without a GPU), or
    a per-user limit the broker enforces (a refusal)."""
    if isinstance(got, Lease):
        return Start(Grant("gpu", lease=got, card=cards.card(got.card_uuid)))
    if isinstance(got, LedgerError):
        return no_ledger(str(got))
    if isinstance(got, PolicyError):
        return _refused(got, request)
    if policy.on_full == "queue":
        return Queue(got)
    message = full_message(quota, got, policy.context_reserve_mib, None)
    figures = {"need_mib": got.need_mib, "free_mib": got.free_mib}
    if policy.on_full == "cpu":
        return Start(Grant("cpu", reason=message + " This kernel was started without a GPU."), "no-gpu-full", figures)
    return Refusal(message, code="refused-no-room", keep=request.restarting, figures=figures)


def _refused(error: PolicyError, request: StartRequest, status: int = 400) -> Refusal:
    figures = rule_figures(error)
    code = figures.pop("code", None)
    return Refusal(str(error), status=status, code=code, keep=request.restarting, figures=figures, cause=error)
