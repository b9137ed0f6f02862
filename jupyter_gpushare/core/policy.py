"""Sizes and quota rules: pure functions, no I/O.

Every figure is in MiB (2**20 bytes), the unit NVML and nvidia-smi report.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

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
# ASCII digits only (``\\d`` would take Arabic-Indic or full-width digits too), at most 15 before the point
# and 9 after it: enough for any card, and no 5,000-digit number reaches float().
_SIZE_RE = re.compile(
    r"\s*(-?)\s*([0-9]{1,15}(?:\.[0-9]{1,9})?(?:[eE][+-]?[0-9]{1,3})?)\s*([A-Za-z]{0,12}|%)\s*", re.ASCII
)
MAX_MIB = 1 << 30  # 1 PiB: no card comes near it; a bigger figure is a typo or a crafted request


class PolicyError(ValueError):
    """A configuration value or a request that the rules cannot accept.

    A request's refusal names its rule: ``code`` (words.CATALOGUE's ``policy.<code>``, and ``event.refused-<code>``
    for a kernel that did not start) with its figures in ``params``, so the sidebar words it itself; the message
    is the English for logs and the CLI. A configuration error has no code.
    """

    def __init__(self, message: str, code: str | None = None, **params: Any) -> None:
        super().__init__(message)
        self.code, self.params = code, params


@dataclass(frozen=True)
class Size:
    """An amount of GPU memory: absolute (``mib``, whole MiB) or a share of a card (``percent``).

    The one constructor of every size, from config, REST or the broker's wire: exactly one of the two, a
    number (never a bool), finite, from 0 to ``MAX_MIB`` or 100%. Anything else raises PolicyError, so no
    negative, infinite or NaN size can reach placement. Zero is a valid size (a headroom of '0MiB'); whether
    a quota may be zero is the Policy's to say (``min_quota``).
    """

    mib: int | None = None
    percent: float | None = None

    def __post_init__(self) -> None:
        if (self.mib is None) == (self.percent is None):
            raise PolicyError(f"A size is either MiB or a percentage of a card, exactly one; got {self!r}.")
        if self.mib is not None:
            if type(self.mib) is not int or not 0 <= self.mib <= MAX_MIB:
                raise PolicyError(f"{_shown(self.mib)} MiB is not a size: use a whole number of MiB from 0 to 1 PiB.")
        elif (
            isinstance(self.percent, bool)
            or not isinstance(self.percent, (int, float))
            or not 0 <= self.percent <= 100  # also False for NaN
        ):
            raise PolicyError(f"{_shown(self.percent)}% is not a size: use a share of a card from 0 to 100%.")

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


def _shown(value: object) -> str:
    """A value for an error message, cut short: a crafted request may send megabytes (or a 5,000-digit int)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**40:
        return f"a number of about {int(value.bit_length() * 0.30103)} digits"
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def parse_size(value: object, name: str = "size", allow_percent: bool = True, least_mib: int = 1) -> Size:
    """Parse "4GiB", "4096MiB", "4G", "1.5 GiB", "25%", "1e3 MiB" (or a Size) into a Size.

    A bare number is refused: without a unit it is ambiguous (bytes? MiB?); the fix it suggests is never below
    ``least_mib`` (a quota's minimum). So are numbers that are not text (``True``, ``1e999``), digits other than
    ASCII's, negative sizes and sizes past ``MAX_MIB``, each with its own reason (code ``size-too-large`` for the
    last, which a caller may say with its own maximum). Raises PolicyError naming ``name``, the bad value and a
    good example.
    """
    if isinstance(value, Size):
        return value
    if not isinstance(value, str):
        raise PolicyError(f"{name}: {_shown(value)} is not a size. Use text with a unit, e.g. {SIZE_EXAMPLES}.")
    shown = _shown(value)
    m = _SIZE_RE.fullmatch(value)
    if not m:
        raise PolicyError(f"{name}: {shown} is not a size. Use a number with a unit, e.g. {SIZE_EXAMPLES}.")
    number, unit = float(m.group(2)), m.group(3).lower()
    if m.group(1) and number > 0:
        least = f", and at least {format_mib(least_mib)} here" if least_mib > 1 else ""
        raise PolicyError(f"{name}: {shown} is negative: a size counts memory from zero up{least}, e.g. '4GiB'.")
    if unit == "%":
        if not allow_percent:
            raise PolicyError(
                f"{name}: {shown} is a percentage, but this setting needs an absolute size, e.g. '640MiB'."
            )
        if number > 100:
            raise PolicyError(f"{name}: {shown} is more than a whole card; use at most '100%', e.g. '25%'.")
        return Size(percent=number)
    if unit not in _UNIT_MIB:
        if unit == "":
            fixes = [f"'{m.group(2)}{u}'" for u in ("MiB", "GiB") if number * _UNIT_MIB[u.lower()] >= max(1, least_mib)]
            hint = f"add a unit, e.g. {' or '.join(fixes)}" if fixes else f"add a unit, e.g. {SIZE_EXAMPLES}"
        else:
            hint = f"the unit {m.group(3)!r} is not known; use e.g. {SIZE_EXAMPLES}"
        raise PolicyError(f"{name}: {shown} is not a size: {hint}.")
    mib = number * _UNIT_MIB[unit]
    if not mib <= MAX_MIB:
        raise PolicyError(
            f"{name}: {shown} is more than 1 PiB; no GPU has that much memory. Use e.g. {SIZE_EXAMPLES}.",
            "size-too-large",
        )
    return Size(mib=int(math.floor(mib)))


def format_mib(mib: float) -> str:
    """512 -> '512 MiB', 3584 -> '3.5 GiB', 0 -> '0 MiB'. Halves round up (15,616 MiB is 15.25 GiB: '15.3 GiB'), as
    the sidebar's formatMiB does, so that a figure reads the same wherever it is said."""
    if abs(mib) >= 1024:
        tenths = math.floor(abs(mib) * 10 / 1024 + 0.5) * (1 if mib >= 0 else -1)
        return f"{tenths / 10:.1f} GiB".replace(".0 GiB", " GiB")
    return f"{math.floor(mib + 0.5)} MiB"


ON_FULL_CHOICES = ("queue", "cpu", "reject")
LINE_PLACES = ("start", "first-use")  # when a kernel asks for its reservation (GpuShareApp.line_place)
LINE_CPU = ("idle", "normal")  # a kernel in line's CPU priority (GpuShareApp.line_cpu)
OVER_QUOTA_ACTIONS = ("protect", "notify", "interrupt", "restart", "shutdown")
IDLE_ACTIONS = ("warn", "shutdown")
DEFAULT_MIN_QUOTA_MIB = 256


def _quota_figures(quota: Size, total_mib: int) -> dict[str, Any]:
    """A refused quota's figures: its MiB on the largest card, and the share typed for a percentage."""
    figures: dict[str, Any] = {"quota_mib": quota.resolve(total_mib)}
    if quota.percent is not None:
        figures["share_pct"] = int(quota.percent) if quota.percent == int(quota.percent) else quota.percent
    return figures


def _quota_text(quota: Size, total_mib: int) -> str:
    """The same in English, as words.CATALOGUE's "{quota_mib}[ ({share_pct}% of a card)]" says it."""
    figures = _quota_figures(quota, total_mib)
    share = f" ({figures['share_pct']}% of a card)" if "share_pct" in figures else ""
    return format_mib(figures["quota_mib"]) + share


@dataclass(frozen=True)
class CardView:
    """What placement needs to know of a card: identity, capacity, what is already reserved, and what
    processes that hold no reservation use on it (measured: a script in a terminal, a program started
    outside Jupyter), which is taken as well until they exit."""

    uuid: str
    index: int
    total_mib: int
    reserved_mib: int = 0
    outside_mib: int = 0

    def room_mib(self, policy: Policy) -> int:
        """What new kernels may still reserve on the card."""
        return policy.usable_mib(self.total_mib) - self.reserved_mib - self.outside_mib


@dataclass(frozen=True)
class Policy:
    """The admin's quota rules, already parsed (see app.py for the config traits)."""

    default_quota: Size = Size(mib=4096)
    max_quota: Size | None = None
    min_quota: Size = Size(mib=DEFAULT_MIN_QUOTA_MIB)
    context_reserve_mib: int = 640
    headroom: Size = Size(mib=0)
    on_full: str = "queue"
    line_place: str = "start"  # "first-use": a server's Python kernel asks at its first GPU framework import
    line_cpu: str = "idle"  # "normal": a kernel in line competes for the CPU with the kernels that hold a GPU
    queue_timeout_s: float = 600.0
    overtake_limit_s: float = 300.0  # a kernel in line is passed by later ones that fit for at most this long
    max_waiting: int = 10  # kernels one user may have in line; 0 = no cap
    kernel_quotas: dict[str, Size] = field(default_factory=dict)
    cards: tuple[str, ...] = ()
    required_level: str = "none"  # levels.py: no kernel gets a GPU held less firmly than this

    def quota_for(self, kernel_name: str, language: str, requested: Size | None = None) -> Size | None:
        """The quota a kernel gets, or None when it reserves nothing (and then sees no GPU).

        An explicit request wins; then a per-kernelspec quota; then the default for Python kernels.
        Kernels of other languages reserve nothing unless configured. A quota of zero is the explicit
        choice of no GPU.
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

    def largest_quota_mib(self, total_mib: int) -> int:
        """The largest quota a kernel may have on a card of ``total_mib``: what the card can hold beside the CUDA
        context reserve, and at most ``max_quota``."""
        biggest = self.usable_mib(total_mib) - self.context_reserve_mib
        if self.max_quota is not None:
            biggest = min(biggest, self.max_quota.resolve(total_mib))
        return max(0, biggest)

    def need_mib(self, quota: Size, total_mib: int) -> int:
        """Reservation on a card for a quota: the quota plus the CUDA context reserve."""
        return quota.resolve(total_mib) + self.context_reserve_mib

    def check_quota(self, quota: Size, cards: Iterable[CardView]) -> None:
        """Refuse a quota below the admin's minimum or above the maximum, or one no allowed card could ever hold."""
        cards = [c for c in cards if self.card_allowed(c.uuid, c.index)]
        totals = [c.total_mib for c in cards]
        if not totals and quota.mib is not None and self.min_quota.mib is not None:
            totals = [0]  # no card to take a percentage of, but two absolute sizes still compare
        least = [self.min_quota.resolve(t) for t in totals if quota.resolve(t) < self.min_quota.resolve(t)]
        if least:
            raise PolicyError(
                f"A quota of {_quota_text(quota, max(totals))} is less than the smallest a kernel may have here ({format_mib(max(least))}). "
                f"Ask for at least {format_mib(max(least))}.",
                "quota-below-min", **_quota_figures(quota, max(totals)), least_mib=max(least),
            )  # fmt: skip
        if not cards:
            return
        if self.max_quota is not None and all(
            quota.resolve(c.total_mib) > self.max_quota.resolve(c.total_mib) for c in cards
        ):
            biggest = max(self.max_quota.resolve(c.total_mib) for c in cards)
            raise PolicyError(
                f"A quota of {_quota_text(quota, max(c.total_mib for c in cards))} is more than the largest a kernel may have here "
                f"({format_mib(biggest)}). Ask for at most {format_mib(biggest)}.",
                "quota-above-max", **_quota_figures(quota, max(c.total_mib for c in cards)), most_mib=biggest,
            )  # fmt: skip
        if all(self.need_mib(quota, c.total_mib) > self.usable_mib(c.total_mib) for c in cards):
            biggest = max(self.usable_mib(c.total_mib) - self.context_reserve_mib for c in cards)
            raise PolicyError(
                f"A quota of {_quota_text(quota, max(c.total_mib for c in cards))} does not fit on any card even when it is empty: the most a kernel can "
                f"reserve here is {format_mib(max(0, biggest))} plus the {format_mib(self.context_reserve_mib)} "
                "CUDA context reserve.",
                "quota-unfit", **_quota_figures(quota, max(c.total_mib for c in cards)), most_mib=max(0, biggest),
                reserve_mib=self.context_reserve_mib,
            )  # fmt: skip

    def place(self, quota: Size, cards: Sequence[CardView]) -> CardView | None:
        """Best fit: the allowed card with the least unreserved memory that still holds the quota."""
        best: tuple[int, int, CardView] | None = None
        for card in cards:
            if not self.card_allowed(card.uuid, card.index):
                continue
            left = card.room_mib(self) - self.need_mib(quota, card.total_mib)
            if left < 0:
                continue
            if best is None or (left, card.index) < best[:2]:
                best = (left, card.index, card)
        return best[2] if best else None


@dataclass(frozen=True)
class EnforcePolicy:
    """The over-quota and idle rules (enforce.py applies them)."""

    near_ratio: float = 0.9  # of the reservation; 0 = no near-quota warning
    over_grace_s: float = 30.0
    over_action: str = "protect"
    idle_timeout_s: float = 3600.0  # 0 = no idle policy
    idle_action: str = "warn"
    idle_shutdown_delay_s: float = 600.0


# -- per-user limits (enforced host-wide by the broker, inside the ledger transaction) -------------

LIMIT_FIELDS = ("max_total", "max_kernel", "max_kernels")
LIMIT_EXAMPLE = "{'max_total': '16GiB', 'max_kernel': '8GiB', 'max_kernels': 2}"


@dataclass(frozen=True)
class UserLimits:
    """What one user may hold at once, host-wide. None = no limit of that kind.

    ``max_total`` bounds the sum of the quotas of the user's kernels (the CUDA context reserve is
    not counted: it is the same for everyone and the user cannot change it); ``max_kernel`` bounds
    one kernel's quota; ``max_kernels`` bounds how many of the user's kernels hold GPU memory.
    """

    max_total: Size | None = None
    max_kernel: Size | None = None
    max_kernels: int | None = None

    def to_dict(self) -> dict[str, str | int | None]:
        return {
            "max_total": str(self.max_total) if self.max_total is not None else None,
            "max_kernel": str(self.max_kernel) if self.max_kernel is not None else None,
            "max_kernels": self.max_kernels,
        }

    def check(self, user: str, quota_mib: int, card_total_mib: int, held_quota_mib: Sequence[int]) -> None:
        """Refuse a new kernel of ``quota_mib`` when the user already holds ``held_quota_mib``.

        Raises PolicyError with the limit, what the user holds and what to do.
        """
        who = f"User {user!r}" if user else "This user"
        if self.max_kernel is not None and quota_mib > self.max_kernel.resolve(card_total_mib):
            limit = self.max_kernel.resolve(card_total_mib)
            raise PolicyError(
                f"{who} may give one kernel at most {format_mib(limit)} of GPU memory (per-user limit "
                f"max_kernel); this kernel asks for {format_mib(quota_mib)}. Ask for at most {format_mib(limit)}.",
                "user-max-kernel", limit_mib=limit, quota_mib=quota_mib,
            )  # fmt: skip
        if self.max_kernels is not None and len(held_quota_mib) + 1 > self.max_kernels:
            raise PolicyError(
                f"{who} may run at most {self.max_kernels} GPU kernel(s) at once (per-user limit max_kernels) "
                f"and already runs {len(held_quota_mib)}. Shut down a kernel you no longer use "
                "(Kernel > Shut Down Kernel), then start this one again.",
                "user-max-kernels", max_kernels=self.max_kernels, kernels=len(held_quota_mib),
            )  # fmt: skip
        if self.max_total is not None:
            limit, held = self.max_total.resolve(card_total_mib), sum(held_quota_mib)
            if held + quota_mib > limit:
                left = limit - held
                smaller = f", or ask for at most {format_mib(left)}" if left > 0 else ""
                raise PolicyError(
                    f"{who} may hold at most {format_mib(limit)} of GPU memory in all kernels together (per-user "
                    f"limit max_total); your kernels already hold {format_mib(held)} and this one asks for "
                    f"{format_mib(quota_mib)}. Shut down a kernel you no longer use{smaller}.",
                    "user-max-total", limit_mib=limit, held_mib=held, quota_mib=quota_mib,
                )  # fmt: skip


def parse_limits(value: object, name: str) -> dict[str, Size | int | None]:
    """One limits entry of the config, e.g. {'max_total': '16GiB', 'max_kernels': 2}.

    Returns only the fields the entry sets; a field set to None (or 'none') means "no limit",
    overriding a default. Raises PolicyError naming ``name`` and the bad field.
    """
    if isinstance(value, UserLimits):
        value = value.to_dict()
    if not isinstance(value, dict):
        raise PolicyError(f"{name}: {value!r} is not a limits entry. Use a dict, e.g. {LIMIT_EXAMPLE}.")
    out: dict[str, Size | int | None] = {}
    for key, raw in value.items():
        if key not in LIMIT_FIELDS:
            raise PolicyError(f"{name}: {key!r} is not a limit. Use {', '.join(LIMIT_FIELDS)}, e.g. {LIMIT_EXAMPLE}.")
        if raw is None or (isinstance(raw, str) and raw.strip().lower() in ("none", "unlimited")):
            out[key] = None
        elif key == "max_kernels":
            if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
                raise PolicyError(
                    f"{name}[{key!r}]: {raw!r} is not a count of kernels; use e.g. 2 (or None: no limit)."
                )
            out[key] = raw
        else:
            out[key] = parse_size(raw, f"{name}[{key!r}]")
    return out


def _generosity(value: Size | int | None, card_total_mib: int) -> float:
    if value is None:
        return math.inf
    return value.resolve(card_total_mib) if isinstance(value, Size) else value


@dataclass(frozen=True)
class LimitRules:
    """Per-user limits from the config: defaults, then the user's groups, then the user's own entry.

    Among the user's groups, each field takes the most generous value a group sets (no limit is
    the most generous). An entry for the user by name overrides both.
    """

    defaults: dict[str, Size | int | None] = field(default_factory=dict)
    users: dict[str, dict[str, Size | int | None]] = field(default_factory=dict)
    groups: dict[str, dict[str, Size | int | None]] = field(default_factory=dict)

    @classmethod
    def parse(cls, defaults: object, users: dict, groups: dict, prefix: str = "GpuShareBroker") -> LimitRules:
        return cls(
            defaults=parse_limits(defaults or {}, f"{prefix}.default_limits"),
            users={u: parse_limits(v, f"{prefix}.user_limits[{u!r}]") for u, v in (users or {}).items()},
            groups={g: parse_limits(v, f"{prefix}.group_limits[{g!r}]") for g, v in (groups or {}).items()},
        )

    def for_user(self, user: str, groups: Iterable[str], card_total_mib: int = 0) -> UserLimits:
        """The limits of ``user`` (a member of ``groups``); ``card_total_mib`` ranks percentages."""
        merged = dict(self.defaults)
        from_groups: dict[str, Size | int | None] = {}
        for group in groups:
            for key, value in self.groups.get(group, {}).items():
                if key not in from_groups or _generosity(value, card_total_mib) > _generosity(
                    from_groups[key], card_total_mib
                ):
                    from_groups[key] = value
        merged.update(from_groups)
        merged.update(self.users.get(user, {}))
        return UserLimits(**merged)  # type: ignore[arg-type]


FRAMEWORKS = ("cupy", "jax", "tensorflow", "torch")  # what the bootstrap caps and a kernel reports (reports.py)
# What a warm kernel may not import before its hand-over (GpuShareApp.warm_imports): the bootstrap's WAITS (their import
# waits for the kernel's GPU and caps) and Keras, which imports one of them.
GPU_IMPORTS = ("torch", "tensorflow", "jax", "cupy", "numba.cuda", "pycuda", "keras")
# Of those, what a warm kernel imports all the same (the bootstrap's WARM_FIRST): its code runs, touching no GPU, and
# its module is kept for the notebook's own import, which waits for the GPU and sets the caps then.
WARM_FRAMEWORKS = ("torch",)


def warm_import_problem(name: object) -> str | None:
    """Why a warm kernel may not import ``name`` (GpuShareApp.warm_imports), or None."""
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", name):
        return f"{name!r} is not a module's name; use e.g. 'numpy'."
    if name not in WARM_FRAMEWORKS and (name.partition(".")[0] in GPU_IMPORTS or name in GPU_IMPORTS):
        return (
            f"{name!r} is a GPU framework: its import waits for the kernel's GPU, which a warm kernel has not got. "
            "Remove it (a kernel imports it while it waits in line); of the GPU frameworks, only "
            f"{', '.join(WARM_FRAMEWORKS)} may be imported warm."
        )
    return None


MAX_WARM_KERNELS = 32  # GpuShareApp.warm_kernels, per kernelspec


@dataclass(frozen=True)
class ParkRules:
    """The admin's parking settings (GpuShareApp.park_*)."""

    after_s: float = 600.0  # idle this long while someone waits: parked (0: never)
    frameworks: tuple[str, ...] = ("torch", "cupy", "tensorflow")  # whose state survives a park (measured)
    host_budget_mib: int | None = None  # host memory all parked state may take (None: no limit)
