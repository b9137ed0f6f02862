"""What a Jupyter server needs of a ledger, whichever it has: this user's ledger file (``ledger.Ledger``) or the
host's broker (``broker.client.BrokerLedger``). One protocol, which mypy checks both against, so the manager never
asks which it holds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from ..core.history import HistoryRules, Learned, Run
from ..core.policy import Policy, UserLimits
from ..host.gpu import Card, DeviceSample
from ..host.procs import ProcessRef
from .leases import Lease, Waiter, Waiting
from .notices import Notice
from .queue import Request


class Reservations(Protocol):
    """What the manager needs of a ledger, whichever it has: this user's ledger file (``Ledger``) or the host's
    broker (``broker.client.BrokerLedger``). The manager never asks which."""

    @property
    def replaced(self) -> str | None:
        """What happened the last time the ledger's file was removed under this process, or None."""

    def reserve(
        self,
        req: Request,
        policy: Policy,
        cards: Sequence[Card],
        wait: bool,
        limits: UserLimits | None = None,
        outside: Mapping[str, int] | None = None,
    ) -> Lease | Waiting: ...

    def outside(self, samples: Sequence[DeviceSample], leases: Sequence[Lease] | None = None) -> dict[str, int] | None:
        """Per card, what processes that hold no reservation use; None where this process cannot tell (the
        broker measures it itself). ``leases``: the ledger's, when the caller has just read them."""
        ...

    def caller(self) -> tuple[str | None, bool, UserLimits | None]:
        """Who this process reserves as: (user, or None for this process's own; whether it sees everyone's
        kernels; its per-user limits, None where there are none)."""
        ...

    def kernel_notebooks(self) -> dict[str, str]:
        """Each kernel's notebook (kernel id -> path) as its server said it, for a caller who sees every kernel
        (a broker's admin); {} where no other server's kernels are named so."""
        ...

    def record_peak(self, kernel_id: str, path: str, run: Run, rules: HistoryRules) -> bool:
        """Remember the run (peak, quota it teaches, failed) of the kernel process that holds ``kernel_id``'s lease, for the lease's user and
        kernelspec and the notebook ``path``; False when there is no such lease (or no history is kept)."""
        ...

    def learned_peak(self, user: str, kernel_name: str, path: str, rules: HistoryRules) -> Learned | None:
        """What earlier runs of a notebook teach ``user`` (history.choose_peak). Through the broker, the broker's
        rules apply and the user is the caller."""
        ...

    def cancel_wait(self, kernel_id: str) -> None: ...
    def act(self, kernel_id: str, action: str, by: str, why: str) -> Notice:
        """A teacher's action on a kernel of the host (notices.py); the caller checks that ``by`` may act."""
        ...

    def take_notices(self, kernel_ids: set[str]) -> list[Notice]:
        """The teacher's notices for these kernels (this server's), each given once."""
        ...

    def park(self, kernel_id: str, mib: int, budget_mib: int | None) -> None:
        """Count ``mib`` of host memory for the kernel's parked GPU state against the host's one budget
        (``budget_mib``: this process's setting; through the broker, the broker's own); PolicyError ``park-budget``
        when it does not fit. Called before the state moves."""
        ...

    def unpark(self, kernel_id: str) -> None:
        """The kernel's parked state is back on its card, or gone: its host memory no longer counts."""
        ...

    def attach(self, kernel_id: str, kernel: ProcessRef | None) -> None: ...
    def resize(
        self,
        kernel_id: str,
        quota_mib: int,
        policy: Policy,
        cards: Sequence[Card],
        limits: UserLimits | None = None,
        outside: Mapping[str, int] | None = None,
    ) -> Lease | None: ...
    def release(self, kernel_id: str) -> Lease | None: ...
    def release_owned_except(self, keep: set[str]) -> list[Lease]: ...
    def reap(self) -> list[Lease]: ...
    def leases(self) -> list[Lease]: ...
    def get(self, kernel_id: str) -> Lease | None: ...
    def waiters(self) -> list[Waiter]: ...
    def close(self) -> None: ...
