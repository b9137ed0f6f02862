"""Whose each GPU process is: a lease's (its kernel's cgroup or process tree), or nobody's; and what that makes of a
reading: what each lease uses, what it uses beyond its lease and how much of that other leases had reserved, and
what processes without a lease use, which admission counts as taken. Read by the ledger (admission), the server's
enforcer and the broker's watchdog and policy on processes without a lease."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..core.overuse import CardRoom, Excess, card_room, over_use
from ..host.cgroups import kernel_of
from ..host.gpu import DeviceSample
from ..host.procs import SessionRef, pid_namespace_depth, root_of
from .leases import Lease


def unreserved_use(samples: Sequence[DeviceSample], leases: Sequence[Lease]) -> dict[str, int]:
    """Per card (uuid), the GPU memory that no reservation covers, which admission counts as taken:

    - what processes that hold no reservation use: a script run in a terminal, a program started outside
      Jupyter, a kernel started without a quota;
    - what a kernel uses beyond its lease (``over_use``): on its lease's card, its use past what it reserved; on
      any other card, all of it (an ``env -i`` child that sees every card, a library with its own CUDA calls).

    Processes in a PID namespace below ours (containers, whose kernels' pids the ledger does not know) are taken
    to be the kernels of the card's leases held by sessions (servers known by a Hub token) up to what those
    reserve, and only the rest counts. In a container ourselves, where the driver's pids are the host's,
    nothing can be told, so the answer is {} (as it is with no reading). A figure the driver does not give
    counts as 0.
    """
    use = lease_use(samples, leases)
    if use is None:
        return {}
    out = dict(use.outside)
    by_id = {lease.kernel_id: lease for lease in leases}
    for kernel_id, cards in use.kernels.items():
        lease = by_id[kernel_id]
        for card, over in over_use(lease.reserved_mib, lease.card_uuid, cards).items():
            out[card] = out.get(card, 0) + over
    return out


@dataclass
class LeaseUse:
    """One reading split by lease: ``kernels`` kernel id -> card uuid -> MiB its processes use, ``processes``
    kernel id -> (pid, card uuid, MiB) of each of them, ``outside`` card uuid -> MiB of processes that hold no
    lease, and ``unleased`` those processes (pid, card uuid, MiB), but those in containers. A process with a
    graphics context is one of them: a Vulkan or EGL allocation is memory like any (an admin's compositor is
    exempted by its user, unleased_exempt_users)."""

    kernels: dict[str, dict[str, int]]
    processes: dict[str, list[tuple[int, str, int]]]
    outside: dict[str, int]
    unleased: list[tuple[int, str, int]] = field(default_factory=list)


def lease_use(samples: Sequence[DeviceSample], leases: Sequence[Lease]) -> LeaseUse | None:
    """The reading split by lease, or None where nothing can be told (in a container ourselves). A process is a
    lease's when it is in the kernel's cgroup (cgroups.kernel_of: a double-forked daemon too) or in its process
    tree."""
    own_depth = pid_namespace_depth("self")
    if own_depth > 1:
        return None
    if not any(s.processes for s in samples):
        return LeaseUse({}, {}, {s.card.uuid: 0 for s in samples})
    by_id = {lease.kernel_id: lease for lease in leases}
    by_root = {lease.kernel.pid: lease for lease in leases if lease.kernel is not None and lease.kernel.alive()}
    roots = set(by_root)
    by_session: dict[str, int] = {}
    for lease in leases:
        if isinstance(lease.owner, SessionRef):  # a server in a container, known by its Hub token
            by_session[lease.card_uuid] = by_session.get(lease.card_uuid, 0) + lease.reserved_mib
    use = LeaseUse({}, {}, {})
    for sample in samples:
        outside = in_containers = 0
        for p in sample.processes:
            holder = by_id.get(kernel_of(p.pid) or "")
            if holder is None:
                root = root_of(p.pid, roots)
                holder = by_root.get(root) if root is not None else None
            if holder is not None:
                cards = use.kernels.setdefault(holder.kernel_id, {})
                cards[sample.card.uuid] = cards.get(sample.card.uuid, 0) + (p.used_mib or 0)
                use.processes.setdefault(holder.kernel_id, []).append((p.pid, sample.card.uuid, p.used_mib or 0))
            elif pid_namespace_depth(p.pid) > own_depth:
                in_containers += p.used_mib or 0
            else:
                outside += p.used_mib or 0
                use.unleased.append((p.pid, sample.card.uuid, p.used_mib or 0))  # a graphics context's too
        use.outside[sample.card.uuid] = outside + max(0, in_containers - by_session.get(sample.card.uuid, 0))
    return use


def card_rooms(samples: Sequence[DeviceSample], leases: Sequence[Lease], use: LeaseUse) -> dict[str, CardRoom]:
    """Each card's room on this reading (overuse.CardRoom): its free memory, and what its leases may still allocate.

    A lease whose kernel is alive is seen: what it may still allocate is its reservation less what its processes
    use. One whose kernel is not (yet) known is not: what it may still allocate is taken to be its reservation
    less every use on the card that no seen lease accounts for and no process without a lease makes (the smallest
    guess)."""
    rooms: dict[str, CardRoom] = {}
    for sample in samples:
        uuid = sample.card.uuid
        on_card = [lease for lease in leases if lease.card_uuid == uuid]
        seen = [lease for lease in on_card if lease.kernel_id in use.kernels or (lease.kernel and lease.kernel.alive())]
        nobodys = sum(mib for _pid, card, mib in use.unleased if card == uuid)  # known to be no lease's
        rooms[uuid] = card_room(
            sample.free_mib,
            None if sample.used_mib is None else max(0, sample.used_mib - nobodys),
            [
                (lease.kernel_id, lease.reserved_mib, use.kernels.get(lease.kernel_id, {}).get(uuid, 0))
                for lease in seen
            ],
            sum(lease.reserved_mib for lease in on_card if lease not in seen),
        )
    return rooms


def lease_excesses(samples: Sequence[DeviceSample], leases: Sequence[Lease], use: LeaseUse) -> list[Excess]:
    """Each lease over its lease on this reading (overuse.Excess), with how much of it other leases had reserved."""
    rooms = card_rooms(samples, leases, use)
    out = []
    for lease in leases:
        over = over_use(lease.reserved_mib, lease.card_uuid, use.kernels.get(lease.kernel_id, {}))
        if not over:
            continue
        stolen = sum(rooms[card].stolen(lease.kernel_id, mib) for card, mib in over.items() if card in rooms)
        sharers = sum(1 for other in leases if other.card_uuid == lease.card_uuid)
        shared = sharers > 1 or use.outside.get(lease.card_uuid, 0) > 0
        kernel_pid = lease.kernel.pid if lease.kernel is not None else None
        processes = tuple(use.processes.get(lease.kernel_id, ()))
        out.append(
            Excess(lease.kernel_id, lease.card_uuid, lease.reserved_mib, over, stolen, processes, kernel_pid, shared)
        )
    return out
