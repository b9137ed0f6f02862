"""Kernels' cgroups that the host's broker owns, for a server whose own groups a kernel could leave.

A student's Jupyter server can make its kernels' cgroups only in a subtree delegated to the student, where a
kernel (the same user) may make sub-groups and move what it starts into the server's own group, out of every
kernel's. The broker runs as root and makes each kernel's group where the student can write nothing
(broker/ops.py, ``enter_group``): a kernel's stand-in asks it to move the stand-in in before it becomes the kernel
(launch/standin.py), the server asks it to open the lease's card at the grant and to end the group with the
kernel. The server reads the groups' processes (``cgroup.procs`` is readable by all) as it reads its own.

``BrokerGroups`` is what the server's Holding uses in place of its own KernelCgroups: the same methods, answered
by the broker.
"""

from __future__ import annotations

import logging
import socket
import threading

from ..core.addresses import BrokerAt
from ..host.cgroups import KernelCgroups, Level
from .client import BrokerLedger

log = logging.getLogger("jupyter_gpushare")


class BrokerGroups(KernelCgroups):
    """The kernels' cgroups of this server, made, opened and ended by the broker at ``socket``."""

    def __init__(self, broker: BrokerAt, offered: dict) -> None:
        """``offered``: the broker's ``hello`` answer's ``groups`` (where its groups are, how they hold)."""
        self.socket = broker.socket
        self._client = BrokerLedger.at(broker)  # a connection of its own: the ledger's is its worker thread's
        self._talk = threading.Lock()  # one request at a time on it (the server's work threads end kernels at once)
        self.bases = [str(b) for b in offered.get("bases") or []]
        self.devices = self.bpf = self.unified = None
        self.dmem = None
        self._programs = {}
        self._unended: dict[str, bool] = {}  # kernel id -> keep: ends the broker did not hear (it was down)
        self.level = Level(
            "cgroup",
            bool(offered.get("card_isolation")),
            offered.get("reason"),
            None,
            "the broker sets no driver limit on the kernels' cgroups it owns",
            escapable=False,
        )

    @classmethod
    def offered(cls, broker: BrokerAt) -> BrokerGroups | None:
        """The broker's groups, where the broker at ``socket`` makes them; None where it does not (or does not
        answer: the server then holds its kernels as it can, and says so)."""
        try:
            groups = BrokerLedger.at(broker).hello().get("groups")
        except Exception as e:  # a broker that is down or older: the server's own way
            log.warning(
                "jupyter-gpushare: the broker at %s makes no kernel cgroups for this server: %s", broker.socket, e
            )
            return None
        return cls(broker, groups) if isinstance(groups, dict) and groups.get("bases") else None

    def through_broker(self, kernel_id: str) -> tuple[str, str] | None:
        """The broker's socket and the kernel's id, for its stand-in; None while the broker does not answer (a
        restart, an outage: the kernel then starts without a GPU and without a group, as its server says)."""
        self._dirs(kernel_id)  # (a kernel id that cannot name a group is refused here, as in create)
        try:  # (on the IOLoop, in the kernel's launch: a connect, bounded, not a request)
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(1.0)
                s.connect(self.socket)
        except OSError as e:
            log.warning(
                "jupyter-gpushare: kernel %s starts outside a cgroup: the broker does not answer (%s)", kernel_id, e
            )
            return None
        return self.socket, kernel_id

    def create(self, kernel_id: str, minors: list[int] | None) -> list[str]:
        return []  # the stand-in asks the broker (through_broker)

    def allow(self, kernel_id: str, minors: list[int] | None) -> None:
        if minors is not None:  # (which card: the broker's own list says, from the lease)
            with self._talk:
                self._client.group_cards(kernel_id)

    def limit(self, kernel_id: str, pci_bus_id: str | None, mib: int | None) -> bool:
        return False

    def remove(self, kernel_id: str, keep: bool = False, grace_s: float = 2.0) -> int:
        """End the kernel's group through the broker. While it does not answer, the end is kept and sent with the
        next one (what is left in the group runs until then; its GPU use counts as the lease's, or as use without
        one once the lease is gone)."""
        killed = 0
        with self._talk:  # (two kernels ended at once: one connection, one request at a time)
            self._unended[kernel_id] = keep
            for kid, keeping in list(self._unended.items()):
                try:
                    ended = self._client.end_group(kid, keeping)
                except OSError as e:
                    log.warning("jupyter-gpushare: kernel %s's cgroup is ended once the broker answers: %s", kid, e)
                    break
                del self._unended[kid]
                if kid == kernel_id:
                    killed = ended
        return killed

    def no_isolation(self, why: str) -> None:
        self.level = Level("cgroup", False, f"no card isolation: {why}", None, self.level.allocation_reason)
