"""What the server knows of each kernel it starts: the grant it got and the record the API serves.

``Grant``: a GPU reservation, a start without a GPU, or no quota at all. ``KernelRecord``: one kernel of this
server as the REST API and the sidebar see it. ``QuotaUnavailable``: a start refused for want of GPU room,
whose message (``full_message``) reaches the HTTP client as it is.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Protocol

from tornado import web

from ..core.policy import PolicyError, Size, format_mib
from ..host.gpu import Card
from ..ledger.leases import Lease, Waiting

WHAT_TO_DO = (
    "Shut down a kernel you no longer use (Kernel > Shut Down Kernel), ask for a smaller quota, or try again later."
)


class QuotaUnavailable(web.HTTPError):
    """A kernel start refused for want of GPU room. The message reaches the HTTP client as is."""

    def __init__(self, message: str, status: int = 503, code: str | None = None):
        """``code``: the event's (``refused-timeout``, ``refused-<rule>``...), where one says which refusal."""
        super().__init__(status, message, reason="GPU quota unavailable")
        self.message, self.code = message, code

    def __str__(self) -> str:
        return self.message


def full_message(quota: Size, got: Waiting, reserve_mib: int, waited_s: float | None) -> str:
    """Why no card has room for a kernel of ``quota``, with the figures and what to do (``reserve_mib``: the CUDA
    context reserve; ``waited_s``: how long it waited, if it queued)."""
    if got.reason:  # nothing is granted for now, whatever room there is
        return got.reason
    reserve = format_mib(reserve_mib)
    need = format_mib(got.need_mib) if got.need_mib else f"{quota} + {reserve}"
    text = (
        f"No GPU has room for this kernel: it needs {need} (quota {quota} + {reserve} CUDA context reserve), "
        f"and the most unreserved on any card is {format_mib(got.free_mib)}."
    )
    if got.outside_mib:
        text += (
            f" Processes that hold no reservation (a script in a terminal, a program started outside a notebook) "
            f"use {format_mib(got.outside_mib)} of the GPU memory: it counts as taken until they exit."
        )
    if waited_s is not None:
        text += f" It waited {waited_s:.0f} s in the queue, as long as kernels may wait here."
    elif got.ahead:
        text += f" {got.ahead} kernel(s) are already waiting for a GPU."
    return f"{text} {WHAT_TO_DO}"


# A kernel's states (life.STATES says how each is shown, and which moves between them are allowed).
KernelState = Literal["starting", "standby", "queued", "running", "cpu", "none", "failed", "parked"]

GrantMode = Literal["gpu", "cpu", "none", "queued", "standby", "warm"]


@dataclass
class Grant:
    """What a kernel got: a GPU reservation, a start without GPU (``cpu``), no quota at all (``none``), or a place
    in line (``queued``: the reservation comes later, from ``QuotaManager.granted``), or nothing yet
    (``standby``: line_place = 'first-use'; the kernel asks at its first GPU use), or, for a warm kernel (warm.py),
    nobody's yet (``warm``)."""

    mode: GrantMode
    lease: Lease | None = None
    card: Card | None = None
    reason: str | None = None


# What changed of a kernel, as a person would notice it: listed or gone from the registry, one of its record's
# notable fields (registry.NOTABLE), an event said of it, the enforcer's judgment of it (near or over quota, idle), a
# move of its quota under way.
ChangeKind = Literal[
    "listed", "gone", "state", "quota", "pending_quota", "position", "parked", "event", "judgment", "move"
]


@dataclass(frozen=True)
class Change:
    """One change of the kernels' registry: whose (None: no one kernel's, an event of the server's) and what."""

    kernel_id: str | None
    what: ChangeKind


class Changes:
    """Who hears of each change of the kernels' registry that a person would notice (``Change``): the server's
    snapshot and its announcer, which says it on the server's event bus. Called from whichever thread made it."""

    def __init__(self) -> None:
        self._listeners: list[Callable[[Change], None]] = []

    def listen(self, listener: Callable[[Change], None]) -> None:
        self._listeners.append(listener)

    def __call__(self, kernel_id: str | None, what: ChangeKind) -> None:
        change = Change(kernel_id, what)
        for listener in self._listeners:
            listener(change)


@dataclass
class Version:
    """How many times the records of one registry were assigned to (the snapshot's test of "built since")."""

    n: int = 0


@dataclass(frozen=True)
class InLine:
    """What a queued kernel carries of its wait (line.py keeps the wait itself): since when it waits (wall clock) and
    the ledger's last answer (``Waiting``: its place, what it needs, the most room free, when it gives up, when it is
    likely granted; None until the first). It is the queued state's alone: a kernel in any other state has none."""

    since: float
    answer: Waiting | None = None

    @property
    def position(self) -> int | None:
        return self.answer.position if self.answer else None

    def to_dict(self, now: float) -> dict[str, Any]:
        """Its figures in the API's kernel (openapi.yaml's ``Kernel``)."""
        got = self.answer
        gives_up = got.gives_up_at if got else None
        return {
            "position": got.position if got else None,
            "need_mib": got.need_mib if got else None,
            "free_mib": got.free_mib if got else None,
            "waited_s": round(now - self.since, 1),
            "wait_left_s": round(max(0.0, gives_up - now)) if gives_up else None,
            "gives_up_at": round(gives_up) if gives_up else None,
            "likely_at": round(got.likely_at) if got and got.likely_at else None,
        }


NOT_IN_LINE = dict.fromkeys(InLine(0.0).to_dict(0.0))  # (the same figures, null: a kernel not in line)


@dataclass(frozen=True)
class Parked:
    """A parked kernel: where its GPU state was (it comes back on that card), what it held, since when."""

    card_uuid: str
    card_index: int
    pids: tuple[int, ...]  # its processes whose GPU state is in host memory
    parked_mib: int  # what they used on the card when parked
    quota_mib: int  # its quota, asked for again at the resume
    reserved_mib: int  # the reservation given back
    since: float  # (time.time)
    park_s: float  # how long parking took

    def to_dict(self) -> dict[str, Any]:
        return {"card_uuid": self.card_uuid, "card_index": self.card_index, "parked_mib": self.parked_mib,
                "quota_mib": self.quota_mib, "reserved_mib": self.reserved_mib, "since": self.since, "park_s": self.park_s}  # fmt: skip


@dataclass(frozen=True, eq=False)
class KernelRecord:
    """What the API says of one kernel of this process. No one assigns to it: its registry changes it
    (``KernelRegistry.update`` and ``move``), and says each change a person would notice."""

    kernel_id: str
    kernel_name: str
    language: str
    user: str
    state: KernelState = "starting"  # one of life.STATES, changed only by KernelRegistry.move
    quota: Size | None = None  # requested (or default) quota
    pending_quota: Size | None = None  # applied at the next restart
    lease: Lease | None = None
    card: Card | None = None
    line: InLine | None = None  # queued: its wait (life.check: a queued kernel's alone)
    reason: str | None = None
    since: float = field(default_factory=time.time)  # (the registry's clock gives it)
    held_cell: dict[str, Any] | None = None  # in line: its cell that waits for the GPU (msg_id, hash, count)
    wait_ended: str | None = None  # its wait for a GPU ended without one (the event's code): it runs on without
    pid: int | None = None
    path: str | None = None  # the notebook, when started through a session
    cancelled: bool = False  # a queued start the user gave up on
    quota_source: str = "default"  # history.SOURCES: default | kernelspec | requested | learned
    learned_peak_mib: int | None = None  # what earlier runs of its notebook peaked at (history.Learned)
    learned_from: str | None = None  # whose runs: "own" | "others"
    recorded_pid: int | None = None  # the kernel process whose peak was recorded (once per process)
    run_started: float | None = None  # when the kernel process was created (its run's reports start after)
    oom: str | None = None  # the framework that ran out of memory in this process (its report says so)
    retry_quota_mib: int | None = None  # then: the quota to restart with (history.retry_quota_mib)
    parked: Parked | None = None  # its GPU state is in host memory (parking.py)
    largest_mib: int = 0  # the largest card's memory: a share's size before the kernel has a card
    restarting: bool = False  # it restarts: its new start, if refused, leaves it listed as 'failed' (life.py)

    def mib_of(self, size: Size | None) -> int | None:
        """A size in MiB on the kernel's card (a share before it has a card: on the largest card)."""
        if size is None:
            return None
        return size.resolve(self.card.total_mib if self.card else self.largest_mib)

    def pending_quota_mib(self) -> int | None:
        return self.mib_of(self.pending_quota)

    def to_dict(self, now: float) -> dict[str, Any]:
        lease = self.lease
        return {
            "kernel_id": self.kernel_id,
            "kernel_name": self.kernel_name,
            "path": self.path,
            "language": self.language,
            "user": self.user,
            "state": self.state,
            "requested_quota_mib": self.mib_of(self.quota),
            "quota_source": self.quota_source,
            "learned_peak_mib": self.learned_peak_mib,
            "learned_from": self.learned_from,
            "pending_quota_mib": self.pending_quota_mib(),
            "quota_mib": lease.quota_mib if lease else None,
            "reserve_mib": lease.reserve_mib if lease else None,
            "reserved_mib": lease.reserved_mib if lease else None,
            "card": self.card.to_dict() if self.card else None,
            **(self.line.to_dict(now) if self.line else NOT_IN_LINE),
            "wait_ended": self.wait_ended,
            "held_cell": self.held_cell if self.state == "queued" else None,
            "reason": self.reason,
            "parked": self.parked.to_dict() if self.parked else None,
            "pid": self.pid,
            "since": self.since,
            "oom": {
                "framework": self.oom,
                "retry_quota_mib": self.retry_quota_mib,
            }
            if self.oom
            else None,
        }


def rule_figures(error: PolicyError) -> dict[str, Any]:
    """The code and figures of the rule that refused a kernel (QuotaManager.refuse), where the rule has a code."""
    return {"code": f"refused-{error.code}", **error.params} if error.code else {}


class Tells(Protocol):
    """What each part of a server needs to say of a kernel: the registry's event (QuotaManager.event), which the
    student's sidebar and the log hear. Each part's own ``Registry`` protocol adds what else it reads."""

    def event(self, kind: str, kernel_id: str | None, logged: bool = True, **figures: Any) -> None: ...


class Writes(Protocol):
    """How a part of a server changes a kernel's record (the registry's: records are frozen to everyone else)."""

    def update(self, rec: KernelRecord, **fields: Any) -> None: ...
    def move(self, rec: KernelRecord, to: KernelState, **fields: Any) -> None: ...
