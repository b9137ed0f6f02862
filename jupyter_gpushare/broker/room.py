"""When the host's line may move, said to the servers that wait on it (the ``watch`` request), not found by polling.

A reservation given back, a wait ended, a lease shrunk, the line reordered: each is a change after which a waiting
kernel may be granted. The broker counts them; a server holds one ``watch`` request on a connection of its own,
which the broker answers at the next change (or after the wait the server asked for), and the server then asks
the ledger for its kernels in line at once (server/room_watch.py). A count, not the change itself: a server reads
the line as it always does, and a change missed between two watches is seen by the count having moved.
"""

from __future__ import annotations

import asyncio
import contextlib

# The requests after which a waiting kernel may fit, or come first, when they changed something (their answer says
# so: a lease, a list, a notice; a wait stopped and the broker's own reaps are counted where they happen). A request
# that changed nothing counts nothing: a caller cannot wake every server of the host with it.
ROOM_OPS = frozenset({"release", "release_owned_except", "resize", "act"})
# Of those, the ones that give leases back: the broker reads the cards again before its next grant (CardReading.stale)
FREEING_OPS = frozenset({"release", "release_owned_except", "act"})


class RoomChanges:
    """The count of changes that may move the line, and the watchers waiting for the next one."""

    def __init__(self) -> None:
        self.version = 0
        self._next: asyncio.Event | None = None

    def changed(self) -> None:
        self.version += 1
        if self._next is not None:
            self._next.set()
            self._next = None

    async def past(self, since: int, wait_s: float) -> int:
        """The count once it differs from ``since`` (at once if it does: a change made meanwhile, or a broker that
        restarted), or after ``wait_s`` seconds."""
        if self.version != since:
            return self.version
        if self._next is None:
            self._next = asyncio.Event()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._next.wait(), wait_s)
        return self.version
