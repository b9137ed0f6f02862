"""What a QuotaManager works with besides its settings: made before it, handed to it whole at construction, and
filled in order, never patched in afterwards.

- ``Readings`` (sampler.py): the cards as this process last read them. The manager reads it (what processes
  without a reservation use, a kernel's peak when it stops); a server's sampler, which is made after the manager
  (it needs the manager's kernels), publishes each reading into it. Outside a server nothing does: it stays empty.
- ``KernelStarts``: how this process starts kernels. A Jupyter server lists a kernel in line at once and launches
  it when granted (app.ServerStarts: how many clients a kernel has, whether one still wants it, how a kernel whose
  wait ended is shut down); a program (nbclient, papermill) waits for the grant inside the start, and may say
  where it stands (``ProgramStarts``, batch.WaitProgress).
- ``Services``: these, the registry's listeners (``records.Changes``) and the over-quota action of the server's
  enforcer (``watchdog``, shown with each kernel).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from ..ledger.leases import Waiting
from .records import Changes, KernelRecord
from .sampler import Readings


class KernelStarts(Protocol):
    """How the process that runs the manager starts kernels (the line asks it; QuotaManager.admit too)."""

    @property
    def holds(self) -> bool:
        """A Jupyter server: a kernel in line is listed at once and launched when granted (held.py)."""
        ...

    def watchers(self, kernel_id: str) -> int | None:
        """How many clients are connected to a kernel (None: not known here); a kernel in line with none for
        ``queue_unwatched_timeout`` leaves it."""
        ...

    def may_grant(self, kernel_id: str) -> bool:
        """Whether a kernel in line may be granted now: only one that some notebook or client still wants."""
        ...

    def end_kernel(self, kernel_id: str) -> None:
        """Shut down a kernel whose wait ended without a grant (its session too), as its server does."""
        ...

    def on_wait(self, rec: KernelRecord, got: Waiting) -> None:
        """The ledger's latest answer for a kernel in line."""
        ...

    async def trim(self, kernel_id: str) -> list[str] | None:
        """Ask an idle kernel to give its frameworks' cached GPU memory back (before a park): the frameworks that
        did; None where the kernel cannot be asked or did not answer."""
        ...

    async def restart(self, kernel_id: str) -> bool:
        """Restart a kernel (a teacher gave its reservation back and it cannot be parked); False where it cannot."""
        ...

    def can_stand_by(self, kernel_id: str) -> bool:
        """Whether a kernel could be asked to stand by now: its pipe is open, and it has not said that a GPU framework
        import began."""
        ...

    async def stand_by(self, kernel_id: str) -> str:
        """Ask a kernel that holds a GPU it has not used to give it back and stand by (its provisioner's
        ``stand_by``): "standby", or why not ("kept:<why>", "cannot")."""
        ...

    async def ask(self, kernel_id: str, expression: str, timeout: float) -> str | None:
        """The text of ``expression``'s value in the kernel (untrusted), "" when it raised; None without an answer."""
        ...

    def tell(self, kernel_id: str, message: dict[str, Any]) -> bool:
        """Tell a kernel one thing on its pipe (held.py); False when it has none."""
        ...

    def hears(self, kernel_id: str) -> bool:
        """Whether the kernel has its pipes to the server: to hear that it is parked, and to say that it is wanted (a
        kernel that could not say so is never parked)."""
        ...


@dataclass(frozen=True)
class ProgramStarts:
    """A program's way (nbclient, papermill, ``jupyter execute``): its start waits for the grant; ``progress``
    hears each answer of the ledger to a kernel in line (batch.WaitProgress says it on stderr)."""

    progress: Callable[[KernelRecord, Waiting], None] | None = None
    holds: bool = False

    def watchers(self, kernel_id: str) -> int | None:
        return None

    def may_grant(self, kernel_id: str) -> bool:
        return True

    def end_kernel(self, kernel_id: str) -> None:
        """Nothing to do: the program's own start raises, and the program decides."""

    def on_wait(self, rec: KernelRecord, got: Waiting) -> None:
        if self.progress is not None:
            self.progress(rec, got)

    async def trim(self, kernel_id: str) -> list[str] | None:
        """A program's kernels are never parked."""
        return None

    async def restart(self, kernel_id: str) -> bool:
        """A program's kernels are its own to restart."""
        return False

    def can_stand_by(self, kernel_id: str) -> bool:
        """A program's kernels are never asked to stand by (its start waited for the GPU it holds)."""
        return False

    async def stand_by(self, kernel_id: str) -> str:
        return "cannot"

    async def ask(self, kernel_id: str, expression: str, timeout: float) -> str | None:
        """A program's kernels are its own to ask."""
        return None

    def tell(self, kernel_id: str, message: dict[str, Any]) -> bool:
        """A program's kernels are never parked."""
        return False

    def hears(self, kernel_id: str) -> bool:
        return False


@dataclass(frozen=True)
class Services:
    """What a manager works with besides its settings (module docstring); the defaults are a program's."""

    starts: KernelStarts = field(default_factory=ProgramStarts)
    readings: Readings = field(default_factory=Readings)
    changes: Changes = field(default_factory=Changes)
    watchdog: str | None = None  # the over-quota action of this server's enforcer (None: no enforcer)
