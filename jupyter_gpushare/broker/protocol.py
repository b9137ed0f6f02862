"""The broker's wire protocol: one JSON object per line each way, and the one place requests are checked.

``{"op": "reserve", "args": {...}}`` -> ``{"ok": true, "result": ...}`` or
``{"ok": false, "error": "PolicyError" | "LedgerError" | "Refused", "message": "..."}``.

Every byte a caller sends is untrusted: ``decode_request`` turns a line into an operation name and typed
arguments (``REQUESTS``), or raises BrokerRefused saying what was wrong. Nothing past it re-checks a type,
a range or a length, and nothing a caller sends about who it is (user, uid, pid) is read at all.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

from ..core.addresses import DEFAULT_LEDGER, DEFAULT_SOCKET, is_tcp, parse_tcp  # noqa: F401  (the broker's names)
from ..core.history import MAX_PATH, MAX_PEAK_MIB, PATH, Run
from ..core.policy import MAX_MIB, PolicyError, Size
from ..ledger.leases import ADOPTED_ID_PREFIX
from ..ledger.notices import ACTIONS, WHY, WHY_MAX

MAX_LINE = (
    64 << 10
)  # bytes of one request line (a real one is under 1 KB; a server's keep list of 1,000 kernels ~40 KB)
MAX_REPLY = 64 << 20  # bytes of one answer the client reads (an admin's view of a busy host: a few MB)
HUB_TOKEN_ENV = "JUPYTERHUB_API_TOKEN"  # what a server started by a JupyterHub authenticates with
MAX_PID = 1 << 22  # Linux's pid_max ceiling
KERNEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}", re.ASCII)  # a jupyter uuid4, or a test's "k1"
INSTANCE_ID = re.compile(r"[A-Za-z0-9-]{1,64}", re.ASCII)
MAX_CARDS, MAX_KEEP = 64, 1_000  # cards a kernel may be placed on; kernels one server keeps (release_owned_except)


class BrokerRefused(RuntimeError):
    """A request the broker will not carry out for this caller (not theirs, bad arguments)."""


# -- typed requests --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NoArgs:
    pass


@dataclass(frozen=True)
class KernelArgs:
    kernel_id: str


@dataclass(frozen=True)
class ReserveArgs:
    kernel_id: str
    quota: Size
    kernel_name: str = ""
    wait: bool = False
    cards: tuple[str, ...] = ()  # the cards the calling server sees; () = any of the broker's
    path: str = ""  # the kernel's notebook, as its server names it (an admin's view shows it)


@dataclass(frozen=True)
class AttachArgs:
    kernel_id: str
    pid: int | None


@dataclass(frozen=True)
class ResizeArgs:
    kernel_id: str
    quota_mib: int  # the kernel's new quota on the card it holds, in whole MiB


@dataclass(frozen=True)
class KeepArgs:
    keep: frozenset[str]


@dataclass(frozen=True)
class RecordPeakArgs:
    kernel_id: str
    path: str  # the notebook, relative to the server's root ("" for a kernel without one)
    run: Run  # NVML's peak, the quota the run teaches (absent from an older server) and whether it failed


@dataclass(frozen=True)
class LearnedArgs:
    kernel_name: str
    path: str


@dataclass(frozen=True)
class EndGroupArgs:
    kernel_id: str
    keep: bool = False  # a restart: end what is in the group, keep the group


@dataclass(frozen=True)
class ActArgs:
    kernel_id: str
    action: str  # one of notices.ACTIONS
    why: str


@dataclass(frozen=True)
class ParkArgs:
    kernel_id: str
    mib: int  # the host memory its parked GPU state takes


@dataclass(frozen=True)
class KernelsArgs:
    kernel_ids: frozenset[str]


@dataclass(frozen=True)
class WatchArgs:
    since: int  # the count of changes the caller last saw (room.py)
    wait_s: float  # how long the broker may hold the answer


@dataclass(frozen=True)
class AuthArgs:
    token: str
    instance: str


class _Fields:
    """Reads one request's arguments, each check naming the operation and the field."""

    def __init__(self, op: str, args: Mapping[str, Any]):
        self.op, self.args = op, args

    def refuse(self, key: str, wanted: str) -> BrokerRefused:
        got = self.args.get(key)
        shown = repr(got) if len(repr(got)) <= 60 else repr(got)[:60] + "..."
        return BrokerRefused(f"Bad {self.op!r} request: {key!r} must be {wanted}; got {shown}.")

    def text(self, key: str, pattern: re.Pattern | None = None, max_len: int = 200, default: str | None = None) -> str:
        value = self.args.get(key, default)
        if not isinstance(value, str) or len(value) > max_len or (pattern is not None and not pattern.fullmatch(value)):
            shape = f"matching {pattern.pattern}" if pattern is not None else f"at most {max_len} characters"
            raise self.refuse(key, f"text {shape}")
        return value

    def kernel_id(self, key: str = "kernel_id") -> str:
        return self.text(key, KERNEL_ID)

    def new_kernel_id(self, key: str = "kernel_id") -> str:
        """A kernel id a caller names for itself: never one of the broker's own names for a process it gave a
        lease to (``process-<pid>-<start>``, a name anyone can compute from /proc)."""
        value = self.kernel_id(key)
        if value.startswith(ADOPTED_ID_PREFIX):
            raise BrokerRefused(
                f"Bad {self.op!r} request: kernel ids starting with {ADOPTED_ID_PREFIX!r} are the broker's names for "
                "processes it gave a lease to; a kernel's id is the one Jupyter gave it."
            )
        return value

    def flag(self, key: str) -> bool:
        value = self.args.get(key, False)
        if not isinstance(value, bool):
            raise self.refuse(key, "true or false")
        return value

    def number(self, key: str, kinds: tuple[type, ...]) -> Any:
        """A number of one of ``kinds`` or None; a bool is not a number here (True is not 1 MiB)."""
        value = self.args.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
            raise self.refuse(key, "a number" if float in kinds else "a whole number")
        return value

    def texts(self, key: str, item: re.Pattern, max_items: int) -> tuple[str, ...]:
        value = self.args.get(key) or []
        if (
            not isinstance(value, list)
            or len(value) > max_items
            or not all(isinstance(v, str) and item.fullmatch(v) for v in value)
        ):
            raise self.refuse(key, f"a list of at most {max_items} texts matching {item.pattern}")
        return tuple(value)


# A kernelspec's name as the broker keeps and prints it: no control, line-separator, bidirectional-override or
# lone-surrogate characters (a name is shown in root's `jupyter gpushare status`), like a notebook's path.
NAME = re.compile(r"[^\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]{0,200}")
CARD_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,99}", re.ASCII)  # a GPU or MIG UUID, or an index


def _reserve(f: _Fields) -> ReserveArgs:
    mib, percent = f.number("mib", (int,)), f.number("percent", (int, float))
    try:
        quota = Size(mib=mib, percent=percent)
    except PolicyError as e:
        raise BrokerRefused(f"Bad 'reserve' request: {e}") from e
    name = f.text("kernel_name", NAME, 200, default="")
    cards, path = f.texts("cards", CARD_ID, MAX_CARDS), f.text("path", PATH, MAX_PATH, default="")
    return ReserveArgs(f.new_kernel_id(), quota, name, f.flag("wait"), cards, path)


def _attach(f: _Fields) -> AttachArgs:
    pid = f.number("pid", (int,))
    if pid is not None and not 0 < pid <= MAX_PID:
        raise f.refuse("pid", f"a process id from 1 to {MAX_PID}")
    return AttachArgs(f.kernel_id(), pid)


def _record_peak(f: _Fields) -> RecordPeakArgs:
    peak, need = f.number("peak_mib", (int,)), f.number("need_mib", (int,))
    if peak is None or not 0 < peak <= MAX_PEAK_MIB:
        raise f.refuse("peak_mib", f"a whole number of MiB from 1 to {MAX_PEAK_MIB}")
    if need is not None and not 0 < need <= MAX_PEAK_MIB:
        raise f.refuse("need_mib", f"a whole number of MiB from 1 to {MAX_PEAK_MIB}")
    run = Run(peak, need, f.flag("failed"))
    return RecordPeakArgs(f.kernel_id(), f.text("path", PATH, MAX_PATH, default=""), run)


def _resize(f: _Fields) -> ResizeArgs:
    quota = f.number("quota_mib", (int,))
    if quota is None or not 0 < quota <= MAX_MIB:
        raise f.refuse("quota_mib", f"a whole number of MiB from 1 to {MAX_MIB}")
    return ResizeArgs(f.kernel_id(), quota)


def _learned(f: _Fields) -> LearnedArgs:
    return LearnedArgs(f.text("kernel_name", NAME, 200, default=""), f.text("path", PATH, MAX_PATH, default=""))


def _keep(f: _Fields) -> KeepArgs:
    return KeepArgs(frozenset(f.texts("keep", KERNEL_ID, MAX_KEEP)))


def _act(f: _Fields) -> ActArgs:
    action = f.text("action")
    if action not in ACTIONS:
        raise f.refuse("action", f"one of {', '.join(ACTIONS)}")
    return ActArgs(f.kernel_id(), action, f.text("why", WHY, WHY_MAX))


MAX_WATCH_S = 60.0  # the longest a broker holds a 'watch' answer


def _park(f: _Fields) -> ParkArgs:
    mib = f.number("mib", (int,))
    if mib is None or not 0 <= mib <= MAX_MIB:
        raise f.refuse("mib", f"a whole number of MiB from 0 to {MAX_MIB}")
    return ParkArgs(f.kernel_id(), mib)


def _watch(f: _Fields) -> WatchArgs:
    since, wait_s = f.number("since", (int,)), f.number("wait_s", (int, float))
    if since is None or not 0 <= since < 1 << 62:
        raise f.refuse("since", "a whole number from 0")
    if wait_s is None or not 0 < wait_s <= MAX_WATCH_S:
        raise f.refuse("wait_s", f"seconds, more than 0 and at most {MAX_WATCH_S:g}")
    return WatchArgs(since, float(wait_s))


def _auth(f: _Fields) -> AuthArgs:
    return AuthArgs(f.text("token", max_len=4096), f.text("instance", INSTANCE_ID))


# The operations a caller may ask for, each with the reader of its arguments (server.py answers them).
REQUESTS: dict[str, Callable[[_Fields], Any]] = {
    "auth": _auth,
    "hello": lambda f: NoArgs(),
    "view": lambda f: NoArgs(),
    "kernel_notebooks": lambda f: NoArgs(),
    "reserve": _reserve,
    "cancel_wait": lambda f: KernelArgs(f.kernel_id()),
    "attach": _attach,
    "resize": _resize,
    "release": lambda f: KernelArgs(f.kernel_id()),
    "release_owned_except": _keep,
    "reap": lambda f: NoArgs(),
    "leases": lambda f: NoArgs(),
    "get": lambda f: KernelArgs(f.kernel_id()),
    "waiters": lambda f: NoArgs(),
    "record_peak": _record_peak,
    "learned_peak": _learned,
    "enter_group": lambda f: KernelArgs(f.new_kernel_id()),
    "group_cards": lambda f: KernelArgs(f.kernel_id()),
    "end_group": lambda f: EndGroupArgs(f.kernel_id(), f.flag("keep")),
    "act": _act,
    "take_notices": lambda f: KernelsArgs(frozenset(f.texts("kernel_ids", KERNEL_ID, MAX_KEEP))),
    "watch": _watch,
    "park": _park,
    "unpark": lambda f: KernelArgs(f.kernel_id()),
}


def decode_request(line: bytes | str | dict) -> tuple[str, Any]:
    """One request line -> (operation, typed arguments). BrokerRefused says what is wrong with anything else.

    Arguments an operation does not know are ignored (a newer server may send more).
    """
    if isinstance(line, dict):
        msg: Any = line
    else:
        try:
            msg = json.loads(line)
        except (ValueError, RecursionError) as e:  # RecursionError: [[[[...]]]] nested past the parser's depth
            raise BrokerRefused(
                f"A request is one JSON object per line; this one is not JSON ({type(e).__name__})."
            ) from e
    if not isinstance(msg, dict):
        raise BrokerRefused('A request is a JSON object: {"op": "<operation>", "args": {...}}.')
    op, args = msg.get("op"), msg.get("args")
    if not isinstance(op, str) or op not in REQUESTS:
        shown = repr(op) if len(repr(op)) <= 40 else repr(op)[:40] + "..."
        raise BrokerRefused(f"Unknown request {shown}; the broker answers {', '.join(sorted(REQUESTS))}.")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise BrokerRefused(f"Bad {op!r} request: 'args' must be a JSON object.")
    return op, REQUESTS[op](_Fields(op, args))


def encode(reply: dict) -> bytes:
    return json.dumps(reply).encode() + b"\n"


def refusal(kind: str, message: str) -> dict:
    return {"ok": False, "error": kind, "message": message}


def policy_refusal(error: PolicyError) -> dict:
    """A rule's refusal, with the rule's code and figures (the server words it for its user)."""
    reply = refusal("PolicyError", str(error))
    if error.code:
        reply.update(code=error.code, params=error.params)
    return reply


_RULE_CODE = re.compile(r"[a-z][a-z-]{0,40}")
_FIGURE_NAME = re.compile(r"[a-z][a-z_]{0,40}")


def _figure(value: object) -> bool:
    """A figure a browser may be shown: a finite number (not a bool) or short text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return math.isfinite(value)
    return isinstance(value, str) and len(value) <= 40


def policy_error_from(reply: dict) -> PolicyError:
    """The PolicyError of a broker's refusal; a code or figure that is not well formed is dropped (the message
    stays), never passed on to a browser."""
    code, params = reply.get("code"), reply.get("params")
    message = str(reply.get("message", ""))[:2000]
    if not isinstance(code, str) or not _RULE_CODE.fullmatch(code) or not isinstance(params, dict):
        return PolicyError(message)
    figures = {k: v for k, v in params.items() if isinstance(k, str) and _FIGURE_NAME.fullmatch(k) and _figure(v)}
    return PolicyError(message, code, **figures)


# -- leases and waiters on the wire ------------------------------------------------------------------------
