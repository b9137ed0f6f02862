"""Enforcement levels: how firmly a kernel is held to its quota, in one word, and the admin's required level.

Each level includes the ones before it:

- ``caps``: its frameworks are capped inside it (TensorFlow, PyTorch, JAX, CuPy): cooperative, and nothing acts
  on memory taken around them;
- ``watchdog``: the card is read every second, and memory beyond the lease is acted on (at once when it is memory
  other kernels reserved); its processes are found by their process tree, which a double-forked daemon leaves;
- ``cgroup``: every process it starts stays in its own cgroup, so none leaves the watchdog's sight;
- ``allocation``: the card itself refuses its processes memory past the lease, whatever they call: the NVIDIA
  driver's per-cgroup limit on its cgroup (r615+, dmem or the driver's own accounting), or an MPS pinned limit.

``GpuShareApp.required_enforcement`` makes the server and the broker refuse a kernel a GPU below that level.
"""

from __future__ import annotations

from .policy import PolicyError

LEVELS = ("caps", "watchdog", "cgroup", "allocation")
REQUIRED_CHOICES = ("none", *LEVELS)
WHAT = {
    "caps": "its frameworks' caps only (cooperative)",
    "watchdog": "a watchdog that acts on memory beyond its lease, its processes found by their process tree",
    "cgroup": "a watchdog, with every process it starts kept in its own cgroup",
    "allocation": "a limit the card enforces at allocation time",
}


def level_of(measured: bool, watchdog: str | None, tracking: str, allocation: str | None) -> str:
    """The level a kernel gets: ``measured`` whether the card's per-process use is read (NVML), ``watchdog`` the
    over-quota action, ``tracking`` "cgroup" or "tree", ``allocation`` how the card limits it (None: not)."""
    if not measured or watchdog in (None, "notify"):
        return "caps"
    if tracking != "cgroup":
        return "watchdog"
    return "allocation" if allocation else "cgroup"


def below(level: str, required: str) -> bool:
    """Whether ``level`` is below the ``required`` one ("none" requires nothing)."""
    return required != "none" and LEVELS.index(level) < LEVELS.index(required)


def check_required(level: str, required: str, why: str) -> None:
    """PolicyError (code ``level-below-required``) when a kernel would get a GPU at ``level`` below ``required``;
    ``why`` says what is missing for the next level, in words."""
    if below(level, required):
        raise PolicyError(
            f"This host holds kernels at the enforcement level '{level}' ({WHAT[level]}), and the admin requires "
            f"'{required}' (GpuShareApp.required_enforcement): {why}. No kernel gets a GPU until that is fixed; "
            "`jupyter gpushare doctor` says how.",
            "level-below-required",
            level=level,
            required=required,
        )
