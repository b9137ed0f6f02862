"""What the ledger holds, as values: a kernel's lease, a place in line, the answer to a kernel that must wait, and
the one codec of each for the broker's wire. No I/O: the ledger (ledger.py) stores them, the broker (broker/)
sends them, the queue (queue.py) and the attribution of GPU processes (attribution.py) read them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..core.policy import PolicyError, Size, parse_size
from ..host.procs import Owner, ProcessRef, SessionRef

ADOPTED = "(no kernel)"  # the kernelspec name of a lease the broker gave a process that held memory without one
ADOPTED_ID_PREFIX = "process-"  # its kernel id: process-<pid>-<start time x 100>, a name no client may reserve


@dataclass(frozen=True)
class Lease:
    kernel_id: str
    card_uuid: str
    card_index: int
    quota_mib: int
    reserve_mib: int
    user: str
    kernel_name: str
    owner: Owner
    kernel: ProcessRef | None
    created: float

    @property
    def reserved_mib(self) -> int:
        return self.quota_mib + self.reserve_mib

    @property
    def adopted(self) -> bool:
        """A process that held memory without a lease, given one by the broker (Ledger.adopt): it is its own kernel,
        in a process group it may share with others (a shell's job), so it is signalled alone."""
        return self.kernel_name == ADOPTED

    @property
    def anonymous(self) -> bool:
        """Other users' reservations on a card, folded into one nameless lease (view.anonymous_leases)."""
        return not self.kernel_id


@dataclass(frozen=True)
class Waiting:
    """Not admitted (yet): where the request stands and why."""

    kernel_id: str
    position: int  # 1 = next in line
    need_mib: int  # quota + context reserve on the card that fits best, 0 if none could
    free_mib: int  # the most room on any allowed card: unreserved, less what processes without a reservation use
    ahead: int  # waiters before this one
    outside_mib: int = 0  # what processes without a reservation use on the allowed cards, together
    reason: str = ""  # why nothing is granted now although room may be free (the ledger is settling)
    expired: bool = False  # it waited as long as the policy lets kernels wait, and left the queue
    gives_up_at: float | None = None  # (wall clock) the line's one deadline for it: joined + queue_timeout; None: none
    likely_at: float | None = (
        None  # (wall clock) when it is likely granted, from past holds (estimate.py); None: unknown
    )


@dataclass(frozen=True)
class Waiter:
    ticket: int
    kernel_id: str
    quota: Size | None  # None: a row this code did not write, whose quota cannot be read
    user: str
    kernel_name: str
    owner: Owner
    created: float


# -- the broker's wire: one codec a record ----------------------------------------------------------------


def owner_to_json(owner: Owner) -> dict:
    if isinstance(owner, SessionRef):
        return {"session": owner.id}
    return {"pid": owner.pid, "start": owner.start}


def owner_from_json(d: dict) -> Owner:
    return SessionRef(d["session"]) if "session" in d else ProcessRef(d["pid"], d["start"])


def waiting_to_json(waiting: Waiting) -> dict:
    return dataclasses.asdict(waiting)


def waiting_from_json(d: dict) -> Waiting:
    """A place in line as a broker said it; fields this version does not know (a newer broker's) are left out."""
    known = {f.name for f in dataclasses.fields(Waiting)}
    return Waiting(**{name: value for name, value in d.items() if name in known})


def lease_to_json(lease: Lease) -> dict:
    kernel = lease.kernel
    return {
        "kernel_id": lease.kernel_id,
        "card_uuid": lease.card_uuid,
        "card_index": lease.card_index,
        "quota_mib": lease.quota_mib,
        "reserve_mib": lease.reserve_mib,
        "reserved_mib": lease.reserved_mib,
        "user": lease.user,
        "kernel_name": lease.kernel_name,
        "owner": owner_to_json(lease.owner),
        "kernel": {"pid": kernel.pid, "start": kernel.start} if kernel else None,
        "created": lease.created,
    }


def lease_from_json(d: dict) -> Lease:
    kernel = d.get("kernel")
    return Lease(
        kernel_id=d["kernel_id"],
        card_uuid=d["card_uuid"],
        card_index=d["card_index"],
        quota_mib=d["quota_mib"],
        reserve_mib=d["reserve_mib"],
        user=d["user"],
        kernel_name=d["kernel_name"],
        owner=owner_from_json(d["owner"]),
        kernel=ProcessRef(**kernel) if kernel else None,
        created=d["created"],
    )


def waiter_to_json(w: Waiter) -> dict:
    return {
        "ticket": w.ticket,
        "kernel_id": w.kernel_id,
        "quota": size_to_json(w.quota),
        "user": w.user,
        "kernel_name": w.kernel_name,
        "owner": owner_to_json(w.owner),
        "created": w.created,
    }


def waiter_from_json(d: dict) -> Waiter:
    return Waiter(
        d["ticket"], d["kernel_id"], size_from_json(d.get("quota")), d["user"], d["kernel_name"],
        owner_from_json(d["owner"]), d["created"],
    )  # fmt: skip


def size_to_json(size: Size | None) -> dict | None:
    """A size on the wire, typed: ``{"mib": 4096}`` or ``{"percent": 25}`` (None: unknown)."""
    if size is None:
        return None
    return {"mib": size.mib} if size.percent is None else {"percent": size.percent}


def size_from_json(value: object) -> Size | None:
    """A size from the wire, through Size's one constructor (anything it refuses is unknown); an older broker's
    text ("4 GiB") is read by the one parser."""
    try:
        if isinstance(value, dict):
            return Size(mib=value.get("mib"), percent=value.get("percent"))
        return parse_size(value) if isinstance(value, str) else None
    except PolicyError:
        return None
