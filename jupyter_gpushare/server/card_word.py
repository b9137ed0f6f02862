"""What the card itself shows of a kernel's parked processes: its word, not the driver call's or the ledger's.

A park is done when the card shows the processes holding nothing; a restore starts only when the card shows the
room for what comes back (a restore that runs out of memory breaks the process for good: cuda-checkpoint#44).
Each look asks the sampler for a reading taken after it, so none is older than the question.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from ..host.gpu import DeviceSample
from .sampler import Readings

READ_S = 1.0  # how long to wait for each reading asked for
TRIMMED_READ_S = 3.0  # after a kernel gave its caches back, how long to wait for a reading that shows it
FREED_MIB = 64  # a parked process shows at most this on the card (the driver keeps a few MiB: 4 on an H100)
FREED_WITHIN_S = 5.0  # the card must show it freed within this
ROOM_WITHIN_S = 5.0  # a resume waits this long for its card to show the room its reservation says is there
RESTORE_MARGIN_MIB = 256  # room beyond the parked state a restore needs (the driver's own, a context's)


def holding(processes: Sequence) -> list[int]:
    """The pids of a kernel's processes that hold memory on the card (the ones a park checkpoints)."""
    return sorted({p.pid for p in processes if (p.used_mib or 0) > 0})


class CardWord:
    """The card's word for parking, read from the sampler's readings (each one asked for, none older than the
    question). Its times are the sampler's, on the system's clock, not the server's injected one (clock.py)."""

    def __init__(self, readings: Readings) -> None:
        self.readings = readings

    async def in_use(self, kernel_id: str, pids: list[int], used_mib: int) -> tuple[list[int], int]:
        """The kernel's processes on the card and what they use, from a reading taken after this call (its caches
        given back); ``pids`` and ``used_mib`` if no such reading comes within TRIMMED_READ_S."""
        reading = await self.readings.fresh(time.time(), TRIMMED_READ_S)
        usage = reading.kernels.get(kernel_id) if reading is not None else None
        if usage is None:
            return pids, used_mib
        return holding(usage.processes), usage.used_mib or 0

    async def held(self, pids: list[int]) -> int | None:
        """None once the card shows the parked processes holding nothing; else what they still hold after
        FREED_WITHIN_S."""
        mine = set(pids)

        def on_card(samples: Sequence[DeviceSample]) -> int:
            return sum((p.used_mib or 0) for s in samples for p in s.processes if p.pid in mine)

        freed = await self._shows(lambda samples: on_card(samples) <= FREED_MIB * max(1, len(pids)), FREED_WITHIN_S)
        return None if freed else on_card(self.readings.latest_samples())

    async def short(self, card_uuid: str, need_mib: int) -> int | None:
        """None once the card shows room for ``need_mib`` and the restore's margin (or gives no figure: then the
        ledger's word is all there is); else what it shows free after ROOM_WITHIN_S (memory used outside any
        reservation, which the enforcer may take back meanwhile)."""

        def free(samples: Sequence[DeviceSample]) -> int | None:
            return next((s.free_mib for s in samples if s.card.uuid == card_uuid), None)

        def room(samples: Sequence[DeviceSample]) -> bool:
            mib = free(samples)
            return mib is None or mib >= need_mib + RESTORE_MARGIN_MIB

        return None if await self._shows(room, ROOM_WITHIN_S) else free(self.readings.latest_samples())

    async def _shows(self, ok: Callable[[Sequence[DeviceSample]], bool], within_s: float) -> bool:
        """Whether a reading taken from now on shows ``ok`` within ``within_s``."""
        deadline = time.monotonic() + within_s
        while True:
            await self.readings.fresh(time.time(), READ_S)
            if ok(self.readings.latest_samples()):
                return True
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.25)
