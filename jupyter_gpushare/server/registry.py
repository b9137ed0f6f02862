"""The kernels of this server: one record each, the moves that decide a start, and the events said of them.

``KernelRegistry`` knows no ledger and no line. It keeps each kernel's record (records.py) from the moment the
kernel is known to the moment it is gone, says each change a person would notice (a kernel listed or gone, its
state, quota or place, an event) to ``on_change``, and keeps the last 500 events for the API. The manager
(manager.py) composes it with the ledger, the line and the rest; the parts read the records through it.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

from ..core.words import CATALOGUE, render
from ..host.gpu import Card
from . import life
from .admission import Refusal, Start
from .clock import SYSTEM, Clock
from .records import ChangeKind, Grant, KernelRecord, KernelState, QuotaUnavailable, Version

# The fields of a record whose change a person would notice, each said as its change (records.Change).
NOTABLE: dict[str, ChangeKind] = {
    "state": "state",
    "quota": "quota",
    "pending_quota": "pending_quota",
    "line": "position",  # (its place: InLine.position)
    "parked": "parked",
}

FIELDS = frozenset(f.name for f in dataclasses.fields(KernelRecord))
WAIT_ENDED = ("refused-timeout", "cancelled")  # a kernel that ran while it waited, whose wait ended so
SAID_BY_PROGRAM = ("queued", "refused", "cancelled")  # a program's own lines say these (batch.py), not its log


class KernelRegistry:
    """The records of this server's kernels, each change said once."""

    def __init__(
        self,
        user: str,
        cards: Sequence[Card],
        on_change: Callable[[str | None, ChangeKind], None],
        log: logging.Logger,
        holds_starts: Callable[[], bool],
        clock: Clock = SYSTEM,
    ) -> None:
        """``holds_starts``: whether this process is a Jupyter server (a program says some events itself); ``clock``:
        the parts' one clock (clock.py), for when a kernel was listed and when each event was said."""
        self.user, self.cards, self.log, self.clock = user, cards, log, clock
        self.records: dict[str, KernelRecord] = {}
        self.version = Version()  # every assignment to a record of this registry
        self.events: collections.deque[dict] = collections.deque(maxlen=500)
        self._on_change, self._holds_starts = on_change, holds_starts

    def record(self, kernel_id: str, kernel_name: str = "", language: str = "") -> KernelRecord:
        """The kernel's record, made (and said) the first time."""
        rec = self.records.get(kernel_id)
        if rec is None:
            rec = self.records[kernel_id] = KernelRecord(
                kernel_id,
                kernel_name,
                language,
                self.user,
                since=self.clock.wall(),
                largest_mib=max((c.total_mib for c in self.cards), default=0),
            )
            self._on_change(kernel_id, "listed")
        return rec

    def update(self, rec: KernelRecord, **fields: Any) -> None:
        """Change ``rec``'s ``fields``, not its state (``move`` does)."""
        if "state" in fields:
            raise ValueError("a kernel's state changes by KernelRegistry.move")
        life.check_fields(rec, fields)
        self._set(rec, fields)

    def move(self, rec: KernelRecord, to: KernelState, **fields: Any) -> None:
        """Move ``rec`` to the state ``to``, with ``fields`` (its lease, card, place, reason...) set first: the
        move is held against the kernel's life (life.check)."""
        life.check(rec, to, fields)
        self._set(rec, {**fields, "state": to})

    def _set(self, rec: KernelRecord, fields: dict[str, Any]) -> None:
        """The one place a record changes, field by field in the order given; each change a person would notice
        (NOTABLE) is said once all are made."""
        unknown = fields.keys() - FIELDS
        if unknown:
            raise TypeError(f"a kernel's record has no field {', '.join(sorted(unknown))}")
        said = [name for name, value in fields.items() if name in NOTABLE and _noticed(name, getattr(rec, name), value)]
        for name, value in fields.items():
            object.__setattr__(rec, name, value)  # (the record is frozen to everyone else)
        self.version.n += 1
        for name in said:
            self._on_change(rec.kernel_id, NOTABLE[name])

    def forget(self, kernel_id: str) -> KernelRecord | None:
        """The kernel is gone from this server: its record goes, and the change is said."""
        rec = self.records.pop(kernel_id, None)
        if rec is not None:
            self._on_change(kernel_id, "gone")
        return rec

    def event(self, kind: str, kernel_id: str | None, logged: bool = True, **figures: Any) -> None:
        """Record an event for the API (``/api/gpushare/events``) and (unless not ``logged``) the log, with the
        figures behind it and the kernel's notebook (``path``), so that a notification can name it even once the
        kernel is gone. Its English is the catalogue's ``event.<code>`` (``code``: which of its kind; else the kind)
        with its figures, written once (core/words.py): the log, the API and the sidebar say the same."""
        rec = self.records.get(kernel_id) if kernel_id else None
        path = figures.pop("path", None) or (rec.path if rec else None)
        code = f"event.{figures.get('code') or kind}"
        if code not in CATALOGUE:  # (a bug of ours: test_contract checks each code the server gives)
            if life.strict():
                raise KeyError(f"{code} is not in core/words.py's catalogue")
            self.log.error("jupyter-gpushare: %s is not in the catalogue of words", code)
        message = render(code, figures)
        self.events.append(
            {
                "time": self.clock.wall(),
                "kind": kind,
                "kernel_id": kernel_id,
                "path": path,
                "message": message,
                **figures,
            }
        )
        self._on_change(kernel_id, "event")
        if logged and (self._holds_starts() or kind not in SAID_BY_PROGRAM):
            self.log.info("gpushare %s %s: %s", kind, kernel_id or "", message)

    def settle(self, rec: KernelRecord, grant: Grant, why: str = "no-gpu-ledger", **figures: Any) -> Grant:
        """The kernel's start is decided: it runs with its grant. ``why`` a kernel starts without a GPU (the code of
        its 'no-gpu' event, with ``figures``): no-gpu-none (this server has none), no-gpu-ledger (no reservation
        can be made now), no-gpu-full (the cards are full and the policy starts it without)."""
        assert grant.mode != "warm"  # (a warm kernel has no record)
        self.move(
            rec, "running" if grant.mode == "gpu" else grant.mode, lease=grant.lease, card=grant.card,
            reason=grant.reason, line=None, parked=None, restarting=False,
            wait_ended=why if grant.mode == "cpu" and why in WAIT_ENDED else None,
        )  # fmt: skip
        if grant.mode == "gpu" and grant.lease:
            card = grant.card.label if grant.card else f"GPU {grant.lease.card_index}"
            self.event("reserved", rec.kernel_id, reserved_mib=grant.lease.reserved_mib, card=card)
        elif grant.mode == "cpu":
            self.event("no-gpu", rec.kernel_id, code=why, **figures)
        return grant

    def conclude(
        self, kernel_id: str, outcome: Start | Refusal, rec: KernelRecord | None = None
    ) -> Grant | QuotaUnavailable:
        """What a kernel's start came to, at once (admission.py) or after a wait in line (the line's outcome,
        line.py), applied to its record and said: its grant, settled (a start after a wait says first how long it
        waited), or the error its refusal is raised as. A start is settled on ``rec``, the record its caller held
        (one forgotten meanwhile, by a shut-down during the start, all the same: the start goes on, and its clean-up
        gives the reservation back). A parked kernel's wait to come back is no start: it is parked again, and its
        resume (parking.py) hears the grant, or why there is none, and moves it on (running once its state is back,
        or parked, saying why)."""
        rec = rec or self.records.get(kernel_id)
        if rec is not None and rec.parked is not None:
            self.move(rec, "parked", line=None)
            if isinstance(outcome, Refusal) or outcome.grant.lease is None:
                why = outcome.message if isinstance(outcome, Refusal) else outcome.grant.reason
                return QuotaUnavailable(why or "no reservation")
            if outcome.waited_s is not None:  # (said as a start's grant is: its GPU is ready)
                self.event("admitted", kernel_id, waited_s=outcome.waited_s)
            return outcome.grant
        if isinstance(outcome, Refusal):
            return self.refuse(
                kernel_id, outcome.message, status=outcome.status, keep=outcome.keep, kind=outcome.kind,
                code=outcome.code, **outcome.figures,
            )  # fmt: skip
        assert rec is not None, f"a start of {kernel_id} settled without its record"
        if outcome.waited_s is not None:
            self.event("admitted", kernel_id, waited_s=outcome.waited_s)
        return self.settle(rec, outcome.grant, outcome.why, **outcome.figures)

    def refuse(
        self,
        kernel_id: str,
        message: str,
        status: int = 503,
        keep: bool = False,
        kind: str = "refused",
        code: str | None = None,
        **figures: Any,
    ) -> QuotaUnavailable:
        """Record why a kernel will not start and return the error to raise. Its record is forgotten, or with
        ``keep`` (a restart that was refused: the kernel is down now) kept as 'failed' with the reason. The event
        is 'refused', or 'cancelled' for a wait its owner stopped; ``code`` (words.CATALOGUE's ``event.<code>``,
        with ``figures``) says which refusal (else the kind's words, with ``message`` as its reason)."""
        rec = self.records.get(kernel_id) if keep else self.forget(kernel_id)
        if rec is not None and keep:
            self.move(
                rec, "failed", lease=None, card=None, line=None, wait_ended=None, restarting=False,
                reason=f"The kernel could not start again: {message} Shut it down, or start it with another quota.",
            )  # fmt: skip
        if code is not None:
            figures["code"] = code
        figures.setdefault("reason", message)
        self.event(kind, kernel_id, path=rec.path if rec else None, **figures)
        return QuotaUnavailable(message, status=status, code=code)

    def keeps(self, rec: KernelRecord | None) -> bool:
        """Whether a refused kernel stays listed as 'failed' (a restart of a kernel nbclient holds); a kernel a
        Jupyter server lists is shut down instead."""
        return rec is not None and not self._holds_starts() and rec.pid is not None

    def usage_targets(self) -> list[tuple[str, int | None, str | None]]:
        """(kernel id, root pid, card uuid) of every kernel record; safe to call from any thread."""
        records = self.records.copy()  # one C-level copy: no iteration over a dict being changed
        return [(kid, rec.pid, rec.card.uuid if rec.card else None) for kid, rec in records.items()]

    def card(self, uuid: str) -> Card | None:
        return next((c for c in self.cards if c.uuid == uuid), None)


def _noticed(name: str, before: Any, after: Any) -> bool:
    """Whether a person would notice a record's field ``name`` going from ``before`` to ``after``: of a kernel's
    wait in line (InLine), its place; of any other notable field, any change."""
    if name == "line":
        return (before.position if before else None) != (after.position if after else None)
    return bool(before != after)
