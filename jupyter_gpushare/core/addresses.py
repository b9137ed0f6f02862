"""Where our parts find each other: the broker's default socket and ledger, a TCP broker's address, and the
name our provisioner is registered under. Constants and parsing only."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_SOCKET = "/run/jupyter-gpushare/broker.sock"
DEFAULT_LEDGER = "/var/lib/jupyter-gpushare/ledger.sqlite"
PROVISIONER_NAME = "gpushare-provisioner"  # our entry point in jupyter_client.kernel_provisioners (pyproject.toml)


@dataclass(frozen=True)
class BrokerAt:
    """Where this host's broker listens and whom to believe there: GpuShareApp.broker_socket, broker_ca_file and the
    uids of broker_users (a server sends nothing to a socket served by anyone but root, itself or those)."""

    socket: str
    ca_file: str = ""
    uids: frozenset[int] = frozenset()


def is_tcp(address: str) -> bool:
    return address.startswith(("tcp://", "tls://"))


def parse_tcp(address: str, what: str) -> tuple[str, int]:
    """'host:port' (or 'tcp://host:port', 'tls://host:port') -> (host, port); ValueError that names ``what``."""
    rest = address.removeprefix("tcp://").removeprefix("tls://")
    host, _, port = rest.rpartition(":")
    if not host or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{what} = {address!r} is not host:port; e.g. 'tcp://gpushare-broker.jhub.svc:8765'.")
    return host.strip("[]"), int(port)
