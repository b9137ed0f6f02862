"""The interface every GPU backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field


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
    mig_instance: int | None = None  # a MIG instance's GPU instance ID (nvidia-smi's "GI ID"); None: a whole GPU
    minor: int | None = None  # the GPU's device node, /dev/nvidia<minor> (of the whole GPU for a MIG instance)
    pci: str | None = None  # its PCI bus id, e.g. "00000000:01:00.0" (the driver's per-cgroup limits name it so)

    @property
    def label(self) -> str:
        """What people call it: "GPU 0", or "GPU 0 MIG 3" for one of several MIG instances of GPU 0."""
        return f"GPU {self.index}" if self.mig_instance is None else f"GPU {self.index} MIG {self.mig_instance}"

    def to_dict(self) -> dict:
        return {**asdict(self), "label": self.label}


@dataclass(frozen=True)
class ProcessSample:
    """One process that holds memory on a card, as the driver reports it.

    ``used_mib`` is None when the driver does not say (WDDM, some MIG set-ups); ``utilization`` is the
    process's SM use in percent over the last interval, 0 when the driver has no sample for it, and
    None when the card cannot report it at all; ``active_at`` is when the driver's last sample in that
    interval saw it use the SM (Unix seconds; None: no such sample), which can be well before the reading.
    """

    pid: int
    used_mib: int | None
    utilization: float | None = 0.0
    kind: str = "compute"  # compute | graphics | compute+graphics
    active_at: float | None = None


@dataclass(frozen=True)
class DeviceSample:
    """One reading of one card. A figure the driver could not give is None, never a guess."""

    card: Card
    total_mib: int | None = None
    used_mib: int | None = None
    free_mib: int | None = None
    utilization: float | None = None
    processes: tuple[ProcessSample, ...] = ()
    mig: bool = False
    lost: bool = False  # the driver says the card fell off the bus (GpuIsLost)
    errors: dict[str, str] = field(default_factory=dict)  # field -> why it is not available


class GpuBackend(ABC):
    """A source of cards (and, for the sampler, of per-process use)."""

    kind: str = "abstract"
    simulated: bool = False
    reason: str | None = None  # why there is no (real) GPU, when there is none

    @abstractmethod
    def cards(self) -> list[Card]:
        """The cards of this host. Raises GpuUnavailable when they cannot be read."""

    def sample(self) -> list[DeviceSample]:
        """Memory, utilisation and processes of every card (called from the sampler thread only).

        Raises GpuUnavailable when nothing can be read at all; a card or a field that cannot be read
        comes back as None figures with the reason in ``errors``. Backends that measure nothing
        return the cards with their capacity only.
        """
        return [
            DeviceSample(card=c, total_mib=c.total_mib, errors={"memory": f"{self.kind} backend does not measure use"})
            for c in self.cards()
        ]

    def close(self) -> None:  # noqa: B027 - optional hook: most backends hold nothing
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
