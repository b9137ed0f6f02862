"""Every GPU process on the host is someone's: the processes that use a card without a lease, and what the admin's
policy does about them.

A student can start GPU work the broker never hears of: a ``python`` in a terminal, a kernel of her own
kernelspec that names ``local-provisioner``, a server whose extension she turned off in her own config, a batch
client without the provisioner. The broker reads the driver itself and sees them all: each such process is told
by its user (uid), its command, and the Jupyter kernel it is when its command line names a connection file. What
they use counts as taken in admission whatever the policy (procs.unreserved_use); ``unleased_action`` adds:

- ``notify``: logged once, and listed for admins (``jupyter gpushare status``);
- ``stop``: ended (SIGKILL, the process alone) once it has used the card for ``unleased_grace`` within a window of
  twice that, and at once when it takes memory that leases have reserved (overuse.py's rules, as for kernels);
- ``lease`` (the default): given a lease in its user's name, from that user's limits (Ledger.adopt), so that it
  is judged like any kernel from then on; where the card's reservations or the user's limits leave no room for
  it, it is treated as under ``stop``.

The users of ``unleased_exempt_users`` (root, by default: the admin's own jobs, the driver's daemons) are only
listed. Nothing in a student's config or environment reaches any of this: the broker runs as root.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import pwd
import re
import signal
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Callable

import psutil

from ..core.overuse import Excess, OverUseJudge
from ..core.policy import format_mib
from ..host.gpu import DeviceSample
from ..ledger.attribution import LeaseUse, card_rooms
from ..ledger.leases import ADOPTED_ID_PREFIX
from ..ledger.ledger import Lease

ACTIONS = ("notify", "stop", "lease")
ADOPT_MARGIN = 1.1  # a lease given to a process is its use now and a tenth more, in whole 256 MiB
GREW_MIB = 64  # a process whose use rose by more than this since the last reading grew (the newest to blame)
_CONNECTION_FILE = re.compile(r"kernel-([0-9A-Za-z._-]{1,100})\.json$")


@dataclass(frozen=True)
class Unleased:
    """One process that uses a card without a lease, at one reading."""

    pid: int
    start: float  # its start time (psutil's create_time): with the pid, the process
    card: str
    card_index: int
    used_mib: int
    uid: int | None
    user: str | None
    command: str | None
    kernel_id: str | None  # the Jupyter kernel it is, from its connection file's name
    stolen_mib: int = 0  # how much of its use leases had reserved (the card's free memory is short by that much)

    @property
    def key(self) -> str:
        """A name for the process that its pid alone would not make (pids are reused); also its lease's kernel id."""
        return f"{ADOPTED_ID_PREFIX}{self.pid}-{int(self.start * 100)}"

    def to_dict(self) -> dict:
        return asdict(self)


def _identify(pid: int) -> tuple[float, int | None, str | None, str | None, str | None] | None:
    """(start time, uid, user, command, Jupyter kernel id) of a process, or None when it is gone."""
    try:
        proc = psutil.Process(pid)
        start, uid = proc.create_time(), proc.uids().real
        argv = proc.cmdline()
    except psutil.Error:
        return None
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    kernel = next((m.group(1) for arg in argv if (m := _CONNECTION_FILE.search(arg))), None)
    return start, uid, user, " ".join(argv)[:200] or None, kernel


def find_unleased(
    samples: Sequence[DeviceSample],
    leases: Sequence[Lease],
    use: LeaseUse,
    grew: dict[str, tuple[float, int]],
    now: float,
) -> list[Unleased]:
    """The processes of this reading that use a card without a lease (but those in containers), each with what it
    takes of what leases have reserved: the card's shortfall, less what leases use past their own reservations
    (the watchdog's to judge), laid on the processes that grew last first (the one whose allocation made it), never
    on a bystander that was there before and has not grown since. ``grew``: when each process (its key) last grew
    by more than GREW_MIB, and what it used then, kept by the caller across readings; updated here, and pruned to
    this reading's."""
    rooms = card_rooms(samples, leases, use)
    index = {s.card.uuid: s.card.index for s in samples}
    found = []
    for pid, card, mib in use.unleased:
        who = _identify(pid)
        if who is not None:
            found.append(Unleased(pid, who[0], card, index.get(card, -1), mib, *who[1:]))
    seen = {}
    for u in found:
        at, before = grew.get(u.key, (now, -GREW_MIB - 1))
        seen[u.key] = (now, u.used_mib) if u.used_mib > before + GREW_MIB else (at, u.used_mib)
    grew.clear()
    grew.update(seen)
    short = {uuid: room.stolen("", 1 << 40) for uuid, room in rooms.items()}  # every lease counts as another's
    for lease in leases:  # a lease over its own reservation made that part of the shortfall: not on the others
        over = use.kernels.get(lease.kernel_id, {}).get(lease.card_uuid, 0) - lease.reserved_mib
        if over > 0 and lease.card_uuid in short:
            short[lease.card_uuid] = max(0, short[lease.card_uuid] - over)
    out = []
    for u in sorted(found, key=lambda u: (-seen[u.key][0], -u.used_mib)):
        stolen = min(u.used_mib, short.get(u.card, 0))
        short[u.card] = short.get(u.card, 0) - stolen
        out.append(dataclasses.replace(u, stolen_mib=stolen))
    return out


class UnleasedPolicy:
    """Applies ``unleased_action`` to each reading's unleased processes (``sweep``); ``current`` is the last
    reading's list, with what is being done about each, for admins."""

    def __init__(
        self,
        action: str,
        grace_s: float,
        exempt: Sequence[str],
        log: logging.Logger,
        adopt: Callable[[Unleased], Lease | None],
        clock: Callable[[], float] = time.monotonic,
        kill: Callable[[int, int], None] = os.kill,
        barred: Callable[[Unleased], str | None] = lambda u: None,
    ) -> None:
        """``barred``: why a process may hold no lease at all (a teacher released its kernel's, or it cannot be held
        at the admin's required level), or None: such a process is stopped at once (listed only under 'notify')."""
        if action not in ACTIONS:
            raise ValueError(f"unleased_action {action!r}: one of {', '.join(ACTIONS)}")
        self.action, self.exempt, self.log, self.clock = action, set(exempt), log, clock
        self._adopt, self._kill, self._barred = adopt, kill, barred
        self.judge = OverUseJudge("notify" if action == "notify" else "restart", grace_s)
        self.current: list[dict] = []
        self.grew: dict[str, tuple[float, int]] = {}  # when each process last grew on its card (find_unleased)
        self._said: set[str] = set()
        self._refused: set[str] = set()

    def sweep(self, found: Sequence[Unleased]) -> list[tuple[int, str]]:
        """One reading; (pid, what was done) for each process acted on: "lease", "stop" or "notify"."""
        done: list[tuple[int, str]] = []
        judged: list[Excess] = []
        by_key: dict[str, Unleased] = {}
        current = []
        for u in found:
            status, why = "listed", None
            if u.user in self.exempt:
                self._say(u, "(its user is in unleased_exempt_users: listed only)")
            elif (why := self._barred(u)) is not None:
                if self.action == "notify":
                    self._say(u, f"({why}; unleased_action notify: listed only)")
                elif self._end(u, why):
                    status = "stopped"
                    done.append((u.pid, "stop"))
            elif self.action == "lease" and self._lease(u):
                status = "leased"
                done.append((u.pid, "lease"))
            else:
                by_key[u.key] = u
                judged.append(
                    Excess(u.key, u.card, 0, {u.card: u.used_mib}, u.stolen_mib, ((u.pid, u.card, u.used_mib),), u.pid)
                )
                status = "judged" if self.action != "notify" else "listed"
                if self.action == "notify":
                    self._say(u, "(unleased_action notify: counted as taken, listed for admins)")
            entry = {**u.to_dict(), "status": status, "over_s": round(self.judge.over_s(u.key), 1)}
            current.append({**entry, "why": why} if why else entry)
        for verdict in self.judge.judge(self.clock(), judged):
            u = by_key[verdict.kernel_id]
            if verdict.action == "notify":
                continue  # said above, once
            why = (
                f"it took {format_mib(u.stolen_mib)} that kernels have reserved"
                if verdict.why == "theft"
                else f"it used the GPU without a reservation for {verdict.over_s:.0f} s"
            )
            if self._end(u, why):
                done.append((u.pid, "stop"))
        self.current = current
        return done

    def _end(self, u: Unleased, why: str) -> bool:
        """End the process (SIGKILL, it alone) and log why; False when it was gone already."""
        try:
            self._kill(u.pid, signal.SIGKILL)
        except OSError as e:  # gone meanwhile
            self.log.debug("jupyter-gpushare broker: ending process %s: %s", u.pid, e)
            return False
        self.log.warning("jupyter-gpushare broker: %s: ended, %s (unleased_action %s)", self._who(u), why, self.action)
        return True

    def _lease(self, u: Unleased) -> bool:
        lease = self._adopt(u)
        if lease is not None:
            if u.key not in self._said:
                self._said.add(u.key)
                self.log.warning(
                    "jupyter-gpushare broker: %s: given a lease of %s in %s's name (unleased_action lease)",
                    self._who(u), format_mib(lease.reserved_mib), u.user,
                )  # fmt: skip
            return True
        if u.key not in self._refused:
            self._refused.add(u.key)
            self.log.warning(
                "jupyter-gpushare broker: %s: no lease can be given (the card's reservations or %s's limits leave no "
                "room); it is ended if it keeps the memory for the grace, or at once if it takes reserved memory",
                self._who(u), u.user,
            )  # fmt: skip
        return False

    def _say(self, u: Unleased, what: str) -> None:
        if u.key not in self._said:
            self._said.add(u.key)
            self.log.warning("jupyter-gpushare broker: %s %s", self._who(u), what)
        if len(self._said) > 4096:  # processes come and go: a bounded memory of them
            self._said.clear()
            self._refused.clear()

    @staticmethod
    def _who(u: Unleased) -> str:
        kernel = f", Jupyter kernel {u.kernel_id}" if u.kernel_id else ""
        return (
            f"process {u.pid} of {u.user} ({u.command}{kernel}) uses {format_mib(u.used_mib)} on GPU {u.card_index} "
            "without a reservation"
        )


def adopted_size(used_mib: int) -> int:
    """The lease given to a process that uses ``used_mib``: a tenth more, in whole 256 MiB."""
    return int(math.ceil(used_mib * ADOPT_MARGIN / 256) * 256)
