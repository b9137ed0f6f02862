"""The one state the sidebar, the status bar and the notifications render: the server is the only judge.

Built from what the server holds in memory: the manager's kernel records (current), the sampler's last
reading and its copy of the ledger's reservations (at most a few seconds old), the enforcer's judgments,
the session manager's notebook paths (so a renamed notebook is followed) and the recent events. Nothing in
it is decided by the browser:

- a kernel's **state** and the words for it (``kernel_status``): a kernel is judged against its
  *reservation*, its quota plus the CUDA context reserve, because that is what it holds on the card and
  what the over-quota policy acts on; near its quota at ``near_quota_threshold`` of it;
- a card's **segments** (``card_segments``): yours, other kernels' (other users' in the host view), memory used without a reservation, kept
  free by the admin, unreserved; one vocabulary, clamped so that they add up to the card;
- student-facing texts never name an admin setting.

``version`` is a hash of everything but the time it was built: an unchanged state is a 304. A change that a
person would notice (a kernel admitted, queued, refused, over its quota, an event) is announced on the
server's event bus (``STATE_SCHEMA``) as soon as it happens, so browsers need not poll fast.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.words import SEVERITY, render
from ..ledger.view import card_segments
from .life import JUDGED, STATES
from .views import KernelView, ServerState

STATE_SCHEMA = "https://jupyter-gpushare.org/events/state-changed/v1"
SCHEMA_FILE = Path(__file__).parent / "events" / "state-changed.yaml"
RECENT_EVENTS = 50


EVENT_FIELDS = ("time", "kind", "code", "kernel_id", "path")  # an event's own fields; the rest are its parameters


def event_view(event: Mapping[str, Any]) -> dict[str, Any]:
    """An event as the API sends it: its code (its kind, or which of its kind), its parameters (the figures behind
    it, and the English ``message`` for logs and the CLI; a figure not known is left out) and how it is announced
    (``severity``; null: only the panel shows it)."""
    params = {k: v for k, v in event.items() if k not in EVENT_FIELDS and v is not None}
    kind = str(event.get("kind"))
    code = str(event.get("code") or kind)  # which refusal (QuotaManager.refuse), else the kind
    return {**event, "code": code, "params": params, "severity": SEVERITY.get(kind)}


STATE_SEVERITY = {**STATES, **JUDGED}  # (life.py: every state, written once)
STATUS_PARAMS = ("position", "need_mib", "free_mib", "wait_left_s", "gives_up_at", "likely_at", "used_mib",
                 "reserved_mib", "quota_mib", "requested_quota_mib", "reserve_mib", "reason")  # fmt: skip


def kernel_status(k: Mapping[str, Any]) -> dict[str, Any]:
    """What a kernel's state means for a student: a code (``words.CATALOGUE``'s ``status.<code>``) with its
    figures, a severity (ok, info, warn, error, muted), and in English a short label and a sentence. The same
    words for the panel, the banner, the status bar and the toolbar."""
    state, used, limit = k.get("state"), k.get("used_mib"), k.get("reserved_mib")
    if state not in STATE_SEVERITY:  # (a bug of ours: life.STATES lists every state a record may have)
        raise ValueError(f"{state!r} is not a kernel state; life.STATES lists them")
    code = str(state)
    severity = STATE_SEVERITY[code]
    if code == "cpu" and k.get("wait_ended"):
        code = "wait_ended"  # it ran while it waited; its wait ended without a GPU (the notebook's banner says so)
    if code == "running" and used is None:
        code = "running_unmeasured"
    params = {name: k.get(name) for name in STATUS_PARAMS if k.get(name) is not None}
    if code == "near_quota" and used is not None and limit:
        params["share_pct"] = round(100 * used / limit)
    parked = k.get("parked")
    if code == "parked" and isinstance(parked, Mapping):
        params.update(parked_mib=parked.get("parked_mib"), reserved_mib=parked.get("reserved_mib"))
    return {
        "code": code,
        "params": params,
        "severity": severity,
        "label": render(f"status.{code}.label", params),
        "detail": render(f"status.{code}.detail", params),
    }


def build_state(
    server: ServerState,
    kernels: Sequence[KernelView],
    usage_cards: Mapping[str, Mapping[str, Any]],
    paths: Mapping[str, str],
    events: Iterable[Mapping[str, Any]],
    config: Mapping[str, Any],
    sampler: Mapping[str, Any],
) -> dict[str, Any]:
    """The state: ``server`` is what the server holds (cards and reservations, queue, ledger), ``kernels`` this
    server's kernel views (records with their measured use and judged state), ``usage_cards`` the measured
    figures per card uuid, ``paths`` the notebook of each kernel (from the sessions), ``events`` the recent
    events."""
    views = []
    for k in kernels:
        view = {**k.to_json(), "path": paths.get(k.kernel_id, k.record.path)}
        view["status"] = kernel_status(view)
        views.append(view)
    cards = []
    held = server.to_json()
    for card, row in zip(server.cards, held["cards"]):
        on_card = [v for v in views if v.get("card") and v["card"]["uuid"] == card.uuid]
        mine = sum(v["reserved_mib"] or 0 for v in on_card)
        over = sum(max(0, (v.get("used_mib") or 0) - (v["reserved_mib"] or 0)) for v in on_card if v["reserved_mib"])
        segments = card_segments(row, mine, over_mib=over)
        cards.append({**row, **usage_cards.get(card.uuid, {}), "mine_reserved_mib": mine, "segments": segments})
    state = {
        **{k: held[k] for k in ("backend", "simulated", "reason", "ledger", "enforcement")},
        "cards": cards,
        "kernels": views,
        "queue": held["queue"],
        "events": [event_view(e) for e in list(events)[-RECENT_EVENTS:]],
        "config": dict(config),
        "sampler": dict(sampler),
    }
    body = json.dumps(state, sort_keys=True, default=str)
    state["version"] = hashlib.sha1(body.encode()).hexdigest()[:16]
    return state
