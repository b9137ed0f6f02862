"""The interface every GPU backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass


class GpuUnavailable(RuntimeError):
    """No GPU can be used: no driver, no NVML library, or the card was lost. The text says which."""


@dataclass(frozen=True)
class Card:
    """One schedulable GPU (a whole card, or a MIG instance)."""

    index: int
    uuid: str
    name: str
    total_mib: int
    simulated: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


class GpuBackend(ABC):
    """A source of cards (and, for the sampler, of per-process use)."""

    kind: str = "abstract"
    simulated: bool = False
    reason: str | None = None  # why there is no (real) GPU, when there is none

    @abstractmethod
    def cards(self) -> list[Card]:
        """The cards of this host. Raises GpuUnavailable when they cannot be read."""

    def close(self) -> None:
        """Release the library handle, if any."""

    def describe(self) -> dict:
        """A JSON-ready summary for the API and logs."""
        return {"backend": self.kind, "simulated": self.simulated, "reason": self.reason}


class NoGpuBackend(GpuBackend):
    """No GPU on this host, or none reachable: kernels start without one, and the API says why."""

    kind = "none"

    def __init__(self, reason: str):
        self.reason = reason

    def cards(self) -> list[Card]:
        return []
