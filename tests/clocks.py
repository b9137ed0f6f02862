"""A clock a test steps (server/clock.py's ``Clock``): its wall and monotonic times move together, by ``step``."""

from __future__ import annotations


class SteppedClock:
    def __init__(self, wall: float = 1_800_000_000.0) -> None:
        self.start = wall
        self.elapsed = 0.0  # seconds stepped so far

    def wall(self) -> float:
        return self.start + self.elapsed

    def mono(self) -> float:
        return self.elapsed

    def step(self, seconds: float) -> None:
        self.elapsed += seconds
