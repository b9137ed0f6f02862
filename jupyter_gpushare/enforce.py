"""Over-quota and idle-GPU policies, applied to each sampler snapshot on the IOLoop.

Over quota: a kernel's process tree uses more than its reservation (quota + context reserve) when
a framework cap was bypassed or a library allocated outside it. At ``near_ratio`` of the
reservation the kernel is warned (state ``near_quota``); past the reservation it is ``over_quota``
and, once it has stayed over for ``over_grace_s``, acted on as the admin configured.

Idle: a kernel that holds a reservation, shows 0% GPU use, is not executing, and has had no
activity for ``idle_timeout_s`` is warned (state ``idle``) and, when configured, shut down
``idle_shutdown_delay_s`` later to give its memory back.

Every warning and action is an event (``/api/gpushare/events``) with the figures behind it.
Decisions need only the snapshot and the kernel manager's in-memory state, so they run on the
IOLoop (where the kernel manager lives); actions are coroutines of the server's kernel manager.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from .policy import EnforcePolicy, format_mib
from .sampler import UsageSnapshot

REPEAT_MIN_S = 5.0  # least time between two actions on a kernel that stays over quota


@dataclass
class _Watch:
    pid: int | None
    started: float
    near_warned: bool = False
    over_since: float | None = None
    acted_at: float | None = None
    gpu_active_at: float = 0.0
    idle_warned_at: float | None = None
    acting: bool = False
    actions: int = 0  # taken in this over-quota episode ('protect': the first interrupts, the next restart)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


class Enforcer:
    """Applies the policies; ``states`` (kernel id -> near_quota | over_quota | idle) is read by the API."""

    def __init__(
        self,
        manager: Any,
        kernel_manager: Any,
        policy: EnforcePolicy,
        log: logging.Logger | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.manager = manager
        self.kernel_manager = kernel_manager
        self.policy = policy
        self.log = log or logging.getLogger("jupyter_gpushare")
        self.clock = clock
        self.states: dict[str, str] = {}
        self.version = 0  # counts on_sample calls (the API caches its reply per version)
        self._watch: dict[str, _Watch] = {}
        self._tasks: set[asyncio.Task] = set()

    def on_sample(self, snap: UsageSnapshot) -> None:
        """Judge every kernel of this snapshot (called on the IOLoop, once per sampler tick)."""
        now = self.clock()
        states: dict[str, str] = {}
        for kid, rec in list(self.manager.records.items()):
            usage = snap.kernels.get(kid)
            if rec.state != "running" or rec.lease is None or usage is None:
                continue
            w = self._watch.get(kid)
            if w is None or w.pid != usage.pid:  # new kernel, or a restarted one: a fresh start
                w = self._watch[kid] = _Watch(pid=usage.pid, started=now, gpu_active_at=now)
            over = self._quota(kid, rec, usage, w, now, snap)
            idle = self._idle(kid, rec, usage, w, now)
            state = over or idle  # over/near quota shows before idle
            if state:
                states[kid] = state
        for kid in [k for k in self._watch if k not in self.manager.records]:
            del self._watch[kid]
        self.states = states
        self.version += 1

    # -- over quota ----------------------------------------------------------------------------

    def _quota(self, kid: str, rec: Any, usage: Any, w: _Watch, now: float, snap: UsageSnapshot) -> str | None:
        used, limit = usage.used_mib, rec.lease.reserved_mib
        if used is None or not limit:
            return None
        action = self._action(rec, w, snap)
        figures = {
            "used_mib": used,
            "reserved_mib": limit,
            "quota_mib": rec.lease.quota_mib,
            "pids": [p.pid for p in usage.processes],
        }
        if used > limit:
            if w.over_since is None:
                w.over_since = now
                self.manager.event(
                    "over-quota",
                    kid,
                    f"The kernel's processes use {format_mib(used)} of GPU memory, more than its reservation of "
                    f"{format_mib(limit)}. {self._consequence(action)}",
                    **figures,
                )
            over_s = now - w.over_since
            # Once per episode for 'notify'; otherwise again if still over after another grace period
            # (an interrupt often frees nothing: the framework keeps its cache).
            again = (
                action != "notify"
                and w.acted_at is not None
                and now - w.acted_at >= max(self.policy.over_grace_s, REPEAT_MIN_S, 2 * snap.interval_s)
            )
            due = over_s >= self.policy.over_grace_s and (w.acted_at is None or again)
            if due and not w.acting:
                w.acted_at = now
                w.actions += 1
                self._act(kid, action, f"over quota for {over_s:.0f} s", dict(figures, over_s=round(over_s, 1)))
            return "over_quota"
        w.over_since, w.acted_at, w.actions = None, None, 0
        if self.policy.near_ratio and used >= self.policy.near_ratio * limit:
            if not w.near_warned:
                w.near_warned = True
                self.manager.event(
                    "near-quota",
                    kid,
                    f"The kernel's processes use {format_mib(used)} of its {format_mib(limit)} reservation "
                    f"({100 * used / limit:.0f}%). Free memory (del tensors, empty caches) or ask for a larger quota.",
                    share_pct=round(100 * used / limit),
                    **figures,
                )
            return "near_quota"
        if used < 0.95 * self.policy.near_ratio * limit:  # a little hysteresis against flapping warnings
            w.near_warned = False
        return None

    def _action(self, rec: Any, w: _Watch, snap: UsageSnapshot) -> str:
        """The over-quota action for this kernel now. 'protect': on a card it shares, interrupt first, then
        restart; alone on its card, notify (what it uses beyond its lease is counted as taken all the same)."""
        action = self.policy.over_action
        if action != "protect":
            return action
        if not self._shared(rec.lease.card_uuid, snap):
            return "notify"
        return "interrupt" if w.actions == 0 else "restart"

    @staticmethod
    def _shared(card_uuid: str, snap: UsageSnapshot) -> bool:
        """Whether other kernels hold reservations on the card, or other processes use it."""
        card = next((c for c in snap.quota.get("cards", ()) if c.get("uuid") == card_uuid), None)
        usage = snap.cards.get(card_uuid)
        return (card is not None and card.get("kernels", 0) > 1) or (
            usage is not None and (usage.used_by_others_mib or 0) > 0
        )

    def _consequence(self, action: str) -> str:
        grace = f"{self.policy.over_grace_s:.0f} s"
        return {
            "notify": "Other kernels on the card may run out of memory; what it uses beyond its reservation is "
            "counted as taken, so new kernels wait.",
            "interrupt": f"It will be interrupted if it stays over for {grace}, and restarted if it still holds "
            "the memory after that, to protect the other kernels on its card."
            if self.policy.over_action == "protect"
            else f"It will be interrupted if it stays over for {grace}.",
            "restart": f"It will be restarted if it stays over for {grace}.",
            "shutdown": f"It will be shut down if it stays over for {grace}.",
        }[action]

    # -- idle ------------------------------------------------------------------------------------

    def _idle(self, kid: str, rec: Any, usage: Any, w: _Watch, now: float) -> str | None:
        if not self.policy.idle_timeout_s:
            return None
        kernel = self._kernel(kid)
        execution = getattr(kernel, "execution_state", None)
        if (usage.utilization or 0) > 0 or execution == "busy":
            w.gpu_active_at = now  # a running cell is never idle, even with 0% GPU
        last = getattr(kernel, "last_activity", None)
        last_ts = last.timestamp() if last is not None and hasattr(last, "timestamp") else 0.0
        idle_for = now - max(last_ts, w.gpu_active_at, w.started)
        if idle_for < self.policy.idle_timeout_s:
            w.idle_warned_at = None
            return None
        figures = {
            "idle_s": round(idle_for, 1),
            "reserved_mib": rec.lease.reserved_mib,
            "used_mib": usage.used_mib,
            "execution_state": execution,
        }
        if w.idle_warned_at is None:
            w.idle_warned_at = now
            then = (
                f" It will be shut down in {self.policy.idle_shutdown_delay_s:.0f} s unless it runs something."
                if self.policy.idle_action == "shutdown"
                else ""
            )
            self.manager.event(
                "idle",
                kid,
                f"The kernel holds {format_mib(rec.lease.reserved_mib)} of GPU memory and has not used the GPU or run "
                f"anything for {_duration(idle_for)}.{then} Shut it down when you are done to give the memory back.",
                **figures,
            )
        elif (
            self.policy.idle_action == "shutdown"
            and now - w.idle_warned_at >= self.policy.idle_shutdown_delay_s
            and not w.acting
        ):
            self._act(kid, "shutdown", f"idle for {idle_for:.0f} s", figures, kind="idle-shutdown")
        return "idle"

    def _kernel(self, kid: str) -> Any:
        try:
            return self.kernel_manager.get_kernel(kid)
        except Exception:
            return None

    # -- actions -----------------------------------------------------------------------------------

    def _act(self, kid: str, action: str, why: str, figures: dict, kind: str | None = None) -> None:
        kind = kind or f"over-quota-{action}"
        w = self._watch.get(kid)
        if action == "notify":
            self.manager.event(
                kind,
                kid,
                f"Over its reservation ({why}). Free memory or ask for a larger quota: a neighbour may run out of memory, "
                "and new kernels wait for what it holds beyond its reservation.",
                action=action,
                **figures,
            )
            return
        if w is not None:
            w.acting = True
        task = asyncio.ensure_future(self._run_action(kid, action, why, figures, kind))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_action(self, kid: str, action: str, why: str, figures: dict, kind: str) -> None:
        verb = {"interrupt": "Interrupted", "restart": "Restarted", "shutdown": "Shut down"}[action]
        km = self.kernel_manager
        try:
            call = {"interrupt": km.interrupt_kernel, "restart": km.restart_kernel, "shutdown": km.shutdown_kernel}[
                action
            ]
            result = call(kid)
            if inspect.isawaitable(result):
                await result
            self.manager.event(kind, kid, f"{verb} the kernel: {why}.", action=action, **figures)
        except Exception as e:
            self.log.warning("jupyter-gpushare: %s of kernel %s failed: %s", action, kid, e)
            self.manager.event(
                "action-failed", kid, f"Could not {action} the kernel ({why}): {e}", code=f"action-failed-{action}",
                action=action, **figures,
            )  # fmt: skip
        finally:
            w = self._watch.get(kid)
            if w is not None:
                w.acting = False

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
