"""What each caller may do: the broker's operations, one method per request (``_op_<name>``).

A part of GpuShareBroker (server.py): what it needs of the broker is declared at the top of the class (the
host's Ledger, the policy, the history rules, the cards, the GPU backend, the per-user limits, the logs).
Every method runs on the broker's one thread, with arguments protocol.decode_request has already typed and
checked.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Awaitable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import psutil

from ..core.history import HistoryRules, OthersBudget, newest
from ..core.levels import WHAT, below, level_of
from ..core.policy import CardView, Policy, Size, UserLimits, format_mib
from ..host.cgroups import KernelCgroups, card_minors, held_in_group, kernel_of
from ..host.gpu import Card, GpuBackend
from ..ledger.leases import lease_to_json, waiter_to_json, waiting_to_json
from ..ledger.ledger import Lease, Ledger, ProcessRef, Request, Waiter
from ..ledger.notices import NoSuchKernel
from ..ledger.view import ANONYMOUS, anonymous_leases, view_for
from .guard import LogLimiter
from .identity import Caller
from .protocol import (
    ActArgs,
    AttachArgs,
    BrokerRefused,
    EndGroupArgs,
    KeepArgs,
    KernelArgs,
    KernelsArgs,
    LearnedArgs,
    NoArgs,
    ParkArgs,
    RecordPeakArgs,
    ReserveArgs,
    ResizeArgs,
    WatchArgs,
    decode_request,
)
from .reading import CardReading
from .room import FREEING_OPS, ROOM_OPS, RoomChanges
from .unleased import UnleasedPolicy
from .watchdog import Watchdog


def cards_seen(cards: Sequence[Card], said: Sequence[str], caller: Caller) -> Sequence[Card]:
    """The broker's cards a kernel may be placed on. A server in a container sees only the cards it was given, and
    says which. A server on this host sees them all (NVML ignores CUDA_VISIBLE_DEVICES): a list from it is ignored,
    so that no one pins a kernel to one card to hold a place there."""
    if not said or caller.session is None:
        return cards
    seen = [c for c in cards if c.uuid in set(said)]
    if not seen:
        raise BrokerRefused(
            f"None of the cards this server sees ({', '.join(said)}) is one of the broker's "
            f"({', '.join(c.uuid for c in cards) or 'none'}). Give the server's container one of "
            "the broker's cards, or check that both read the same host's cards."
        )
    return seen


class KernelNotebooks:
    """Each kernel's notebook, as its server said it with its reserve: kept in memory only (lost at a broker restart
    until the kernel reserves again), and dropped once the kernel holds and waits for nothing."""

    def __init__(self) -> None:
        self._paths: dict[str, str] = {}

    KEPT_MAX = 4096  # past this many names, those of kernels gone are dropped at once (no admin may look for days)

    def said(self, kernel_id: str, path: str, ledger: Ledger) -> None:
        if path:
            self._paths[kernel_id] = path
        if len(self._paths) > self.KEPT_MAX:
            self.current(ledger)

    def current(self, ledger: Ledger) -> dict[str, str]:
        held = {lease.kernel_id for lease in ledger.leases()} | {w.kernel_id for w in ledger.waiters()}
        self._paths = {kid: path for kid, path in self._paths.items() if kid in held}
        return dict(self._paths)


class Operations:
    # -- what the broker provides (server.py's setup) --------------------------------------------------
    _ledger: Ledger | None  # the host's one ledger (None until it is opened)
    _me: ProcessRef  # the broker's own process: the owner of what it writes for itself
    _taught: OthersBudget  # how many other users' notebooks each user has asked about (learned_peak)
    policy: Policy
    history: HistoryRules
    cards: list[Card]
    backend: GpuBackend
    log: logging.Logger
    log_limited: LogLimiter
    reading: CardReading  # the driver's per-process reading, read again after leases were given back
    unleased: UnleasedPolicy  # what is done about processes that use a card without a lease
    watchdog: Watchdog  # the over-quota policy on every lease
    groups: KernelCgroups  # kernels' cgroups the broker owns for servers whose own a kernel could leave
    _group_users: dict[str, int]  # kernel id -> the uid whose kernel entered its group (the ledger's groups_made)
    notebooks: KernelNotebooks  # each kernel's notebook, as its server said it (admins' view only)
    park_budget_mib: int | None  # host memory all parked kernels' GPU state may take (None: no bound)
    room: RoomChanges  # changes that may move the line, which servers watch (room.py)

    def limits_for(self, caller: Caller) -> UserLimits:
        """The caller's per-user limits (the broker's rules for their user and groups)."""
        raise NotImplementedError

    # -- requests (all on the one ledger thread) ------------------------------------------------------

    @contextmanager
    def _as_owner(self, caller: Caller) -> Iterator[Ledger]:
        """The ledger with the caller's server process as the owner of what it writes."""
        assert self._ledger is not None
        if caller.owner is None:
            raise BrokerRefused(
                "The broker cannot see the calling process (it runs in another PID namespace, e.g. a container). "
                "Servers in containers connect over TCP with their JupyterHub token: set GpuShareApp.broker_socket "
                "to 'tcp://<broker host>:<port>' (GpuShareBroker.tcp_address, docs/multi-user.md)."
            )
        self._ledger.owner = caller.owner
        try:
            yield self._ledger
        finally:
            self._ledger.owner = self._me

    def _mine(self, caller: Caller, user: str) -> bool:
        return caller.admin or user == caller.user

    def _may_change(self, caller: Caller, kernel_id: str, lease_user: str, owner: Any, what: str) -> None:
        """Refuse a change to a lease or waiter that this connection does not hold (admins may)."""
        if caller.admin or (lease_user == caller.user and caller.owns(owner)):
            return
        if lease_user != caller.user:
            self.log_limited(
                "refused-other-user", logging.WARNING, "%s (uid %s) asked to %s %s's kernel %s; refused.",
                caller.user, caller.uid, what, lease_user, kernel_id,
            )  # fmt: skip
            raise BrokerRefused(f"Kernel {kernel_id} is another user's; you may not {what} it.")
        raise BrokerRefused(
            f"Only the Jupyter server that holds kernel {kernel_id}'s reservation may {what} it; this connection "
            f"(process {caller.process.pid if caller.process else '?'}) is not that server. Shut the kernel down from "
            "JupyterLab (Kernel > Shut Down Kernel) to give its GPU memory back."
        )

    def _op_hello(self, caller: Caller, args: NoArgs) -> dict:
        return {
            "user": caller.user,
            "uid": caller.uid,
            "admin": caller.admin,
            "pid": caller.process.pid if caller.process else None,
            "session": caller.session.id if caller.session else None,
            "cards": [c.to_dict() for c in self.cards],
            "limits": self.limits_for(caller).to_dict(),
            "context_reserve_mib": self.policy.context_reserve_mib,
            "groups": self._groups_offered(),
        }

    # -- kernels' cgroups the broker owns ----------------------------------------------------------------
    # A student's server can make its kernels' groups only in a cgroup subtree delegated to the student, where a
    # kernel (the same user) may move what it starts out of its group. The broker (root) makes them where the
    # student can write nothing: a kernel's stand-in asks to enter its group before it becomes the kernel
    # (standin.py), its server asks to open the lease's card at the grant and to end the group with the kernel.

    MAX_GROUPS_PER_USER = 100

    def _groups_offered(self) -> dict | None:
        level = self.groups.level
        if level.tracking != "cgroup":
            return None
        return {"bases": list(self.groups.bases), **level.to_dict(), "escapable": False}

    def _group_pids_of(self, kernel_id: str, caller: Caller) -> set[int]:
        """The processes in the kernel's group; BrokerRefused if any is not the caller's (root and admins may)."""
        try:
            pids = self.groups.pids(kernel_id)
        except ValueError as e:
            raise BrokerRefused(f"Kernel id {kernel_id!r} cannot name a cgroup: {e}.") from e
        if not caller.admin:
            for pid in pids:
                try:
                    uid = psutil.Process(pid).uids().real
                except psutil.Error:
                    continue
                if uid != caller.uid:
                    raise BrokerRefused(f"The cgroup of kernel {kernel_id} holds another user's processes.")
        return pids

    def _op_enter_group(self, caller: Caller, args: KernelArgs) -> dict:
        """The calling process (a kernel's stand-in, on the Unix socket) enters its kernel's group, made here with
        the lease's card open (none while it waits, or without a lease)."""
        assert self._ledger is not None
        if self._groups_offered() is None:
            raise BrokerRefused(f"This broker makes no cgroups for kernels: {self.groups.level.reason}.")
        if caller.process is None:
            raise BrokerRefused("A kernel enters its cgroup through the broker's Unix socket only.")
        lease = self._ledger.get(args.kernel_id)
        waiter = next((w for w in self._ledger.waiters() if w.kernel_id == args.kernel_id), None)
        holder = lease.user if lease is not None else waiter.user if waiter is not None else None
        made_for = self._group_users.get(args.kernel_id)
        if (holder is not None and holder != caller.user) or (made_for is not None and made_for != caller.uid):
            raise BrokerRefused(f"Kernel {args.kernel_id} is not yours: only its own user's kernel enters its cgroup.")
        inside = kernel_of(caller.process.pid)
        if inside is not None and inside != args.kernel_id:  # (a kernel's process moving itself to another group)
            raise BrokerRefused(f"This process is kernel {inside}'s: it stays in that kernel's cgroup.")
        self._group_pids_of(args.kernel_id, caller)
        mine = [kid for kid, uid in self._group_users.items() if uid == caller.uid]
        if args.kernel_id not in self._group_users and len(mine) >= self.MAX_GROUPS_PER_USER:
            for kid in mine:  # groups left empty by servers that ended without saying so
                if not self.groups.pids(kid) and self._ledger.get(kid) is None:
                    self._group_removed(kid)
            if sum(uid == caller.uid for uid in self._group_users.values()) >= self.MAX_GROUPS_PER_USER:
                raise BrokerRefused(f"You have {len(mine)} kernels' cgroups already, the most one user may have.")
        card = next((c for c in self.cards if lease is not None and c.uuid == lease.card_uuid), None)
        try:
            procs = self.groups.create(args.kernel_id, card_minors(card))
            for path in procs:
                with open(path, "w") as f:
                    f.write(str(caller.process.pid))
        except OSError as e:
            raise BrokerRefused(f"The kernel's cgroup could not be made or entered here: {e}.") from e
        if args.kernel_id not in self._group_users:
            self._group_users[args.kernel_id] = caller.uid
            self._ledger.group_made(args.kernel_id, caller.uid)
        return {"procs": procs}

    def _op_group_cards(self, caller: Caller, args: KernelArgs) -> None:
        """A kernel that waited is granted: its group may open its lease's card (the broker's own list of cards
        says which device that is, whatever the server says)."""
        lease = self._lease_to_change(caller, args.kernel_id, "open the card of")
        if lease is None or args.kernel_id not in self._group_users:
            raise BrokerRefused(f"Kernel {args.kernel_id} has no reservation or no cgroup of the broker's.")
        card = next((c for c in self.cards if c.uuid == lease.card_uuid), None)
        try:
            self.groups.allow(args.kernel_id, card_minors(card))
        except OSError as e:
            raise BrokerRefused(f"The card of kernel {args.kernel_id} could not be opened to its cgroup: {e}.") from e

    def _op_end_group(self, caller: Caller, args: EndGroupArgs) -> dict:
        """The kernel's process is gone: end what is left in its group and, unless it restarts, remove the group.
        Only its own user's (or an admin's) call ends anything."""
        owner = self._group_users.get(args.kernel_id)
        if owner is not None and owner != caller.uid and not caller.admin:
            raise BrokerRefused(f"The cgroup of kernel {args.kernel_id} is not yours.")
        self._group_pids_of(args.kernel_id, caller)
        if args.keep:
            return {"killed": self.groups.remove(args.kernel_id, keep=True)}
        return {"killed": self._group_removed(args.kernel_id)}

    def _group_removed(self, kernel_id: str) -> int:
        """End and remove a kernel's group, and forget it was made (the ledger keeps the groups the broker made,
        for its next start). Returns how many processes had to be killed."""
        assert self._ledger is not None
        killed = self.groups.remove(kernel_id)
        if self._group_users.pop(kernel_id, None) is not None:
            self._ledger.group_made(kernel_id, None)
        return killed

    def _op_reserve(self, caller: Caller, args: ReserveArgs) -> dict:
        ledger = self._ledger
        assert ledger is not None
        taken = ledger.get(args.kernel_id)
        parked = ledger.parked().get(args.kernel_id)
        if (
            (taken is not None and taken.user != caller.user)
            or any(w.kernel_id == args.kernel_id and w.user != caller.user for w in ledger.waiters())
            or (parked is not None and parked[0] != caller.user)
        ):
            raise BrokerRefused(f"Kernel id {args.kernel_id} is in use by another user's kernel; use a new id.")
        cards = cards_seen(self.cards, args.cards, caller)
        self.policy.check_quota(args.quota, [CardView(c.uuid, c.index, c.total_mib) for c in cards])
        request = Request(args.kernel_id, args.quota, caller.user, args.kernel_name)
        outside = ledger.outside(self.reading.latest())
        with self._as_owner(caller) as led:
            got = led.reserve(request, self.policy, cards, args.wait, self.limits_for(caller), outside=outside)
        self.notebooks.said(args.kernel_id, args.path, ledger)
        if isinstance(got, Lease):
            return {"lease": lease_to_json(got)}
        return {"waiting": waiting_to_json(got)}

    def _op_cancel_wait(self, caller: Caller, args: KernelArgs) -> None:
        assert self._ledger is not None
        waiter = next((w for w in self._ledger.waiters() if w.kernel_id == args.kernel_id), None)
        if waiter is not None:
            self._may_change(caller, args.kernel_id, waiter.user, waiter.owner, "stop the wait of")
            self._ledger.cancel_wait(args.kernel_id)
            self.room.changed()  # the ones behind it move up

    def _op_act(self, caller: Caller, args: ActArgs) -> dict:
        """A teacher's action on any kernel of the host (ledger/notices.py): the broker's admins only. A take-out is
        done here at once; a release here at its deadline unless the kernel's server gave the lease back first
        (server.py, ``_release_overdue``)."""
        assert self._ledger is not None
        if not caller.admin:
            raise BrokerRefused(
                f"Only an admin of this host's broker may {args.action} another kernel's place or reservation; "
                f"{caller.user} is not one (the broker's admin_users and admin_groups)."
            )
        try:
            notice = self._ledger.act(args.kernel_id, args.action, caller.user, args.why)
        except NoSuchKernel as e:
            raise BrokerRefused(str(e)) from e
        self.log.info(
            "jupyter-gpushare broker: %s: %s %s's kernel %s (%s)%s", caller.user, args.action, notice.user,
            args.kernel_id, args.why or "no reason given",
            f"; its server has until {time.strftime('%H:%M:%S', time.localtime(notice.deadline))}"
            if notice.deadline else "",
        )  # fmt: skip
        return notice.to_json()

    def _op_take_notices(self, caller: Caller, args: KernelsArgs) -> list[dict]:
        """The notices written for the caller's kernels (notices.take: for the server that held each when it was
        ruled on, its user's only), each given once."""
        with self._as_owner(caller) as led:
            return [n.to_json() for n in led.take_notices(set(args.kernel_ids), caller.user)]

    def _op_park(self, caller: Caller, args: ParkArgs) -> None:
        """A kernel's GPU state is to be parked in host memory: counted against the host's one budget (the broker's
        GpuShareApp.park_host_budget, whatever the server's says); PolicyError ``park-budget`` when it does not fit.
        Only the server that holds the kernel's lease asks."""
        if self._lease_to_change(caller, args.kernel_id, "park") is None:
            raise BrokerRefused(f"Kernel {args.kernel_id} holds no GPU reservation, so there is nothing to park.")
        with self._as_owner(caller) as led:
            led.park(args.kernel_id, args.mib, self.park_budget_mib)

    def _op_unpark(self, caller: Caller, args: KernelArgs) -> None:
        """The kernel's parked state is back on its card or gone; only its own server (or an admin) says so."""
        assert self._ledger is not None
        row = self._ledger.parked().get(args.kernel_id)
        if row is not None:
            self._may_change(caller, args.kernel_id, row[0], row[1], "unpark")
            self._ledger.unpark(args.kernel_id)

    def _lease_to_change(self, caller: Caller, kernel_id: str, what: str) -> Lease | None:
        """The kernel's lease, None when it holds none; BrokerRefused if the caller may not ``what`` it."""
        assert self._ledger is not None
        lease = self._ledger.get(kernel_id)
        if lease is not None:
            self._may_change(caller, kernel_id, lease.user, lease.owner, what)
        return lease

    def _op_attach(self, caller: Caller, args: AttachArgs) -> None:
        ledger = self._ledger
        assert ledger is not None
        lease = self._lease_to_change(caller, args.kernel_id, "attach a process to")
        if lease is None:
            return None
        if caller.session is not None:
            return None  # a server in a container: its pids mean nothing here; its session keeps the lease
        if lease.adopted:  # (its owner is the process it was made for, which could point it at another)
            raise BrokerRefused(
                f"{args.kernel_id} is the broker's lease of one process; no other process may be attached to it."
            )
        ref = None
        if args.pid is not None:
            try:
                owner_uid = psutil.Process(args.pid).uids().real
            except psutil.Error as e:
                raise BrokerRefused(f"Process {args.pid} cannot be attached: {e}.") from e
            if owner_uid != caller.uid and caller.uid != 0:
                raise BrokerRefused(
                    f"Process {args.pid} is not yours (uid {owner_uid}); only your own kernels can be attached."
                )
            ref = ProcessRef.of(args.pid)
            self._held_as_required(ledger, lease, args.pid)
        ledger.attach(args.kernel_id, ref)
        return None

    def _held_as_required(self, ledger: Ledger, lease: Lease, pid: int) -> None:
        """A kernel held below GpuShareApp.required_enforcement, as the broker reads it from /proc and the cgroup
        filesystem (a student's server may say anything), loses its lease and its process: BrokerRefused says why."""
        level = self._level_of(pid, lease.kernel_id)
        if not below(level, self.policy.required_level):
            return
        ledger.release(lease.kernel_id)
        try:
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        except OSError:
            pass
        self.log_limited(
            "below-required", logging.WARNING,
            "%s's kernel %s (process %s) is held at the '%s' level, below the required '%s': ended, its lease released.",
            lease.user, lease.kernel_id, pid, level, self.policy.required_level,
        )  # fmt: skip
        raise BrokerRefused(
            f"This kernel is held at the '{level}' enforcement level ({WHAT[level]}), and the admin requires "
            f"'{self.policy.required_level}' (GpuShareApp.required_enforcement): it was ended and its reservation "
            "released. Its Jupyter server must run it in a cgroup of its own (GpuShareApp.kernel_cgroups = 'auto', "
            "run as root or with a delegated cgroup subtree); `jupyter gpushare doctor` says what is missing."
        )

    def _op_resize(self, caller: Caller, args: ResizeArgs) -> dict | None:
        """A kernel's new quota on its own lease (ledger.resize), for the server that holds it, within the broker's
        rules and the caller's per-user limits."""
        ledger = self._ledger
        assert ledger is not None
        if self._lease_to_change(caller, args.kernel_id, "resize") is None:
            return None
        self.policy.check_quota(Size(mib=args.quota_mib), [CardView(c.uuid, c.index, c.total_mib) for c in self.cards])
        outside = ledger.outside(self.reading.latest())
        got = ledger.resize(args.kernel_id, args.quota_mib, self.policy, self.cards, self.limits_for(caller), outside)
        return lease_to_json(got) if got else None

    def _op_release(self, caller: Caller, args: KernelArgs) -> dict | None:
        ledger = self._ledger
        assert ledger is not None
        if self._lease_to_change(caller, args.kernel_id, "release") is None:  # a start still waiting: that stops it
            self._op_cancel_wait(caller, args)
            return None
        released = ledger.release(args.kernel_id)
        return lease_to_json(released) if released else None

    def _op_record_peak(self, caller: Caller, args: RecordPeakArgs) -> bool:
        """A run's peak, for the lease's own user only: its server (no one else, admins included) names the
        notebook; no more than its card holds. One row per kernel process (ledger.record_peak)."""
        ledger = self._ledger
        assert ledger is not None
        lease = self._lease_to_change(replace(caller, admin=False), args.kernel_id, "record the peak of")
        if lease is None:
            return False
        card = next((c for c in self.cards if c.uuid == lease.card_uuid), None)
        most = max(args.run.peak_mib, args.run.need_mib or 0)
        if card is None or most > card.total_mib:
            raise BrokerRefused(
                f"A peak or quota of {format_mib(most)} is more than kernel {args.kernel_id}'s card holds; not recorded."
            )
        return ledger.record_peak(args.kernel_id, args.path, args.run, self.history)

    def _op_learned_peak(self, caller: Caller, args: LearnedArgs) -> dict | None:
        """What the caller's next kernel of a notebook learns, by the broker's rules (never the server's); from
        other users' runs only within the caller's hourly budget of notebooks (history.OthersBudget)."""
        assert self._ledger is not None
        got = self._ledger.learned_peak(caller.user, args.kernel_name, args.path, self.history)
        if got is not None and got.source == "own":
            return got.for_caller().to_json()
        # Any question that others' runs could answer counts against the budget, answered or not: a miss tells
        # that no one ran a notebook there, so guessing paths costs the same whether a guess hits
        if not self._taught.allow(caller.user, (args.kernel_name, args.path), time.monotonic()):
            self.log.warning(
                "jupyter-gpushare broker: %s asked about more than %d notebooks not their own in an hour; %r is "
                "answered from their own runs only",
                caller.user, self._taught.per_hour, args.path,
            )  # fmt: skip
            return None
        return got.for_caller().to_json() if got is not None else None

    def _op_release_owned_except(self, caller: Caller, args: KeepArgs) -> list[dict]:
        with self._as_owner(caller) as led:
            return [lease_to_json(x) for x in led.release_owned_except(set(args.keep))]

    def _op_reap(self, caller: Caller, args: NoArgs) -> list[dict]:
        assert self._ledger is not None
        gone = self._ledger.reap()
        self._log_reclaimed(gone)
        return [lease_to_json(x) for x in gone if self._mine(caller, x.user)]

    def _op_leases(self, caller: Caller, args: NoArgs) -> list[dict]:
        assert self._ledger is not None
        leases = self._ledger.leases()
        if caller.admin:
            return [lease_to_json(x) for x in leases]
        own = [x for x in leases if x.user == caller.user]
        others = [x for x in leases if x.user != caller.user]
        return [lease_to_json(x) for x in own + anonymous_leases(others)]

    def _op_get(self, caller: Caller, args: KernelArgs) -> dict | None:
        assert self._ledger is not None
        lease = self._ledger.get(args.kernel_id)
        return lease_to_json(lease) if lease and self._mine(caller, lease.user) else None

    def _op_waiters(self, caller: Caller, args: NoArgs) -> list[dict]:
        assert self._ledger is not None
        return [
            waiter_to_json(
                w if self._mine(caller, w.user) else Waiter(w.ticket, "", None, "", "", ANONYMOUS, w.created)
            )
            for w in self._ledger.waiters()
        ]

    def _op_view(self, caller: Caller, args: NoArgs) -> dict:
        assert self._ledger is not None
        led = self._ledger
        leases, waiters = led.leases(), led.waiters()
        notebooks = self.notebooks.current(led) if caller.admin else None
        view = view_for(caller, leases, waiters, self.cards, self.policy, self.limits_for(caller), notebooks=notebooks)
        # what notebooks taught: every user's for an admin, else the caller's own (nothing of others' files)
        found = led.notebooks(self.history, None if caller.admin else caller.user)
        view["notebooks"], view["notebooks_total"] = newest(found), len(found)  # a bounded answer
        if caller.admin:  # processes without a lease, with their user and command, and how each kernel is held
            view["unleased"] = list(self.unleased.current)
            view["rulings"] = [n.to_json() for n in led.rulings()]  # the teachers' rulings and what became of them
            view["levels"] = {
                lease.kernel_id: {"user": lease.user, "level": self._level_of(lease.kernel.pid, lease.kernel_id)}
                for lease in led.leases()
                if lease.kernel is not None and lease.kernel.alive()
            }
        return view

    def _op_kernel_notebooks(self, caller: Caller, args: NoArgs) -> dict[str, str]:
        """For an admin (a teacher's line names every kernel by it); a student's own server names her notebooks."""
        assert self._ledger is not None
        return self.notebooks.current(self._ledger) if caller.admin else {}

    def _level_of(self, pid: int, kernel_id: str) -> str:
        """A kernel's enforcement level as the broker reads it from /proc and the cgroup filesystem."""
        grouped, allocation = held_in_group(pid, kernel_id)
        return level_of(True, self.watchdog.action, "cgroup" if grouped else "tree", allocation)

    def handle(self, caller: Caller, op: str, args: Any) -> Any:
        """Carry out one request for ``caller``; runs on the ledger thread. ``args`` is the request's arguments,
        typed by protocol.decode_request (a plain dict is decoded here first)."""
        if isinstance(args, dict):
            op, args = decode_request({"op": op, "args": args})
        answer = getattr(self, f"_op_{op}", None)
        if answer is None:  # 'auth' is answered by the connection, before any other request
            raise BrokerRefused(f"{op!r} is not a request for this point of the conversation.")
        result = answer(caller, args)
        if op in ROOM_OPS and result:
            if op in FREEING_OPS:
                self.reading.stale()
            self.room.changed()
        return result

    def _op_watch(self, caller: Caller, args: WatchArgs) -> Awaitable[int]:
        """Wait until the line may move (room.py): the connection awaits the answer, off the ledger's time."""
        return self.room.past(args.since, args.wait_s)

    def _log_reclaimed(self, gone: Sequence[Lease]) -> None:
        if gone:
            self.reading.stale()
            self.room.changed()
        for lease in gone:
            self.log.info(
                "Reclaimed %s of %s's kernel %s (its server and kernel are gone).",
                format_mib(lease.reserved_mib),
                lease.user,
                lease.kernel_id,
            )
