"""Where this host's broker is and whom to believe there: the settings a server, a program and the CLI read to find
it (part of GpuShareApp, settings.py, which every entry point reads)."""

from __future__ import annotations

import os
import pwd
from typing import Any

from traitlets import List, TraitError, Unicode, default, validate
from traitlets.config import LoggingConfigurable

from ..core.addresses import DEFAULT_SOCKET, BrokerAt, is_tcp, parse_tcp
from ..core.policy import PolicyError


def checked(parse: Any, errors: type[Exception] = PolicyError) -> Any:
    """A parse that raises ``errors``, its message as the TraitError traitlets reports for a bad setting."""
    try:
        return parse()
    except errors as e:
        raise TraitError(str(e)) from e


class BrokerPlace(LoggingConfigurable):
    """The broker's socket, its TLS CA and the users it may run as (``c.GpuShareApp.broker_*``)."""

    broker_socket = Unicode(
        "",
        config=True,
        help="Unix socket of this host's GPU broker (`jupyter gpushare broker`, docs/multi-user.md), e.g. "
        "'/run/jupyter-gpushare/broker.sock', or 'tcp://host:port' ('tls://host:port' when the broker has "
        "GpuShareBroker.tcp_certfile) for a server in a container, which then identifies itself with its "
        "$JUPYTERHUB_API_TOKEN. When set, reservations go through the broker, which "
        "owns the host's ledger and applies per-user limits, and ledger_path is not used. Default: the broker's "
        "default socket, '/run/jupyter-gpushare/broker.sock', when it exists on this host (so that every program "
        "finds this host's broker with nothing set: a server, a student's `jupyter execute` in a terminal), else "
        "'' = no broker: this server uses ledger_path itself. Set '' to use ledger_path even so.",
    )
    broker_ca_file = Unicode(
        "",
        config=True,
        help="PEM file of the CA that signed the broker's TLS certificate (GpuShareBroker.tcp_certfile), for "
        "broker_socket = 'tls://host:port'. Default: '' = the system's trusted CAs.",
    )

    broker_users = List(
        Unicode(),
        default_value=[],
        config=True,
        help="Unix users a broker may run as, besides root and this server's own user: a server sends nothing to a "
        "socket whose listening process (its peer credentials) runs as anyone else, so a socket another student "
        "serves is never taken for the broker. Name the broker's dedicated user here when it is not root (e.g. "
        "['gpushare']). Default: [].",
    )

    @default("broker_socket")
    def _default_broker_socket(self) -> str:
        return DEFAULT_SOCKET if os.path.exists(DEFAULT_SOCKET) else ""

    # -- each setting alone ---------------------------------------------------------------------------

    @validate("broker_socket")
    def _valid_broker_socket(self, proposal: Any) -> str:
        if is_tcp(proposal["value"]):
            checked(lambda: parse_tcp(proposal["value"], "GpuShareApp.broker_socket"), ValueError)
        return proposal["value"]

    @validate("broker_ca_file")
    def _valid_ca_file(self, proposal: Any) -> str:
        if proposal["value"] and not os.access(proposal["value"], os.R_OK):
            raise TraitError(
                f"GpuShareApp.broker_ca_file = {proposal['value']!r} is not a file this server can read; name the "
                "PEM file of the CA that signed the broker's certificate, or '' for the system's CAs."
            )
        return proposal["value"]

    @validate("broker_users")
    def _valid_broker_users(self, proposal: Any) -> list[str]:
        unknown = []
        for name in proposal["value"]:
            try:
                pwd.getpwnam(name)
            except KeyError:
                unknown.append(name)
        if unknown:
            raise TraitError(
                f"GpuShareApp.broker_users: {unknown} are not users of this host; name the Unix user the broker runs "
                "as (`ps -o user= -p $(pgrep -f 'gpushare broker')`), or leave it [] for a broker run as root."
            )
        return list(proposal["value"])

    def broker(self, socket: str | None = None) -> BrokerAt | None:
        """Where this host's broker is (``socket``, else broker_socket) and whom to believe there (broker_ca_file,
        broker_users); None without one."""
        socket = socket or self.broker_socket
        if not socket:
            return None
        uids = set()
        for name in self.broker_users:
            try:
                uids.add(pwd.getpwnam(name).pw_uid)
            except KeyError:  # (checked when set; removed since: not believed)
                continue
        return BrokerAt(socket, self.broker_ca_file, frozenset(uids))
