"""A kernel's life in this server: its states, written once, and the moves between them.

``STATES`` is the one list of what a kernel's record may be, with how each is shown (its severity); ``JUDGED`` the
states the over-quota and idle policies give a running kernel. Everything else is checked against them
(tests/server/test_contract.py): the API's enum (openapi.yaml), the catalogue's ``status.<state>`` words (words.py and
the sidebar's words.ts), and the sidebar's TypeScript union (types.ts). A state that is not here fails there, and
``state.kernel_status`` refuses it, instead of showing it as 'failed'.

``KernelRegistry.move`` is the one way a record changes state: ``check`` holds the move against ``MOVES`` and what
each state carries (a running kernel holds a lease, a parked one its parked state, a queued one its wait in line and
no lease, a 'cpu' one the code of a wait that ended, if one did; no other state a wait, or an ended one); the
registry then applies the record's other fields first and its state last, so no one reads "running" before its lease
is there. A change of other fields (``KernelRegistry.update``) is held against what the state carries
(``check_fields``): no record is written that its state does not allow. A move the table does not know is a bug: it
raises under tests (``GPUSHARE_STRICT_LIFE=1``), and in a server it is logged and made, so that a student's kernel goes
on.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any, Literal

from .records import KernelRecord, KernelState

log = logging.getLogger("jupyter_gpushare")

Judged = Literal["near_quota", "over_quota", "idle"]

# Each state, and how every view shows it (ok, info, warn, error, muted).
STATES: dict[str, str] = {
    "starting": "info",  # its start is being decided
    "standby": "muted",  # it runs and holds no GPU: its first GPU use asks (line_place 'first-use', or it stood by)
    "queued": "warn",  # it runs and waits in line for its GPU
    "running": "ok",  # it holds its GPU reservation
    "cpu": "error",  # it runs without a GPU (its wait ended, or none could be reserved), and says why
    "none": "muted",  # it asks for no GPU at all (a quota of 0)
    "failed": "error",  # a restart was refused: the kernel is down
    "parked": "info",  # its GPU state is in host memory and its reservation went to the line
}
JUDGED: dict[str, str] = {"near_quota": "warn", "over_quota": "error", "idle": "warn"}

# The moves. A kernel's start decides where it goes (OUTCOMES), and so does each restart, from whatever state it was
# in (a restart keeps its record: running, cpu, failed, parked, ...); a wait, a grant, an ask at the first GPU use and
# a stand-by are moves between those. Only a park leaves them: a kernel is parked from running (a park), or again
# from queued (a resume that waited out its turn). (Seen in the whole test suite, every move made: these and no more.)
OUTCOMES = frozenset({"starting", "standby", "queued", "running", "cpu", "none", "failed"})
PARKED_FROM = frozenset({"running", "queued", "parked"})
MOVES: dict[str, frozenset[str]] = {
    state: OUTCOMES | ({"parked"} if state in PARKED_FROM else set()) for state in STATES
}


class IllegalMove(RuntimeError):
    """A move the table does not allow, or a state without what it carries (a bug of ours)."""


def strict() -> bool:
    return os.environ.get("GPUSHARE_STRICT_LIFE") == "1"


def check(rec: KernelRecord, to: KernelState, fields: Mapping[str, Any]) -> None:
    """Whether ``rec`` may move to ``to`` with ``fields`` (its lease, card, place, reason...) set: a move the table
    does not know raises under tests and is logged in a server (KernelRegistry.move makes it all the same)."""
    _report(rec, _problem(rec.state, to, _with(rec, fields)))


def check_fields(rec: KernelRecord, fields: Mapping[str, Any]) -> None:
    """Whether ``rec``, in its state, may take ``fields`` (KernelRegistry.update): a running kernel's lease cannot
    be taken away, nor a wait given to one not in line, without a move. Raised or logged as ``check`` does."""
    _report(rec, _carried(rec.state, _with(rec, fields)))


def _with(rec: KernelRecord, fields: Mapping[str, Any]) -> Callable[[str], Any]:
    """A field of ``rec`` as it would be with ``fields`` set."""
    return lambda name: fields[name] if name in fields else getattr(rec, name)


def _report(rec: KernelRecord, problem: str | None) -> None:
    if problem:
        if strict():
            raise IllegalMove(f"kernel {rec.kernel_id}: {problem}")
        log.error("jupyter-gpushare: kernel %s: %s (made all the same)", rec.kernel_id, problem)


def _problem(before: str, to: str, value: Callable[[str], Any]) -> str | None:
    if to not in STATES:
        return f"{to!r} is not a kernel state"
    if to not in MOVES.get(before, frozenset()):
        return f"no move from {before!r} to {to!r}"
    return _carried(to, value)


def _carried(to: str, value: Callable[[str], Any]) -> str | None:
    """What is wrong with a record in state ``to`` whose fields are ``value(name)``: None where it carries what
    its state carries and nothing another state's."""
    if to == "running" and value("lease") is None:
        return "running without a lease"
    if to in ("queued", "parked", "standby", "failed", "none") and value("lease") is not None:
        return f"{to} with a lease"
    if to == "parked" and value("parked") is None:
        return "parked without its parked state"
    if to not in ("parked", "queued") and value("parked") is not None:  # (queued: on its way back)
        return f"{to} with a parked state"
    if (to == "queued") != (value("line") is not None):
        return "queued without its wait" if to == "queued" else f"{to} with a wait in line"
    if to != "cpu" and value("wait_ended") is not None:
        return f"{to} with a wait that ended (a kernel's that runs on without a GPU, in 'cpu', alone)"
    return None
