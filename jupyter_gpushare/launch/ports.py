"""A kernel's ports, held from their pick to its shutdown (``GpuShareProvisioner.hold_ports``, Linux, tcp), and renewed
when a restart asks for new ones (docs/jupyter-client-port-reuse.md)."""

from __future__ import annotations

import socket
import sys
from typing import Any

from jupyter_client.connect import LocalPortCache, port_names
from jupyter_client.provisioning import LocalProvisioner

from ..server.seam.internals import record_random_ports, restart_activity_watch


class HeldPorts(LocalProvisioner):
    """The provisioner's part that picks, holds and hands on its kernel's ports."""

    hold_ports: bool  # (GpuShareProvisioner's setting)
    _ports_renewed = False
    _ports: tuple[socket.socket, ...] = ()  # the kernel's ports, held bound from their pick to its shutdown

    async def _pick_ports(self, **kwargs: Any) -> dict[str, Any]:
        """LocalProvisioner's pre_launch, with ports held (``hold_ports``) and renewed when asked.

        LocalProvisioner picks and caches the ports before the KernelManager records which of its
        ports are random, so ``cleanup_random_ports()`` finds none and every restart reuses the
        first ports, even the restarter's "new random ports" for a kernel that died before it was
        stable: one whose port another socket took dies on it again, up to the restart limit.
        Recording them first lets ``restart_kernel(newports=True)`` zero them; fresh ones are then
        picked here while the old ones are still held or marked used, so none comes back.
        """
        km = self.parent
        stale_ports: list[int] = []
        stale_held: tuple[socket.socket, ...] = ()
        try:
            if km is not None and km.cache_ports and self.ports_cached and not all(km.ports):
                info: dict[str, Any] = dict(self.connection_info)
                stale_ports = [info[name] for name in port_names]
                stale_held, self.ports_cached = self._ports, False
            if km is not None and km.cache_ports and not self.ports_cached:
                record_random_ports(km)
                if self.hold_ports and km.transport == "tcp" and sys.platform.startswith("linux"):
                    self._ports = hold_ports(km.ip)
                    for name, sock in zip(port_names, self._ports):
                        setattr(km, name, sock.getsockname()[1])
                    self.ports_cached = True  # LocalProvisioner then writes km's ports as they are
            kwargs = await super().pre_launch(**kwargs)
            self._ports_renewed = bool(stale_ports)
            return kwargs
        finally:
            close(stale_held)
            for port in stale_ports:
                LocalPortCache.instance().return_port(port)

    def take_ports(self, other: HeldPorts) -> None:
        """The ports ``other`` holds (a warm kernel's, warm_start.py) are this kernel's; those picked for it go."""
        close(self._ports)
        self._ports, other._ports = other._ports, ()

    def _watch_activity_on_new_ports(self) -> None:
        """Point jupyter_server's activity watch (execution state, culling) at the kernel's new iopub port.

        jupyter_server reconnects it after its own restart_kernel only. Left on the old port, the
        state stays 'starting', and every new websocket's nudge waits for it until
        kernel_info_timeout, then closes.
        """
        restart_activity_watch(self.parent, self.kernel_id)


def hold_ports(ip: str) -> tuple[socket.socket, ...]:
    """Five ports the OS picks free, each kept bound (not listening) by a socket of ours.

    Linux gives a port with a bound socket to no bind(0) or connect() (ipykernel binds one with
    bind(0) for its IOPub pipe: in a start storm, that is what took another kernel's port), yet
    lets a listener bind it when both sockets set SO_REUSEADDR and ours never listens.
    """
    held: list[socket.socket] = []
    try:
        for _ in port_names:
            sock = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET)
            held.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((ip, 0))
    except BaseException:
        close(held)
        raise
    return tuple(held)


def close(socks: tuple[socket.socket, ...] | list[socket.socket]) -> None:
    for sock in socks:
        sock.close()
