"""A clock a test steps (server/clock.py's ``Clock``): its wall and monotonic times move together, by ``step``. Its
wall time starts at the real one, so what the ledger and the sampler stamp (on the system's clock) reads as recent."""

from __future__ import annotations

import time


class SteppedClock:
    def __init__(self) -> None:
        self.start = time.time()
        self.elapsed = 0.0  # seconds stepped so far

    def wall(self) -> float:
        return self.start + self.elapsed

    def mono(self) -> float:
        return self.elapsed

    def step(self, seconds: float) -> None:
        self.elapsed += seconds
