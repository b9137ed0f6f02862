"""The client a Jupyter server uses to reserve through the host's broker (server.py).

``BrokerLedger`` answers the same calls as the embedded ``Ledger``, so the manager uses either the same way.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import ssl
import struct
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

from ..core.addresses import BrokerAt
from ..core.history import HistoryRules, Learned, Run, history_key
from ..core.policy import Policy, PolicyError, UserLimits, parse_limits
from ..host.gpu import Card
from ..ledger.leases import lease_from_json, waiter_from_json, waiting_from_json
from ..ledger.ledger import Lease, LedgerError, ProcessRef, Request, Waiter, Waiting
from ..ledger.notices import Notice
from .protocol import HUB_TOKEN_ENV, MAX_REPLY, is_tcp, parse_tcp, policy_error_from

log = logging.getLogger("jupyter_gpushare.broker")


@dataclass
class _Outage:
    since: float
    message: str


class BrokerSaidNo(LedgerError):
    """The broker answered, and refused the request (not the caller's kernel, not its admin, bad arguments): a
    LedgerError like any, which a caller may tell from the broker being down."""


class _Refused(Exception):
    """What trying again does not mend, said as it is: the broker did not accept this server's JupyterHub token,
    the socket is not the broker's, or its answer is too large."""


@dataclass
class BrokerLedger:
    """The Ledger interface, answered by the host's broker over its Unix socket.

    Same methods and signatures as Ledger, so QuotaManager uses it unchanged. Not thread-safe (the
    manager calls it from its one ledger thread). It reconnects on each call after a failure, so a
    broker restart is invisible; while the broker is down, reserve raises LedgerError with
    what to do, releases and attaches are kept and sent once it is back, and queries answer empty,
    with ``on_state`` told the reason (and None once the broker answers again).

    ``path`` is the broker's Unix socket, or 'tcp://host:port' ('tls://host:port': TLS, the broker's
    certificate checked against ``ca_file`` or the system's CAs) for a server in a container: it then
    authenticates with ``token`` (default: $JUPYTERHUB_API_TOKEN, which every Hub-started server has)
    and an instance id of its own, which names its session at the broker.
    """

    path: str
    timeout: float = 15.0
    ca_file: str = ""
    on_state: Callable[[str | None], None] | None = None
    owner: ProcessRef = field(default_factory=ProcessRef.me)
    token: str | None = None
    instance: str = field(default_factory=lambda: uuid.uuid4().hex)
    broker_uids: frozenset[int] = frozenset()  # who may serve the socket besides root and us (GpuShareApp.broker_users)
    _sock: socket.socket | None = field(default=None, repr=False)
    _file: Any = field(default=None, repr=False)
    _pending_release: set = field(default_factory=set, repr=False)
    _pending_attach: dict = field(default_factory=dict, repr=False)
    outage: _Outage | None = field(default=None, repr=False)
    replaced: str | None = None  # (the broker's file is the broker's to watch)
    _hello: tuple[float, dict] | None = field(default=None, repr=False)

    @classmethod
    def at(cls, where: BrokerAt, **kwargs: Any) -> BrokerLedger:
        """A client of the broker ``where`` says (its socket, its CA, whom to believe there)."""
        return cls(where.socket, ca_file=where.ca_file, broker_uids=where.uids, **kwargs)

    # -- transport ---------------------------------------------------------------------------------------

    @property
    def tcp(self) -> bool:
        return is_tcp(self.path)

    def _connect(self) -> None:
        token = os.environ.get(HUB_TOKEN_ENV, "") if self.token is None and self.tcp else self.token
        if self.tcp and not token:
            raise _Refused(
                f"This server has no JupyterHub API token (${HUB_TOKEN_ENV}) to identify itself to the GPU broker at "
                f"{self.path}. A broker on TCP serves servers started by a JupyterHub; outside one, use its Unix socket."
            )
        if self.tcp:
            host, port = parse_tcp(self.path, "GpuShareApp.broker_socket")
            sock = socket.create_connection((host, port), timeout=self.timeout)
            if self.path.startswith("tls://"):
                sock = self._wrap_tls(sock, host)
        else:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            try:
                sock.connect(self.path)
                self._check_peer(sock)
            except (OSError, _Refused):
                sock.close()
                raise
        self._sock, self._file = sock, sock.makefile("rb")
        if token:
            reply = self._exchange("auth", {"token": token, "instance": self.instance})
            if not reply.get("ok"):
                self._drop()
                raise _Refused(f"The GPU broker at {self.path} refused this server: {reply.get('message', reply)}")

    def _check_peer(self, sock: socket.socket) -> None:
        """Whoever listens at the socket must be the broker, by its credentials (SO_PEERCRED), never by a path: root,
        this server's own user (a broker a user runs for themself), or a user the admin named as the broker's
        (GpuShareApp.broker_users). Anyone else would receive this server's leases and answer its quotas."""
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, _ = struct.unpack("3i", creds)
        if uid not in {0, os.getuid(), *self.broker_uids}:
            raise _Refused(
                f"The socket {self.path} is served by uid {uid} (pid {pid}): not root, not this server's user, and "
                "not a user named in GpuShareApp.broker_users. It is not the GPU broker, and nothing was sent to it. "
                "Check GpuShareApp.broker_socket; if the broker runs as a user of its own, name that user in "
                "GpuShareApp.broker_users."
            )

    def _wrap_tls(self, sock: socket.socket, host: str) -> ssl.SSLSocket:
        try:
            return ssl.create_default_context(cafile=self.ca_file or None).wrap_socket(sock, server_hostname=host)
        except ssl.SSLCertVerificationError as e:
            sock.close()
            raise _Refused(
                f"This server does not trust the GPU broker's certificate at {self.path} ({e.verify_message}). Set "
                "GpuShareApp.broker_ca_file to the CA that signed GpuShareBroker.tcp_certfile; the certificate "
                f"must name {host!r}."
            ) from e
        except Exception:  # no TLS there (ssl.SSLError), an unreadable CA file: reported as not reachable
            sock.close()
            raise

    def _drop(self) -> None:
        sock, file = self._sock, self._file  # (``close`` from another thread may drop it too)
        self._sock = self._file = None
        if sock is not None:
            with contextlib.suppress(OSError):
                file.close()
                sock.close()

    def _exchange(self, op: str, args: dict) -> dict:
        sock, file = self._sock, self._file  # (``close`` from another thread may drop them at any point: CI run 50)
        if sock is None or file is None:
            raise ConnectionResetError("the connection was closed")
        sock.sendall(json.dumps({"op": op, "args": args}).encode() + b"\n")
        line = file.readline(MAX_REPLY)  # (the broker's answers may be long; requests are capped on its side)
        if not line:
            raise ConnectionResetError("the broker closed the connection")
        if not line.endswith(b"\n"):
            raise _Refused(f"The GPU broker's answer to {op!r} is too large (more than {MAX_REPLY >> 20} MiB).")
        return json.loads(line)

    def _down_message(self, e: BaseException) -> str:
        hint = {
            "tls": " If the broker has no GpuShareBroker.tcp_certfile, it speaks plain TCP: use tcp://.",
            "tcp": " If the broker has GpuShareBroker.tcp_certfile, it speaks TLS: use tls://.",
        }.get(self.path.partition("://")[0] if self.tcp else "", "")
        return (
            f"The GPU broker at {self.path} is not reachable ({e}). GPU reservations for this host go through it, "
            "so kernels start without a GPU until it is back. Ask the administrator "
            f"to check it (systemctl status jupyter-gpushare-broker; jupyter gpushare doctor).{hint}"
        )

    def _call(self, op: str, **args: Any) -> Any:
        reply = None
        for attempt in (0, 1):  # a connection the broker dropped (restart) is retried once, fresh
            try:
                if self._sock is None:
                    self._connect()
                    self._replay()
                reply = self._exchange(op, args)
                break
            except (OSError, ValueError, _Refused) as e:
                self._drop()
                if attempt or isinstance(e, _Refused):
                    message = str(e) if isinstance(e, _Refused) else self._down_message(e)
                    if self.outage is None or self.outage.message != message:
                        self.outage = _Outage(time.time(), message)
                        log.error("%s", message)
                        if self.on_state:
                            self.on_state(message)
                    raise LedgerError(message) from e
        if self.outage is not None:
            log.warning("jupyter-gpushare: the GPU broker at %s answers again.", self.path)
            self.outage = None
            if self.on_state:
                self.on_state(None)
        assert reply is not None
        if reply.get("ok"):
            return reply.get("result")
        if reply.get("error") == "PolicyError":
            raise policy_error_from(reply)
        raise BrokerSaidNo(f"The GPU broker refused: {reply.get('message', reply)}")

    def _replay(self) -> None:
        """Send the releases and attaches that were made while the broker was down."""
        for kernel_id in list(self._pending_release):
            self._exchange("release", {"kernel_id": kernel_id})
            self._pending_release.discard(kernel_id)
            self._pending_attach.pop(kernel_id, None)
        for kernel_id, pid in list(self._pending_attach.items()):
            self._exchange("attach", {"kernel_id": kernel_id, "pid": pid})
            self._pending_attach.pop(kernel_id, None)

    def _query(self, op: str, empty: Any, **args: Any) -> Any:
        try:
            return self._call(op, **args)
        except LedgerError:
            if self.outage is None:
                raise
            return empty

    def close(self) -> None:
        """Close the connection; a call that holds it in another thread (a ``watch``) ends at once. Closing alone
        would wait for that thread's read to return (a program after a wait idled until its watch's end, 25 s)."""
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
        self._drop()

    # -- the Ledger interface -----------------------------------------------------------------------------

    def hello(self) -> dict:
        return self._call("hello")

    def caller(self) -> tuple[str | None, bool, UserLimits | None]:
        """Who the broker says this server is (asked at most every 5 s): user, admin, per-user limits."""
        if self._hello is None or time.monotonic() - self._hello[0] > 5.0:
            self._hello = (time.monotonic(), self.hello())
        hello = self._hello[1]
        limits = UserLimits(**parse_limits(hello.get("limits") or {}, "The broker's limits"))  # type: ignore[arg-type]
        return hello.get("user"), bool(hello.get("admin")), limits

    def outside(self, samples: Sequence[Any], leases: Sequence[Any] | None = None) -> None:
        """The broker measures what processes without a reservation use itself, from every user's leases."""
        return None

    def kernel_notebooks(self) -> dict[str, str]:
        """Every kernel's notebook, as its server said it with its reserve (the broker's admins only; {} else)."""
        return dict(self._call("kernel_notebooks"))

    def view(self) -> dict:
        """What the broker shows this caller (see view_for)."""
        return self._call("view")

    def reserve(
        self,
        req: Request,
        policy: Policy | None = None,
        cards: Sequence[Card] = (),
        wait: bool = False,
        limits: UserLimits | None = None,
        outside: Any = None,
    ) -> Lease | Waiting:
        """Reserve through the broker. ``policy``, ``limits``, ``outside`` and ``req.user`` are the broker's to decide
        and are not sent; ``cards`` (the real cards this server sees) restrict where the broker may place the kernel.
        What processes without a reservation use, the broker measures itself."""
        visible = [c.uuid for c in cards if not c.simulated]
        path = history_key(req.path)  # (a path the broker would refuse is not sent: the kernel goes by its id)
        extra = {**({"cards": visible} if visible else {}), **({"path": path} if path else {})}
        got = self._call("reserve", kernel_id=req.kernel_id, mib=req.quota.mib, percent=req.quota.percent, kernel_name=req.kernel_name, wait=wait, **extra)  # fmt: skip
        if "lease" in got:
            return lease_from_json(got["lease"])
        return waiting_from_json(got["waiting"])

    def record_peak(self, kernel_id: str, path: str, run: Run, rules: HistoryRules | None = None) -> bool:
        """Send a run; the broker keys it by this server's user and the lease's kernelspec, and keeps it by its own
        rules. Lost (False) while the broker is down: history is advice, not a reservation."""
        figures = {"peak_mib": run.peak_mib, "failed": run.failed}
        if run.need_mib is not None:
            figures["need_mib"] = run.need_mib
        return bool(self._query("record_peak", False, kernel_id=kernel_id, path=path, **figures))

    def learned_peak(self, user: str, kernel_name: str, path: str, rules: HistoryRules | None = None) -> Learned | None:
        """What the broker says this server's user learns for a notebook (its rules; ``user`` is not sent: the
        broker knows who calls)."""
        return Learned.from_json(self._query("learned_peak", None, kernel_name=kernel_name[:200], path=path))

    def act(self, kernel_id: str, action: str, by: str, why: str) -> Notice:
        """The broker acts as its caller (``by`` is who the broker knows the caller as); BrokerRefused, as a
        LedgerError, when the caller is not one of its admins or the kernel is not where the action needs it."""
        return Notice.from_json(self._call("act", kernel_id=kernel_id, action=action, why=why))

    def watch(self, since: int, wait_s: float) -> int:
        """Wait at the broker until the host's line may move (a reservation given back anywhere, a wait ended, the
        line reordered: broker/room.py), at most ``wait_s``: the broker's count of such changes. The call holds its
        connection that long (a client of its own: ``twin``), and is not tried again on a dropped connection (the
        caller watches again, or has closed it to stop)."""
        try:
            if self._sock is None:
                self._connect()
            sock = self._sock  # (closed from another thread meanwhile: None, or its calls raise OSError)
            if sock is None:
                raise ConnectionResetError("the connection was closed")
            sock.settimeout(self.timeout + wait_s)
            reply = self._exchange("watch", {"since": since, "wait_s": wait_s})
            with contextlib.suppress(OSError):
                sock.settimeout(self.timeout)
        except (OSError, ValueError, _Refused) as e:
            self._drop()
            raise LedgerError(str(e) if isinstance(e, _Refused) else self._down_message(e)) from e
        count = reply.get("result")
        if not reply.get("ok"):
            raise BrokerSaidNo(f"The GPU broker refused: {reply.get('message', reply)}")
        if not isinstance(count, int) or isinstance(count, bool):
            raise LedgerError(f"The GPU broker answered a watch with {count!r}, not a count.")
        return count

    def twin(self) -> BrokerLedger:
        """A client on a connection of its own, as this server (its session too, on TCP)."""
        return BrokerLedger(
            self.path, self.timeout, self.ca_file, owner=self.owner, token=self.token, instance=self.instance,
            broker_uids=self.broker_uids,
        )  # fmt: skip

    def take_notices(self, kernel_ids: set[str]) -> list[Notice]:
        return [Notice.from_json(n) for n in self._call("take_notices", kernel_ids=sorted(kernel_ids))]

    def park(self, kernel_id: str, mib: int, budget_mib: int | None = None) -> None:
        """Count a park against the host's one budget, the broker's (``budget_mib`` is not sent); PolicyError
        ``park-budget`` when it does not fit."""
        self._call("park", kernel_id=kernel_id, mib=mib)

    def unpark(self, kernel_id: str) -> None:
        self._query("unpark", None, kernel_id=kernel_id)

    def cancel_wait(self, kernel_id: str) -> None:
        try:
            self._call("cancel_wait", kernel_id=kernel_id)
        except LedgerError:
            if self.outage is None:
                raise  # while the broker is down, its waiter goes stale without heartbeats and is dropped

    def attach(self, kernel_id: str, kernel: ProcessRef | None) -> None:
        pid = kernel.pid if kernel else None
        try:
            self._call("attach", kernel_id=kernel_id, pid=pid)
        except LedgerError:
            if self.outage is None:
                raise
            self._pending_attach[kernel_id] = pid

    def resize(
        self,
        kernel_id: str,
        quota_mib: int,
        policy: Any = None,
        cards: Any = None,
        limits: Any = None,
        outside: Any = None,
    ) -> Lease | None:
        """Change a kernel's quota on its lease through the broker: its rules, limits and measurements apply, not
        this server's (``policy``, ``cards``, ``limits`` and ``outside`` are not sent)."""
        got = self._call("resize", kernel_id=kernel_id, quota_mib=quota_mib)
        return lease_from_json(got) if got else None

    def release(self, kernel_id: str) -> Lease | None:
        try:
            got = self._call("release", kernel_id=kernel_id)
        except LedgerError:
            if self.outage is None:
                raise
            self._pending_release.add(kernel_id)
            log.warning(
                "jupyter-gpushare: kernel %s's reservation will be released when the broker is back.", kernel_id
            )
            return None
        return lease_from_json(got) if got else None

    def release_owned_except(self, keep: set[str]) -> list[Lease]:
        return [lease_from_json(d) for d in self._query("release_owned_except", [], keep=sorted(keep))]

    def reap(self) -> list[Lease]:
        return [lease_from_json(d) for d in self._query("reap", [])]

    def leases(self) -> list[Lease]:
        """This user's leases, and other users' as one nameless lease per card (admins: all)."""
        return [lease_from_json(d) for d in self._query("leases", [])]

    def get(self, kernel_id: str) -> Lease | None:
        got = self._query("get", None, kernel_id=kernel_id)
        return lease_from_json(got) if got else None

    def waiters(self) -> list[Waiter]:
        return [waiter_from_json(d) for d in self._query("waiters", [])]

    # -- kernels' cgroups the broker owns (groups.py) --------------------------------------------------------

    def group_cards(self, kernel_id: str) -> None:
        """Open the kernel's lease's card to its group (OSError: the broker did not)."""
        try:
            self._call("group_cards", kernel_id=kernel_id)
        except (LedgerError, PolicyError) as e:
            raise OSError(str(e)) from e

    def end_group(self, kernel_id: str, keep: bool = False) -> int:
        """End what is left in the kernel's group and, unless ``keep`` (a restart), remove it; how many processes
        had to be ended (OSError: the broker did not)."""
        try:
            return int((self._call("end_group", kernel_id=kernel_id, keep=keep) or {}).get("killed", 0))
        except (LedgerError, PolicyError) as e:
            raise OSError(str(e)) from e
