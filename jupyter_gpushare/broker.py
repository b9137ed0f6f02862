"""Host-wide broker: one process owns the host's ledger; the Jupyter servers of many users reserve through it.

Deployment mode 2 (docs/multi-user.md). The broker runs as its own user (or root), owns the ledger file
(mode 0600) and listens on a Unix socket. Protocol: one JSON object per line each way,
``{"op": "reserve", "args": {...}}`` -> ``{"ok": true, "result": ...}`` or
``{"ok": false, "error": "PolicyError", "message": "..."}``.

The caller is identified by the kernel or by the JupyterHub, never by what it says about itself:
- On the Unix socket, SO_PEERCRED gives the uid (-> user name and groups) and the pid (-> the
  calling server process, the owner of its leases, as pid + start time).
- On TCP (``tcp_address``, for servers in containers: other PID namespaces, one shared uid), the
  first request must be ``auth`` with the server's JupyterHub API token; the Hub says whose it is
  (hub.py). With ``tcp_certfile`` the listener speaks TLS and servers connect to 'tls://host:port'.
  Its leases belong to a session (ledger.SessionRef) that lives while the server keeps calling (its
  reconcile loop does every 10 s) and expires ``session_ttl`` seconds after the last call.
A student's server can only reserve as that student, only release, attach or adopt that student's
leases, attach only processes of the same uid, and sees other users only as anonymous per-card
totals. Admins (``admin_users``, ``admin_groups``, root, the broker's own user and Hub admins) see
everything. With a Hub configured, Hub groups count as groups for limits and ``admin_groups``.
"""

from __future__ import annotations

import asyncio
import functools
import grp
import json
import logging
import os
import pwd
import signal
import socket
import ssl
import stat
import struct
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import psutil
from jupyter_core.application import JupyterApp
from traitlets import Any as AnyTrait
from traitlets import Bool, Dict, Float, List, Unicode, default

from .gpu import Card, DeviceSample
from .hub import HubClient, HubError
from .ledger import Lease, Ledger, LedgerError, Owner, ProcessRef, Request, SessionRef, Waiter, Waiting
from .policy import CardView, LimitRules, Policy, PolicyError, Size, UserLimits, format_mib, parse_limits
from .sampler import pid_namespace_depth, unreserved_use

log = logging.getLogger("jupyter_gpushare.broker")

DEFAULT_SOCKET = "/run/jupyter-gpushare/broker.sock"
DEFAULT_LEDGER = "/var/lib/jupyter-gpushare/ledger.sqlite"
MAX_LINE = 1 << 20
HUB_TOKEN_ENV = "JUPYTERHUB_API_TOKEN"  # what a server started by a JupyterHub authenticates with
SAMPLE_TTL_S = 1.0  # the driver is read at most this often for what processes without a reservation use


class BrokerRefused(RuntimeError):
    """A request the broker will not carry out for this caller (not theirs, bad arguments)."""


# -- who is calling ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Caller:
    """A connected client as the kernel identifies it."""

    user: str
    uid: int
    groups: tuple[str, ...] = ()
    admin: bool = False
    process: ProcessRef | None = None
    session: SessionRef | None = None  # a server identified by its Hub token (no process to see)

    @property
    def owner(self) -> Owner | None:
        return self.session or self.process


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket, from the kernel."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", raw)


def _top_mount(pid: int | str, mount_point: str) -> tuple[list[str], list[str]] | None:
    """The mount on top at ``mount_point`` as process ``pid`` sees it, from /proc/<pid>/mountinfo (readable
    by any user): (the fields before the "-" separator, the fields after it: type, source, options);
    None when it cannot be read or nothing is mounted there."""
    top = None
    try:
        with open(f"/proc/{pid}/mountinfo") as f:
            for line in f:  # the last one listed is the one on top
                fields = line.split()
                if len(fields) > 9 and fields[4] == mount_point and "-" in fields[6:]:
                    sep = fields.index("-", 6)
                    top = (fields[:sep], fields[sep + 1 :])
    except OSError:
        return None
    return top


def _root_filesystem(pid: int | str) -> tuple[str, ...] | None:
    """What a process sees as /: (device, directory within it, type, source) of its top "/" mount."""
    top = _top_mount(pid, "/")
    return None if top is None else (top[0][2], top[0][3], *top[1][:2])


def proc_hidden_from_me() -> str | None:
    """Why this process cannot see other users' processes in /proc (mounted with hidepid, and this
    process neither root nor in its gid= group), or None."""
    top = _top_mount("self", "/proc")
    options = dict(o.partition("=")[::2] for o in top[1][2].split(",")) if top else {}
    hidepid, gid = options.get("hidepid", "off"), options.get("gid")
    if hidepid in ("0", "off") or os.geteuid() == 0 or (gid and int(gid) in {os.getegid(), *os.getgroups()}):
        return None
    return (
        f"/proc is mounted with hidepid={hidepid}, so the broker's user {pwd.getpwuid(os.geteuid()).pw_name} cannot "
        "see other users' processes: it could not tell when a server or kernel exits. Remount /proc with a group of "
        "the broker's user (mount -o remount,hidepid=2,gid=gpushare /proc, and gid= in /etc/fstab) or run the "
        "broker as root"
    )


def container_reason(pid: int) -> str | None:
    """Why a process looks like it runs in a container, or None: it is in a PID namespace below the
    broker's own, or it sees another root filesystem than the broker (a container that shares the host's
    PIDs: ``docker run --pid=host``, Apptainer). A systemd sandbox (ProtectSystem, PrivateTmp) keeps the
    host's root filesystem and is not a container."""
    if pid_namespace_depth(pid) > max(1, pid_namespace_depth("self")):
        return f"process {pid} is in a PID namespace of its own"
    theirs, mine = _root_filesystem(pid), _root_filesystem("self")
    if theirs and mine and theirs != mine:
        return f"process {pid} sees another root filesystem, {theirs[2]} {theirs[3]}, than the broker's {mine[2]} {mine[3]}"
    return None


def user_and_groups(uid: int) -> tuple[str, tuple[str, ...]]:
    """User name and group names of a uid (the uid as text when it has no passwd entry)."""
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return str(uid), ()
    names = set()
    try:
        gids = os.getgrouplist(entry.pw_name, entry.pw_gid)
    except OSError:
        gids = [entry.pw_gid]
    for gid in gids:
        try:
            names.add(grp.getgrgid(gid).gr_name)
        except KeyError:
            names.add(str(gid))
    return entry.pw_name, tuple(sorted(names))


def is_tcp(address: str) -> bool:
    return address.startswith(("tcp://", "tls://"))


def parse_tcp(address: str, what: str) -> tuple[str, int]:
    """'host:port' (or 'tcp://host:port', 'tls://host:port') -> (host, port); ValueError that names ``what``."""
    rest = address.removeprefix("tcp://").removeprefix("tls://")
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{what} = {address!r} is not host:port; e.g. 'tcp://gpushare-broker.jhub.svc:8765'.")
    return host.strip("[]"), int(port)


# -- wire format -----------------------------------------------------------------------------------


def owner_to_json(owner: Owner) -> dict:
    if isinstance(owner, SessionRef):
        return {"session": owner.id}
    return {"pid": owner.pid, "start": owner.start}


def owner_from_json(d: dict) -> Owner:
    return SessionRef(d["session"]) if "session" in d else ProcessRef(d["pid"], d["start"])


def lease_to_json(lease: Lease) -> dict:
    kernel = lease.kernel
    return {
        "kernel_id": lease.kernel_id,
        "card_uuid": lease.card_uuid,
        "card_index": lease.card_index,
        "quota_mib": lease.quota_mib,
        "reserve_mib": lease.reserve_mib,
        "reserved_mib": lease.reserved_mib,
        "user": lease.user,
        "kernel_name": lease.kernel_name,
        "owner": owner_to_json(lease.owner),
        "kernel": {"pid": kernel.pid, "start": kernel.start} if kernel else None,
        "created": lease.created,
    }


def lease_from_json(d: dict) -> Lease:
    kernel = d.get("kernel")
    return Lease(
        kernel_id=d["kernel_id"],
        card_uuid=d["card_uuid"],
        card_index=d["card_index"],
        quota_mib=d["quota_mib"],
        reserve_mib=d["reserve_mib"],
        user=d["user"],
        kernel_name=d["kernel_name"],
        owner=owner_from_json(d["owner"]),
        kernel=ProcessRef(**kernel) if kernel else None,
        created=d["created"],
    )


def waiter_to_json(w: Waiter) -> dict:
    return {
        "ticket": w.ticket,
        "kernel_id": w.kernel_id,
        "quota": w.quota,
        "user": w.user,
        "kernel_name": w.kernel_name,
        "owner": owner_to_json(w.owner),
        "created": w.created,
    }


def waiter_from_json(d: dict) -> Waiter:
    return Waiter(
        d["ticket"], d["kernel_id"], d["quota"], d["user"], d["kernel_name"], owner_from_json(d["owner"]), d["created"]
    )


ANONYMOUS = ProcessRef(0, 0.0)


def anonymous_leases(leases: Sequence[Lease]) -> list[Lease]:
    """Other users' leases folded into one nameless lease per card (its quota is their total)."""
    totals: dict[tuple[str, int], int] = {}
    for lease in leases:
        key = (lease.card_uuid, lease.card_index)
        totals[key] = totals.get(key, 0) + lease.reserved_mib
    return [Lease("", uuid, index, total, 0, "", "", ANONYMOUS, None, 0.0) for (uuid, index), total in totals.items()]


# -- views -------------------------------------------------------------------------------------------


def view_for(
    caller: Caller,
    leases: Sequence[Lease],
    waiters: Sequence[Waiter],
    cards: Sequence[Card],
    policy: Policy,
    limits: UserLimits | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """What ``caller`` may see of the host: cards, kernels, users and the queue.

    A student (not ``caller.admin``) sees their own kernels and waiters in detail, other users only
    as an anonymous total per card (``others_reserved_mib``) and nameless queue places; no other
    user's name, kernel id or kernel name appears anywhere in the result. An admin sees every kernel.
    """
    now = time.time() if now is None else now
    mine = [lease for lease in leases if caller.admin or lease.user == caller.user]
    card_rows = []
    for card in cards:
        on_card = [lease for lease in leases if lease.card_uuid == card.uuid]
        reserved = sum(lease.reserved_mib for lease in on_card)
        own = sum(lease.reserved_mib for lease in on_card if lease.user == caller.user)
        usable = policy.usable_mib(card.total_mib)
        card_rows.append(
            {
                **card.to_dict(),
                "usable_mib": usable,
                "reserved_mib": reserved,
                "unreserved_mib": max(0, usable - reserved),
                "mine_reserved_mib": own,
                "others_reserved_mib": reserved - own,
                "allowed": policy.card_allowed(card.uuid, card.index),
            }
        )
    labels = {card.uuid: card.label for card in cards}
    kernels = [
        {
            "kernel_id": lease.kernel_id,
            "kernel_name": lease.kernel_name,
            "user": lease.user,
            "card_index": lease.card_index,
            "card_uuid": lease.card_uuid,
            "card_label": labels.get(lease.card_uuid, f"GPU {lease.card_index}"),
            "quota_mib": lease.quota_mib,
            "reserve_mib": lease.reserve_mib,
            "reserved_mib": lease.reserved_mib,
            "server_pid": lease.owner.pid if isinstance(lease.owner, ProcessRef) else None,
            "kernel_pid": lease.kernel.pid if lease.kernel else None,
            "age_s": round(now - lease.created, 1),
        }
        for lease in mine
    ]
    users: dict[str, dict[str, int]] = {}
    for lease in mine:
        row = users.setdefault(lease.user, {"kernels": 0, "quota_mib": 0, "reserved_mib": 0})
        row["kernels"] += 1
        row["quota_mib"] += lease.quota_mib
        row["reserved_mib"] += lease.reserved_mib
    queue = []
    for position, w in enumerate(waiters, start=1):
        visible = caller.admin or w.user == caller.user
        queue.append(
            {
                "position": position,
                "mine": w.user == caller.user,
                "kernel_id": w.kernel_id if visible else None,
                "kernel_name": w.kernel_name if visible else None,
                "user": w.user if visible else None,
                "quota": w.quota if visible else None,
                "waited_s": round(now - w.created, 1),
            }
        )
    return {
        "user": caller.user,
        "admin": caller.admin,
        "limits": limits.to_dict() if limits is not None else None,
        "context_reserve_mib": policy.context_reserve_mib,
        "cards": card_rows,
        "users": [{"user": name, **row} for name, row in sorted(users.items())],
        "kernels": kernels,
        "queue": queue,
    }


def host_view(ledger: Any, user: str, cards: Sequence[Card], policy: Policy) -> dict[str, Any] | None:
    """The host view for a server's API, whichever ledger it has (call it on the ledger thread).

    Through a broker (a BrokerLedger): what the broker shows this server's user (view_for on the
    broker's side; raises LedgerError while it is down). With an embedded Ledger: every lease in
    it is this user's, so all of it. None when there is no ledger.
    """
    if ledger is None:
        return None
    if isinstance(ledger, BrokerLedger):
        return ledger.view()
    return view_for(Caller(user, os.getuid(), admin=True), ledger.leases(), ledger.waiters(), cards, policy)


# -- the broker process ------------------------------------------------------------------------------


class GpuShareBroker(JupyterApp):
    """The host-wide GPU reservation broker (``jupyter gpushare broker``)."""

    name = "jupyter-gpushare-broker"
    description = "Own this host's GPU ledger and admit the kernels of every user's Jupyter server."

    socket_path = Unicode(
        DEFAULT_SOCKET,
        config=True,
        help="Unix socket the broker listens on. Its directory is created (mode 0755) if missing. "
        f"Default: '{DEFAULT_SOCKET}'. Servers point GpuShareApp.broker_socket at it.",
    )
    socket_group = Unicode(
        "",
        config=True,
        help="Unix group allowed to connect: the socket gets mode 0660 and this group. Default: '' = any "
        "local user may connect (mode 0666); callers are identified by the kernel either way.",
    )
    ledger_path = Unicode(
        DEFAULT_LEDGER,
        config=True,
        help="The host's ledger file, written only by the broker (created mode 0600). Its directory must "
        f"not be writable by other users (e.g. root-owned, 0755). Default: '{DEFAULT_LEDGER}'.",
    )
    admin_users = List(
        Unicode(),
        default_value=[],
        config=True,
        help="Users who see every user's kernels and may release any reservation. root and the broker's "
        "own user always may. Default: [].",
    )
    admin_groups = List(
        Unicode(),
        default_value=[],
        config=True,
        help="Groups whose members are admins (see admin_users): Unix groups, and JupyterHub groups when "
        "hub_api_url is set. Default: [].",
    )
    default_limits = Dict(
        default_value={},
        config=True,
        help="Per-user limits for everyone, e.g. {'max_total': '16GiB', 'max_kernel': '8GiB', "
        "'max_kernels': 2}: total of a user's kernel quotas, largest quota of one kernel, most GPU kernels "
        "at once. Sizes as in GpuShareApp.default_quota ('25%' = of a card). Default: {} = no limits.",
    )
    user_limits = Dict(
        default_value={},
        config=True,
        help="Limits per user name, overriding group and default limits field by field, e.g. "
        "{'alice': {'max_total': '32GiB'}}; a field set to None means no limit. Default: {}.",
    )
    group_limits = Dict(
        default_value={},
        config=True,
        help="Limits per group (Unix groups, and JupyterHub groups when hub_api_url is set), e.g. "
        "{'staff': {'max_total': None}, 'students': {'max_total': '8GiB'}}. "
        "A user in several groups gets the most generous value of each field. Default: {}.",
    )
    user_limits_hook = AnyTrait(
        None,
        allow_none=True,
        config=True,
        help="Callable (user: str, groups: tuple[str, ...], limits: UserLimits) -> UserLimits | dict | None, "
        "for limits that come from elsewhere (a course roster, LDAP). A dict overrides the fields it sets; "
        "None keeps the configured limits. Default: None.",
    )
    reap_interval = Float(
        5.0,
        config=True,
        help="Seconds between sweeps that reclaim the reservations of servers and kernels that are gone "
        "(every reservation also sweeps first). Default: 5.",
    )
    tcp_address = Unicode(
        "",
        config=True,
        help="Also listen on TCP at 'host:port', for Jupyter servers in containers (DockerSpawner, "
        "KubeSpawner), which cannot be identified by the Unix socket. They point GpuShareApp.broker_socket at "
        "'tcp://<this host>:<port>' ('tls://...' with tcp_certfile) and authenticate with their JupyterHub API "
        "token, so hub_api_url is needed. Without tcp_certfile the tokens cross it in plain text: bind it to an "
        "address only the servers can reach (e.g. the Docker bridge or a cluster-internal Service). "
        "Default: '' = Unix socket only.",
    )
    tcp_certfile = Unicode(
        "",
        config=True,
        help="PEM certificate (chain) for TLS on tcp_address; servers then connect to 'tls://host:port', with "
        "GpuShareApp.broker_ca_file naming the CA that signed it unless the system trusts it. The certificate "
        "must name the host the servers connect to. Default: '' = plain TCP.",
    )
    tcp_keyfile = Unicode(
        "",
        config=True,
        help="PEM private key of tcp_certfile, if it is not in that file. Default: ''.",
    )
    hub_api_url = Unicode(
        config=True,
        help="The JupyterHub API, e.g. 'http://127.0.0.1:8081/hub/api': tokens of servers on TCP are checked "
        "against it, and Hub groups and Hub admins count for limits and admin rights (also for Unix-socket "
        "callers, by user name). Default: $JUPYTERHUB_API_URL (set when the Hub runs the broker as a service), "
        "else '' = no Hub.",
    )
    hub_api_token = Unicode(
        config=True,
        help="The broker's own Hub API token, to look up the Hub groups and admin flag of Unix-socket callers "
        "(scopes read:users:name and read:users:groups). Default: $JUPYTERHUB_API_TOKEN.",
    )
    allow_container_callers = Bool(
        False,
        config=True,
        help="Accept Unix-socket callers in a container that mounts the socket (a PID namespace or a root "
        "filesystem of their own). Only where their uid truly names the user: Apptainer, or rootless Podman, whose "
        "user namespace maps the container to the user who started it. Default: False = such callers are refused "
        "and told to use TCP.",
    )
    session_ttl = Float(
        60.0,
        config=True,
        help="Seconds a server identified by its Hub token keeps its reservations after its last call (it calls "
        "at least every GpuShareApp.reconcile_interval, 10 s); then they are reclaimed. Default: 60.",
    )

    @default("hub_api_url")
    def _default_hub_api_url(self) -> str:
        return os.environ.get("JUPYTERHUB_API_URL", "")

    @default("hub_api_token")
    def _default_hub_api_token(self) -> str:
        return os.environ.get(HUB_TOKEN_ENV, "")

    @default("log_level")
    def _default_log_level(self) -> int:
        return logging.INFO

    config_file_name = Unicode("jupyter_gpushare_broker_config", config=True, help="Config file name (no extension) searched in the Jupyter config path.")  # fmt: skip

    aliases = {
        **JupyterApp.aliases,
        "socket": "GpuShareBroker.socket_path",
        "ledger": "GpuShareBroker.ledger_path",
        "socket-group": "GpuShareBroker.socket_group",
    }

    # -- set-up ---------------------------------------------------------------------------------------

    def setup(self) -> None:
        """Build policy, limits and cards from config (PolicyError names the bad setting)."""
        from .app import GpuShareApp
        from .gpu import open_backend

        shared = GpuShareApp(config=self.config)  # the same placement rules as a single server
        self.policy = shared.build_policy()
        self.backend = open_backend(shared.gpu_backend, shared.simulated_cards)
        self.cards: list[Card] = self.backend.cards()
        self.rules = LimitRules.parse(self.default_limits, self.user_limits, self.group_limits)
        self._admin_groups = set(self.admin_groups)
        self._admin_users = set(self.admin_users) | {"root", pwd.getpwuid(os.getuid()).pw_name}
        self._me = ProcessRef.me()
        self._ledger: Ledger | None = None
        self._biggest = max((c.total_mib for c in self.cards), default=0)
        self.hub = HubClient(self.hub_api_url, self.hub_api_token) if self.hub_api_url else None
        self._touched: dict[str, float] = {}
        self._samples: tuple[DeviceSample, ...] = ()
        self._sampled_at = -SAMPLE_TTL_S
        if self.tcp_address:
            try:
                self._tcp = parse_tcp(self.tcp_address, "GpuShareBroker.tcp_address")
            except ValueError as e:
                raise PolicyError(str(e)) from e
            if self.hub is None:
                raise PolicyError(
                    "GpuShareBroker.tcp_address needs GpuShareBroker.hub_api_url: servers on TCP are identified by "
                    "their JupyterHub API token. Set it (e.g. 'http://127.0.0.1:8081/hub/api'), or run the broker as "
                    "a Hub service, which sets $JUPYTERHUB_API_URL."
                )
        self._tls = self._tls_context()

    def _tls_context(self) -> ssl.SSLContext | None:
        if not self.tcp_certfile:
            if self.tcp_keyfile:
                raise PolicyError("GpuShareBroker.tcp_keyfile is set but tcp_certfile is not: set both, or neither.")
            return None
        if not self.tcp_address:
            raise PolicyError("GpuShareBroker.tcp_certfile is for the TCP listener: set tcp_address too, or drop it.")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            context.load_cert_chain(self.tcp_certfile, self.tcp_keyfile or None)
        except (OSError, ssl.SSLError) as e:
            raise PolicyError(
                f"GpuShareBroker.tcp_certfile {self.tcp_certfile!r} / tcp_keyfile {self.tcp_keyfile!r} cannot be "
                f"used ({e}): both are PEM files the broker's user can read, the key matching the certificate."
            ) from e
        return context

    def limits_for(self, caller: Caller) -> UserLimits:
        limits = self.rules.for_user(caller.user, caller.groups, self._biggest)
        if self.user_limits_hook is not None:
            got = self.user_limits_hook(caller.user, caller.groups, limits)
            if isinstance(got, UserLimits):
                limits = got
            elif got is not None:
                merged = {**{k: getattr(limits, k) for k in ("max_total", "max_kernel", "max_kernels")}}
                merged.update(parse_limits(got, f"GpuShareBroker.user_limits_hook({caller.user!r})"))
                limits = UserLimits(**merged)  # type: ignore[arg-type]
        return limits

    def _is_admin(self, user: str, groups: Sequence[str]) -> bool:
        return user in self._admin_users or bool(self._admin_groups & set(groups))

    def identify(self, pid: int, uid: int) -> Caller:
        """A Unix-socket caller: who the kernel says it is (plus its Hub groups, with a Hub)."""
        reason = container_reason(pid) if pid > 0 and not self.allow_container_callers else None
        if reason:
            raise BrokerRefused(
                f"This server runs in a container ({reason}), where a uid does not say for sure who the user is, "
                "so the broker's Unix socket refuses it. Connect over TCP with the server's JupyterHub token "
                "instead: GpuShareBroker.tcp_address on the broker, GpuShareApp.broker_socket = 'tls://host:port' "
                "in the server (docs/multi-user.md). Where the container's uid is the user's own (Apptainer, "
                "rootless Podman), the admin may set GpuShareBroker.allow_container_callers = True."
            )
        user, groups = user_and_groups(uid)
        process = ProcessRef.of(pid) if pid > 0 else None
        if pid > 0 and process is None:  # it is connected, so it exists: /proc hides it from the broker
            raise BrokerRefused(
                f"The broker cannot see this server's process {pid} (user {user}) in /proc. "
                + (proc_hidden_from_me() or "Its /proc entry cannot be read")
                + ". Until then kernels of servers on this host cannot reserve GPU memory."
            )
        hub_user = self.hub.user(user) if self.hub else None
        if hub_user:
            groups = tuple(sorted(set(groups) | set(hub_user.groups)))
        admin = uid == 0 or uid == os.getuid() or bool(hub_user and hub_user.admin) or self._is_admin(user, groups)
        return Caller(user, uid, groups, admin, process)

    def authenticate(self, token: str, instance: str) -> Caller:
        """A server that sent its JupyterHub API token: who the Hub says it is, owning through a session."""
        if self.hub is None:
            raise BrokerRefused(
                "This broker has no JupyterHub configured (GpuShareBroker.hub_api_url), so it cannot check tokens; "
                "connect over its Unix socket instead."
            )
        if not instance or len(instance) > 64 or not instance.replace("-", "").isalnum():
            raise BrokerRefused(f"A server instance id is 1-64 letters, digits and '-'; got {instance!r}.")
        try:
            who = self.hub.whoami(token)
        except HubError as e:
            raise BrokerRefused(f"The broker could not identify this server by its JupyterHub token: {e}.") from e
        admin = who.admin or self._is_admin(who.name, who.groups)
        return Caller(who.name, -1, who.groups, admin, None, SessionRef(f"hub:{who.name}:{instance}"))

    def _touch(self, caller: Caller) -> None:
        """Keep a token-identified server's session alive (a ledger write at most every ttl/6)."""
        if caller.session is None or self._ledger is None:
            return
        now = time.monotonic()
        if now - self._touched.get(caller.session.id, float("-inf")) >= self.session_ttl / 6:
            self._ledger.touch_session(caller.session, caller.user, time.time() + self.session_ttl)
            self._touched[caller.session.id] = now

    def _open_ledger(self) -> Ledger:
        path = Path(self.ledger_path)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        mode = path.parent.stat().st_mode
        if mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise LedgerError(
                f"The ledger's directory {path.parent} is writable by other users (mode {stat.S_IMODE(mode):o}), "
                f"so a student could replace the ledger. Use a directory only the broker's user can write: "
                f"chmod 0755 {path.parent} (owned by root or the broker's user)."
            )
        ledger = Ledger(path, owner=self._me)
        for suffix in ("", "-wal", "-shm", ".lock"):
            extra = Path(str(path) + suffix)
            if extra.exists():
                os.chmod(extra, 0o600)
        return ledger

    # -- requests (all on the one ledger thread) ------------------------------------------------------

    @contextmanager
    def _as_owner(self, caller: Caller) -> Iterator[Ledger]:
        """The ledger with the caller's server process as the owner of what it writes."""
        assert self._ledger is not None
        if caller.owner is None:
            raise BrokerRefused(
                "The broker cannot see the calling process (it runs in another PID namespace, e.g. a container). "
                "Servers in containers connect over TCP with their JupyterHub token: set GpuShareApp.broker_socket "
                "to 'tcp://<broker host>:<port>' (GpuShareBroker.tcp_address, docs/multi-user.md)."
            )
        self._ledger.owner = caller.owner
        try:
            yield self._ledger
        finally:
            self._ledger.owner = self._me

    def _latest_samples(self) -> tuple[DeviceSample, ...]:
        """The driver's per-process reading (ledger thread), at most SAMPLE_TTL_S old; none without a GPU."""
        if time.monotonic() - self._sampled_at >= SAMPLE_TTL_S:
            try:
                self._samples = tuple(self.backend.sample())
            except Exception as e:  # a lost card, no NVML: reservations alone then
                self.log.debug("jupyter-gpushare broker: no GPU reading: %s", e)
                self._samples = ()
            self._sampled_at = time.monotonic()
        return self._samples

    def _mine(self, caller: Caller, user: str) -> bool:
        return caller.admin or user == caller.user

    def handle(self, caller: Caller, op: str, args: dict) -> Any:
        """Carry out one request for ``caller``; runs on the ledger thread."""
        ledger = self._ledger
        assert ledger is not None
        if op == "hello":
            return {
                "user": caller.user,
                "uid": caller.uid,
                "admin": caller.admin,
                "pid": caller.process.pid if caller.process else None,
                "session": caller.session.id if caller.session else None,
                "cards": [c.to_dict() for c in self.cards],
                "limits": self.limits_for(caller).to_dict(),
                "context_reserve_mib": self.policy.context_reserve_mib,
            }
        if op == "reserve":
            kernel_id = str(args["kernel_id"])
            mib, percent = args.get("mib"), args.get("percent")
            quota = Size(
                mib=int(mib) if mib is not None else None, percent=float(percent) if percent is not None else None
            )
            if quota.is_zero or (quota.mib is not None and quota.mib < 0):
                raise BrokerRefused(f"A reservation needs a positive quota; got {args!r}.")
            taken = ledger.get(kernel_id)
            if taken is not None and taken.user != caller.user:
                raise BrokerRefused(f"Kernel id {kernel_id} is in use by another user's kernel; use a new id.")
            if any(w.kernel_id == kernel_id and w.user != caller.user for w in ledger.waiters()):
                raise BrokerRefused(f"Kernel id {kernel_id} is in use by another user's kernel; use a new id.")
            cards = self.cards
            if args.get("cards"):  # the server sees only these (a container given some of the host's cards)
                cards = [c for c in self.cards if c.uuid in set(args["cards"])]
                if not cards:
                    raise BrokerRefused(
                        f"None of the cards this server sees ({', '.join(args['cards'])}) is one of the broker's "
                        f"({', '.join(c.uuid for c in self.cards) or 'none'}). Give the server's container one of "
                        "the broker's cards, or check that both read the same host's cards."
                    )
            self.policy.check_quota(quota, [CardView(c.uuid, c.index, c.total_mib) for c in cards])
            request = Request(kernel_id, quota, caller.user, str(args.get("kernel_name", ""))[:200])
            outside = unreserved_use(self._latest_samples(), ledger.leases())
            with self._as_owner(caller) as led:
                got = led.reserve(
                    request, self.policy, cards, bool(args.get("wait")), self.limits_for(caller), outside=outside
                )
            if isinstance(got, Lease):
                return {"lease": lease_to_json(got)}
            waiting = asdict(got)  # outside_mib beside it: a server older than it takes the rest as it was
            return {"waiting": waiting, "outside_mib": waiting.pop("outside_mib")}
        if op == "cancel_wait":
            kernel_id = str(args["kernel_id"])
            if any(w.kernel_id == kernel_id and self._mine(caller, w.user) for w in ledger.waiters()):
                ledger.cancel_wait(kernel_id)
            return None
        if op == "attach":
            kernel_id, pid = str(args["kernel_id"]), args.get("pid")
            lease = ledger.get(kernel_id)
            if lease is None or not self._mine(caller, lease.user) or caller.session is not None:
                return None  # a server in a container: its pids mean nothing here; its session keeps the lease
            ref = None
            if pid is not None:
                try:
                    owner_uid = psutil.Process(int(pid)).uids().real
                except psutil.Error as e:
                    raise BrokerRefused(f"Process {pid} cannot be attached: {e}.") from e
                if owner_uid != caller.uid and caller.uid != 0:
                    raise BrokerRefused(
                        f"Process {pid} is not yours (uid {owner_uid}); only your own kernels can be attached."
                    )
                ref = ProcessRef.of(int(pid))
            ledger.attach(kernel_id, ref)
            return None
        if op == "release":
            kernel_id = str(args["kernel_id"])
            lease = ledger.get(kernel_id)
            if lease is not None and not self._mine(caller, lease.user):
                self.log.warning(
                    "%s (uid %s) asked to release %s's reservation; refused.", caller.user, caller.uid, lease.user
                )
                return None
            if lease is None:
                if any(w.kernel_id == kernel_id and self._mine(caller, w.user) for w in ledger.waiters()):
                    ledger.cancel_wait(kernel_id)
                return None
            released = ledger.release(kernel_id)
            return lease_to_json(released) if released else None
        if op == "release_owned_except":
            with self._as_owner(caller) as led:
                return [lease_to_json(x) for x in led.release_owned_except(set(args.get("keep", [])))]
        if op == "adopt":
            kernel_id = str(args["kernel_id"])
            lease = ledger.get(kernel_id)
            if lease is None or lease.user != caller.user:
                raise BrokerRefused(f"Kernel {kernel_id} holds no reservation of yours to adopt.")
            with self._as_owner(caller) as led:
                led.adopt(kernel_id)
            return None
        if op == "reap":
            gone = ledger.reap()
            self._log_reclaimed(gone)
            return [lease_to_json(x) for x in gone if self._mine(caller, x.user)]
        if op == "leases":
            leases = ledger.leases()
            if caller.admin:
                return [lease_to_json(x) for x in leases]
            own = [x for x in leases if x.user == caller.user]
            others = [x for x in leases if x.user != caller.user]
            return [lease_to_json(x) for x in own + anonymous_leases(others)]
        if op == "get":
            lease = ledger.get(str(args["kernel_id"]))
            return lease_to_json(lease) if lease and self._mine(caller, lease.user) else None
        if op == "waiters":
            return [
                waiter_to_json(
                    w if self._mine(caller, w.user) else Waiter(w.ticket, "", "", "", "", ANONYMOUS, w.created)
                )
                for w in ledger.waiters()
            ]
        if op == "reserved_by_card":
            return ledger.reserved_by_card()
        if op == "view":
            return view_for(caller, ledger.leases(), ledger.waiters(), self.cards, self.policy, self.limits_for(caller))
        raise BrokerRefused(f"Unknown request {op!r}.")

    def _log_reclaimed(self, gone: Sequence[Lease]) -> None:
        for lease in gone:
            self.log.info(
                "Reclaimed %s of %s's kernel %s (its server and kernel are gone).",
                format_mib(lease.reserved_mib),
                lease.user,
                lease.kernel_id,
            )

    # -- the socket ------------------------------------------------------------------------------------

    # Ledger calls run on the event loop's own thread: each takes well under a millisecond, only the
    # broker writes the file (no lock waits), and a thread hop per request cost more than the call.

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, tcp: bool = False) -> None:
        loop = asyncio.get_running_loop()
        caller: Caller | None = None
        try:
            refusal = None
            if not tcp:  # Unix socket: the kernel says who is calling (NSS lookups may be slow: off the loop)
                pid, uid, _gid = peer_credentials(writer.get_extra_info("socket"))
                try:
                    caller = await loop.run_in_executor(None, self.identify, pid, uid)
                except BrokerRefused as e:  # answered to every request on this connection
                    refusal = e
            while True:
                line = await reader.readline()
                if not line:
                    break
                try:
                    if refusal is not None:
                        raise refusal
                    msg = json.loads(line)
                    op, args = str(msg["op"]), dict(msg.get("args") or {})
                    if op == "auth":  # a server's JupyterHub token (asks the Hub: off the loop)
                        caller = await loop.run_in_executor(
                            None, self.authenticate, str(args.get("token", "")), str(args.get("instance", ""))
                        )
                        self.log.info("%s authenticated by JupyterHub token as %s", writer.get_extra_info("peername") or "a Unix-socket client", caller.session.id)  # type: ignore[union-attr]  # fmt: skip
                    if caller is None:
                        raise BrokerRefused(
                            "Send your JupyterHub API token first ({'op': 'auth', 'args': {'token': ..., 'instance': "
                            "...}}): on TCP the broker knows callers only by it."
                        )
                    self._touch(caller)
                    result = (
                        {"user": caller.user, "admin": caller.admin} if op == "auth" else self.handle(caller, op, args)
                    )
                    reply: dict[str, Any] = {"ok": True, "result": result}
                except PolicyError as e:
                    reply = {"ok": False, "error": "PolicyError", "message": str(e)}
                except LedgerError as e:
                    reply = {"ok": False, "error": "LedgerError", "message": str(e)}
                except BrokerRefused as e:
                    reply = {"ok": False, "error": "Refused", "message": str(e)}
                except (ValueError, KeyError, TypeError) as e:
                    reply = {"ok": False, "error": "Refused", "message": f"Bad request ({type(e).__name__}: {e})."}
                except Exception as e:  # a bug, or a user_limits_hook that raised: answer, keep serving
                    self.log.exception("jupyter-gpushare broker: %r from %s failed", line[:200], caller)
                    reply = {
                        "ok": False,
                        "error": "LedgerError",
                        "message": f"The broker failed on this request ({e}); see its log.",
                    }
                writer.write(json.dumps(reply).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except Exception:
            self.log.exception("jupyter-gpushare broker: a client connection failed")
        finally:
            writer.close()

    def _prepare_socket(self) -> None:
        path = Path(self.socket_path)
        if not path.parent.exists():
            path.parent.mkdir(parents=True)
            os.chmod(path.parent, 0o755)  # the umask is 077: let users reach the socket
        if path.exists() or path.is_symlink():
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(str(path))
            except OSError:
                path.unlink()  # left behind by a broker that is gone
            else:
                raise SystemExit(f"jupyter-gpushare broker: another broker already listens on {path}.")
            finally:
                probe.close()

    def _secure_socket(self) -> None:
        if self.socket_group:
            try:
                gid = grp.getgrnam(self.socket_group).gr_gid
            except KeyError as e:
                raise SystemExit(
                    f"jupyter-gpushare broker: GpuShareBroker.socket_group {self.socket_group!r} is not a group."
                ) from e
            os.chown(self.socket_path, -1, gid)
            os.chmod(self.socket_path, 0o660)
        else:
            os.chmod(self.socket_path, 0o666)

    async def serve(self, ready: Callable[[], None] | None = None) -> None:
        self._ledger = self._open_ledger()
        self._ledger.extend_sessions(time.time() + self.session_ttl)  # servers could not call while it was down
        gone = self._ledger.reap()
        self._log_reclaimed(gone)
        self._prepare_socket()
        server = await asyncio.start_unix_server(self._client, path=self.socket_path, limit=MAX_LINE)
        self._secure_socket()
        tcp_server = None
        if self.tcp_address:
            host, port = self._tcp
            try:
                tcp_server = await asyncio.start_server(
                    functools.partial(self._client, tcp=True), host, port, limit=MAX_LINE, ssl=self._tls
                )
            except OSError as e:
                raise SystemExit(f"jupyter-gpushare broker: cannot listen on {self.tcp_address}: {e}") from e
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        self.log.info(
            "jupyter-gpushare broker: %d card(s) %s, ledger %s, socket %s%s",
            len(self.cards), [f"{c.index}:{format_mib(c.total_mib)}" for c in self.cards], self.ledger_path, self.socket_path,
            f", {'TLS' if self._tls else 'TCP'} {self.tcp_address} (JupyterHub tokens, Hub {self.hub_api_url})" if tcp_server else "",
        )  # fmt: skip
        hidden = proc_hidden_from_me()
        if hidden:
            self.log.warning("jupyter-gpushare broker: %s. Servers on this host are refused until then.", hidden)
        if tcp_server and not self._tls:
            self.log.warning(
                "jupyter-gpushare broker: %s is plain TCP: servers' JupyterHub tokens cross it unencrypted. Keep it on "
                "a network only the servers reach, or set GpuShareBroker.tcp_certfile (docs/multi-user.md).",
                self.tcp_address,
            )
        if ready:
            ready()

        async def sweep() -> None:
            while True:
                await asyncio.sleep(self.reap_interval)
                try:
                    self._log_reclaimed(self._ledger.reap())
                    stale = time.monotonic() - self.session_ttl
                    self._touched = {k: t for k, t in self._touched.items() if t > stale}
                except Exception:
                    self.log.exception("jupyter-gpushare broker: reclaiming failed")

        sweeper = asyncio.ensure_future(sweep())
        async with server:
            await stop.wait()
        if tcp_server is not None:
            tcp_server.close()
        sweeper.cancel()
        try:
            os.unlink(self.socket_path)
        except OSError:
            pass
        self._ledger.close()

    def start(self) -> None:
        os.umask(0o077)  # the ledger, its WAL and lock files: broker's user only
        try:
            self.setup()
        except PolicyError as e:
            raise SystemExit(f"jupyter-gpushare broker: bad configuration: {e}") from e
        try:
            asyncio.run(self.serve())
        except LedgerError as e:
            raise SystemExit(f"jupyter-gpushare broker: {e}") from e


# -- the client a Jupyter server uses ----------------------------------------------------------------


@dataclass
class _Outage:
    since: float
    message: str


class _AuthRefused(Exception):
    """The broker did not accept this server's JupyterHub token."""


@dataclass
class BrokerLedger:
    """The Ledger interface, answered by the host's broker over its Unix socket.

    Same methods and signatures as Ledger, so QuotaManager uses it unchanged. Not thread-safe (the
    manager calls it from its one ledger thread). It reconnects on each call after a failure, so a
    broker restart is invisible; while the broker is down, reserve (and adopt) raise LedgerError with
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
    _sock: socket.socket | None = field(default=None, repr=False)
    _file: Any = field(default=None, repr=False)
    _pending_release: set = field(default_factory=set, repr=False)
    _pending_attach: dict = field(default_factory=dict, repr=False)
    outage: _Outage | None = field(default=None, repr=False)

    # -- transport ---------------------------------------------------------------------------------------

    @property
    def tcp(self) -> bool:
        return is_tcp(self.path)

    def _connect(self) -> None:
        token = os.environ.get(HUB_TOKEN_ENV, "") if self.token is None and self.tcp else self.token
        if self.tcp and not token:
            raise _AuthRefused(
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
            except OSError:
                sock.close()
                raise
        self._sock, self._file = sock, sock.makefile("rb")
        if token:
            reply = self._exchange("auth", {"token": token, "instance": self.instance})
            if not reply.get("ok"):
                self._drop()
                raise _AuthRefused(f"The GPU broker at {self.path} refused this server: {reply.get('message', reply)}")

    def _wrap_tls(self, sock: socket.socket, host: str) -> ssl.SSLSocket:
        try:
            return ssl.create_default_context(cafile=self.ca_file or None).wrap_socket(sock, server_hostname=host)
        except ssl.SSLCertVerificationError as e:
            sock.close()
            raise _AuthRefused(
                f"This server does not trust the GPU broker's certificate at {self.path} ({e.verify_message}). Set "
                "GpuShareApp.broker_ca_file to the CA that signed GpuShareBroker.tcp_certfile; the certificate "
                f"must name {host!r}."
            ) from e
        except Exception:  # no TLS there (ssl.SSLError), an unreadable CA file: reported as not reachable
            sock.close()
            raise

    def _drop(self) -> None:
        if self._sock is not None:
            try:
                self._file.close()
                self._sock.close()
            except OSError:
                pass
        self._sock = self._file = None

    def _exchange(self, op: str, args: dict) -> dict:
        assert self._sock is not None
        self._sock.sendall(json.dumps({"op": op, "args": args}).encode() + b"\n")
        line = self._file.readline(MAX_LINE)
        if not line:
            raise ConnectionResetError("the broker closed the connection")
        return json.loads(line)

    def _down_message(self, e: BaseException) -> str:
        hint = {
            "tls": " If the broker has no GpuShareBroker.tcp_certfile, it speaks plain TCP: use tcp://.",
            "tcp": " If the broker has GpuShareBroker.tcp_certfile, it speaks TLS: use tls://.",
        }.get(self.path.partition("://")[0] if self.tcp else "", "")
        return (
            f"The GPU broker at {self.path} is not reachable ({e}). GPU reservations for this host go through it "
            "(GpuShareApp.broker_socket), so kernels start without a GPU until it is back. Ask the administrator "
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
            except (OSError, ValueError, _AuthRefused) as e:
                self._drop()
                if attempt or isinstance(e, _AuthRefused):
                    message = str(e) if isinstance(e, _AuthRefused) else self._down_message(e)
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
            raise PolicyError(reply.get("message", ""))
        raise LedgerError(f"The GPU broker refused: {reply.get('message', reply)}")

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
        self._drop()

    # -- the Ledger interface -----------------------------------------------------------------------------

    def hello(self) -> dict:
        return self._call("hello")

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
    ) -> Lease | Waiting:
        """Reserve through the broker. ``policy``, ``limits`` and ``req.user`` are the broker's to decide and are
        not sent; ``cards`` (the real cards this server sees) restrict where the broker may place the kernel.
        What processes without a reservation use, the broker measures itself."""
        visible = [c.uuid for c in cards if not c.simulated]
        got = self._call("reserve", kernel_id=req.kernel_id, mib=req.quota.mib, percent=req.quota.percent, kernel_name=req.kernel_name, wait=wait, **({"cards": visible} if visible else {}))  # fmt: skip
        if "lease" in got:
            return lease_from_json(got["lease"])
        known = Waiting.__dataclass_fields__  # a newer broker may say more
        waiting = {k: v for k, v in got["waiting"].items() if k in known}
        return Waiting(**{**waiting, "outside_mib": int(got.get("outside_mib") or 0)})

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

    def adopt(self, kernel_id: str) -> None:
        self._call("adopt", kernel_id=kernel_id)

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

    def reserved_by_card(self) -> dict[str, int]:
        return self._query("reserved_by_card", {})


def main(argv: list[str] | None = None) -> None:
    GpuShareBroker.launch_instance(argv)


if __name__ == "__main__":
    main()
