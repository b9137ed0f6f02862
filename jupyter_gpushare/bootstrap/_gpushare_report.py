"""Inside the kernel: this process's report of what the caps did, and the quota they read from the environment.

Standard library only, Python >= 3.9 (see ``_gpushare_boot``). The lowest layer of the bootstrap: the framework
hooks (``_gpushare_caps``, ``_gpushare_views``, ``_gpushare_oom``, ``_gpushare_alloc``) record here what they did,
and ``_gpushare_boot``, which installs them, records which framework brought which one in. Nothing here imports
another part of the bootstrap but the names of its environment (``_gpushare_env``).

Every process of the kernel that imports a framework (and the kernel process itself, at start) writes
``$GPUSHARE_REPORT_DIR/<kernel id>.<pid>.json`` (temp file + os.replace): see ``report``.
"""

from __future__ import annotations

import _thread
import os
import sys
import time

import _gpushare_env as env

TYPE_CHECKING = False  # (typing is not imported in kernels: this module runs in every process)
if TYPE_CHECKING:
    import types

_HERE = os.path.dirname(os.path.abspath(__file__))
STATE: dict = {"frameworks": {}, "warnings": [], "views": [], "nested": {}}  # nested: see pulled_in_by
STARTED = time.time()
LOCK = _thread.RLock()
HOOK_SECONDS: dict = {}  # time the bootstrap spent around each hooked import (for bench/)


class GpuShareWarning(UserWarning):
    """A GPU cap could not be applied as asked, or was changed to fit the kernel's quota."""


# -- configuration from the environment -----------------------------------------------------------


def env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def quota_mib() -> int | None:
    return env_int(env.QUOTA_MIB)


def cap_mib() -> int:
    """The quota to cap at, where ``no_cap_reason()`` is None (which names a missing quota as its reason)."""
    quota = quota_mib()
    if quota is None:
        raise RuntimeError(f"{env.QUOTA_MIB} is missing from the kernel's environment")
    return quota


def cap_fraction() -> float:
    """The quota as a fraction of the card, where ``no_cap_reason()`` is None."""
    share = fraction()
    if share is None:
        raise RuntimeError(f"{env.TORCH_FRACTION} and {env.CARD_TOTAL_MIB} are missing from the kernel's environment")
    return share


def fraction() -> float | None:
    """The quota as a fraction of the card's total memory (what torch and XLA take)."""
    try:
        return float(os.environ[env.TORCH_FRACTION])
    except (KeyError, ValueError):
        quota, total = quota_mib(), env_int(env.CARD_TOTAL_MIB)
        return quota / total if quota and total else None


def no_cap_reason() -> str | None:
    """Why no framework of this process can be capped on a GPU, or None when a cap applies."""
    mode = os.environ.get(env.MODE, "")
    reason = os.environ.get(env.REASON, "")
    if mode == "cpu":
        return "this kernel runs without a GPU (CUDA_VISIBLE_DEVICES is empty)" + (f": {reason}" if reason else "")
    if mode != "gpu":
        return "this kernel has no GPU quota, so it sees no GPU (CUDA_VISIBLE_DEVICES is empty)" + (
            f": {reason}" if reason else ""
        )
    if quota_mib() is None:
        return "GPUSHARE_QUOTA_MIB is missing from the kernel's environment"
    if os.environ.get(env.SIMULATED) == "1":
        return "the card is simulated: CUDA_VISIBLE_DEVICES is empty, so no GPU is visible"
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return "CUDA_VISIBLE_DEVICES is empty, so no GPU is visible"
    return None


# -- warnings and the report ---------------------------------------------------------------------


def version_tuple(text: str) -> tuple[int, ...]:
    import re

    return tuple(int(x) for x in re.findall(r"\d+", text.split("+")[0])[:3])


def torch_build(module) -> tuple[str | None, str | None]:
    """torch's version and CUDA version, read from torch/version.py (before torch is imported, or after); (None,
    None) for a package without a version.py."""
    import re

    for folder in getattr(getattr(module, "__spec__", None), "submodule_search_locations", None) or []:
        try:
            with open(os.path.join(folder, "version.py"), encoding="utf-8") as f:
                text = f.read()
        except OSError:
            continue
        version = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", text, re.M)
        cuda = re.search(r"^cuda(?:\s*:[^=]*)?=\s*['\"]([^'\"]+)", text, re.M)
        return (version.group(1) if version else None, cuda.group(1) if cuda else None)
    return None, None


def dist_version(module) -> str | None:
    """A package's version before its import, from the one installed distribution beside it that ships it
    (``tensorflow``, ``tensorflow-cpu``, ``tf-nightly``: its ``*.dist-info`` lists the package in
    ``top_level.txt``); None when there is none, or several of different versions."""
    found = set()
    for folder in getattr(getattr(module, "__spec__", None), "submodule_search_locations", None) or []:
        parent = os.path.dirname(os.path.abspath(folder))
        try:
            names = [n for n in os.listdir(parent) if n.endswith(".dist-info")]
        except OSError:
            continue
        for name in names:
            try:
                with open(os.path.join(parent, name, "top_level.txt"), encoding="utf-8") as f:
                    ships = module.__name__ in f.read().split()
            except OSError:
                continue
            stem = name[: -len(".dist-info")]  # <name>-<version>
            if ships and stem.count("-") == 1:
                found.add(stem.split("-")[1])
    return found.pop() if len(found) == 1 else None


def _user_stacklevel() -> int:
    """A stacklevel pointing at the first frame outside the bootstrap and the import machinery."""
    level = 1
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        internal = "importlib" in name and "_bootstrap" in name  # frames warnings.warn skips itself
        if os.path.dirname(name) != _HERE and not internal:
            return level
        frame = frame.f_back
        level += 0 if internal else 1
    return 1


def warn(message: str) -> None:
    with LOCK:
        if message not in STATE["warnings"]:
            STATE["warnings"].append(message)
            del STATE["warnings"][:-50]
    try:
        import warnings

        warnings.warn(f"jupyter-gpushare: {message}", GpuShareWarning, stacklevel=_user_stacklevel())
    except Exception:
        pass


def set_framework(
    framework: str, capped: bool, detail: str, limit_mib: int | None = None, version: str | None = None
) -> None:
    entry = {"capped": bool(capped), "limit_mib": limit_mib if capped else None, "detail": detail}
    if version:
        entry["version"] = version
    with LOCK:
        STATE["frameworks"][framework] = entry
    write_report()


def add_views(names: list) -> None:
    """Note for the report that these functions now give the kernel's quota as the GPU's size (the next
    write says so: a framework's own entry is written right after, by its cap hook)."""
    with LOCK:
        STATE["views"] = sorted(set(STATE["views"]) | set(names))


def report() -> dict:
    """This process's report, as written to the report directory."""
    with LOCK:
        root = os.environ.get(env.ROOT_PID)
        frameworks, pulled_in = {}, {}
        for name, entry in STATE["frameworks"].items():
            by = pulled_in_by(name)
            if by:
                pulled_in[name] = by
                continue
            frameworks[name] = dict(entry)
            views = [v for v in STATE["views"] if v.startswith(name + ".")]
            if views:
                frameworks[name]["views"] = views
        return {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "kernel_id": os.environ.get(env.KERNEL_ID),
            "root": root == str(os.getpid()),
            "started": STARTED,
            "time": time.time(),
            "mode": os.environ.get(env.MODE),
            "quota_mib": quota_mib(),
            "frameworks": frameworks,
            "pulled_in": pulled_in,
            "views": list(STATE["views"]),
            "warnings": list(STATE["warnings"]),
            "alloc": dict(STATE.get("alloc", {})),
            "oom": STATE.get("oom"),
            "hook_ms": {k: round(v * 1000, 3) for k, v in HOOK_SECONDS.items()},
        }


def write_report() -> None:
    directory, kernel_id = os.environ.get(env.REPORT_DIR), os.environ.get(env.KERNEL_ID)
    if not directory or not kernel_id:
        return
    pid = os.getpid()
    final = os.path.join(directory, f"{kernel_id}.{pid}.json")
    tmp = os.path.join(directory, f".{kernel_id}.{pid}.{_thread.get_ident()}.tmp")
    try:
        import json

        data = json.dumps(report())
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(data)
        os.replace(tmp, final)
    except Exception as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        with LOCK:
            note = f"could not write the cap report to {directory}: {e}"
            if note not in STATE["warnings"]:
                STATE["warnings"].append(note)


def pulled_in_by(name: str) -> str | None:
    """The framework (or Keras) whose own import alone imported ``name`` in this process; None when the
    notebook or a library that is not a GPU framework imported it (Keras's backend counts as the notebook's:
    Keras computes with it)."""
    return STATE["nested"].get(name)
