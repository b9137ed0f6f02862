"""Host-wide broker: one process owns the host's ledger; the Jupyter servers of many users reserve through it.

- ``protocol``: the wire format and the one decoder that checks every request;
- ``identity``: who a Unix-socket caller is (peer credentials, containers, hidepid);
- ``guard`` and ``listener``: per-user connection caps and request rates, and fair accepting;
- ``server``: the broker process (``jupyter gpushare broker``) and what each caller may do;
- ``client``: ``BrokerLedger``, what a Jupyter server reserves through.

The server is imported only when asked for (``jupyter_gpushare.broker.GpuShareBroker``): a Jupyter server or
`jupyter gpushare status` needs the client alone.
"""

from __future__ import annotations

from typing import Any

from ..host.procs import container_reason
from .client import BrokerLedger
from .identity import Caller
from .protocol import DEFAULT_LEDGER, DEFAULT_SOCKET, BrokerRefused, is_tcp, parse_tcp

__all__ = [
    "DEFAULT_LEDGER",
    "DEFAULT_SOCKET",
    "BrokerLedger",
    "BrokerRefused",
    "Caller",
    "GpuShareBroker",
    "container_reason",
    "is_tcp",
    "main",
    "parse_tcp",
]


def __getattr__(name: str) -> Any:
    if name in ("GpuShareBroker", "main"):
        from . import server

        return getattr(server, name)
    raise AttributeError(name)
