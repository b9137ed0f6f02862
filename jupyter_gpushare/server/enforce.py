"""Over-quota and idle-GPU policies, applied to each sampler snapshot on the IOLoop.

Over quota: a kernel's process tree uses more than its reservation (quota + context reserve) when
a framework cap was bypassed or a library allocated outside it. At ``near_ratio`` of the
reservation the kernel is warned (state ``near_quota``); past the reservation it is ``over_quota``,
and overuse.py's rules (the same as the root broker's) say when and how it is acted on: at once when
it takes memory other kernels have reserved, else once it has been over for ``over_grace_s`` within a
window of twice that; the child processes that hold the excess are stopped where that is enough.

Idle: a kernel that holds a reservation, shows 0% GPU use, is not executing, and has had no
activity for ``idle_timeout_s`` is warned (state ``idle``) and, when configured, shut down
``idle_shutdown_delay_s`` later to give its memory back.

Every warning and action is an event (``/api/gpushare/events``) with the figures behind it.
Decisions need only the sampler's reading, the server's last snapshot (frameworks, the host's line) and the
kernel manager's in-memory state, so they run on the IOLoop (where the kernel manager lives); actions are
coroutines of the server's kernel manager.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import signal
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from traitlets import TraitError

from ..core.overuse import CardRoom, Excess, OverUseJudge, Verdict, card_room, over_use
from ..core.policy import EnforcePolicy
from ..ledger.leases import Lease
from .clock import SYSTEM, Clock
from .life import Judged as Judgment
from .parking import Parking
from .records import ChangeKind, KernelRecord, Tells
from .sampler import KernelUsage, UsageSnapshot
from .snapshot import ServerSnapshot

# (Judgment: the API's Kernel.state the policies give, life.JUDGED) kernel id -> (its lease, usage, card uuid -> MiB)
Judged = dict[str, tuple[Lease, KernelUsage, dict[str, int]]]
ACTIVE_WINDOW_S = 5.0  # a process's last SM sample is believed if this recent; else the reading's time (never sooner)


@dataclass
class _Watch:
    pid: int | None
    started: float
    near_warned: bool = False
    over_warned: bool = False
    gpu_active_at: float = 0.0
    idle_warned_at: float | None = None
    acting: bool = False


def _last_activity(kernel: Any) -> float:
    """When Jupyter last saw the kernel do anything (time.time; 0: not known). Its trait is unset, and raises, while
    the kernel's start finishes (seen in a class of 60: the reading's callback failed on it)."""
    try:
        last = kernel.last_activity
    except (AttributeError, TraitError):
        return 0.0
    return last.timestamp() if hasattr(last, "timestamp") else 0.0


def _need(rec: KernelRecord) -> int:
    """What a queued kernel needs, as the ledger last said (1 MiB before its first answer)."""
    got = rec.line.answer if rec.line else None
    return got.need_mib if got and got.need_mib else 1


class Registry(Tells, Protocol):
    """What the enforcer needs of the kernels' registry (QuotaManager): the records, parking (a parked kernel that is
    busy comes back), and the student's events."""

    records: dict[str, KernelRecord]
    parking: Parking


class Enforcer:
    """Applies the policies; ``states`` (kernel id -> near_quota | over_quota | idle) is read by the API."""

    def __init__(
        self,
        manager: Registry,
        kernel_manager: Any,
        policy: EnforcePolicy,
        log: logging.Logger | None = None,
        clock: Clock = SYSTEM,
        on_change: Callable[[str | None, ChangeKind], None] | None = None,
    ) -> None:
        """``on_change``: told of each kernel whose judged state (near or over quota, idle) changes."""
        self.manager = manager
        self.kernel_manager = kernel_manager
        self.policy = policy
        self.log = log or logging.getLogger("jupyter_gpushare")
        self.clock = clock
        self._on_change = on_change or (lambda kernel_id, what: None)
        self.judge = OverUseJudge(policy.over_action, policy.over_grace_s)
        self.states: dict[str, Judgment] = {}
        self._watch: dict[str, _Watch] = {}
        self._tasks: set[asyncio.Task] = set()

    def on_sample(self, snap: UsageSnapshot, last: ServerSnapshot | None = None) -> bool:
        """Judge every kernel of this reading (called on the IOLoop, once per sampler tick), with the frameworks and
        the host's line of the server's ``last`` snapshot. Returns whether any kernel is over its reservation (the
        sampler then reads the driver more often)."""
        last = last or ServerSnapshot()
        now = self.clock.wall()
        states: dict[str, Judgment] = {}
        judged: Judged = {}
        uuids = {c.index: uuid for uuid, c in snap.cards.items()}
        parking = self.manager.parking
        for kid, rec in list(self.manager.records.items()):
            usage = snap.kernels.get(kid)
            if rec.parked is not None and getattr(self._kernel(kid), "execution_state", None) == "busy":
                parking.resume(kid, retry=True)  # a parked kernel busy with anything (any client's) is wanted
            if rec.state != "running" or rec.lease is None or usage is None:
                continue
            w = self._watch.get(kid)
            if w is None or w.pid != usage.pid:  # new kernel, or a restarted one: a fresh start
                w = self._watch[kid] = _Watch(pid=usage.pid, started=now, gpu_active_at=now)
                self.judge.forget(kid)
            if usage.used_mib is not None and rec.lease.reserved_mib:
                used: dict[str, int] = {}
                for p in usage.processes:
                    uuid = uuids.get(p.card_index, "")
                    used[uuid] = used.get(uuid, 0) + (p.used_mib or 0)
                judged[kid] = (rec.lease, usage, used)
            idle_for, execution = self._idle_for(kid, usage, w, now)
            idle = self._idle(kid, rec.lease, usage, w, now, idle_for, execution)
            if idle:
                states[kid] = idle
            parking.consider(rec, usage, idle_for, last.frameworks.get(kid) or (), execution=execution)
        parking.decide(self._line_needs(last))
        excesses = self._excesses(snap, last, judged, uuids)
        for kid, (lease, usage, _) in judged.items():
            state = self._quota(kid, lease, usage, excesses.get(kid))
            if state:
                states[kid] = state  # over/near quota shows before idle
        for verdict in self.judge.judge(now, list(excesses.values()), present=judged):
            self._act_on(verdict, judged[verdict.kernel_id][0])
        for kid in [k for k in self._watch if k not in self.manager.records]:
            del self._watch[kid]
        for kid in sorted({k for k in states.keys() | self.states.keys() if states.get(k) != self.states.get(k)}):
            self._on_change(kid, "judgment")
        self.states = states
        return bool(excesses)

    # -- over quota ----------------------------------------------------------------------------

    def _excesses(
        self, snap: UsageSnapshot, last: ServerSnapshot, judged: Judged, uuids: dict[int, str]
    ) -> dict[str, Excess]:
        """The kernels over their reservations, with how much of that other kernels had reserved. Leases of other
        servers (other users', through a broker) are not seen here: what they may still allocate is guessed at
        its smallest, so no theft is imagined (the broker, which sees them all, judges them too)."""
        rooms: dict[str, CardRoom] = {}
        reserved_on = {c.uuid: c.row.reserved_mib for c in last.server.cards}
        for uuid, card in snap.cards.items():
            seen = [
                (kid, lease.reserved_mib, used.get(uuid, 0))
                for kid, (lease, _usage, used) in judged.items()
                if lease.card_uuid == uuid
            ]
            unseen = max(0, reserved_on.get(uuid, 0) - sum(reserved for _, reserved, _ in seen))
            rooms[uuid] = card_room(card.free_mib, card.used_mib, seen, unseen)
        out = {}
        for kid, (lease, usage, used) in judged.items():
            over = over_use(lease.reserved_mib, lease.card_uuid, used)
            if not over:
                continue
            stolen = sum(rooms[card].stolen(kid, mib) for card, mib in over.items() if card in rooms)
            processes = tuple((p.pid, uuids.get(p.card_index, ""), p.used_mib or 0) for p in usage.processes)
            shared = self._shared(lease.card_uuid, snap, last)
            out[kid] = Excess(kid, lease.card_uuid, lease.reserved_mib, over, stolen, processes, usage.pid, shared)
        return out

    def _quota(self, kid: str, lease: Lease, usage: KernelUsage, excess: Excess | None) -> Judgment | None:
        used, limit = usage.used_mib or 0, lease.reserved_mib
        w = self._watch[kid]
        figures = self._figures(lease, usage)
        if excess is not None:
            if not w.over_warned:
                w.over_warned = True
                self.manager.event("over-quota", kid, **figures, **self._consequence(excess))
            return "over_quota"
        if kid not in self.judge.episodes():
            w.over_warned = False  # a new episode is said again
        if self.policy.near_ratio and used >= self.policy.near_ratio * limit:
            if not w.near_warned:
                w.near_warned = True
                self.manager.event("near-quota", kid, share_pct=round(100 * used / limit), **figures)
            return "near_quota"
        if used < 0.95 * self.policy.near_ratio * limit:  # a little hysteresis against flapping warnings
            w.near_warned = False
        return None

    @staticmethod
    def _figures(lease: Lease, usage: KernelUsage) -> dict[str, Any]:
        return {
            "used_mib": usage.used_mib,
            "reserved_mib": lease.reserved_mib,
            "quota_mib": lease.quota_mib,
            "pids": [p.pid for p in usage.processes],
        }

    @staticmethod
    def _shared(card_uuid: str, snap: UsageSnapshot, last: ServerSnapshot) -> bool:
        """Whether other kernels hold reservations on the card (as of the ``last`` snapshot), or other processes
        use it."""
        card = last.server.card(card_uuid)
        usage = snap.cards.get(card_uuid)
        return (card is not None and card.kernels > 1) or (usage is not None and (usage.used_by_others_mib or 0) > 0)

    def _consequence(self, excess: Excess) -> dict[str, Any]:
        """What the policy does if the kernel stays over, as the over-quota event's code and figures (words.py):
        nothing (notify; or protect, alone on its card), the excess stopped, or the kernel interrupted, restarted or
        shut down after the grace; at once where it took memory others have reserved."""
        action = self.policy.over_action
        if excess.stolen_mib and action != "notify":
            return {"code": "over-quota-then-theft", "stolen_mib": excess.stolen_mib}
        if action == "notify" or (action == "protect" and not excess.shared):
            return {}
        return {"code": f"over-quota-then-{action}", "grace_s": round(self.policy.over_grace_s)}

    def _act_on(self, verdict: Verdict, lease: Lease) -> None:
        w = self._watch.get(verdict.kernel_id)
        if w is not None and w.acting:  # a restart still under way: the judge asks again if it is still needed
            return
        excess = verdict.excess
        figures = {
            "used_mib": excess.used_mib,
            "reserved_mib": lease.reserved_mib,
            "quota_mib": lease.quota_mib,
            "pids": sorted({pid for pid, _card, _mib in excess.processes}),
            "over_s": verdict.over_s if verdict.why == "grace" else None,
            "why": verdict.why,
            "stolen_mib": excess.stolen_mib or None,
        }
        if verdict.why == "theft" and verdict.action in ("stop", "restart"):
            figures["code"] = f"over-quota-{verdict.action}-theft"
        if verdict.action == "stop":
            self._stop(verdict, figures)
        else:
            self._act(verdict.kernel_id, verdict.action, figures, now=verdict.why != "grace")

    def _stop(self, verdict: Verdict, figures: dict) -> None:
        """End the kernel's child processes that hold its excess; the kernel runs on."""
        ended = []
        for pid in verdict.pids:
            try:
                os.kill(pid, signal.SIGKILL)
                ended.append(pid)
            except OSError as e:  # gone meanwhile
                self.log.debug("jupyter-gpushare: stopping process %s of kernel %s: %s", pid, verdict.kernel_id, e)
        self.manager.event(
            "over-quota-stop", verdict.kernel_id, action="stop", processes=len(ended), stopped=ended, **figures
        )

    # -- idle ------------------------------------------------------------------------------------

    def _line_needs(self, last: ServerSnapshot) -> int:
        """What the kernels in line need beyond the free room (MiB; 0: nobody waits): this server's own kernels'
        needs as known now; another server's waiter (the last snapshot) counts as a need of at least 1 MiB."""
        needs = sum(_need(rec) for rec in self.manager.records.values() if rec.state == "queued")
        free = sum(c.row.unreserved_mib for c in last.server.cards if c.row.allowed)
        others = any(not q.mine for q in last.server.queue)
        return max(needs - free, 1 if others else 0)

    def _idle_for(self, kid: str, usage: KernelUsage, w: _Watch, now: float) -> tuple[float, str | None]:
        """How long the kernel has run nothing and used no GPU, and its execution state."""
        kernel = self._kernel(kid)
        execution = getattr(kernel, "execution_state", None)
        if execution == "busy":
            w.gpu_active_at = now  # a running cell is never idle, even with 0% GPU
        elif (usage.utilization or 0) > 0:  # used since the last reading: until the driver's last sample that saw it
            at = usage.active_at  # (a time the driver's clock puts outside this reading's window is not believed)
            w.gpu_active_at = max(w.gpu_active_at, at if at is not None and now - ACTIVE_WINDOW_S <= at <= now else now)
        return now - max(_last_activity(kernel), w.gpu_active_at, w.started), execution

    def _idle(
        self,
        kid: str,
        lease: Lease,
        usage: KernelUsage,
        w: _Watch,
        now: float,
        idle_for: float,
        execution: str | None,
    ) -> Judgment | None:
        if not self.policy.idle_timeout_s:
            return None
        if idle_for < self.policy.idle_timeout_s:
            w.idle_warned_at = None
            return None
        figures: dict[str, Any] = {
            "idle_s": round(idle_for, 1),
            "reserved_mib": lease.reserved_mib,
            "used_mib": usage.used_mib,
            "execution_state": execution,
        }
        if w.idle_warned_at is None:
            w.idle_warned_at = now
            then: dict[str, Any] = (
                {"code": "idle-then-shutdown", "delay_s": round(self.policy.idle_shutdown_delay_s)}
                if self.policy.idle_action == "shutdown"
                else {}
            )
            self.manager.event("idle", kid, **figures, **then)
        elif (
            self.policy.idle_action == "shutdown"
            and now - w.idle_warned_at >= self.policy.idle_shutdown_delay_s
            and not w.acting
        ):
            self._act(kid, "shutdown", figures, kind="idle-shutdown")
        return "idle"

    def _kernel(self, kid: str) -> Any:
        try:
            return self.kernel_manager.get_kernel(kid)
        except Exception:
            return None

    # -- actions -----------------------------------------------------------------------------------

    def _act(self, kid: str, action: str, figures: dict, kind: str | None = None, now: bool = False) -> None:
        kind = kind or f"over-quota-{action}"
        w = self._watch.get(kid)
        if action == "notify":
            self.manager.event(kind, kid, action=action, **figures)
            return
        if w is not None:
            w.acting = True
        task = asyncio.ensure_future(self._run_action(kid, action, figures, kind, now))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_action(self, kid: str, action: str, figures: dict, kind: str, now: bool) -> None:
        km = self.kernel_manager
        try:
            if action == "interrupt":
                result = km.interrupt_kernel(kid)
            else:  # memory others have reserved, or that an interrupt did not free: no graceful wait then
                call = km.restart_kernel if action == "restart" else km.shutdown_kernel
                result = call(kid, now=now)
            if inspect.isawaitable(result):
                await result
            self.manager.event(kind, kid, action=action, **figures)
        except Exception as e:
            self.log.warning("jupyter-gpushare: %s of kernel %s failed: %s", action, kid, e)
            self.manager.event("action-failed", kid, action=action, **{**figures, "code": f"action-failed-{action}"})
        finally:
            w = self._watch.get(kid)
            if w is not None:
                w.acting = False

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
