"""The one clock of a server's parts. The line, parking and the enforcer read the time only through the ``Clock``
the manager gives them, so a test steps it instead of waiting, and no part mixes the two kinds of time:

- ``wall()``: seconds since the epoch, as the ledger writes them and the page shows them (when a kernel joined the
  line, when it gives up, how long a park held its memory);
- ``mono()``: this process's intervals and deadlines (a kernel's idle time, a retry's hold-off): a change of the
  wall clock neither ends nor prolongs them.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def wall(self) -> float: ...
    def mono(self) -> float: ...


class SystemClock:
    """The process's own clocks."""

    def wall(self) -> float:
        return time.time()

    def mono(self) -> float:
        return time.monotonic()


SYSTEM = SystemClock()
