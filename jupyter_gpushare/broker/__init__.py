"""Host-wide broker: one process owns the host's ledger; the Jupyter servers of many users reserve through it.

- ``protocol``: the wire format and the one decoder that checks every request;
- ``identity``: who a Unix-socket caller is (peer credentials, containers, hidepid);
- ``guard``: per-user connection caps and request rates;
- ``server``: the broker process (``jupyter gpushare broker``) and what each caller may do;
- ``client``: ``BrokerLedger``, what a Jupyter server reserves through.
"""

from __future__ import annotations

from .client import BrokerLedger
from .identity import Caller, container_reason
from .protocol import BrokerRefused, is_tcp, parse_tcp
from .server import DEFAULT_LEDGER, DEFAULT_SOCKET, GpuShareBroker, main

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
