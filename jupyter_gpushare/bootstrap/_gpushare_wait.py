"""Inside a kernel that runs while its GPU waits (GPUSHARE_MODE=queued): the first use of a GPU framework waits
in its cell for the grant, says the kernel's place in line, and can be interrupted. A kernel that has not asked
yet (GPUSHARE_MODE=standby, line_place = 'first-use') asks first, through the pipe named by GPUSHARE_ASK_FD.

The server writes to the pipe named by GPUSHARE_GRANT_FD (launch/held.py): ``{"wait": {...}}`` lines while the
kernel is in line, then ``{"grant": {...}}``, the variables the grant changes in the kernel's environment (null:
removed). A thread reads the pipe from the kernel's start and applies the grant to ``os.environ`` as it comes.
No framework has initialised CUDA by then (their imports wait for it here; PyTorch's code runs first, while it
waits, and sets CUDA up only at its first use), so every framework's caps and every child process started afterwards
see the card and the quota. A grant of ``GPUSHARE_MODE=cpu`` is a wait that
ended without a GPU: the frameworks then import without one, and the waiting cell says why.

A kernel granted its GPU (in line, or at its start under line_place = 'start': it then starts granted, its pipe
open) may be asked to give it back while others wait and it has not used it (``{"standby": {...}}``: the server's
parking.py): it agrees only if no GPU framework was imported and no child process of it runs, and then stands by
as a kernel that asks at its first GPU use does. It answers on its ask pipe (``standby`` or
``kept:<why>``), where it also asks again at its next GPU use. Its first GPU framework import says ``using`` there
first (the server then never asks: the answer would be no, and a kernel loading a framework can be slow to give it).

A kernel that is parked (the server moved its GPU state to host memory: parking.py) hears ``{"parked": {...}}``
(with its place in line once it waits to come back) and then ``{"back": {}}``. Meanwhile anything that wants the
kernel brings it back, whichever client sent it: a cell (IPython's ``pre_run_cell``: a notebook's, a console's, an
IDE's on the kernel's own ZMQ shell) and a comm message (a widget's) each write ``resume`` on the ask pipe. A cell
runs at once; it says in one line, on its stdout, that the GPU comes back and where it stands, and only a GPU call in
it waits, inside the driver, until the state is back; if the resume does not happen (no room on the card, no
reservation in time), the server says why and the running cell prints it (the server tries again while the kernel
is busy). Whether the kernel can be parked at all is its ``parkable``:
not while a thread its notebook started runs (a demo served from a thread makes GPU calls no cell asks for).

Standard library only; the kernel process alone reads the pipe (its children do not inherit it).
"""

from __future__ import annotations

import os
import sys
import threading
import time

import _gpushare_env as env
import _gpushare_report as rep

# What waits for the grant: the GPU frameworks, and the CUDA bindings that open the card themselves (not numba:
# it is a CPU compiler first; its numba.cuda opens the card).
WAITS = ("torch", "tensorflow", "jax", "cupy", "numba.cuda", "pycuda")
# Imported while the kernel waits, the wait then coming before the import returns: a framework whose import opens no
# card and reads nothing the grant changes (CUDA is set up at its first use), from the version measured so. torch
# 2.11, imported with every GPU hidden, then given the card and its allocator's cap in os.environ, saw the card and
# kept to the cap (bench/results/probe_import_first-h100-2026-11-27*.json); TensorFlow 2.21 (and Keras 3 on it),
# imported so, then given the card, listed it and kept to the logical device's memory_limit set after (as
# _gpushare_caps sets it: its hooks run after the wait), the driver's library not even loaded by the import
# (probe_import_first-tensorflow-h100-2026-11-27.json). Their imports' seconds (torch 1.2-2.1 s, TensorFlow 9-14 s
# on an H100 host, 8 at once) pass while the kernel waits, not after its grant; only near the front of the line (at
# most half the host's CPUs import at once so, beside the kernels that compute: 24 imports at once slowed the first
# wave of a class by 7.3 s on the H100 host, bench/README.md).
IMPORTS_FIRST = {"torch": (2, 11), "tensorflow": (2, 21)}
# Imported in a warm kernel (GpuShareApp.warm_imports, policy.WARM_FRAMEWORKS), before any notebook has it: the code
# runs then, and the module is kept (not in sys.modules) for the notebook's own import, which waits for the grant and
# sets the caps as any. One of IMPORTS_FIRST whose import pulls in no framework that waits (TensorFlow's pulls in JAX).
WARM_FIRST = ("torch",)
# The names the sidebar and the docs use (words.ts says "PyTorch", not "torch").
NAMES = {"torch": "PyTorch", "tensorflow": "TensorFlow", "jax": "JAX", "cupy": "CuPy", "numba.cuda": "Numba",
         "pycuda": "PyCUDA"}  # fmt: skip
ASK_ANSWER_S = 2.0  # how long a first GPU use waits for the server's first answer before saying it waits
# Never changed by a grant: this process's own.
KEPT = (env.ROOT_PID, env.GRANT_FD, env.ASK_FD, env.KERNEL_ID, env.REPORT_DIR)

_cond = threading.Condition()
_state: dict = {
    "place": None,
    "granted": False,
    "reading": False,
    "ask_fd": None,
    "using": False,
    "parked": None,
    "wanted": False,  # a cell or comm message came since the server last asked parkable()
    "cell": False,  # a cell runs (known from the first park on: IPython's pre_run_cell and post_run_cell)
}
_hooked: set[str] = set()  # what ``_hear_demands`` has hooked in this process (IPython's cells, comm messages)


def start() -> bool:
    """Read the grant's pipe in a thread (the kernel's own process only); False when there is none."""
    ask = os.environ.pop(env.ASK_FD, "")
    if ask.isdigit():
        try:
            os.set_inheritable(int(ask), False)
            _state["ask_fd"] = int(ask)
        except OSError:
            pass
    raw = os.environ.pop(env.GRANT_FD, "")
    if not raw.isdigit():
        return False
    fd = int(raw)
    try:
        os.set_inheritable(fd, False)  # its children, and `!pip`, do not hold the pipe open
        pipe = os.fdopen(fd, "rb", buffering=0)
    except OSError:
        return False
    _state["reading"], _state["granted"] = True, os.environ.get(env.MODE) == "gpu"  # (granted at its start)
    threading.Thread(target=_read, args=(pipe,), name="gpushare-grant", daemon=True).start()
    return True


def _read(pipe) -> None:
    import json

    buffered = b""
    try:
        with pipe:
            while True:
                chunk = pipe.read(65536)
                if not chunk:
                    break
                buffered += chunk
                *lines, buffered = buffered.split(b"\n")
                for line in lines:
                    try:
                        message = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(message, dict):
                        _take(message)
    except OSError:
        pass
    finally:
        with _cond:
            _state["reading"] = False
            _cond.notify_all()


def _take(message: dict) -> None:
    """Apply one message from the server. The pipe is read to its end (the server closes it when nothing more can
    come): a wait that ended without a GPU may join the line again (``can_rejoin``), and a kernel granted its GPU in
    line may be asked to stand by."""
    place, grant, standby = message.get("wait"), message.get("grant"), message.get("standby")
    parked, back, handover = message.get("parked"), message.get("back"), message.get("handover")
    with _cond:
        if isinstance(handover, dict) and os.environ.get(env.MODE) == "warm":
            _hand_over(handover)
        if isinstance(parked, dict):
            before = _state["parked"]
            if before is not None and "why" not in parked:  # its place in line while it comes back (still asked)
                parked = {"parked_mib": before.get("parked_mib"), "asked": before.get("asked"), **parked}
            _state["parked"] = parked
            _hear_demands()
            if _state["wanted"]:  # a demand came while it was being parked, before it heard so: it asks now
                parked["asked"] = _tell("resume")
            elif before is not None and isinstance(parked.get("why"), str) and _state["cell"]:
                _not_back(parked["why"])  # a resume did not happen, and a cell that wants the kernel runs
            elif before is not None and _state["cell"] and _new_place(before, parked):
                _say_place(parked["position"])  # it waits in line to come back, and a cell runs: where it stands
            _state["wanted"] = False
        if isinstance(back, dict):
            _state["parked"] = None
        if message.get("rejoin") is True:
            _rejoined()
        if isinstance(place, dict):
            _state["place"] = place
        if isinstance(grant, dict):
            _apply(grant)
            _state["granted"] = True
        if isinstance(standby, dict):
            _tell(_stand_by(standby))
        _cond.notify_all()


def _apply(changes: dict) -> None:
    """The server's changes to this kernel's environment (null: removed); never this process's own variables."""
    for name, value in changes.items():
        if not isinstance(name, str) or name in KEPT:
            continue
        if value is None:
            os.environ.pop(name, None)
        elif isinstance(value, str):
            os.environ[name] = value


def _hand_over(given: dict) -> None:
    """This warm kernel becomes a notebook's: its environment (``env``, all of it, and what the kernel set itself since
    its launch with ``launched``), working directory (``cwd``) and
    connection file are set exactly as its own start would have set them, and it says ``ready``; the server lets no
    client reach it before. ``pipe`` false: nothing more comes through the pipe (a kernel granted for good, or without
    a GPU). (Called with ``_cond`` held.)"""
    new, launched = given.get("env"), given.get("launched")
    cwd, connection = given.get("cwd"), given.get("connection_file")
    old_report = os.path.join(os.environ.get(env.REPORT_DIR, ""), f"{os.environ.get(env.KERNEL_ID)}.{os.getpid()}.json")
    if isinstance(new, dict) and isinstance(launched, dict):
        # what the kernel set itself since its launch (``launched``: site's .pth files, ipykernel's TERM, CLICOLOR,
        # PAGER, MPLBACKEND ...), as a fresh kernel of the notebook would set it again
        own = {k: v for k, v in os.environ.items() if launched.get(k) != v or k == env.ROOT_PID}
        os.environ.clear()
        os.environ.update({k: v for k, v in new.items() if isinstance(k, str) and isinstance(v, str)})
        for name in (env.GRANT_FD, env.ASK_FD):
            os.environ.pop(name, None)
        os.environ.update(own)
    if isinstance(cwd, str) and cwd:
        old = os.getcwd()
        try:
            os.chdir(cwd)
        except OSError as e:
            sys.stderr.write(f"jupyter-gpushare: the kernel could not change to its notebook's directory {cwd}: {e}\n")
        else:
            sys.path[:] = [cwd if p == old else p for p in sys.path]
            shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
            dirs = shell.user_ns.get("_dh") if shell is not None else None
            if isinstance(dirs, list):  # %cd's history (IPython's own list, of paths) starts where the kernel starts
                dirs[:] = [type(dirs[0])(cwd) if dirs else cwd]
    app = getattr(sys.modules.get("ipykernel.kernelapp"), "IPKernelApp", None)
    if isinstance(connection, str) and app is not None and app.initialized():
        app.instance().connection_file = connection
    _state["granted"] = os.environ.get(env.MODE) == "gpu"
    if given.get("pipe") is False:
        _state["reading"] = False
    try:
        os.unlink(old_report)
    except OSError:
        pass
    rep.write_report()
    _tell("ready")


def _stand_by(changes: dict) -> str:
    """The server asks this kernel to give back the GPU it holds and has not used: it does, unless a GPU framework
    (or CUDA binding) was imported since its start (that one may hold the card, or will: CUDA is set up once a
    process), or a child process runs (started with the card in its environment). Then the next GPU import asks for
    a GPU again and waits, as at a first use. What to answer. (Called with ``_cond`` held, as every import's wait for
    the GPU takes it: none begins meanwhile.)"""
    if not _state["granted"] or os.environ.get(env.MODE) != "gpu":
        return "kept:not-granted"
    imported = [name for name in WAITS if name in sys.modules]
    if imported:
        return "kept:" + ",".join(imported)
    if _children():  # one may use the card it was started with (`!python train.py`): it would lose it midway
        return "kept:children"
    _apply(changes)
    _state["granted"], _state["place"] = False, None
    return "standby"


def _children() -> list[int]:
    """This process's live child processes (Linux's /proc; none where it cannot be read)."""
    me, found = os.getpid(), []
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()  # (the name, in parentheses, may hold anything)
        if len(fields) > 1 and fields[1] == str(me).encode() and fields[0] != b"Z":
            found.append(int(pid))
    return found


def _hear_demands() -> None:
    """From the first park on, every cell and every comm message of this kernel asks to bring it back while it is
    parked (``_demand``): hooked once, into IPython's events and the kernel's shell handlers, as they are now."""
    ipython = sys.modules.get("IPython")
    shell = getattr(ipython, "get_ipython", lambda: None)() if ipython else None
    if shell is None:
        return
    if "cells" not in _hooked:
        try:
            shell.events.register("pre_run_cell", _cell_demand)
            shell.events.register("post_run_cell", _cell_done)
            _hooked.add("cells")
        except Exception as e:  # (an IPython without events)
            rep.warn(f"a cell cannot bring this parked kernel back: {e}")
    kernel = getattr(shell, "kernel", None)
    handlers = getattr(kernel, "shell_handlers", None)
    comm = handlers.get("comm_msg") if isinstance(handlers, dict) else None
    if "comms" not in _hooked and isinstance(handlers, dict) and comm is not None:

        def comm_msg(*args, **kwargs):
            _demand()
            return comm(*args, **kwargs)

        handlers["comm_msg"] = comm_msg
        _hooked.add("comms")


def _not_back(why: str) -> None:
    """A resume did not happen, and a cell runs: a GPU call in it waits in the driver until the state is back (the
    server tries again while the kernel is busy). The cell says why, in the server's words, once for each reason.
    Written from the pipe's thread, so ipykernel puts it in the running cell. (Called with ``_cond`` held.)"""
    sys.stdout.write(
        f"jupyter-gpushare: its GPU state did not come back. {why[:400]} To give up instead, restart the kernel (its "
        "variables are lost).\n"
    )
    sys.stdout.flush()


def _new_place(before: dict, parked: dict) -> bool:
    position = parked.get("position")
    return isinstance(position, int) and not isinstance(position, bool) and position != before.get("position")


def _say_place(position: int) -> None:
    """A parked kernel waits in line to come back while a cell runs: the cell says its place, once each time it
    changes (its CPU work ran on meanwhile). Written from the pipe's thread, so ipykernel puts it in the running
    cell. (Called with ``_cond`` held.)"""
    sys.stdout.write(f"jupyter-gpushare: its GPU state comes back when the card has room: #{position} in line.\n")
    sys.stdout.flush()


def _cell_done(*_args) -> None:
    with _cond:
        _state["cell"] = False


def _demand() -> bool:
    """Ask the server to bring this parked kernel back (once a park: it is on its way until it says ``back``);
    whether it is parked."""
    with _cond:
        parked: dict | None = _state["parked"]
        if parked is None:
            _state["wanted"] = True  # (a park under way hears it once it is done: ``_take``)
            return False
        if not parked.get("asked"):
            parked["asked"] = _tell("resume")
        return True


def _cell_demand(*_args) -> None:
    """A cell begins (any client's): a parked kernel comes back, and the cell says so in one line."""
    with _cond:
        _state["cell"] = True
    if not _demand():
        return
    place = (_state["parked"] or {}).get("position")
    where = f" (#{place} in line)" if isinstance(place, int) else ""
    sys.stdout.write(
        f"jupyter-gpushare: this kernel was parked; its GPU state comes back now{where}. CPU work runs at once; a "
        "GPU call in this cell waits until it is back.\n"
    )
    sys.stdout.flush()


def parkable(allowed=None) -> str:
    """The server asks before a park: "ok", or why not: a GPU framework that is not in ``allowed`` (its
    GPU state does not survive a park: JAX's did not), or while a thread that the notebook started runs, or a child
    process (a model served from a thread, a demo's web server, a program started with ``!``: their GPU calls come
    from no cell, so nothing would bring the kernel back for them). A port the kernel listens on is not asked about:
    something of the kernel answers it, a thread or a process; and a kernel's own ports vary (ipykernel 7 listens on
    six). Asking also starts the kernel listening for demands, so one that comes while the park is under way is heard
    (``_take``)."""
    import threading

    _hear_demands()  # (hooked now, in the main thread: a demand during the park is heard)
    with _cond:
        _state["wanted"] = False
    if allowed is not None:
        other = [NAMES[m] for m in NAMES if m in sys.modules and m not in allowed]
        if other:
            return f"it imported {', '.join(other)}, whose GPU state is not known to survive a park (park_frameworks)"
    no_cell = "their GPU calls would come from no cell"
    children = _children()
    if children:
        return f"child processes run ({', '.join(map(str, children[:5]))}): {no_cell}"
    mine = []
    for thread in threading.enumerate():
        if thread is threading.main_thread() or not thread.is_alive():
            continue
        target = getattr(thread, "_target", None) or getattr(type(thread), "run", None)
        module = getattr(target, "__module__", None) or type(thread).__module__ or ""
        if not module.startswith(_INFRASTRUCTURE):
            mine.append(thread.name)
    return f"threads its notebook started run ({', '.join(sorted(mine))[:200]}): {no_cell}" if mine else "ok"


# The threads of a kernel that are Jupyter's, Python's and ours, by the module of their code: any other is one the
# notebook started.
_INFRASTRUCTURE = (
    "ipykernel", "IPython", "jupyter_client", "zmq", "tornado", "asyncio", "concurrent.futures", "threading",
    "queue", "_gpushare", "debugpy", "traitlets", "comm",
)  # fmt: skip


def _tell(answer: str) -> bool:
    """Write one line to the server on the ask pipe; False when it cannot be (no pipe, or the server is gone)."""
    fd = _state["ask_fd"]
    if fd is None:
        return False
    try:
        os.write(fd, answer.encode() + b"\n")
    except OSError:
        return False
    return True


def can_rejoin() -> str:
    """The server asks whether this kernel, whose wait ended without a GPU, can wait again in place (its variables
    kept): "ok", else why not. Only a kernel that has imported no GPU framework since can: one that ran without a
    GPU keeps that (CUDA is set up once a process). Read only: the server then says ``{"rejoin": true}`` on the
    pipe, and the kernel waits again from there (a late answer, to a question the server gave up on, changes
    nothing)."""
    with _cond:
        if not _state["reading"]:
            return "no-pipe"
        if os.environ.get(env.MODE) != "cpu":
            return "not-ended"
        imported = [name for name in WAITS if name in sys.modules]
        return "imported:" + ",".join(imported) if imported else "ok"


def _rejoined() -> None:
    """In line again (the server said so): the next GPU framework's import waits for the grant again. (Called with
    ``_cond`` held.)"""
    if os.environ.get(env.MODE) == "cpu":
        _state["granted"], _state["place"] = False, None
        os.environ[env.MODE] = "queued"
        os.environ.pop(env.REASON, None)


def _ask() -> bool:
    """Ask the server for this kernel's GPU (its first GPU use, or the first since it stood by): it then waits as a
    kernel in line does. False when it cannot ask (no pipe, or the server is gone): the framework goes on without a
    GPU. (Called with ``_cond`` held.)"""
    if not _tell("ask"):
        return False
    os.environ[env.MODE] = "queued"
    return True


def _said(module: str, place: dict | None) -> str:
    """The line a waiting cell prints, again each time it changes: its place, its need and its times, never the
    card's unreserved room, which changes with every neighbour's allocation (the banner and the sidebar show it as it
    is; a printed line would keep a stale figure)."""
    name = NAMES.get(module, module)
    if not place:
        return f"jupyter-gpushare: {name} waits for this kernel's GPU (in line)."
    figures = []
    if isinstance(place.get("position"), int):
        figures.append(f"#{place['position']} in line")
    if isinstance(place.get("need_mib"), int):
        figures.append(f"needs {_size(place['need_mib'])}")
    for key, words in (("likely_at", "likely granted by"), ("gives_up_at", "gives up at")):
        if isinstance(place.get(key), int):
            figures.append(f"{words} {time.strftime('%H:%M', time.localtime(place[key]))}")
    return f"jupyter-gpushare: {name} waits for this kernel's GPU: {', '.join(figures)}."


def _size(mib: int) -> str:
    return f"{mib / 1024:.1f} GiB" if mib >= 1024 else f"{mib} MiB"


class GpuWaitEnded(RuntimeError):
    """The wait for this kernel's GPU ended without one (stopped, or past the line's timeout) while a cell waited."""

    stops_import = True  # the import fails with it (_gpushare_boot lets it through), and the next one runs

    def _render_traceback_(self):
        """What IPython shows in the cell instead of a traceback through the import machinery and this module (47-55
        lines): the reason is all there is to read."""
        return [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {self}"]


class WarmImport(ImportError):
    """A GPU framework imported in a warm kernel, before a notebook's hand-over (GpuShareApp.warm_imports)."""

    stops_import = True


class WarmKept(ImportError):
    """A framework's code ran in a warm kernel (``WARM_FIRST``): the module is kept for the notebook's own import."""

    stops_import = True


def _keep_for_the_notebook(module) -> None:
    """After a warm kernel ran a framework's code: the import ends here, and the loader keeps the module for the
    notebook's import (_gpushare_boot's ``keep``), whose wait and caps come at the hand-over."""
    raise WarmKept(
        f"jupyter-gpushare: {module.__name__}'s code ran in this warm kernel; its import completes, with the GPU "
        "and caps, once a notebook opens the kernel."
    )


def wait_for_gpu(module):
    """A framework's pre-import hook: return once the kernel holds its grant. An interrupt raises KeyboardInterrupt
    here: the import fails, the kernel stays in line, and the next import waits again. A wait that ends without a
    GPU raises GpuWaitEnded in the cell that waited; later imports go on without a GPU. A framework that imports
    first (``IMPORTS_FIRST``) waits here only until its kernel is near the front of the line (``_near_front``), and
    then returns what to call once its code ran (``_gpushare_boot`` does): the rest of the wait, before the import
    returns."""
    name = module.__name__
    if os.environ.get(env.MODE) == "warm":
        if name in WARM_FIRST and _imports_first(module):
            return _keep_for_the_notebook
        raise WarmImport(
            f"jupyter-gpushare: a warm kernel imports no GPU framework ({name}) before a notebook opens it: its "
            "import waits for the notebook's GPU and caps."
        )
    with _cond:
        if not _must_wait(name):
            return None
        first = _imports_first(module)
        said = _wait(name, _near_front if first else None)
        if first and not _state["granted"] and _state["reading"]:
            return lambda _module: _wait_and_say(name, said)
    _say_after(name, said)
    return None


def _must_wait(name: str) -> bool:
    """Whether this import waits for the GPU (a kernel in line, or one standing by, which asks first here). (Called
    with ``_cond`` held.)"""
    if not _state["using"] and _state["reading"] and os.environ.get(env.MODE) != "standby":
        # The server need not ask it to stand by now (it would say no: a framework is imported from here on), nor
        # wait for its answer meanwhile: said once, before the import's first line runs
        _state["using"] = _tell("using")
    child = os.environ.get(env.ROOT_PID) != str(os.getpid())  # a program the kernel started
    if child and os.environ.get(env.MODE) in ("queued", "standby"):
        sys.stderr.write(
            f"jupyter-gpushare: {name} runs without a GPU in this process: its kernel holds none now, and a "
            f"program the kernel started cannot ask for one. Import {name} in a cell of the notebook first (it "
            "waits for the kernel's GPU there), then start the program again.\n"
        )
        return False
    if _state["granted"] or not _state["reading"]:
        return False
    if os.environ.get(env.MODE) == "standby":
        if not _ask():
            sys.stderr.write(
                f"jupyter-gpushare: {name} runs without a GPU: this kernel could not ask for one (its pipe to "
                "the server is closed). Restart the kernel to ask again.\n"
            )
            return False
        # The server answers at once, with the grant or the kernel's place: say the place, not "in line".
        _cond.wait_for(lambda: _state["place"] or _state["granted"] or not _state["reading"], ASK_ANSWER_S)
    return True


def _imports_first(module) -> bool:
    """Whether this framework's code may run before the grant: listed in IMPORTS_FIRST, at a version measured so."""
    since = IMPORTS_FIRST.get(module.__name__)
    if since is None:
        return False
    version = rep.torch_build(module)[0] or rep.dist_version(module)  # its own version.py (torch), else its dist-info
    return version is not None and rep.version_tuple(version) >= since


def _near_front() -> bool:
    """Whether this kernel is within the first places of the line, as many as half this host's CPUs: so many
    framework imports run at once while kernels wait, beside the kernels that compute. (Called with ``_cond``
    held.)"""
    position = (_state["place"] or {}).get("position")
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 2
    return isinstance(position, int) and position <= max(1, cpus // 2)


def _wait_and_say(name: str, said: str | None) -> None:
    with _cond:
        said = _wait(name, said=said)
    _say_after(name, said)


def _wait(name: str, until=None, said: str | None = None) -> str | None:
    """Until the grant, the wait's end, or ``until()`` (the place said first); what was last said of the place (None:
    nothing, it did not wait). (Called with ``_cond`` held.)"""
    while not _state["granted"] and _state["reading"]:
        now = _said(name, _state["place"])
        if now != said:  # (the first time with how to stop; again only when the place changes)
            if said is None:
                _tell_cell()
            first = " Other cells run on the CPU meanwhile. Interrupt the kernel to stop this cell; the kernel keeps its place."
            sys.stdout.write(now + (first if said is None else "") + "\n")  # (not red in the cell: no error)
            sys.stdout.flush()
            said = now
        if until is not None and until():
            break
        _cond.wait(0.5)  # (a timed wait: the main thread's interrupt is seen at once)
    return said


def _tell_cell() -> None:
    """Say which cell waits (the request's message id, a hash of its code, its number): a page reloaded meanwhile
    finds it by its code and shows what it prints once it runs (the sidebar's heldcell.ts). Nothing where it is not
    an IPython kernel's cell."""
    import json

    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    kernel = getattr(shell, "kernel", None)
    try:
        parent = kernel.get_parent("shell") if kernel is not None else {}
        msg_id, code = parent["header"]["msg_id"], parent["content"]["code"]
    except Exception:  # (not an ipykernel cell, or another kernel's layout: the cell is not said)
        return
    if isinstance(msg_id, str) and isinstance(code, str) and len(msg_id) <= 100:
        said = {"msg_id": msg_id, "hash": code_hash(code), "count": getattr(shell, "execution_count", None)}
        _tell("cell:" + json.dumps(said, separators=(",", ":")))


def code_hash(code: str) -> str:
    """FNV-1a (32 bits) of the code's UTF-8 bytes, in hex: the sidebar computes the same of each cell's source."""
    h = 0x811C9DC5
    for byte in code.encode("utf-8"):
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return f"{h:08x}"


def _say_after(module: str, said: str | None) -> None:
    """What the cell hears when its wait is over: that the GPU is its kernel's now (if it waited), or why it runs
    without one."""
    name = NAMES.get(module, module)
    if os.environ.get(env.MODE) != "gpu":
        reason = os.environ.get(env.REASON) or "the wait for a GPU ended"
        if said is not None:  # this cell waited: it says that it did not run, and why (the next one runs on the CPU)
            raise GpuWaitEnded(
                f"jupyter-gpushare: this cell did not run: {reason} Run it again to use the CPU, or choose "
                "Join again above the notebook to wait for a GPU, with this kernel's variables."
            )
        sys.stderr.write(f"jupyter-gpushare: {name} runs without a GPU: {reason}\n")
        sys.stderr.flush()
    elif said is not None:
        sys.stdout.write(f"jupyter-gpushare: the GPU is this kernel's now; {name} goes on.\n")
        sys.stdout.flush()  # before the cell's next output: PyTorch's import now returns at once after it
