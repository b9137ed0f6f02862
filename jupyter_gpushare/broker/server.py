"""The broker process: owns the host's ledger and answers the Jupyter servers of every user.

Deployment mode 2 (docs/multi-user.md). The broker runs as its own user (or root), owns the ledger file
(mode 0600) and listens on a Unix socket (and, for servers in containers, on TCP or TLS, where a server
authenticates with its JupyterHub API token and owns its leases through a session).

What a caller may do, checked here for every request (protocol.py has already checked its shape):
- reserve only as itself (the user the kernel or the Hub names), within its per-user limits;
- release, attach and stop waiting only for leases its own connection's process (or Hub session) holds:
  a student's kernel runs as the student but is not their server, so it cannot hand its memory back
  behind the server's back;
- see other users only as anonymous per-card totals.
Admins (admin_users, admin_groups, Hub admins; on the Unix socket also root and the broker's own user)
see everything and may release any reservation. Each user has a connection cap and a request rate
(guard.py), so nobody can starve the broker.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import ssl
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Callable

from jupyter_core.application import JupyterApp
from traitlets import Any as AnyTrait
from traitlets import Bool, Dict, Enum, Float, Int, List, Unicode, default

from ..config.settings import settings_from
from ..core.history import OthersBudget
from ..core.overuse import FAST_INTERVAL_S
from ..core.policy import CardView, LimitRules, PolicyError, UserLimits, format_mib, parse_limits
from ..host.cgroups import KernelCgroups
from ..host.gpu import Card
from ..host.hub import HubClient, HubError
from ..host.procs import container_reason, proc_hidden_from_me
from ..ledger.ledger import Ledger, LedgerError, ProcessRef, SessionRef, host_clock
from .connections import AUTH_TIMEOUT_S, Connections
from .guard import Guard, LogLimiter, raise_fd_limit
from .identity import Caller, user_and_groups
from .judging import Judging
from .listener import Listener, tcp_listener_socket, unix_listener_socket
from .ops import KernelNotebooks
from .paths import fillable_by_students, untrusted_dir
from .protocol import (
    DEFAULT_LEDGER,
    DEFAULT_SOCKET,
    HUB_TOKEN_ENV,
    BrokerRefused,
    parse_tcp,
)
from .reading import SAMPLE_TTL_S, CardReading
from .room import RoomChanges
from .unleased import ACTIONS as UNLEASED_ACTIONS
from .unleased import UnleasedPolicy
from .watchdog import Watchdog

RESTART_HEAR_S = 5.0  # at start, kernels in line must call again within this (servers in line call every 0.5 s)


class GpuShareBroker(Judging, Connections, JupyterApp):
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
        help="Users who see every user's kernels and may release any reservation. On the Unix socket root and "
        "the broker's own Unix user always may; over TCP only these users, admin_groups and Hub admins, whatever a "
        "Hub user is called (a Hub user named 'root' is not the Unix root). Default: [].",
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

    unleased_action = Enum(
        list(UNLEASED_ACTIONS),
        default_value="lease",
        config=True,
        help="What the broker does about a process that uses a card without a lease (a python in a terminal, a "
        "kernel of a student's own kernelspec or of a server without the extension): 'lease' = give it a lease in "
        "its user's name from that user's limits, sized at its use, so that it is judged like any kernel from then "
        "on, or, where the card's reservations or the user's limits leave no room, as 'stop'; 'stop' = end it "
        "(SIGKILL, the process alone) once it has used the card for unleased_grace, and at once when it takes "
        "memory that kernels have reserved; 'notify' = log it once and list it for admins. Whatever the choice, "
        "what it uses counts as taken when kernels are admitted. Default: 'lease'.",
    )
    unleased_grace = Float(
        30.0,
        config=True,
        help="Seconds (within a window of twice that) a process without a lease may use a card before "
        "unleased_action 'stop' ends it; memory that kernels have reserved gets no grace. Default: 30.",
    )
    unleased_exempt_users = List(
        Unicode(),
        default_value=["root"],
        config=True,
        help="Users whose processes without a lease are only listed, whatever unleased_action says (the admin's own "
        "jobs, the driver's daemons). Default: ['root'].",
    )

    max_connections_per_user = Int(
        64,
        config=True,
        help="Connections one user (a Unix uid, or a Hub user over TCP) may hold open to the broker; more are refused "
        "with this number in the message. A server holds one, one more while a kernel of it waits (its watch of the line), "
        "and one for each `jupyter gpushare status`. Root and "
        "the broker's own user are not limited. Default: 64.",
    )
    requests_per_second = Float(
        200.0,
        config=True,
        help="Requests per second one user may make on average; faster ones are answered later, so one user flooding "
        "the broker slows only themselves. A server makes about 2 per queued kernel and a few more every "
        "reconcile_interval. 0 = no limit. Default: 200.",
    )
    request_burst = Float(
        400.0,
        config=True,
        help="Requests one user may make at once before requests_per_second applies (a class starting its kernels). "
        "Default: 400.",
    )
    nice = Int(
        -10,
        config=True,
        help="Scheduling priority (nice value, -20..19) the broker gives itself at start, so that students' busy "
        "processes cannot take its CPU time and slow everyone's kernel starts (a negative value needs root or "
        "CAP_SYS_NICE; without them it is logged and left as it is). Default: -10. 0 = leave it.",
    )
    idle_timeout = Float(
        300.0,
        config=True,
        help="Seconds after which a connection that sent nothing is closed (a server reconnects on its next call, "
        f"which comes every GpuShareApp.reconcile_interval). A TCP caller must authenticate within {AUTH_TIMEOUT_S:g} s. "
        "Default: 300.",
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
        from ..host.gpu import open_backend

        self.room = RoomChanges()
        shared = settings_from(self.config)  # the same placement rules (c.GpuShareApp.*) as a single server
        self.policy = shared.build_policy()
        self.history = shared.build_history()  # whose runs teach whom: the broker's rules, not the servers'
        # The over-quota policy, run here as root whatever students do to their servers (a broker cannot shut a
        # kernel down for its server: 'shutdown' ends it as 'restart' does, and its server restarts it).
        action = {"shutdown": "restart"}.get(shared.over_quota_action, shared.over_quota_action)
        self.watchdog = Watchdog(action, shared.over_quota_grace, self.log)
        self.unleased = UnleasedPolicy(
            self.unleased_action, self.unleased_grace, self.unleased_exempt_users, self.log, self._adopt,
            barred=self._barred,
        )  # fmt: skip
        self.park_budget_mib = shared.build_park().host_budget_mib  # one budget for the whole host
        self.taken_out_s = shared.taken_out_for
        self._ruled: dict[str, str] = {}  # processes of kernels whose lease a ruling released: (key) -> why
        self._released: dict[str, str] = {}  # (this reading's) kernels a teacher released in the last day -> by
        self._released_processes: dict[int, tuple[float, str]] = {}  # (this reading's) the processes they named
        self._outside_mib: dict[str, int] = {}  # (this reading's) per card, what processes without a lease use
        self.backend = open_backend(shared.gpu_backend, shared.simulated_cards)
        self.cards: list[Card] = self.backend.cards()
        shared.check(self.policy, [CardView(c.uuid, c.index, c.total_mib) for c in self.cards])
        self.rules = LimitRules.parse(self.default_limits, self.user_limits, self.group_limits)
        self._admin_groups = set(self.admin_groups)
        self._admin_users = set(self.admin_users)
        self._me = ProcessRef.me()
        self._ledger: Ledger | None = None
        self._biggest = max((c.total_mib for c in self.cards), default=0)
        self.hub = HubClient(self.hub_api_url, self.hub_api_token) if self.hub_api_url else None
        self._touched: dict[str, float] = {}
        self._taught = OthersBudget()
        self.reading = CardReading(self.backend, self.log)
        self.groups = KernelCgroups(enabled=shared.kernel_cgroups == "auto")
        self._group_users: dict[str, int] = {}  # kernel id -> the uid whose kernel entered its group
        self.notebooks = KernelNotebooks()
        if not -20 <= self.nice <= 19:
            raise PolicyError(f"GpuShareBroker.nice: {self.nice!r} is not a nice value; use -20..19, e.g. -10.")
        for name in ("max_connections_per_user", "requests_per_second", "request_burst", "idle_timeout"):
            if getattr(self, name) < 0 or (name == "max_connections_per_user" and self.max_connections_per_user < 1):
                raise PolicyError(f"GpuShareBroker.{name}: {getattr(self, name)!r} must be positive.")
        self.guard = Guard(self.max_connections_per_user, rate=self.requests_per_second, burst=self.request_burst)
        self.log_limited = LogLimiter(self.log)
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
                limits = UserLimits(**merged)
        return limits

    def _is_admin(self, user: str, groups: Sequence[str]) -> bool:
        """Admin by configuration: the names in admin_users, the groups in admin_groups (no built-in name)."""
        return user in self._admin_users or bool(self._admin_groups & set(groups))

    def _trusted_uid(self, uid: int) -> bool:
        """Root and the broker's own Unix user: admins on the Unix socket, and not rate-limited."""
        return uid == 0 or uid == os.getuid()

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
        admin = self._trusted_uid(uid) or bool(hub_user and hub_user.admin) or self._is_admin(user, groups)
        return Caller(user, uid, groups, admin, process)

    def authenticate(self, token: str, instance: str) -> Caller:
        """A server that sent its JupyterHub API token: who the Hub says it is, owning through a session.
        Admin only by the Hub's admin flag or the configured admins: the Unix-root rule does not cross TCP."""
        if self.hub is None:
            raise BrokerRefused(
                "This broker has no JupyterHub configured (GpuShareBroker.hub_api_url), so it cannot check tokens; "
                "connect over its Unix socket instead."
            )
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
            self._ledger.touch_session(caller.session, caller.user, host_clock() + self.session_ttl)
            self._touched[caller.session.id] = now

    def _open_ledger(self) -> Ledger:
        path = Path(self.ledger_path)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        why = untrusted_dir(path.parent)
        if why:
            raise LedgerError(
                f"The ledger's directory {path.parent} is not safe: {why}, so a student could read, replace or "
                "remove the ledger's files. Use a directory only root (or the broker's user) can write, with no "
                "such parent, e.g. GpuShareBroker.ledger_path = '/var/lib/jupyter-gpushare/ledger.sqlite'."
            )
        shared = fillable_by_students(path.parent)
        if shared:
            self.log.warning(
                "jupyter-gpushare broker: the ledger %s is on the same filesystem as %s, which students can fill: "
                "then every reservation is refused until there is space. Put it on a filesystem of its own (or "
                "one with space kept for root), e.g. /var/lib/jupyter-gpushare on a separate mount.",
                path,
                shared,
            )
        extras = [Path(str(path) + suffix) for suffix in ("", "-wal", "-shm", ".lock")]
        for extra in extras:
            if extra.is_symlink() or (extra.exists() and not extra.is_file()):
                raise LedgerError(f"{extra} is a link or not a regular file; the broker will not open it. Remove it.")
        ledger = Ledger(path, owner=self._me)
        for extra in extras:
            if extra.exists():
                os.chmod(extra, 0o600)
        return ledger

    def _set_priority(self) -> None:
        if self.nice and os.getpriority(os.PRIO_PROCESS, 0) != self.nice:
            try:
                os.setpriority(os.PRIO_PROCESS, 0, self.nice)
            except OSError as e:
                self.log.warning(
                    "jupyter-gpushare broker: cannot set its priority to nice %d (%s); students' busy processes may "
                    "slow it. Run it as root, or give it CAP_SYS_NICE (systemd: Nice=%d).", self.nice, e, self.nice,
                )  # fmt: skip

    async def serve(self, ready: Callable[[], None] | None = None) -> None:
        self._set_priority()
        fds = raise_fd_limit()
        self.guard.total = max(16, min(self.guard.total, fds - 64))  # room left for the ledger and NVML
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: self.log_limited("event-loop", logging.ERROR, "jupyter-gpushare broker: %s", context.get("message"), exc_info=bool(context.get("exception"))))  # fmt: skip
        self._ledger = self._open_ledger()
        self._ledger.barred_s = self.taken_out_s
        self._groups_found()
        self._ledger.extend_sessions(host_clock() + self.session_ttl)  # servers could not call while it was down
        self._ledger.hear_waiters_within(RESTART_HEAR_S)  # while waiters of live servers call twice a second
        gone = self._ledger.reap()
        self._log_reclaimed(gone)
        self._prepare_socket()
        listeners = [Listener(unix_listener_socket(self.socket_path), self.guard, self._unix_key, self._client, self.log_limited)]  # fmt: skip
        self._secure_socket()
        if self.tcp_address:
            try:
                sock = tcp_listener_socket(*self._tcp)
            except OSError as e:
                raise SystemExit(f"jupyter-gpushare broker: cannot listen on {self.tcp_address}: {e}") from e
            listeners.append(Listener(sock, self.guard, self._tcp_key, self._client, self.log_limited, self._tls, AUTH_TIMEOUT_S))  # fmt: skip
        tcp_server = len(listeners) > 1
        for listener in listeners:
            listener.start()
        stop = asyncio.Event()
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

        sweeper, watcher = asyncio.ensure_future(self._sweep()), asyncio.ensure_future(self._watch())
        await stop.wait()
        for listener in listeners:
            listener.close()
        sweeper.cancel()
        watcher.cancel()
        try:
            os.unlink(self.socket_path)
        except OSError:
            pass
        self._ledger.close()

    async def _sweep(self) -> None:
        """Reclaim the reservations of servers and kernels that are gone, every reap_interval."""
        while True:
            await asyncio.sleep(self.reap_interval)
            try:
                assert self._ledger is not None  # opened before the sweep starts
                self._log_reclaimed(self._ledger.reap())
                for kernel_id in list(self._group_users):  # groups left by servers that ended without ending them
                    self._end_empty_group(kernel_id)
                stale = time.monotonic() - self.session_ttl
                self._touched = {k: t for k, t in self._touched.items() if t > stale}
            except Exception:
                self.log.exception("jupyter-gpushare broker: reclaiming failed")

    async def _watch(self) -> None:
        """The over-quota watchdog (watchdog.py) and the policy on processes without a lease (unleased.py), on each
        reading of the driver: every SAMPLE_TTL_S, and every FAST_INTERVAL_S while a kernel is over its lease or
        a process without one is being judged."""
        while True:
            judging = any(u["status"] == "judged" for u in self.unleased.current)
            pace = FAST_INTERVAL_S if self.watchdog.hurry or judging else SAMPLE_TTL_S
            await asyncio.sleep(pace)
            try:
                assert self._ledger is not None  # opened before the watch starts
                self.watch_once(self.reading.latest(pace))
            except Exception:
                self.log.exception("jupyter-gpushare broker: the over-quota watchdog failed")

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


def main(argv: list[str] | None = None) -> None:
    GpuShareBroker.launch_instance(argv)
