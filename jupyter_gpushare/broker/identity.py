"""Who is calling the broker, as the kernel (or the JupyterHub) says, never as the caller says.

On the Unix socket, SO_PEERCRED gives the uid (-> user name and groups) and the pid (-> the calling
process, pid + start time, which owns what it reserves). A caller in a container (a PID namespace or a
root filesystem of its own) is told to use TCP with its Hub token; a broker that /proc hides other users
from (hidepid) says so.
"""

from __future__ import annotations

import grp
import os
import pwd
import socket
import struct
from dataclasses import dataclass

from ..host.procs import Owner, ProcessRef, SessionRef


@dataclass(frozen=True)
class Caller:
    """A connected client as the kernel (or the Hub) identifies it."""

    user: str
    uid: int
    groups: tuple[str, ...] = ()
    admin: bool = False
    process: ProcessRef | None = None
    session: SessionRef | None = None  # a server identified by its Hub token (no process to see)

    @property
    def owner(self) -> Owner | None:
        return self.session or self.process

    def owns(self, owner: Owner) -> bool:
        """Whether this connection is the process (or the Hub session) that holds ``owner``'s leases: a
        server's kernel runs as the same user, but it is another process, so it is not its server."""
        if isinstance(owner, SessionRef):
            return self.session == owner
        return self.process is not None and self.process.same(owner)


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket, from the kernel."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", raw)


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
