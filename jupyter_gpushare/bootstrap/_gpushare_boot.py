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

- in a kernel that runs while its GPU waits, a framework's import waits for the grant (``_gpushare_wait``): before
  its code runs, or, PyTorch's, after (it imports while the kernel waits) and before the import returns.

The layers, lowest first: ``_gpushare_env`` (the variables' names), ``_gpushare_report`` (the quota read from the
environment, warnings and the report), the hooks (``_gpushare_alloc``, ``_gpushare_oom``, ``_gpushare_views``,
``_gpushare_caps``, ``_gpushare_wait``), and this module, which installs them. No layer imports one above it.
"""

from __future__ import annotations

import _thread
import os
import sys
import time

import _gpushare_env as env
import _gpushare_report as rep
from _gpushare_report import GpuShareWarning, pulled_in_by, report

# json, re and warnings are imported where used: every process of the kernel (each `!pip`, each
# DataLoader worker) runs this module at start, so it imports as little as it can.

__all__ = ["GpuShareWarning", "install", "register", "report", "pulled_in_by"]

_installed = False
_importing = _thread._local()  # per thread: the hooked modules whose code is executing now, outermost first
FRAMEWORKS = ("torch", "tensorflow", "jax", "cupy")  # what the report lists (reports.FRAMEWORKS)
# Whose own import, when it imports a framework, brings that one in on its own account: the frameworks, and
# Keras 3, which imports JAX whatever its backend (TensorFlow 2.21 imports JAX too, for tf.lite).
OUTER_IMPORTS = (*FRAMEWORKS, "keras")


# -- configuration from the environment -----------------------------------------------------------


def _check_visible_devices() -> None:
    card = os.environ.get(env.CARD_UUID)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if card and visible not in (None, "", card):
        rep.warn(
            f"CUDA_VISIBLE_DEVICES was changed to {visible!r}; this kernel's quota is reserved on {card} only. "
            "Work on other cards is not reserved and may fail when a neighbour needs the memory."
        )


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
        done = False
        try:
            for i, fn in enumerate(pre):
                after = _guarded(fn, self._name, module)
                if callable(after):  # the module executes now; this and the rest of the pre hooks after it
                    seconds, interrupted = _whole(self._execute, module)
                    start += seconds  # (not the bootstrap's time)
                    module, done = sys.modules.get(self._name, module), True
                    if interrupted:
                        raise KeyboardInterrupt
                    _guarded(after, self._name, module)
                    for rest in pre[i + 1 :]:
                        _guarded(rest, self._name, module)
                    break
        except BaseException:  # an interrupted wait for the GPU: the import fails, and the next one runs them again
            self._finder.put_back(self._name, pre, post)
            if done:  # (its code ran: the next import takes this module as it is, not a second run of it)
                self._finder.keep(self._name, module)
            raise
        spent = time.perf_counter() - start
        if not done:
            self._execute(module)
        start = time.perf_counter()
        for fn in post:
            _guarded(fn, self._name, sys.modules.get(self._name, module))
        rep.HOOK_SECONDS[self._name] = spent + time.perf_counter() - start

    def _execute(self, module) -> float:
        """Run the module's code (or take the module an earlier import ran and a wait then failed); its seconds."""
        start = time.perf_counter()
        kept = self._finder.kept(self._name)
        if kept is not None:
            sys.modules[self._name] = kept  # (importlib returns what sys.modules holds after exec_module)
            return 0.0
        outer = _enter_import(self._name)
        try:
            self._loader.exec_module(module)
        finally:
            if outer:
                _importing.stack.pop()
        return time.perf_counter() - start


def _whole(run, module) -> tuple:
    """``run(module)`` with an interrupt (SIGINT, in the main thread) held until it returns: what it returned, and
    whether an interrupt came meanwhile (to raise then; the cell hears at once that it will). A framework
    interrupted midway through its code is left half imported, and no later import mends it."""
    import signal
    import threading

    held: list = []

    def hold(*_) -> None:
        if not held:
            sys.stderr.write(
                f"jupyter-gpushare: the interrupt stops this cell once {module.__name__}'s import has run (a "
                "framework stopped midway could not be imported again in this kernel).\n"
            )
            sys.stderr.flush()
        held.append(True)

    try:
        if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
            return run(module), False
        before = signal.signal(signal.SIGINT, hold)
    except (ValueError, OSError):
        return run(module), False
    try:
        return run(module), bool(held)
    finally:
        signal.signal(signal.SIGINT, before)


def _guarded(fn, name: str, module):
    """``fn(module)``, a failure said as a warning; what it returned (a pre hook's hook to run after the module's
    code: see ``register``)."""
    try:
        return fn(module)
    except Exception as e:
        if getattr(e, "stops_import", False):  # a hook's word to the cell (a wait for the GPU that ended), not a fault
            raise
        rep.warn(f"the {name} hook failed ({type(e).__name__}: {e}); {name} was imported without it")


class _Finder:
    """A ``sys.meta_path`` finder (``find_spec`` only) that wraps the loaders of hooked modules."""

    def __init__(self) -> None:
        self._pre: dict[str, list] = {}
        self._post: dict[str, list] = {}
        self._busy = _thread._local()
        self._kept: dict = {}

    def add(self, name: str, pre=None, post=None) -> None:
        with rep.LOCK:
            if pre is not None:
                self._pre.setdefault(name, []).append(pre)
            if post is not None:
                self._post.setdefault(name, []).append(post)

    def put_back(self, name: str, pre: list, post: list) -> None:
        with rep.LOCK:
            self._pre[name] = pre + self._pre.get(name, [])
            self._post[name] = post + self._post.get(name, [])

    def keep(self, name: str, module) -> None:
        with rep.LOCK:
            self._kept[name] = module

    def kept(self, name: str):
        with rep.LOCK:
            return self._kept.pop(name, None)

    def take(self, name: str) -> tuple[list, list]:
        with rep.LOCK:
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
    Exceptions in either become a GpuShareWarning. A ``pre`` may return a callable: the module's code then runs at
    once, and that callable and the later ``pre`` hooks after it (the wait for the GPU lets PyTorch import first).
    If one of them raises (an interrupted wait), the import fails, and the next import takes the same module
    object, without running its code again, and runs them all again.
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
    if stack and name in FRAMEWORKS and name not in rep.STATE["nested"]:
        with rep.LOCK:
            rep.STATE["nested"][name] = stack[-1]  # this import runs inside that one's: it brought it in
        _watch_imports()
    if name in OUTER_IMPORTS:
        stack.append(name)
        return True
    return False


def _watch_imports() -> None:
    """Chain builtins.__import__ while some framework is pulled in (only then: it runs for every import)."""
    global _builtin_import
    import builtins

    if builtins.__import__ is not _import:
        _builtin_import = builtins.__import__
        builtins.__import__ = _import


def _import(name, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002  (__import__'s own names)
    if level == 0 and rep.STATE["nested"]:
        try:
            _imported_by(name.partition(".")[0], globals)
        except Exception:
            pass
    return _builtin_import(name, globals, locals, fromlist, level)


def _imported_by(top: str, namespace) -> None:
    if top not in rep.STATE["nested"] or getattr(_importing, "stack", None):
        return  # not pulled in, or inside a framework's own import
    importer = ((namespace or {}).get("__name__") or "").partition(".")[0]
    if importer not in OUTER_IMPORTS:
        _imported(top)


def _imported(name: str) -> None:
    """``name`` counts as the notebook's from now on; the watch on imports ends with the last one pulled in."""
    import builtins

    with rep.LOCK:
        rep.STATE["nested"].pop(name, None)
        done = not rep.STATE["nested"]
    if done and builtins.__import__ is _import and _builtin_import is not None:
        builtins.__import__ = _builtin_import
    rep.write_report()


def _keras_post(keras) -> None:
    """Keras 3 imports JAX whatever its backend, and its backend, which it computes with: note which it is."""
    config = getattr(keras, "config", None) or getattr(keras, "backend", None)
    backend = getattr(config, "backend", None)
    name = backend() if callable(backend) else None
    if isinstance(name, str) and rep.STATE["nested"].get(name) == "keras":
        _imported(name)


# -- start ------------------------------------------------------------------------------------------


def install() -> bool:
    """Install the framework hooks for this process (once). False when this is not a gpushare kernel."""
    global _installed
    if _installed or not os.environ.get(env.KERNEL_ID):
        return _installed
    _installed = True
    if not os.environ.get(env.ROOT_PID):  # the kernel process; its children inherit the variable
        os.environ[env.ROOT_PID] = str(os.getpid())
    if not rep.no_cap_reason():
        _check_visible_devices()
    import _gpushare_caps
    import _gpushare_views

    mode = os.environ.get(env.MODE)
    if mode in ("queued", "standby", "warm") or (mode == "gpu" and os.environ.get(env.GRANT_FD)):
        # Its GPU waits, or is not asked for yet: a framework waits for the grant first (and, standby, asks for it);
        # or it is granted, and may be asked to stand by later (then its next framework import waits again)
        import _gpushare_wait

        if os.environ.get(env.ROOT_PID) == str(os.getpid()):
            _gpushare_wait.start()
        for name in _gpushare_wait.WAITS:
            register(name, pre=_gpushare_wait.wait_for_gpu)
    for hooks in (_gpushare_views.HOOKS, _gpushare_caps.HOOKS):  # views first: the caps' report says both
        for name, (pre, post) in hooks.items():
            register(name, pre, post)
    register("keras", post=_keras_post)
    if os.environ.get(env.ROOT_PID) == str(os.getpid()):
        rep.write_report()  # the kernel process says at once that its bootstrap runs
        if mode == "warm":
            _warm_imports()
    return True


def _warm_imports() -> None:
    """A warm kernel imports what the admin listed (GpuShareApp.warm_imports) before its notebook opens; a module
    that fails is said on stderr (the server's log) and left out. A GPU framework is refused, but PyTorch's code
    runs and waits, kept, for the notebook's import (_gpushare_wait.WARM_FIRST)."""
    import importlib

    import _gpushare_wait

    for name in filter(None, os.environ.pop(env.WARM_IMPORTS, "").split(",")):
        try:
            importlib.import_module(name)
        except _gpushare_wait.WarmKept:
            pass
        except BaseException as e:  # (a module's own SystemExit too: the kernel starts without it)
            sys.stderr.write(f"jupyter-gpushare: a warm kernel could not import {name!r} (GpuShareApp.warm_imports): "
                             f"{type(e).__name__}: {e}\n")  # fmt: skip
