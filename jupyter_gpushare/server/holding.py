"""How this server holds its kernels' processes, and how firmly that holds them to their quotas.

Each kernel's cgroup (cgroups.py) is made before its first process enters it, its lease's card is opened to it
once granted, the driver's limit is set on it where the host has one, and what is left in it is ended with the
kernel. ``level`` says what that gives, in one word (levels.py), for a kernel (the API's ``held``) and for the
server (its ``enforcement``, and ``GpuShareApp.required_enforcement``). It owns no reservation: the manager
hands it each kernel's grant.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any, Callable

from ..core.levels import level_of
from ..host.cgroups import KernelCgroups, card_minors
from ..host.gpu import Card, GpuBackend
from .records import Grant, QuotaUnavailable


class Holding:
    """The kernels' cgroups, cards and driver limits, and the enforcement level they give."""

    def __init__(
        self,
        cgroups: KernelCgroups,
        backend: GpuBackend,
        cards: Sequence[Card],
        blocking: Callable[..., Awaitable[Any]],
        event: Callable[..., None],
        watchdog: str | None = None,
    ) -> None:
        """``blocking``: runs a blocking call off the IOLoop; ``event``: records an event (QuotaManager.event);
        ``watchdog``: the over-quota action of this server's enforcer (None: no enforcer)."""
        self.cgroups, self.backend, self._blocking, self._event = cgroups, backend, blocking, event
        self.watchdog = watchdog
        self._allocation: dict[str, str] = {}  # kernel id -> how the driver limits its group ("dmem")
        if cgroups.devices is not None and any(c.minor is None for c in cards):
            cgroups.no_isolation("the driver does not give the cards' device numbers (nvmlDeviceGetMinorNumber)")

    # -- a kernel's group ---------------------------------------------------------------------------

    def groups(self, kernel_id: str, grant: Grant | None) -> tuple[list[str], tuple[str, str] | None]:
        """The kernel's cgroups, made and limited to its grant's card (to none while it waits, or without a GPU):
        the ``cgroup.procs`` files its first process enters, or (where the host's broker owns them) the broker's
        socket and the kernel id it asks to enter with. A group that cannot be made stops the start."""
        card = grant.card if grant is not None and grant.mode == "gpu" else None
        try:
            broker = self.cgroups.through_broker(kernel_id)
            if broker is not None:
                return [], broker
            groups = self.cgroups.create(kernel_id, card_minors(card))
            if groups:
                self._limit(kernel_id, grant)
            return groups, None
        except (OSError, ValueError) as e:
            raise QuotaUnavailable(f"The kernel's cgroup could not be made: {e}. Ask the admin.") from e

    def _limit(self, kernel_id: str, grant: Grant | None) -> None:
        """The driver's limit on the kernel's group (where the host has one): its reservation on its card, or
        none (no GPU, or in line: its card stays closed anyway)."""
        card = grant.card if grant is not None and grant.mode == "gpu" else None
        lease = grant.lease if grant is not None and card is not None else None
        if card is None or lease is None or card.simulated:
            limited = self.cgroups.limit(kernel_id, None, None)
        else:
            limited = self.cgroups.limit(kernel_id, card.pci, lease.reserved_mib)
            if self.cgroups.dmem is not None and not limited:
                raise OSError(f"the driver's memory limit on {card.label} could not be set on its cgroup (dmem.max)")
        if limited:
            self._allocation[kernel_id] = "dmem"
        else:
            self._allocation.pop(kernel_id, None)

    async def adopt(self, warm_id: str, kernel_id: str, grant: Grant) -> None:
        """A warm kernel (warm.py) is handed over: it moves into the kernel's groups, its card open to it if it is
        granted now (closed while it waits)."""
        await self._blocking(self._adopt, warm_id, kernel_id, grant)

    def _adopt(self, warm_id: str, kernel_id: str, grant: Grant) -> None:
        card = grant.card if grant.mode == "gpu" else None
        self.cgroups.move(warm_id, kernel_id, card_minors(card))
        if self.cgroups.bases:
            self._limit(kernel_id, grant)

    async def open_cards(self, kernel_id: str, grant: Grant) -> None:
        """A kernel that waited is granted: its group may now open its card, and the driver limits it."""
        if grant.mode == "gpu" and grant.card is not None:
            await self._blocking(self.cgroups.allow, kernel_id, card_minors(grant.card))
            await self._blocking(self._limit, kernel_id, grant)

    async def close_cards(self, kernel_id: str) -> None:
        """A kernel gives its GPU back and runs on (parking.py, ``stood_by``): its group may open no card again until
        its next grant, and no driver limit is left on it."""
        await self._blocking(self.cgroups.allow, kernel_id, None)
        await self._blocking(self._limit, kernel_id, None)

    async def end(self, kernel_id: str, restart: bool) -> None:
        """The kernel's process is gone: end what is left in its groups (what it started and left behind) and,
        unless it restarts, remove them."""
        killed = await self._blocking(self.cgroups.remove, kernel_id, restart)
        if not restart:
            self._allocation.pop(kernel_id, None)
        if killed:
            self._event("group-ended", kernel_id, processes=killed)

    # -- the level ----------------------------------------------------------------------------------

    def held(self, kernel_id: str, frameworks: dict[str, Any] | None) -> dict[str, Any]:
        """How a kernel is held, level by level: its frameworks' caps (None: it imported none), how its processes
        are tracked (cgroup or process tree), whether it is kept from opening other cards, the over-quota policy
        (the watchdog), how the card refuses it memory past its reservation (``allocation``: None, not), and its
        enforcement level in one word."""
        level, allocation = self.cgroups.level, self._allocation.get(kernel_id)
        return {
            "caps": None if not frameworks else all(f.get("capped") for f in frameworks.values()),
            **level.to_dict(),
            "allocation": allocation,
            "watchdog": self.watchdog,
            "level": level_of(self._measures(), self.watchdog, level.tracking, allocation),
        }

    def enforcement(self, required: str) -> dict[str, Any]:
        """How this server holds its kernels (the state's ``enforcement``), with the level the admin requires."""
        return {**self.cgroups.level.to_dict(), "watchdog": self.watchdog, "level": self.level(), "required": required}

    def level(self) -> str:
        """The enforcement level this server gives a kernel it starts now."""
        level = self.cgroups.level
        return level_of(self._measures(), self.watchdog, level.tracking, level.allocation)

    def missing(self) -> str:
        """What keeps this server's kernels from the next enforcement level, in words."""
        level = self.cgroups.level
        if not self._measures():
            return f"per-process GPU use cannot be read ({self.backend.reason or self.backend.kind})"
        if self.watchdog in (None, "notify"):
            return "GpuShareApp.over_quota_action is 'notify': over-use is only reported"
        if level.tracking != "cgroup":
            return level.reason or "kernels are tracked by their process tree"
        return level.allocation_reason or "the driver sets no per-cgroup limit here"

    def _measures(self) -> bool:
        """Whether the card's per-process use is read here (the watchdog's eyes)."""
        return self.backend.kind in ("nvml", "simulated")
