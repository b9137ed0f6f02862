"""The typed ledger worker: every call to a server's ledger (its own SQLite file, or the host's broker) runs on
one thread of its own, so nothing blocks the Tornado IOLoop, and a ledger that cannot be opened is tried again,
backing off from 1 s to 60 s, while kernels start without a GPU and say why.

Calls are typed against the ``ledger.Reservations`` protocol: a caller hands a function of the ledger
(``on(lambda ledger: ledger.release(kernel_id))``), never a method name.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

from ..broker import BrokerLedger
from ..core.addresses import BrokerAt
from ..ledger.ledger import Lease, Ledger, LedgerError
from ..ledger.reservations import Reservations

T = TypeVar("T")
RETRY_S = (1.0, 60.0)  # a ledger that cannot be opened is tried again after 1 s, doubling up to 60 s


class LedgerWorker:
    """One server's ledger, on its own thread."""

    def __init__(
        self,
        path: str,
        broker: BrokerAt | None = None,
        log: logging.Logger | None = None,
        on_reclaimed: Callable[[Sequence[Lease]], None] = lambda leases: None,
    ):
        """``path``: the ledger file; ``broker``: reserve through the host's broker instead (broker/);
        ``on_reclaimed``: told of the leases of
        dead kernels reclaimed as the ledger opens."""
        self.path, self.broker = path, broker
        self.log = log or logging.getLogger("jupyter_gpushare")
        self.on_reclaimed = on_reclaimed
        self.error: str | None = None  # why the ledger cannot be used now (None: it can)
        self._ledger: Reservations | None = None
        self._retry_at, self._retry_after = 0.0, RETRY_S[0]
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpushare-ledger")
        self._thread.submit(self._open).result()

    @property
    def replaced(self) -> bool | None:
        """Whether the ledger file was found replaced and re-entered (``Ledger.replaced``; None through a broker)."""
        return getattr(self._ledger, "replaced", None)

    # -- on the ledger's thread --------------------------------------------------------------------------------

    def _open(self) -> None:
        """Open the ledger (or the broker's client); on failure say why and try again later (``ensure``)."""
        try:
            ledger = self._connect(on_state=lambda e: setattr(self, "error", e))
            self._ledger = ledger
            reclaimed = ledger.reap()
        except LedgerError as e:
            if self._ledger is not None:
                self._ledger.close()
            self._ledger = None
            if self.error != str(e):
                self.log.error("%s Kernels will start without a GPU until this is fixed.", e)
            self.error = str(e)
            self._retry_at = time.monotonic() + self._retry_after
            self._retry_after = min(RETRY_S[1], self._retry_after * 2)
            return
        if self.error is not None:
            self.log.warning("jupyter-gpushare: the GPU ledger %s can be used again.", self.path)
        self.error, self._retry_after = None, RETRY_S[0]
        self.on_reclaimed(reclaimed)

    def _connect(self, on_state: Callable[[str | None], None] | None = None) -> Reservations:
        """A new connection to the ledger: the file, or the host's broker (many users on this host: their broker
        owns the ledger; ``on_state`` is told when it goes down or comes back)."""
        if self.broker is not None:
            return BrokerLedger.at(self.broker, on_state=on_state)
        return Ledger(self.path)

    def twin(self) -> BrokerLedger | None:
        """A broker client of its own (for a request that holds its connection: room_watch.py); None without a
        broker."""
        return BrokerLedger.at(self.broker) if self.broker is not None else None

    def ensure(self) -> bool:
        """Whether a ledger is open, opening it again when its back-off has passed."""
        if self._ledger is None and time.monotonic() >= self._retry_at:
            self._open()
        return self._ledger is not None

    def call(self, call: Callable[[Reservations], T]) -> T | None:
        """``call(ledger)``; None while the ledger cannot be opened. LedgerError is the caller's."""
        if not self.ensure():
            return None
        assert self._ledger is not None
        return call(self._ledger)

    def must(self, call: Callable[[Reservations], T]) -> T:
        """``call(ledger)``, or LedgerError (with why) while the ledger cannot be opened."""
        if not self.ensure():
            raise LedgerError(self.error or "the GPU ledger cannot be opened")
        assert self._ledger is not None
        return call(self._ledger)

    # -- from the IOLoop ---------------------------------------------------------------------------------------

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Any function on the ledger's thread (one that calls ``call`` or ``must`` itself)."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def on(self, call: Callable[[Reservations], T]) -> T | None:
        """``call`` from the IOLoop; as the program exits (an atexit clean-up, as nbclient's, once the interpreter
        has stopped the executors' threads), on a connection of its own, in this thread (``at_exit``)."""
        try:
            running = asyncio.get_running_loop().run_in_executor(self._thread, self.call, call)
        except RuntimeError:  # "cannot schedule new futures after (interpreter) shutdown"
            return self.at_exit(call)
        return await running

    async def available(self) -> bool:
        """Whether the ledger can be used now (opening it again if its back-off has passed)."""
        return await self.run(self.ensure)

    async def quietly(self, what: str, call: Callable[[Reservations], T]) -> T | None:
        """A call whose failure is logged, not raised (clean-up on a path that is already failing)."""
        try:
            return await self.on(call)
        except LedgerError as e:
            self.log.warning("jupyter-gpushare: %s failed: %s", what, e)
            return None

    def later(self, what: str, call: Callable[[Reservations], Any]) -> None:
        """``call`` on the ledger's thread, not waited for; a failure is logged (from any thread; nothing once
        the worker is closed: the server is going away)."""

        def run() -> None:
            try:
                self.call(call)
            except LedgerError as e:
                self.log.info("jupyter-gpushare: %s failed: %s", what, e)

        try:
            self._thread.submit(run)
        except RuntimeError:  # closed
            pass

    def at_exit(self, call: Callable[[Reservations], T]) -> T:
        """``call`` on a ledger connection of its own, in this thread, for a program that exits: the interpreter
        stops the ledger's thread before atexit handlers run. LedgerError is the caller's."""
        ledger = self._connect()
        try:
            return call(ledger)
        finally:
            ledger.close()

    def close(self) -> None:
        if self._ledger is not None:
            self._thread.submit(self._ledger.close).result()
        self._thread.shutdown(wait=False)
