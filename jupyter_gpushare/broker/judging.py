"""What the broker does itself about what it reads on the cards, whatever any student's server does: a part of
GpuShareBroker (server.py), on its one thread, at each reading of the driver (``watch_once``).

- A teacher's release whose server did not give the lease back by its deadline is carried out here (notices.py):
  the lease goes to the line, and what the kernel's processes still hold is use without a lease that may not be
  adopted.
- Every lease's over-use is judged (watchdog.py), then every process without a lease (unleased.py): adopted only
  from room that neither reservations nor other processes without a lease take, never below the admin's required
  enforcement level, never for a kernel a ruling released.
- The kernels' groups this broker made survive its restart: its ledger lists them (nothing else on the cgroup tree
  is its to judge), and the ones left empty by servers that are gone are removed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..core.levels import WHAT, below
from ..host.cgroups import kernel_of
from ..host.gpu import DeviceSample
from ..ledger.attribution import LeaseUse, lease_use
from ..ledger.leases import ADOPTED_ID_PREFIX
from ..ledger.ledger import Lease, ProcessRef
from .identity import Caller, user_and_groups
from .ops import Operations
from .unleased import Unleased, adopted_size, find_unleased


class Judging(Operations):
    _ruled: dict[str, str]  # processes of kernels whose lease a ruling released: (their key) -> why
    _released: dict[str, str]  # (this reading's) kernels a teacher released in the last day -> by whom
    _released_processes: dict[int, tuple[float, str]]  # (this reading's) the processes they named: (start, by)
    _outside_mib: dict[str, int]  # (this reading's) per card, what processes without a lease use

    def watch_once(self, samples: Sequence[DeviceSample]) -> None:
        """One reading judged: the teacher's releases past their deadline, every lease's over-use, then every
        process without a lease."""
        assert self._ledger is not None
        leases = self._ledger.leases()
        use = lease_use(samples, leases)
        if use is None:  # in a container ourselves: no process can be told from another
            return
        if self._release_overdue(use):
            leases = self._ledger.leases()
            use = lease_use(samples, leases) or use
        self._released, self._released_processes = self._ledger.ruled_away()
        self.watchdog.sweep(samples, leases, use)
        self._outside_mib = dict(use.outside)
        self.unleased.sweep(find_unleased(samples, leases, use, self.unleased.grew, time.monotonic()))

    def _release_overdue(self, use: LeaseUse) -> bool:
        """A teacher's release whose kernel's server did not give the lease back by its deadline is carried out
        here (notices.py): the lease goes to the line, and what the kernel's processes still hold on the card is
        use without a lease that may not be adopted (unleased.py stops it). True when any was."""
        assert self._ledger is not None
        overdue = self._ledger.overdue_releases()
        for notice, lease in overdue:
            why = f"{notice.by} released its kernel's GPU reservation and its server did not give it back in time"
            held = [pid for pid, _card, _mib in use.processes.get(lease.kernel_id, [])]
            if lease.kernel is not None:
                held.append(lease.kernel.pid)
            for pid in set(held):
                ref = ProcessRef.of(pid)
                if ref is not None:
                    self._ruled[f"{ADOPTED_ID_PREFIX}{ref.pid}-{int(ref.start * 100)}"] = why
            self.log.warning(
                "jupyter-gpushare broker: %s's kernel %s: released at the deadline of %s's release (%s); its server "
                "had not given it back. Its processes %s may hold no GPU memory now.",
                lease.user, lease.kernel_id, notice.by, notice.why or "no reason given", sorted(set(held)),
            )  # fmt: skip
        if len(self._ruled) > 4096:  # processes come and go: a bounded memory of them
            self._ruled = dict(list(self._ruled.items())[-2048:])
        if overdue:
            self.room.changed()
        return bool(overdue)

    def _barred(self, u: Unleased) -> str | None:
        """Why a process may hold no lease at all (unleased.py stops it at once), or None: it is of a kernel a
        teacher released (by its cgroup, its connection file or its own adopted name), whoever gave the lease back
        and however (its server early, a detach, the broker at the deadline); or it cannot be held at the admin's
        required level. A kernel that got a reservation again has its processes covered by it: they are not here."""
        ruled = self._ruled.get(u.key)
        if ruled is not None:
            return ruled
        start, by = self._released_processes.get(u.pid, (0.0, None))
        by = by if ProcessRef(u.pid, u.start).same(ProcessRef(u.pid, start)) else None
        for kernel_id in (u.key, kernel_of(u.pid), u.kernel_id):
            by = by or self._released.get(kernel_id or "")
        if by is not None:
            return f"{by} released its kernel's GPU reservation: it may hold no GPU memory without one"
        required = self.policy.required_level
        level = self._level_of(u.pid, kernel_of(u.pid) or u.key)
        if below(level, required):
            return (
                f"it can be held only at the '{level}' enforcement level ({WHAT[level]}), and the admin requires "
                f"'{required}' (GpuShareApp.required_enforcement)"
            )
        return None

    def _adopt(self, u: Unleased) -> Lease | None:
        """A lease for a process without one, from its user's limits (unleased_action 'lease'), from room that
        neither the card's reservations nor what other processes without a lease use (as the card says) hold."""
        assert self._ledger is not None
        card = next((c for c in self.cards if c.uuid == u.card), None)
        if card is None or u.uid is None or u.user is None:
            return None
        user, groups = user_and_groups(u.uid)
        limits = self.limits_for(Caller(user, u.uid, groups))
        process = ProcessRef(u.pid, u.start)
        others = max(0, self._outside_mib.get(u.card, 0) - u.used_mib)
        lease = self._ledger.adopt(
            u.key, user, card, adopted_size(u.used_mib), process, self.policy, limits, others_mib=others
        )
        if lease is not None:  # (its use now counts as a lease's, for the next adoption of this reading)
            self._outside_mib[u.card] = max(0, self._outside_mib.get(u.card, 0) - u.used_mib)
        return lease

    def _groups_found(self) -> None:
        """The kernels' groups this broker made before it (re)started, as its ledger lists them, each its kernel's
        user's: each that holds no process, and whose kernel neither holds a lease nor waits, is removed. Nothing
        else on the tree is this broker's to judge (a root server's own groups, or another broker's, may sit beside
        them)."""
        assert self._ledger is not None
        if self._groups_offered() is None:
            return
        for kernel_id, uid in self._ledger.groups_made().items():
            self._group_users[kernel_id] = uid
            self._end_empty_group(kernel_id)  # (one no longer on the tree is empty: forgotten)

    def _end_empty_group(self, kernel_id: str) -> None:
        """Remove a kernel's group that holds no process, unless its kernel still holds a lease or waits (a
        restart between its two processes)."""
        assert self._ledger is not None
        if self.groups.pids(kernel_id) or self._ledger.get(kernel_id) is not None:
            return
        if any(w.kernel_id == kernel_id for w in self._ledger.waiters()):
            return
        self._group_removed(kernel_id)
