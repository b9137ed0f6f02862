"""Inside the kernel: a short note after a GPU framework's out-of-memory traceback.

Standard library only, Python >= 3.9 (see ``_gpushare_boot``). Each framework's hook registers its
out-of-memory error classes here (``register_oom_type``); when one of them reaches the notebook
(an IPython custom exception handler) or the top of a script (a chained ``sys.excepthook``), the
usual traceback is shown, then the note: the kernel's quota, what the framework holds now, what
earlier runs of the notebook needed when the server knows it, and what to do.
"""

from __future__ import annotations

import os
import sys

import _gpushare_alloc as alloc
import _gpushare_env as env
import _gpushare_report as rep

__all__ = ["oom_framework", "oom_note", "register_oom_type"]

MiB = 2**20

_oom_types: list = []
_ip_previous: dict = {}
_NAMES = {"torch": "PyTorch", "tensorflow": "TensorFlow", "jax": "JAX", "cupy": "CuPy", "jaxlib": "JAX"}


def oom_framework(exc: BaseException | None) -> str | None:
    """The framework ('torch', 'tensorflow', 'jax', 'cupy') whose out-of-memory error ``exc`` is (or wraps)."""
    seen = 0
    while exc is not None and seen < 8:
        for cls in type(exc).__mro__:
            top = (getattr(cls, "__module__", "") or "").split(".")[0]
            if cls.__name__ == "OutOfMemoryError" and top in ("torch", "cupy", "cupy_backends"):
                return "cupy" if top.startswith("cupy") else "torch"
            if cls.__name__ == "ResourceExhaustedError" and top == "tensorflow":
                return "tensorflow"
            if cls.__name__ in ("XlaRuntimeError", "JaxRuntimeError") and "RESOURCE_EXHAUSTED" in str(exc):
                return "jax"
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def _in_use_mib(framework: str) -> int | None:
    """What the framework's allocator holds now, where it can tell without side effects."""
    try:
        if framework == "torch":
            torch = sys.modules["torch"]
            if torch.cuda.is_initialized():
                return torch.cuda.memory_reserved(0) // MiB
        elif framework == "cupy":
            return sys.modules["cupy"].get_default_memory_pool().total_bytes() // MiB
        elif framework == "jax":
            for device in sys.modules["jax"].local_devices():
                if device.platform == "gpu":
                    stats = device.memory_stats() or {}
                    return stats.get("bytes_in_use", 0) // MiB
        elif framework == "tensorflow":
            tf = sys.modules["tensorflow"]
            if tf.config.list_physical_devices("GPU"):
                return tf.config.experimental.get_memory_info("GPU:0")["current"] // MiB
    except Exception:
        return None
    return None


def _env_mib(name: str) -> int | None:
    """A size the provisioner set (GPUSHARE_PEAK_BEFORE_MIB: what earlier runs of this kernel's notebook peaked
    at; GPUSHARE_RETRY_QUOTA_MIB: the quota to restart with after running out of memory, history.retry_quota_mib):
    a plain positive whole number of MiB below 2**40, else None."""
    import re

    value = os.environ.get(name, "")
    if not re.fullmatch(r"[1-9][0-9]{0,12}", value) or int(value) >= 2**40:
        return None
    return int(value)


def _size(mib: int) -> str:
    """As the server words sizes (policy.format_mib): 512 MiB, 3.5 GiB, 3 GiB."""
    return f"{mib / 1024:.1f} GiB".replace(".0 GiB", " GiB") if mib >= 1024 else f"{mib} MiB"


def oom_note(framework: str) -> str:
    """The note shown after a framework's out-of-memory traceback."""
    name = _NAMES.get(framework, framework)
    quota, most = rep.quota_mib(), rep.env_int(env.MAX_QUOTA_MIB)
    reason = rep.no_cap_reason()
    lines = [f"[jupyter-gpushare] {name} ran out of memory."]
    if quota is not None and os.environ.get(env.MODE) == "gpu":
        card = os.environ.get(env.CARD_NAME) or "its GPU"
        used = _in_use_mib(framework)
        held = f"; {name} holds {_size(used)} of it now" if used is not None else ""
        lines.append(f"This kernel's GPU memory quota is {_size(quota)} on {card}{held}.")
        if reason:
            lines.append(f"(No GPU cap applies in this process: {reason}.)")
    else:
        lines.append(f"This kernel has no GPU memory quota: {reason or 'no GPU reservation'}.")
    peak, retry = _env_mib(env.PEAK_BEFORE_MIB), _env_mib(env.RETRY_QUOTA_MIB)
    if retry and os.environ.get(env.LEARNS) == "1":
        lines.append(f"This notebook learns from it: its next kernel gets at least {_size(retry)}.")
    if peak:
        lines.append(f"On earlier runs this notebook needed up to {_size(peak)} of GPU memory (CUDA context included).")
    free = {
        "torch": "del tensors you no longer need, then torch.cuda.empty_cache()",
        "cupy": "del arrays you no longer need, then cupy.get_default_memory_pool().free_all_blocks()",
        "jax": "del arrays you no longer need (and jax.clear_caches())",
        "tensorflow": "del tensors and models you no longer need (tf.keras.backend.clear_session())",
    }.get(framework, "free what you no longer need")
    larger, how = "restart the kernel with a larger quota", []
    if retry and quota and retry > quota:
        larger = f"restart it with {_size(retry)}"
        how = [f"GPU panel: Restart with {_size(retry)}", "it waits if the GPU is full"]
    if most:
        how.append(f"at most {_size(most)} on this server")
    if how:
        larger += f" ({'; '.join(how)})"
    lines.append(f"What to do: use a smaller batch or model; {free}; or {larger}.")
    return "\n".join(lines)


def _print_note(exc: BaseException) -> None:
    framework = oom_framework(exc)
    if framework:
        try:
            alloc.update(oom=framework)  # the report says it failed: the notebook learns from it
        except Exception:
            pass
        sys.stderr.write("\n" + oom_note(framework) + "\n")
        sys.stderr.flush()


def _ipython_handler(shell, etype, value, tb, tb_offset=None):
    previous = _ip_previous.get(id(shell))
    if previous and issubclass(etype, previous[0]) and not issubclass(etype, tuple(_oom_types)):
        return previous[1](etype, value, tb, tb_offset=tb_offset)
    shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
    try:
        _print_note(value)
    except Exception:
        pass
    return None


_ipython_handler._gpushare = True  # type: ignore[attr-defined]  # how a second install knows it


def _install_ipython_handler() -> None:
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    shell = get() if get else None
    if shell is None or not hasattr(shell, "set_custom_exc"):
        return
    current = tuple(getattr(shell, "custom_exceptions", ()) or ())
    ours = getattr(getattr(shell, "CustomTB", None), "__func__", None)
    if current and id(shell) not in _ip_previous and not getattr(ours, "_gpushare", False):
        _ip_previous[id(shell)] = (current, shell.CustomTB)  # someone else's handler: chain to it
    previous = _ip_previous.get(id(shell), ((), None))[0]
    shell.set_custom_exc(tuple(dict.fromkeys(_oom_types + list(previous))), _ipython_handler)
    # set_custom_exc wraps the handler: mark the wrapper so a second call knows it is ours
    shell.CustomTB.__func__._gpushare = True


def _excepthook(etype, value, tb):
    _previous_excepthook(etype, value, tb)
    try:
        _print_note(value)
    except Exception:
        pass


_previous_excepthook = sys.excepthook


def register_oom_type(cls) -> None:
    global _previous_excepthook
    if cls is None or cls in _oom_types:
        return
    _oom_types.append(cls)
    alloc.watch()
    try:
        _install_ipython_handler()
    except Exception as e:
        rep.warn(f"the out-of-memory note could not be set up in IPython: {e}")
    if sys.excepthook is not _excepthook:
        _previous_excepthook, sys.excepthook = sys.excepthook, _excepthook
