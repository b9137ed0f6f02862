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
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .policy import format_mib

STATE_SCHEMA = "https://jupyter-gpushare.org/events/state-changed/v1"
SCHEMA_FILE = Path(__file__).parent / "events" / "state-changed.yaml"
RECENT_EVENTS = 50
SEGMENTS = (  # key, label, what it is (the card bar's legend and tooltips)
    ("mine", "yours", "reserved by your kernels (quotas + CUDA context)"),
    ("others", "other kernels", "reserved by other kernels on this host"),
    ("outside", "no reservation", "used by processes that hold no reservation; new kernels count it as taken"),
    ("headroom", "kept free", "kept free by the admin for the driver and processes outside Jupyter"),
    ("free", "unreserved", "what new kernels can still reserve"),
)


def _gib(mib: float | None) -> str:
    return "–" if mib is None else format_mib(mib)


_ADVICE = re.compile(r"((?:Ask for|Shut down|Shut it down|Free |Try |Run |Restart )[^.]*\.\s*)+$")
ADVICE = {  # what to do, for the events whose own message does not end with it
    "admitted": "Run your cells: the kernel has its GPU now.",
    "queued": "It starts by itself when a kernel frees room; cells you run meanwhile run then.",
    "no-gpu": "It runs on the CPU; restart it later to get a GPU.",
    "over-quota-interrupt": "Free GPU memory (del large tensors, empty the framework's cache) or ask for a larger "
    "quota (Change quota… in the GPU panel): on a shared card it is restarted if it keeps more than its reservation.",
    "over-quota-restart": "Ask for a larger quota (Change quota… in the GPU panel) before you run it again: it "
    "used more than its reservation on a card other kernels share.",
    "group-ended": "What a kernel starts ends with it; run long jobs from the kernel and keep it running.",
}


def with_advice(event: Mapping[str, Any]) -> dict[str, Any]:
    """An event with what to do apart (``advice``), so that a notification can say it first."""
    message = str(event.get("message", ""))
    match = _ADVICE.search(message)
    if match and match.start() > 0:
        return {**event, "message": message[: match.start()].rstrip(), "advice": match.group(0).strip()}
    return {**event, "advice": ADVICE.get(str(event.get("kind")), "")}


def kernel_status(k: Mapping[str, Any]) -> dict[str, str]:
    """What a kernel's state means for a student: a short label, a sentence with the figures, a severity
    (ok, info, warn, error, muted). The same words for the panel, the status bar and the toolbar
    (notifications say the events' own messages; the queued banner its own sentence)."""
    state, used, limit = k.get("state"), k.get("used_mib"), k.get("reserved_mib")
    quota, reserve = k.get("quota_mib"), k.get("reserve_mib")
    held = f"its {_gib(limit)} reservation (quota {_gib(quota)} + {_gib(reserve)} for the CUDA context)"
    if state == "queued":
        position = k.get("position")
        left = k.get("wait_left_s")
        most = f" (at most about {max(1, round(left / 60))} min more)" if left is not None else ""
        detail = f"Waiting for a GPU: #{position} in line, needs {_gib(k.get('need_mib'))}"
        if k.get("free_mib") is not None:
            detail += f"; {_gib(k.get('free_mib'))} unreserved now"
        return {"label": f"queued #{position}", "severity": "warn", "detail": f"{detail}. It starts by itself when a kernel frees room{most}."}  # fmt: skip
    if state == "over_quota":
        return {"label": "over quota", "severity": "error", "detail": f"Uses {_gib(used)}: more than {held}. Free memory (del large arrays, or restart) or ask for a larger quota."}  # fmt: skip
    if state == "near_quota":
        share = f" ({round(100 * used / limit)}%)" if used is not None and limit else ""
        return {"label": "near quota", "severity": "warn", "detail": f"Uses {_gib(used)} of {held}{share}: the next large allocation may fail. Free memory or ask for a larger quota."}  # fmt: skip
    if state == "idle":
        return {"label": "idle", "severity": "warn", "detail": f"Holds {_gib(limit)} of GPU memory without using the GPU. Shut it down to give the memory back to others."}  # fmt: skip
    if state == "running":
        figures = f"Uses {_gib(used)} of {held}." if used is not None else f"Holds {held}; use not measured yet."
        return {"label": "running", "severity": "ok", "detail": figures}
    texts = {
        "starting": ("starting", "info", "Reserving GPU memory for this kernel…"),
        "cpu": ("no GPU", "error", f"Started without a GPU. {k.get('reason') or ''}".strip()),
        "none": (
            "no GPU",
            "muted",
            k.get("reason") or "This kind of kernel reserves no GPU memory, so it sees no GPU.",
        ),
        "failed": ("not running", "error", k.get("reason") or "The kernel could not start again."),
    }
    label, severity, detail = texts.get(str(state), (str(state), "muted", k.get("reason") or ""))
    return {"label": label, "severity": severity, "detail": detail}


OTHER_USERS = ("others", "other users", "reserved by other users' kernels on this host")


def card_segments(card: Mapping[str, Any], mine_mib: int, by_user: bool = False) -> list[dict[str, Any]]:
    """The card's memory as the bar shows it, each part clamped to what is left of the card, so they add up
    to its total; ``mine_mib`` is what this server's own kernels reserve on it (a kernel restarting with a new
    quota is still its own), or with ``by_user`` (the host view) what all the caller's kernels reserve, the
    rest being other users'."""
    total = max(0, int(card["total_mib"]))
    reserved = int(card.get("reserved_mib") or 0)
    wanted = {
        "mine": mine_mib,
        "others": reserved - mine_mib,
        "outside": card.get("outside_mib") or 0,
        "headroom": total - int(card.get("usable_mib", total)),
    }
    left, out = total, []
    for key, label, what in SEGMENTS:
        if by_user and key == "others":
            key, label, what = OTHER_USERS
        mib = left if key == "free" else max(0, min(int(wanted[key]), left))
        left -= mib
        out.append({"key": key, "label": label, "mib": mib, "title": f"{label[0].upper()}{label[1:]}: {format_mib(mib)} {what}"})  # fmt: skip
    return out


def build_state(
    quota: Mapping[str, Any],
    kernels: Sequence[Mapping[str, Any]],
    usage_cards: Mapping[str, Mapping[str, Any]],
    paths: Mapping[str, str],
    events: Iterable[Mapping[str, Any]],
    config: Mapping[str, Any],
    sampler: Mapping[str, Any],
) -> dict[str, Any]:
    """The state: ``quota`` is the manager's snapshot (cards and reservations, queue, ledger), ``kernels`` this
    server's kernel views (records with their measured use and judged state), ``usage_cards`` the measured
    figures per card uuid, ``paths`` the notebook of each kernel (from the sessions), ``events`` the recent
    events."""
    views = []
    for k in kernels:
        view = {**k, "path": paths.get(k["kernel_id"], k.get("path"))}
        view["status"] = kernel_status(view)
        views.append(view)
    cards = []
    for card in quota.get("cards", []):
        mine = sum(v["reserved_mib"] or 0 for v in views if v.get("card") and v["card"]["uuid"] == card["uuid"])
        measured = usage_cards.get(card["uuid"], {})
        cards.append({**card, **measured, "mine_reserved_mib": mine, "segments": card_segments(card, mine)})
    state = {
        **{k: quota.get(k) for k in ("backend", "simulated", "reason", "ledger", "enforcement")},
        "cards": cards,
        "kernels": views,
        "queue": quota.get("queue", []),
        "events": [with_advice(e) for e in list(events)[-RECENT_EVENTS:]],
        "config": dict(config),
        "sampler": dict(sampler),
    }
    body = json.dumps(state, sort_keys=True, default=str)
    state["version"] = hashlib.sha1(body.encode()).hexdigest()[:16]
    return state


def notable(records: Mapping[str, Any], judged: Mapping[str, str], events: Sequence[Mapping[str, Any]]) -> tuple:
    """What a person would notice changing: each kernel's state, quota and place in line, the policy's
    judgments, the newest event. A new value is announced on the event bus (measured use is not: it
    changes every reading and is polled while someone looks)."""
    kernels = tuple(sorted((kid, r.state, r.quota, r.pending_quota, r.position) for kid, r in records.items()))
    return kernels, tuple(sorted(judged.items())), (len(events), events[-1]["time"] if events else None)


def changed_kernels(old: tuple, new: tuple) -> list[str]:
    """The kernels whose state, quota, place in line or judgment differ between two ``notable`` keys."""
    out: set[str] = set()
    for part in (0, 1):  # the records, the judgments
        before, after = {t[0]: t for t in old[part]}, {t[0]: t for t in new[part]}
        out |= {kid for kid in before.keys() | after.keys() if before.get(kid) != after.get(kid)}
    return sorted(out)
