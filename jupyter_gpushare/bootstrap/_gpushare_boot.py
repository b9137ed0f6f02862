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
  frameworks were capped and at what limit, or why not; a framework that another one's import
  brought in (TensorFlow imports JAX) is named apart, under ``pulled_in``;
- the GPU's size as torch, CuPy and NVML report it inside the kernel is the kernel's quota
  (``_gpushare_views``); the report lists those ``views``;
- when a framework's out-of-memory error reaches the notebook or the top of a script, a short note
  follows the usual traceback (``_gpushare_oom``).
"""

from __future__ import annotations

import _thread
import os
import sys
import time

import _gpushare_env as env

# json, re and warnings are imported where used: every process of the kernel (each `!pip`, each
# DataLoader worker) runs this module at start, so it imports as little as it can.

__all__ = ["GpuShareWarning", "install", "register", "report", "pulled_in_by"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_installed = False
_state: dict = {"frameworks": {}, "warnings": [], "views": [], "nested": {}}  # nested: see pulled_in_by
_started = time.time()
_lock = _thread.RLock()
_hook_seconds: dict = {}  # time our code spent around each hooked import (for bench/)
_importing = _thread._local()  # per thread: the hooked modules whose code is executing now, outermost first
MiB = 2**20
FRAMEWORKS = ("torch", "tensorflow", "jax", "cupy")  # what the report lists (reports.FRAMEWORKS)
# Whose own import, when it imports a framework, brings that one in on its own account: the frameworks, and
# Keras 3, which imports JAX whatever its backend (TensorFlow 2.21 imports JAX too, for tf.lite).
OUTER_IMPORTS = (*FRAMEWORKS, "keras")


class GpuShareWarning(UserWarning):
    """A GPU cap could not be applied as asked, or was changed to fit the kernel's quota."""


# -- configuration from the environment -----------------------------------------------------------


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def _quota_mib() -> int | None:
    return _env_int(env.QUOTA_MIB)


def _fraction() -> float | None:
    """The quota as a fraction of the card's total memory (what torch and XLA take)."""
    try:
        return float(os.environ[env.TORCH_FRACTION])
    except (KeyError, ValueError):
        quota, total = _quota_mib(), _env_int(env.CARD_TOTAL_MIB)
        return quota / total if quota and total else None


def _no_cap_reason() -> str | None:
    """Why no framework of this process can be capped on a GPU, or None when a cap applies."""
    mode = os.environ.get(env.MODE, "")
    reason = os.environ.get(env.REASON, "")
    if mode == "cpu":
        return "this kernel runs without a GPU (CUDA_VISIBLE_DEVICES is empty)" + (f": {reason}" if reason else "")
    if mode != "gpu":
        return "this kernel has no GPU quota, so it sees no GPU (CUDA_VISIBLE_DEVICES is empty)" + (
            f": {reason}" if reason else ""
        )
    if _quota_mib() is None:
        return "GPUSHARE_QUOTA_MIB is missing from the kernel's environment"
    if os.environ.get(env.SIMULATED) == "1":
        return "the card is simulated: CUDA_VISIBLE_DEVICES is empty, so no GPU is visible"
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return "CUDA_VISIBLE_DEVICES is empty, so no GPU is visible"
    return None


def _check_visible_devices() -> None:
    card = os.environ.get(env.CARD_UUID)
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


def _add_views(names: list) -> None:
    """Note for the report that these functions now give the kernel's quota as the GPU's size (the next
    write says so: a framework's own entry is written right after, by its cap hook)."""
    with _lock:
        _state["views"] = sorted(set(_state["views"]) | set(names))


def report() -> dict:
    """This process's report, as written to the report directory."""
    with _lock:
        root = os.environ.get(env.ROOT_PID)
        frameworks, pulled_in = {}, {}
        for name, entry in _state["frameworks"].items():
            by = pulled_in_by(name)
            if by:
                pulled_in[name] = by
                continue
            frameworks[name] = dict(entry)
            views = [v for v in _state["views"] if v.startswith(name + ".")]
            if views:
                frameworks[name]["views"] = views
        return {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "kernel_id": os.environ.get(env.KERNEL_ID),
            "root": root == str(os.getpid()),
            "started": _started,
            "time": time.time(),
            "mode": os.environ.get(env.MODE),
            "quota_mib": _quota_mib(),
            "frameworks": frameworks,
            "pulled_in": pulled_in,
            "views": list(_state["views"]),
            "warnings": list(_state["warnings"]),
            "alloc": dict(_state.get("alloc", {})),
            "oom": _state.get("oom"),
            "hook_ms": {k: round(v * 1000, 3) for k, v in _hook_seconds.items()},
        }


def _write_report() -> None:
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
        outer = _enter_import(self._name)
        try:
            self._loader.exec_module(module)
        finally:
            if outer:
                _importing.stack.pop()
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


# -- who imported a framework ---------------------------------------------------------------------------
# A framework is listed in the report when it was imported in this process by the notebook or by any library
# it uses, not when only another framework's own import brought it in (TensorFlow and Keras import JAX when it
# is installed). Such a one is "pulled in" until an import statement outside the frameworks and Keras names it:
# `import tensorflow as tf, jax` lists both, though jax was already in sys.modules when its statement ran.

_builtin_import = None


def _enter_import(name: str) -> bool:
    """Note a hooked module starting to execute; True when it was pushed as an outer import."""
    stack = _importing.__dict__.setdefault("stack", [])
    if stack and name in FRAMEWORKS and name not in _state["nested"]:
        with _lock:
            _state["nested"][name] = stack[-1]  # this import runs inside that one's: it brought it in
        _watch_imports()
    if name in OUTER_IMPORTS:
        stack.append(name)
        return True
    return False


def pulled_in_by(name: str) -> str | None:
    """The framework (or Keras) whose own import alone imported ``name`` in this process; None when the
    notebook or a library that is not a GPU framework imported it (Keras's backend counts as the notebook's:
    Keras computes with it)."""
    return _state["nested"].get(name)


def _watch_imports() -> None:
    """Chain builtins.__import__ while some framework is pulled in (only then: it runs for every import)."""
    global _builtin_import
    import builtins

    if builtins.__import__ is not _import:
        _builtin_import = builtins.__import__
        builtins.__import__ = _import


def _import(name, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002  (__import__'s own names)
    if level == 0 and _state["nested"]:
        try:
            _imported_by(name.partition(".")[0], globals)
        except Exception:
            pass
    return _builtin_import(name, globals, locals, fromlist, level)


def _imported_by(top: str, namespace) -> None:
    if top not in _state["nested"] or getattr(_importing, "stack", None):
        return  # not pulled in, or inside a framework's own import
    importer = ((namespace or {}).get("__name__") or "").partition(".")[0]
    if importer not in OUTER_IMPORTS:
        _imported(top)


def _imported(name: str) -> None:
    """``name`` counts as the notebook's from now on; the watch on imports ends with the last one pulled in."""
    import builtins

    with _lock:
        _state["nested"].pop(name, None)
        done = not _state["nested"]
    if done and builtins.__import__ is _import:
        builtins.__import__ = _builtin_import
    _write_report()


def _keras_post(keras) -> None:
    """Keras 3 imports JAX whatever its backend, and its backend, which it computes with: note which it is."""
    config = getattr(keras, "config", None) or getattr(keras, "backend", None)
    backend = getattr(config, "backend", None)
    backend = backend() if callable(backend) else None
    if _state["nested"].get(backend) == "keras":
        _imported(backend)


# -- start ------------------------------------------------------------------------------------------


def install() -> bool:
    """Install the framework hooks for this process (once). False when this is not a gpushare kernel."""
    global _installed
    if _installed or not os.environ.get(env.KERNEL_ID):
        return _installed
    _installed = True
    if not os.environ.get(env.ROOT_PID):  # the kernel process; its children inherit the variable
        os.environ[env.ROOT_PID] = str(os.getpid())
    if not _no_cap_reason():
        _check_visible_devices()
    import _gpushare_caps
    import _gpushare_views

    for hooks in (_gpushare_views.HOOKS, _gpushare_caps.HOOKS):  # views first: the caps' report says both
        for name, (pre, post) in hooks.items():
            register(name, pre, post)
    register("keras", post=_keras_post)
    if os.environ.get(env.ROOT_PID) == str(os.getpid()):
        _write_report()  # the kernel process says at once that its bootstrap runs
    return True
