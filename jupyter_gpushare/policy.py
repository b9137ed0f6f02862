"""Sizes and quota rules: pure functions, no I/O.

Every figure is in MiB (2**20 bytes), the unit NVML and nvidia-smi report.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Iterable, Sequence

SIZE_EXAMPLES = "'4GiB', '4096MiB', '4G' or '25%' (of a card)"

# Binary units. "G"/"M"/"T" mean GiB/MiB/TiB, as in nvidia-smi and Docker; "GB"/"MB"/"TB"
# are decimal and converted.
_UNIT_MIB = {
    "kib": 1 / 1024,
    "k": 1 / 1024,
    "mib": 1.0,
    "m": 1.0,
    "gib": 1024.0,
    "g": 1024.0,
    "tib": 1024.0 * 1024,
    "t": 1024.0 * 1024,
    "kb": 1e3 / 2**20,
    "mb": 1e6 / 2**20,
    "gb": 1e9 / 2**20,
    "tb": 1e12 / 2**20,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*|%)\s*$")


class PolicyError(ValueError):
    """A configuration value or a request that the rules cannot accept."""


@dataclass(frozen=True)
class Size:
    """An amount of GPU memory: absolute (``mib``) or a share of a card (``percent``)."""

    mib: int | None = None
    percent: float | None = None

    def resolve(self, card_total_mib: int) -> int:
        """MiB this size stands for on a card of ``card_total_mib``."""
        if self.percent is not None:
            return int(card_total_mib * self.percent / 100)
        return int(self.mib or 0)

    @property
    def is_zero(self) -> bool:
        return (self.mib or 0) == 0 and (self.percent or 0) == 0

    def __str__(self) -> str:
        if self.percent is not None:
            return f"{self.percent:g}%"
        return format_mib(self.mib or 0)


def parse_size(value: object, name: str = "size", allow_percent: bool = True) -> Size:
    """Parse "4GiB", "4096MiB", "4G", "1.5 GiB", "25%" (or a Size) into a Size.

    A bare number is refused: without a unit it is ambiguous (bytes? MiB?).
    Raises PolicyError naming ``name``, the bad value and a good example.
    """
    if isinstance(value, Size):
        return value
    text = "" if value is None else str(value)
    m = _SIZE_RE.match(text)
    if not m:
        raise PolicyError(f"{name}: {text!r} is not a size. Use a number with a unit, e.g. {SIZE_EXAMPLES}.")
    number, unit = float(m.group(1)), m.group(2).lower()
    if unit == "%":
        if not allow_percent:
            raise PolicyError(f"{name}: {text!r} is a percentage, but this setting needs an absolute size, e.g. '640MiB'.")
        if number > 100:
            raise PolicyError(f"{name}: {text!r} is more than a whole card; use at most '100%', e.g. '25%'.")
        return Size(percent=number)
    if unit not in _UNIT_MIB:
        if unit == "":
            hint = f"add a unit, e.g. '{m.group(1)}MiB' or '{m.group(1)}GiB'"
        else:
            hint = f"the unit {m.group(2)!r} is not known; use e.g. {SIZE_EXAMPLES}"
        raise PolicyError(f"{name}: {text!r} is not a size: {hint}.")
    return Size(mib=int(math.floor(number * _UNIT_MIB[unit])))


def format_mib(mib: float) -> str:
    """512 -> '512 MiB', 3584 -> '3.5 GiB', 0 -> '0 MiB'."""
    if abs(mib) >= 1024:
        return f"{mib / 1024:.1f} GiB".replace(".0 GiB", " GiB")
    return f"{int(round(mib))} MiB"


ON_FULL_CHOICES = ("queue", "cpu", "reject")


@dataclass(frozen=True)
class CardView:
    """What placement needs to know of a card: identity, capacity and what is already reserved."""

    uuid: str
    index: int
    total_mib: int
    reserved_mib: int = 0


@dataclass(frozen=True)
class Policy:
    """The admin's quota rules, already parsed (see app.py for the config traits)."""

    default_quota: Size = Size(mib=4096)
    max_quota: Size | None = None
    context_reserve_mib: int = 640
    headroom: Size = Size(mib=0)
    on_full: str = "queue"
    queue_timeout_s: float = 600.0
    kernel_quotas: dict[str, Size] = field(default_factory=dict)
    cards: tuple[str, ...] = ()

    def quota_for(self, kernel_name: str, language: str, requested: Size | None = None) -> Size | None:
        """The quota a kernel gets, or None when it reserves nothing.

        An explicit request wins; then a per-kernelspec quota; then the default for Python kernels.
        Kernels of other languages reserve nothing unless configured.
        """
        if requested is not None:
            quota = requested
        elif kernel_name in self.kernel_quotas:
            quota = self.kernel_quotas[kernel_name]
        elif (language or "").lower() == "python":
            quota = self.default_quota
        else:
            return None
        return None if quota.is_zero else quota

    def card_allowed(self, uuid: str, index: int) -> bool:
        return not self.cards or uuid in self.cards or str(index) in self.cards

    def usable_mib(self, total_mib: int) -> int:
        """What may be reserved on a card: its memory less the headroom kept free."""
        return max(0, total_mib - self.headroom.resolve(total_mib))

    def need_mib(self, quota: Size, total_mib: int) -> int:
        """Reservation on a card for a quota: the quota plus the CUDA context reserve."""
        return quota.resolve(total_mib) + self.context_reserve_mib

    def check_quota(self, quota: Size, cards: Iterable[CardView]) -> None:
        """Refuse a quota above the admin's maximum, or one no allowed card could ever hold."""
        cards = [c for c in cards if self.card_allowed(c.uuid, c.index)]
        if not cards:
            return
        if self.max_quota is not None and all(quota.resolve(c.total_mib) > self.max_quota.resolve(c.total_mib) for c in cards):
            biggest = max(self.max_quota.resolve(c.total_mib) for c in cards)
            raise PolicyError(
                f"A quota of {quota} is more than the largest a kernel may have here "
                f"({format_mib(biggest)}, GpuShareApp.max_quota). Ask for at most {format_mib(biggest)}."
            )
        if all(self.need_mib(quota, c.total_mib) > self.usable_mib(c.total_mib) for c in cards):
            biggest = max(self.usable_mib(c.total_mib) - self.context_reserve_mib for c in cards)
            raise PolicyError(
                f"A quota of {quota} does not fit on any card even when it is empty: the most a kernel can "
                f"reserve here is {format_mib(max(0, biggest))} plus the {format_mib(self.context_reserve_mib)} "
                "CUDA context reserve."
            )

    def place(self, quota: Size, cards: Sequence[CardView]) -> CardView | None:
        """Best fit: the allowed card with the least unreserved memory that still holds the quota."""
        best: tuple[int, int, CardView] | None = None
        for card in cards:
            if not self.card_allowed(card.uuid, card.index):
                continue
            left = self.usable_mib(card.total_mib) - card.reserved_mib - self.need_mib(quota, card.total_mib)
            if left < 0:
                continue
            if best is None or (left, card.index) < best[:2]:
                best = (left, card.index, card)
        return best[2] if best else None
