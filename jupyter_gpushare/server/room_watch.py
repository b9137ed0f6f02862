"""Another server's release, pushed: this server holds one ``watch`` request at the host's broker (broker/room.py),
which the broker answers as soon as the line may move anywhere on the host (a reservation given back, a wait
ended, the line reordered); the line then asks the ledger for its kernels in line at once, not at its next poll.

A thread of its own, on a broker connection of its own (the request holds it). A broker without ``watch`` (an
older one) ends it: the line polls as before. A broker that is down is watched again every RETRY_S.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Callable

from ..broker.client import BrokerLedger, BrokerSaidNo
from ..ledger.ledger import LedgerError

WATCH_S = 25.0  # how long one watch may be held (the broker answers at the next change, or then)
RETRY_S = 5.0  # a broker that cannot be reached is watched again after this
FIRST_S = 0.001  # the first watch on a connection: the count now, and whether the broker says changes at all


class RoomWatch:
    """Wakes the line (``wake``, on the IOLoop) at each change the broker says; ``live`` while a watch is held."""

    def __init__(self, client: BrokerLedger, wake: Callable[[], None], log: logging.Logger) -> None:
        self._client, self._wake, self._log = client, wake, log
        self._loop = asyncio.get_running_loop()
        self.live = False
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpushare-room-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self.live = False
        self._client.close()  # a watch held now fails at once

    def _run(self) -> None:
        seen, wait_s = 0, FIRST_S
        while not self._stopped.is_set():
            try:
                count = self._client.watch(seen, wait_s)
            except BrokerSaidNo as e:  # a broker without 'watch': the line polls
                self.live = False
                self._log.info("jupyter-gpushare: the GPU broker does not say changes (%s); the line polls.", e)
                return
            except LedgerError:  # down, or stopped meanwhile
                self.live, wait_s = False, FIRST_S
                self._stopped.wait(RETRY_S)
                continue
            self.live, wait_s = True, WATCH_S  # from here on, a watch is held at the broker
            if count != seen:
                seen = count
                if not self._stopped.is_set():
                    self._loop.call_soon_threadsafe(self._wake)
