"""Inside the kernel: cap each GPU framework at the kernel's quota when it is imported.

Standard library only, Python >= 3.9: this file runs in kernel environments that may not have
jupyter-gpushare (or anything else) installed. ``sitecustomize`` calls ``install()`` at interpreter
start; child processes inherit it through PYTHONPATH.

What it does, all driven by the GPUSHARE_* environment the provisioner set:

- a ``sys.meta_path`` finder wraps the loaders of ``torch``, ``tensorflow``, ``jax`` and ``cupy``, so
  code runs just before each module executes (set environment knobs the framework reads later) and
  just after (configure the framework, register its out-of-memory error);
- nothing here creates a CUDA context: only calls documented not to initialise the GPU are made;
- any failure in a hook becomes a ``GpuShareWarning``, never an error in the user's import;
- every process of the kernel that imports a framework (and the kernel process itself, at start)
  writes ``$GPUSHARE_REPORT_DIR/<kernel id>.<pid>.json`` (temp file + os.replace) saying which
  frameworks were capped and at what limit, or why not;
- when a framework's out-of-memory error reaches the notebook (IPython custom exception handler)
  or the top of a script (chained ``sys.excepthook``), a short note follows the usual traceback.
"""

from __future__ import annotations

import _thread
import os
import sys
import time

# json, re and warnings are imported where used: every process of the kernel (each `!pip`, each
# DataLoader worker) runs this module at start, so it imports as little as it can.

__all__ = ["GpuShareWarning", "install", "register", "report", "oom_framework", "oom_note"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_installed = False
_state: dict = {"frameworks": {}, "warnings": []}
_started = time.time()
_lock = _thread.RLock()
_hook_seconds: dict = {}  # time our code spent around each hooked import (for bench/)
MiB = 2**20


class GpuShareWarning(UserWarning):
    """A GPU cap could not be applied as asked, or was changed to fit the kernel's quota."""


# -- configuration from the environment -----------------------------------------------------------


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def _quota_mib() -> int | None:
    return _env_int("GPUSHARE_QUOTA_MIB")


def _fraction() -> float | None:
    """The quota as a fraction of the card's total memory (what torch and XLA take)."""
    try:
        return float(os.environ["GPUSHARE_TORCH_FRACTION"])
    except (KeyError, ValueError):
        quota, total = _quota_mib(), _env_int("GPUSHARE_CARD_TOTAL_MIB")
        return quota / total if quota and total else None


def _no_cap_reason() -> str | None:
    """Why no framework of this process can be capped on a GPU, or None when a cap applies."""
    mode = os.environ.get("GPUSHARE_MODE", "")
    reason = os.environ.get("GPUSHARE_REASON", "")
    if mode == "cpu":
        return "this kernel runs without a GPU (CUDA_VISIBLE_DEVICES is empty)" + (f": {reason}" if reason else "")
    if mode != "gpu":
        return "this kernel has no GPU quota, so it sees no GPU (CUDA_VISIBLE_DEVICES is empty)" + (
            f": {reason}" if reason else ""
        )
    if _quota_mib() is None:
        return "GPUSHARE_QUOTA_MIB is missing from the kernel's environment"
    if os.environ.get("GPUSHARE_SIMULATED") == "1":
        return "the card is simulated: CUDA_VISIBLE_DEVICES is empty, so no GPU is visible"
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return "CUDA_VISIBLE_DEVICES is empty, so no GPU is visible"
    return None


def _check_visible_devices() -> None:
    card = os.environ.get("GPUSHARE_CARD_UUID")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if card and visible not in (None, "", card):
        _warn(
            f"CUDA_VISIBLE_DEVICES was changed to {visible!r}; this kernel's quota is reserved on {card} only. "
            "Work on other cards is not reserved and may fail when a neighbour needs the memory."
        )


# -- warnings and the report ---------------------------------------------------------------------


def _user_stacklevel() -> int:
    """A stacklevel pointing at the first frame outside the bootstrap and the import machinery."""
    level, frame = 1, sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        internal = "importlib" in name and "_bootstrap" in name  # frames warnings.warn skips itself
        if os.path.dirname(name) != _HERE and not internal:
            return level
        frame = frame.f_back
        level += 0 if internal else 1
    return 1


def _warn(message: str) -> None:
    with _lock:
        if message not in _state["warnings"]:
            _state["warnings"].append(message)
            del _state["warnings"][:-50]
    try:
        import warnings

        warnings.warn(f"jupyter-gpushare: {message}", GpuShareWarning, stacklevel=_user_stacklevel())
    except Exception:
        pass


def _set(framework: str, capped: bool, detail: str, limit_mib: int | None = None, version: str | None = None) -> None:
    entry = {"capped": bool(capped), "limit_mib": limit_mib if capped else None, "detail": detail}
    if version:
        entry["version"] = version
    with _lock:
        _state["frameworks"][framework] = entry
    _write_report()


def report() -> dict:
    """This process's report, as written to the report directory."""
    with _lock:
        root = os.environ.get("GPUSHARE_ROOT_PID")
        return {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "kernel_id": os.environ.get("GPUSHARE_KERNEL_ID"),
            "root": root == str(os.getpid()),
            "started": _started,
            "time": time.time(),
            "mode": os.environ.get("GPUSHARE_MODE"),
            "quota_mib": _quota_mib(),
            "frameworks": {k: dict(v) for k, v in _state["frameworks"].items()},
            "warnings": list(_state["warnings"]),
            "hook_ms": {k: round(v * 1000, 3) for k, v in _hook_seconds.items()},
        }


def _write_report() -> None:
    directory, kernel_id = os.environ.get("GPUSHARE_REPORT_DIR"), os.environ.get("GPUSHARE_KERNEL_ID")
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
        with _lock:
            note = f"could not write the cap report to {directory}: {e}"
            if note not in _state["warnings"]:
                _state["warnings"].append(note)


# -- post-import hooks -------------------------------------------------------------------------------


class _HookedLoader:
    """Runs the real loader, with our code just before and just after the module executes."""

    def __init__(self, loader, name: str, finder: _Finder):
        self._loader, self._name, self._finder = loader, name, finder

    def __getattr__(self, attr):
        return getattr(self._loader, attr)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        # The module's own code sees its real loader.
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        pre, post = self._finder.take(self._name)
        start = time.perf_counter()
        for fn in pre:
            _guarded(fn, self._name, module)
        spent = time.perf_counter() - start
        self._loader.exec_module(module)
        start = time.perf_counter()
        for fn in post:
            _guarded(fn, self._name, sys.modules.get(self._name, module))
        _hook_seconds[self._name] = spent + time.perf_counter() - start


def _guarded(fn, name: str, module) -> None:
    try:
        fn(module)
    except Exception as e:
        _warn(f"the {name} hook failed ({type(e).__name__}: {e}); {name} was imported without it")


class _Finder:
    """A ``sys.meta_path`` finder (``find_spec`` only) that wraps the loaders of hooked modules."""

    def __init__(self) -> None:
        self._pre: dict[str, list] = {}
        self._post: dict[str, list] = {}
        self._busy = _thread._local()

    def add(self, name: str, pre=None, post=None) -> None:
        with _lock:
            if pre is not None:
                self._pre.setdefault(name, []).append(pre)
            if post is not None:
                self._post.setdefault(name, []).append(post)

    def take(self, name: str) -> tuple[list, list]:
        with _lock:
            return self._pre.pop(name, []), self._post.pop(name, [])

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self._pre and fullname not in self._post:
            return None
        busy = self._busy.__dict__.setdefault("names", set())
        if fullname in busy:
            return None
        busy.add(fullname)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            busy.discard(fullname)
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec  # namespace package or legacy loader: leave it alone
        spec.loader = _HookedLoader(spec.loader, fullname, self)
        return spec


_finder = _Finder()


def register(name: str, pre=None, post=None) -> None:
    """Run ``pre(module)`` just before module ``name`` executes and ``post(module)`` just after.

    Each runs once. If the module is already imported, ``post`` runs now and ``pre`` never.
    Exceptions in either become a GpuShareWarning.
    """
    if name in sys.modules:
        if post is not None:
            _guarded(post, name, sys.modules[name])
        return
    _finder.add(name, pre, post)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


# -- out-of-memory note -------------------------------------------------------------------------------

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


def oom_note(framework: str) -> str:
    """The note shown after a framework's out-of-memory traceback."""
    name = _NAMES.get(framework, framework)
    quota, most = _quota_mib(), _env_int("GPUSHARE_MAX_QUOTA_MIB")
    reason = _no_cap_reason()
    lines = [f"[jupyter-gpushare] {name} ran out of memory."]
    if quota is not None and os.environ.get("GPUSHARE_MODE") == "gpu":
        card = os.environ.get("GPUSHARE_CARD_NAME") or "its GPU"
        used = _in_use_mib(framework)
        held = f"; {name} holds {used} MiB of it now" if used is not None else ""
        lines.append(f"This kernel's GPU memory quota is {quota} MiB on {card}{held}.")
        if reason:
            lines.append(f"(No GPU cap applies in this process: {reason}.)")
    else:
        lines.append(f"This kernel has no GPU memory quota: {reason or 'no GPU reservation'}.")
    free = {
        "torch": "del tensors you no longer need, then torch.cuda.empty_cache()",
        "cupy": "del arrays you no longer need, then cupy.get_default_memory_pool().free_all_blocks()",
        "jax": "del arrays you no longer need (and jax.clear_caches())",
        "tensorflow": "del tensors and models you no longer need (tf.keras.backend.clear_session())",
    }.get(framework, "free what you no longer need")
    larger = "restart the kernel with a larger quota"
    if most:
        larger += f" (at most {most} MiB on this server)"
    lines.append(f"What to do: use a smaller batch or model; {free}; or {larger}.")
    return "\n".join(lines)


def _print_note(exc: BaseException) -> None:
    framework = oom_framework(exc)
    if framework:
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


_ipython_handler._gpushare = True


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


def _register_oom_type(cls) -> None:
    global _previous_excepthook
    if cls is None or cls in _oom_types:
        return
    _oom_types.append(cls)
    try:
        _install_ipython_handler()
    except Exception as e:
        _warn(f"the out-of-memory note could not be set up in IPython: {e}")
    if sys.excepthook is not _excepthook:
        _previous_excepthook, sys.excepthook = sys.excepthook, _excepthook


# -- start ------------------------------------------------------------------------------------------


def install() -> bool:
    """Install the framework hooks for this process (once). False when this is not a gpushare kernel."""
    global _installed
    if _installed or not os.environ.get("GPUSHARE_KERNEL_ID"):
        return _installed
    _installed = True
    if not os.environ.get("GPUSHARE_ROOT_PID"):  # the kernel process; its children inherit the variable
        os.environ["GPUSHARE_ROOT_PID"] = str(os.getpid())
    if not _no_cap_reason():
        _check_visible_devices()
    import _gpushare_caps

    for name, (pre, post) in _gpushare_caps.HOOKS.items():
        register(name, pre, post)
    if os.environ.get("GPUSHARE_ROOT_PID") == str(os.getpid()):
        _write_report()  # the kernel process says at once that its bootstrap runs
    return True
