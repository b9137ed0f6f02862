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

from ..ledger import Owner, ProcessRef, SessionRef
from ..sampler import pid_namespace_depth


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
