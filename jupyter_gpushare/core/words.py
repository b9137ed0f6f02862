"""The words the server and the sidebar say, once: a code and its figures, worded here in English.

The API sends a kernel's status and each event as a **code with parameters** (numbers: sizes in whole MiB
under names ending ``_mib``, times in seconds under names ending ``_s``, a place in line, a share in %), with
plain English for logs, the CLI and older clients, rendered from this catalogue: a status's ``label`` and
``detail``, an event's ``message`` (``event.<code>``: every event has one, and a server's event is said by it
alone, in the log, the API and a notification alike). The sidebar
words the same codes through JupyterLab's translator (``labextension/src/words.ts``, whose English must match
this catalogue: ``tests/server/test_contract.py`` checks it), so a translation changes every place at once.

A template names its parameters in braces, ``{need_mib}``. A part in square brackets is said only when every
parameter inside it is known: ``"needs {need_mib}[; {free_mib} unreserved now]"``. ``{reason}`` (and ``{why}``,
``{learned_from}``) carry text the server could not code yet (an admission refusal's reason, an error), said as is.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

from .policy import format_mib

# The context of a kernel's memory, said in several sentences
_HELD = "its {reserved_mib} reservation (quota {quota_mib} + {reserve_mib} for the CUDA context)"

CATALOGUE: dict[str, str] = {
    # a kernel's state as the server judges it: a short label (badge, status bar) and a sentence
    "status.queued.label": "#{position} in line",
    "status.queued.detail": "Waiting for a GPU: #{position} in line, needs {need_mib}[; {free_mib} unreserved now]"
    "[; gives up at {gives_up_at}].[ Likely granted by {likely_at}, from how long kernels here held the GPU "
    "before.] CPU cells run now; a cell that uses the GPU waits for it and goes on by itself when a kernel "
    "frees room.",
    "status.wait_ended.label": "no GPU",
    "status.wait_ended.detail": "{reason} Its cells run on without a GPU. Join again to wait for one: the kernel "
    "keeps its variables, unless it ran a GPU framework without the GPU meanwhile (then it restarts in line).",
    "status.standby.label": "GPU at first use",
    "status.standby.detail": "Holds no GPU now: its next cell that uses the GPU asks for one[ (a "
    "{requested_quota_mib} quota)] and waits its turn if the card is full. CPU cells run now.",
    "status.parked.label": "parked",
    "status.parked.detail": "Parked while others needed the GPU: its {parked_mib} of GPU state waits in host memory, "
    "and its {reserved_mib} reservation went to the line. Your next cell brings it back (it may wait its turn).",
    "status.over_quota.label": "over quota",
    "status.over_quota.detail": "Uses {used_mib}: more than " + _HELD + ". Free memory (del large arrays, or "
    "restart) or ask for a larger quota.",
    "status.near_quota.label": "near quota",
    "status.near_quota.detail": "Uses {used_mib} of " + _HELD + "[ ({share_pct}%)]: the next large allocation may "
    "fail. Free memory or ask for a larger quota.",
    "status.idle.label": "idle",
    "status.idle.detail": "Holds {reserved_mib} of GPU memory without using the GPU. Shut it down to give the memory "
    "back to others.",
    "status.running.label": "running",
    "status.running.detail": "Uses {used_mib} of " + _HELD + ".",
    "status.running_unmeasured.label": "running",
    "status.running_unmeasured.detail": "Holds " + _HELD + "; use not measured yet.",
    "status.starting.label": "starting",
    "status.starting.detail": "Reserving GPU memory for this kernel…",
    "status.cpu.label": "no GPU",
    "status.cpu.detail": "Started without a GPU.[ {reason}]",
    "status.none.label": "no GPU",
    "status.none.detail": "This kind of kernel reserves no GPU memory, so it sees no GPU.[ {reason}]",
    "status.failed.label": "not running",
    "status.failed.detail": "The kernel could not start again.[ {reason}]",
    # events, as a notification says them (short: read whole); what to do is in the panel
    "event.queued": "Waiting for a GPU: #{position} in line, needs {need_mib}.",
    "event.admitted": "GPU ready after waiting {waited_s}.",
    "event.parked": "Parked: {parked_mib} moved to host memory in {park_s}; its reservation went to the line until "
    "its next cell.",
    "event.park-failed": "Could not be parked, and runs on: {reason}",
    "event.stood-by": "Gave its {reserved_mib} GPU reservation to the line, unused for {held_s} while others waited. "
    "Its next GPU use asks again.",
    "event.teacher-front": "{by} moved it to the front of the line[: {why}]. It is served first where it fits.",
    "event.teacher-remove": "{by} took it out of the line[: {why}]. Its cells run on without a GPU.",
    "event.teacher-release": "{by} gave its GPU reservation back[: {why}].",
    "event.teacher-release-parked": "{by} gave its GPU reservation back[: {why}]. It is parked, its state kept: its "
    "next cell asks for a GPU again.",
    "event.teacher-release-restarted": "{by} gave its GPU reservation back[: {why}]. It was restarted and waits "
    "for a GPU again; its variables are lost.",
    "event.resumed": "Back on its GPU after {waited_s} in line; its state came back in {resume_s}.",
    "event.resume-waited-out": "Still parked: no reservation came in time[ ({reason})]. Retried while a cell runs.",
    "event.resume-no-room": "Still parked: {free_mib} free on its card, {parked_mib} needed (used outside the line). "
    "Retried while a cell runs.",
    "event.resume-failed": "Its GPU state could not be brought back ({reason}); the kernel was shut down.",
    "event.cancelled": "Stopped waiting for a GPU[ ({why})].",
    "event.refused": "Not started: {reason}",
    "event.refused-no-room": "Not started: it needs {need_mib}, and the most unreserved on any card is {free_mib}.",
    "event.refused-timeout": "Stopped waiting[ after {waited_s}]: it needs {need_mib}, and the most unreserved on any "
    "card is {free_mib}.",
    "event.refused-closing": "Not started: the Jupyter server is shutting down.",
    "event.cancelled-unwatched": "Stopped waiting for a GPU: nothing was connected to it for {unwatched_s}.",
    "event.refused-quota-below-min": "Not started: its quota {quota_mib} is below the minimum here, {least_mib}.",
    "event.refused-quota-above-max": "Not started: its quota {quota_mib} is above the maximum here, {most_mib}.",
    "event.refused-quota-unfit": "Not started: its quota {quota_mib} fits on no card; the most is {most_mib}.",
    "event.refused-user-max-kernel": "Not started: one kernel of yours may hold at most {limit_mib}; it asks for {quota_mib}.",
    "event.refused-user-max-kernels": "Not started: you may run at most {max_kernels} GPU kernels at once.",
    "event.refused-user-max-kernels.one": "Not started: you may run only {max_kernels} GPU kernel at a time.",
    "event.refused-level-below-required": "Not started: this host holds kernels at enforcement level {level}, "
    "and the admin requires {required}.",
    "event.refused-taken-out": "No GPU: {by} took it out of the line[: {why}]. It may join again in {wait_s}.",
    "event.refused-user-max-total": "Not started: your kernels hold {held_mib} of your {limit_mib}; it asks for {quota_mib}.",
    "event.no-gpu-none": "Started without a GPU: this server has none[ ({reason})].",
    "event.no-gpu-ledger": "Started without a GPU: no GPU memory can be reserved now. The GPU panel says why.",
    "event.no-gpu-full": "Started without a GPU: it needs {need_mib}, and the most unreserved on any card is {free_mib}.",
    "event.action-failed-interrupt": "Could not interrupt it; the server log says why.",
    "event.action-failed-restart": "Could not restart it; the server log says why.",
    "event.action-failed-shutdown": "Could not shut it down; the server log says why.",
    "event.refused-user-max-waiting": "Not started: you already have {waiting} kernels waiting for a GPU, the most allowed.",
    "event.refused-user-max-waiting.one": "Not started: you already have {waiting} kernel waiting for a GPU, the most allowed.",
    "event.near-quota": "Uses {used_mib} of its {reserved_mib} reservation ({share_pct}%): free memory or ask for "
    "a larger quota.",
    "event.over-quota": "Uses {used_mib}, more than its {reserved_mib} reservation: free memory or ask for a larger "
    "quota.",
    # (and what the policy does if it stays over: enforce.py)
    "event.over-quota-then-protect": "Uses {used_mib}, over its {reserved_mib} reservation: what holds the excess is "
    "stopped in {grace_s}. Free memory.",
    "event.over-quota-then-interrupt": "Uses {used_mib}, over its {reserved_mib} reservation: it is interrupted if "
    "still over in {grace_s}.",
    "event.over-quota-then-restart": "Uses {used_mib}, over its {reserved_mib} reservation: it is restarted if still "
    "over in {grace_s}.",
    "event.over-quota-then-shutdown": "Uses {used_mib}, over its {reserved_mib} reservation: it is shut down if "
    "still over in {grace_s}.",
    "event.over-quota-then-theft": "Uses {used_mib}: {stolen_mib} of it other kernels had reserved, so it is "
    "stopped at once.",
    "event.idle": "Holds {reserved_mib} of GPU memory unused for {idle_s}: shut it down when you are done.",
    "event.idle-then-shutdown": "Holds {reserved_mib} of GPU memory unused for {idle_s}: it is shut down in "
    "{delay_s} unless it runs something.",
    "event.out-of-memory": "{framework} ran out of GPU memory at quota {quota_mib}: restart with {retry_mib} to run "
    "it with more.",
    "event.quota-requested": "Quota {quota_mib} requested; it applies at the next restart.",
    "event.quota-at-first-use": "Quota {quota_mib} requested; it applies at the first GPU use, without a restart.",
    "event.quota-applied": "Restarted with its new quota, {quota_mib} ({reserved_mib} reserved).",
    "event.quota-kept": "Quota {quota_mib} was not applied; it keeps {kept_mib}: {why}",
    "event.over-quota-notify": "Still over its {reserved_mib} reservation after {over_s}: free memory or ask for "
    "a larger quota.",
    "event.over-quota-interrupt": "Interrupted: it used {used_mib}, over its {reserved_mib} reservation[, for "
    "{over_s}]. Free memory or ask for a larger quota.",
    "event.over-quota-restart": "Restarted: it used {used_mib}, over its {reserved_mib} reservation[, for "
    "{over_s}]. Ask for a larger quota, then run it again.",
    "event.over-quota-restart-theft": "Restarted at once: it took {stolen_mib} of GPU memory other kernels had "
    "reserved. Ask for a larger quota.",
    "event.over-quota-stop": "Ended {processes} processes it started, which took it to {used_mib}, over its "
    "{reserved_mib} reservation. It runs on.",
    "event.over-quota-stop.one": "Ended {processes} process it started, which took it to {used_mib}, over its "
    "{reserved_mib} reservation. It runs on.",
    "event.over-quota-stop-theft": "Ended {processes} processes it started, which took {stolen_mib} other kernels "
    "had reserved. It runs on.",
    "event.over-quota-stop-theft.one": "Ended {processes} process it started, which took {stolen_mib} other kernels "
    "had reserved. It runs on.",
    "event.over-quota-shutdown": "Shut down: it used {used_mib}, over its {reserved_mib} reservation[, for {over_s}].",
    "event.idle-shutdown": "Shut down after {idle_s} without using the GPU; its {reserved_mib} went back to the "
    "others.",
    "event.group-ended": "{processes} processes it had started were still running and were ended with it.",
    "event.group-ended.one": "{processes} process it had started was still running and was ended with it.",
    # events only the panel, the log and the CLI say
    "event.reserved": "{reserved_mib} on {card}.",
    "event.released": "Released {reserved_mib} ({why}).",
    "event.reclaimed": "Reclaimed {reserved_mib} of a kernel this server no longer has.",
    "event.release-pending": "Its reservation will be given back once the ledger works: {reason}",
    "event.learned": "Quota {quota} learned from earlier runs ({learned_from}).",
    # a rule's refusal, said in the quota dialog (policy.PolicyError's code and figures)
    "policy.quota-below-min": "A quota of {quota_mib}[ ({share_pct}% of a card)] is less than the smallest a kernel may have here ({least_mib}). Ask for at least {least_mib}.",
    "policy.quota-above-max": "A quota[ of {quota_mib}][ ({share_pct}% of a card)] is more than the largest a kernel may have here ({most_mib}). Ask for at most {most_mib}.",
    "policy.quota-unfit": "A quota of {quota_mib}[ ({share_pct}% of a card)] does not fit on any card even when it is empty: the most a kernel can reserve here is {most_mib} plus the {reserve_mib} CUDA context reserve.",
    "policy.user-max-kernel": "You may give one kernel at most {limit_mib} of GPU memory; this one asks for {quota_mib}. Ask for at most {limit_mib}.",
    "policy.user-max-kernels": "You may run at most {max_kernels} GPU kernels at once and already run {kernels}. Shut down a kernel you no longer use, then start this one again.",
    "policy.user-max-kernels.one": "You may run only {max_kernels} GPU kernel at a time and already run {kernels}. Shut down a kernel you no longer use, then start this one again.",
    "policy.level-below-required": "This host holds kernels at enforcement level {level}, and the admin requires {required}. Ask the admin: `jupyter gpushare doctor` says what is missing.",
    "policy.user-max-total": "You may hold at most {limit_mib} of GPU memory in all your kernels together; they hold {held_mib} and this one asks for {quota_mib}. Shut down a kernel you no longer use.",
    "policy.user-max-waiting": "You have {waiting} kernels waiting for a GPU already, the most one user may have in line here. Stop waiting on one of them (the banner’s Stop waiting, or shut its kernel down), or wait until one starts.",
    "policy.user-max-waiting.one": "You have {waiting} kernel waiting for a GPU already, the most one user may have in line here. Stop waiting on it (the banner’s Stop waiting, or shut its kernel down), or wait until it starts.",
    "policy.grow-no-room": "{quota_mib} needs {extra_mib} more on GPU {card_index}, which has {free_mib} unreserved now. The kernel keeps its quota and its GPU; ask again once others have shut down, or ask for less.",
    "policy.join-needs-restart": "{frameworks} ran in this kernel without a GPU, so only a restart can give it one: "
    "the kernel restarts in line, and its variables are lost.",
    "policy.join-cannot": "This kernel cannot wait again in place (it did not wait for a GPU since its start): only a "
    "restart gives it one, and its variables are lost.",
    "policy.join-busy": "The kernel is busy: join again once its cell has finished.",
    "policy.taken-out": "{by} took this kernel out of the GPU line[: {why}]. It may join the line again in "
    "{wait_s}; until then its cells run without a GPU. Ask {by} if it needs the GPU sooner.",
    "policy.park-budget": "Its {parked_mib} of GPU state does not fit the host memory kept for parked kernels: {held_mib} of "
    "{budget_mib} is taken. It is not parked.",
    "limits.use": "You hold {held}.",
    "limits.total": "{quota_mib} of {max_total_mib}",
    "limits.kernels": "{kernels} of {max_kernels} GPU kernels",
    "limits.kernels.one": "{kernels} of {max_kernels} GPU kernel",
    "limits.and": "{a} and {b}",
    # a card's memory in parts that add up to it (state.card_segments): the legend and its tooltips
    "segment.text": "{label} {size_mib}",
    "segment.mine.label": "yours",
    "segment.mine.title": "Yours: {size_mib} reserved by your kernels (quotas + CUDA context)",
    "segment.others.label": "other kernels",
    "segment.others.title": "Other kernels: {size_mib} reserved by other kernels on this host",
    "segment.other_users.label": "other users",
    "segment.other_users.title": "Other users: {size_mib} reserved by other users’ kernels on this host",
    "segment.over.label": "over-use",
    "segment.over.title": "Over-use: {size_mib} used by your kernels past their reservations; new kernels count it "
    "as taken",
    "segment.outside.label": "no reservation",
    "segment.outside.title": "No reservation: {size_mib} used by processes that hold no reservation; new kernels "
    "count it as taken",
    "segment.headroom.label": "kept free",
    "segment.headroom.title": "Kept free: {size_mib} kept free by the admin for the driver and processes outside "
    "Jupyter",
    "segment.free.label": "unreserved",
    "segment.free.title": "Unreserved: {size_mib} what new kernels can still reserve",
    # sizes and times, for every figure in every sentence
    "size.mib": "{n} MiB",
    "size.gib": "{n} GiB",
    "time.s": "{n} s",
    "time.min": "{n} min",
    "time.h": "{n} h",
    "time.h_min": "{h} h {min} min",
}

# How an event is announced (None: only the panel shows it); the server says it, the sidebar does not guess
SEVERITY: dict[str, str] = {
    "admitted": "success",
    "cancelled": "info",
    "refused": "error",
    "over-quota": "error",
    "action-failed": "error",
    "out-of-memory": "error",
    "no-gpu": "warning",
    "queued": "warning",
    "near-quota": "warning",
    "idle": "warning",
    "group-ended": "warning",
    "over-quota-notify": "warning",
    "over-quota-interrupt": "warning",
    "over-quota-restart": "warning",
    "over-quota-stop": "warning",
    "over-quota-shutdown": "warning",
    "idle-shutdown": "warning",
    "quota-requested": "info",
    "quota-applied": "success",
    "quota-kept": "warning",
    "teacher-front": "info",
    "stood-by": "info",
    "teacher-remove": "warning",
    "teacher-release": "warning",
}

# Codes whose words change with a count: the ``<code>.one`` form is said when that parameter is 1 (English's two
# forms; a translation with more forms words the plural form as best it can). The sidebar's PLURALS is the same.
PLURALS: dict[str, str] = {
    "event.group-ended": "processes",
    "event.over-quota-stop": "processes",
    "event.over-quota-stop-theft": "processes",
    "limits.kernels": "max_kernels",
    "event.refused-user-max-kernels": "max_kernels",
    "policy.user-max-kernels": "max_kernels",
    "event.refused-user-max-waiting": "waiting",
    "policy.user-max-waiting": "waiting",
}

# One name per framework, wherever it is said (the sidebar's FRAMEWORK_NAMES is the same)
FRAMEWORKS: dict[str, str] = {"cupy": "CuPy", "jax": "JAX", "tensorflow": "TensorFlow", "torch": "PyTorch"}

_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")
_OPTIONAL = re.compile(r"\[([^\[\]]*)\]")


def format_duration(seconds: float) -> str:
    """Seconds for people: "45 s", "3 min", "2 h 5 min" (whole units, rounded down; the sidebar's rule too)."""
    s = max(0, round(seconds))
    if s < 60:
        return render("time.s", {"n": s})
    if s < 3600:
        return render("time.min", {"n": s // 60})
    h, minutes = s // 3600, s % 3600 // 60
    return render("time.h_min", {"h": h, "min": minutes}) if minutes else render("time.h", {"n": h})


def _figure(name: str, value: Any) -> str:
    if name.endswith("_mib"):
        return format_mib(value)
    if name.endswith("_s"):
        return format_duration(value)
    if name.endswith("_at") and isinstance(value, (int, float)):
        return time.strftime("%H:%M", time.localtime(value))  # a time of day (the server's clock; the UI: its own)
    if name == "framework":
        return FRAMEWORKS.get(value, str(value))
    return str(value)


def render(code: str, params: Mapping[str, Any]) -> str:
    """A code's English words with its parameters. Optional parts are kept or dropped first (dropped when one of
    their parameters is not known), then every parameter is put in, in one pass: a parameter's own text (a
    notebook's name, what a kernel reported) is never read as a template. A parameter that is not known is a
    dash. An unknown code says its ``message`` parameter, else the code itself. A code in PLURALS says its
    ``.one`` form when its count is 1."""
    if code in PLURALS and params.get(PLURALS[code]) == 1:
        code = f"{code}.one"
    template = CATALOGUE.get(code)
    if template is None:
        return str(params.get("message") or code)

    def known(name: str) -> bool:
        return params.get(name) is not None and params.get(name) != ""

    kept = _OPTIONAL.sub(lambda m: m.group(1) if all(map(known, _PLACEHOLDER.findall(m.group(1)))) else "", template)
    return _PLACEHOLDER.sub(lambda m: _figure(m.group(1), params[m.group(1)]) if known(m.group(1)) else "–", kept)


def event_words(kind: str, params: Mapping[str, Any]) -> str:
    """An event's notification text (without the notebook's name)."""
    return render(f"event.{kind}", params)


def limits_words(use: Mapping[str, Any] | None) -> str | None:
    """How much of their limits a user holds (``ledger.view.limits_use``), as the sidebar's host section says it."""
    if not use:
        return None
    parts = [
        render(code, use)
        for code, known in (("limits.total", use.get("max_total_mib")), ("limits.kernels", use.get("max_kernels")))
        if known is not None
    ]
    if not parts:
        return None
    held = render("limits.and", {"a": parts[0], "b": parts[1]}) if len(parts) == 2 else parts[0]
    return render("limits.use", {"held": held})
