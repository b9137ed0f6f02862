"""A teacher's actions from the host view, and this server's part in them (ledger/notices.py has the rules).

Owns two moves. ``act``: an admin of the host (the host view's ``admin``) acts on any kernel of the host, through
the ledger, which carries the action out on its rows and leaves a notice. ``take``: at each reconcile, this server
takes the notices for its own kernels and carries them out where only it can, then says each to the student as
an event with who did it and why:

- ``front``: nothing more to do (the ledger moved the kernel); the student hears it.
- ``remove``: the kernel's wait ends; it runs on without a GPU, with the teacher's reason.
- ``release``: the kernel is parked where it can be (its state kept, its next cell asks again), else restarted
  (in line again; its variables lost). Either gives its reservation back.

It does not judge who may act (the ledger's caller does: the broker its admins, a ledger file its owner).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Protocol

from ..core.policy import PolicyError
from ..ledger.notices import Notice
from ..ledger.reservations import Reservations
from .ledger_worker import LedgerWorker
from .records import KernelRecord, Tells

if TYPE_CHECKING:
    from .line import Line
    from .parking import Parking
    from .services import KernelStarts

VERBS = {
    "front": "moved it to the front of the line",
    "remove": "took it out of the line",
    "release": "gave its GPU reservation back",
}


class NotAdmin(PermissionError):
    """Only an admin of the host acts on its kernels."""


class Registry(Tells, Protocol):
    """What the teacher needs of the kernels' registry (QuotaManager): whose server this is, the kernels' records,
    and the student's events."""

    user: str
    records: dict[str, KernelRecord]
    log: logging.Logger


class Teacher:
    """The teacher's actions as this server carries them out."""

    def __init__(
        self, kernels: Registry, ledger: LedgerWorker, line: Line, parking: Parking, starts: KernelStarts
    ) -> None:
        """``kernels``: the registry; ``ledger``: the host's; ``line``, ``parking``: this server's, which carry out a
        take-out and a release; ``starts``: how this server restarts a kernel that cannot be parked."""
        self.kernels, self.ledger, self.line, self.parking, self.starts = kernels, ledger, line, parking, starts
        self._taking: asyncio.Future | None = None

    async def act(self, kernel_id: str, action: str, why: str) -> Notice:
        """Act on a kernel of the host as this server's user. NotAdmin unless the ledger says the user is one of
        the host's admins; NoSuchKernel (a file's ledger) or LedgerError (the broker's word) when the kernel is not
        where the action needs it. A kernel of this server's is acted on at once."""
        user = self.kernels.user

        def act(ledger: Reservations) -> Notice:
            who, admin, _ = ledger.caller()
            if not admin:
                raise NotAdmin(
                    f"Only an admin of this host may act on its kernels; {who or user} is not one. The broker's "
                    "admins are its admin_users and admin_groups."
                )
            return ledger.act(kernel_id, action, who or user, why)

        notice = await self.ledger.run(self.ledger.must, act)
        if kernel_id in self.kernels.records:
            await self.take()
        return notice

    def soon(self) -> None:
        """Take the notices now, on the IOLoop (the broker said a change that may be a ruling): once at a time."""
        if self._taking is None or self._taking.done():
            self._taking = asyncio.ensure_future(self._take_logged())

    async def _take_logged(self) -> None:
        try:
            await self.take()
        except Exception as e:  # noqa: BLE001 (the broker down: the next reconcile takes them)
            self.kernels.log.debug("jupyter-gpushare: taking the notices failed: %s", e)

    async def take(self) -> None:
        """Carry out the notices for this server's kernels (module docstring)."""
        mine = set(self.kernels.records)
        if not mine:
            return
        for notice in await self.ledger.on(lambda ledger: ledger.take_notices(mine)) or []:
            if notice.action in VERBS:  # (an action a newer broker knows and this server does not: left out)
                await self._carry_out(notice)

    async def _carry_out(self, n: Notice) -> None:
        kernels, kid = self.kernels, n.kernel_id
        said = f"{n.by} {VERBS[n.action]}: {n.why}" if n.why else f"{n.by} {VERBS[n.action]}."
        how = ""
        if n.action == "remove" and self.line.waiting(kid) is not None:
            self.line.cancel(kid, said)
        elif n.action == "release" and kid in kernels.records and kernels.records[kid].lease is not None:
            with contextlib.suppress(PolicyError):  # it cannot be parked here: restarted instead
                await self.parking.park(kid)
            rec = kernels.records.get(kid)
            if rec is not None and rec.state == "parked":
                how = "parked"
            elif await self.starts.restart(kid):  # (a park that failed said why in its own event)
                how = "restarted"
        code = f"teacher-{n.action}" + (f"-{how}" if how else "")
        kernels.event(f"teacher-{n.action}", kid, code=code, by=n.by, why=n.why or None)
