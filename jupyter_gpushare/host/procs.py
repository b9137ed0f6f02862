"""Processes: who is who, and whose process a GPU process is.

A process is its pid and its start time, never its pid alone (pids are reused). Here too: process trees and
kernel cgroups (which kernel a GPU process belongs to), what processes in no reserved kernel's tree use, PID namespaces,
and the checks for callers in containers or behind a /proc that hides other users.
"""

from __future__ import annotations

import os
import pwd
import time
from dataclasses import dataclass
from typing import Union

import psutil

from .cgroups import kernel_of

MAX_DEPTH = 64  # ancestors walked from a GPU process before giving up
REVALIDATE_S = 10.0  # a pid listed in consecutive readings is re-read from /proc at least this often


@dataclass(frozen=True)
class ProcessRef:
    """A process identified by pid and start time, so a reused pid does not pass for it."""

    pid: int
    start: float

    @classmethod
    def of(cls, pid: int) -> ProcessRef | None:
        try:
            return cls(pid, psutil.Process(pid).create_time())
        except psutil.Error:
            return None

    @classmethod
    def me(cls) -> ProcessRef:
        ref = cls.of(os.getpid())
        assert ref is not None
        return ref

    def same(self, other: object) -> bool:
        """The same process: same pid, start times equal within what /proc's clock ticks can tell apart."""
        return isinstance(other, ProcessRef) and other.pid == self.pid and abs(other.start - self.start) < 0.05

    def alive(self) -> bool:
        try:
            proc = psutil.Process(self.pid)
            return abs(proc.create_time() - self.start) < 0.05 and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return self._hidden()
        except psutil.Error:
            return False

    def _hidden(self) -> bool:
        """Whether a process /proc does not show is there all the same, another user's behind hidepid: then
        it is taken for alive (its start time cannot be checked), so its memory is never handed out twice."""
        try:
            os.kill(self.pid, 0)  # signal 0: only asks whether the pid exists
        except PermissionError:  # it does, and is not ours
            return True
        except OSError:
            return False
        return False  # ours, so /proc would show it: the pid came back for a new process


@dataclass(frozen=True)
class SessionRef:
    """A server known to the broker by a session (see the module's doc), not as a process it can see."""

    id: str


Owner = Union[ProcessRef, SessionRef]  # (Python 3.9: no X | Y at run time)


def _proc_stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of a process, or None when it does not exist (one read on Linux).

    The start time is in clock ticks since boot on Linux (from /proc/<pid>/stat), elsewhere
    psutil's create_time: either way, with the pid it names one process for its whole life.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError:
        return _psutil_stat(pid)
    fields = data[data.rindex(b")") + 2 :].split()  # the name may hold spaces and parentheses
    try:
        return int(fields[1]), int(fields[19])  # ppid (field 4), starttime (field 22)
    except (IndexError, ValueError):
        return _psutil_stat(pid)


def _psutil_stat(pid: int) -> tuple[int, int] | None:
    try:
        p = psutil.Process(pid)
        return p.ppid(), int(p.create_time() * 1000)
    except (psutil.Error, ValueError):
        return None


if not os.path.isdir("/proc/self"):  # not Linux: psutil for both
    _proc_stat = _psutil_stat  # noqa: F811


def pid_namespace_depth(pid: int | str) -> int:
    """How many PID namespaces a process is in, as /proc sees it (its NSpid line, readable by any user);
    0 when that cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return len(line.split()) - 1
    except OSError:  # gone
        pass
    return 0


def _exists(pid: int) -> bool:
    """The pid names a process (a signal-0 probe: one system call, no /proc read)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: another user's process, alive
        pass
    return True


def root_of(pid: int, roots: set[int]) -> int | None:
    """The one of ``roots`` a process is or descends from (its parents read from /proc), or None (a process that
    is gone or hidden from us is under none)."""
    for _ in range(MAX_DEPTH):
        if pid in roots:
            return pid
        stat = _proc_stat(pid)
        if stat is None or stat[0] <= 1:
            return None
        pid = stat[0]
    return None


class ProcessTrees:
    """Maps pids to the kernel whose process tree holds them, caching by (pid, start time)."""

    def __init__(self) -> None:
        self._roots: dict[int, tuple[int, str]] = {}  # root pid -> (start time, kernel id)
        self._owner: dict[tuple[int, int], tuple[int, int] | None] = {}  # process -> its kernel root
        self._roots_version = 0
        self._negative_version: dict[tuple[int, int], int] = {}
        self._recent: dict[int, tuple[tuple[int, int], tuple[int, int], float]] = {}  # pid -> (key, stat, read at)

    def set_roots(self, roots: dict[str, int | None]) -> None:
        """The kernels' root pids (kernel id -> pid); a root's start time is read once."""
        current = {pid: kid for kid, pid in roots.items() if pid}
        changed = False
        for pid in list(self._roots):
            if current.get(pid) != self._roots[pid][1]:
                del self._roots[pid]
                changed = True
        for pid, kid in current.items():
            if pid not in self._roots:
                stat = _proc_stat(pid)
                if stat is None:
                    continue
                self._roots[pid] = (stat[1], kid)
                changed = True
        if changed:
            self._roots_version += 1

    def owners(self, pids: set[int]) -> dict[int, str]:
        """Kernel id for every pid that belongs to a kernel of this server; others are left out.

        A pid listed by the driver in the previous reading too, still alive, and read from /proc
        less than REVALIDATE_S ago, is taken to be the same process without reading /proc again: for another
        process to hold that pid, this one must have exited (and the driver drops exited processes
        at once), the pid be handed out again and the new process reach the GPU, all within one
        interval. Every other pid is read (one small /proc read each).
        """
        now = time.monotonic()
        found: dict[int, str] = {}
        seen: dict[int, tuple[tuple[int, int], tuple[int, int], float]] = {}
        stat: tuple[int, int] | None
        for pid in pids:
            recent = self._recent.get(pid)
            if recent is not None and now - recent[2] < REVALIDATE_S and _exists(pid):
                key, stat, checked = recent
            else:
                stat = _proc_stat(pid)
                if stat is None:
                    continue  # exited (or another namespace's pid): "other"
                key, checked = (pid, stat[1]), now
            seen[pid] = (key, stat, checked)
            root = self._lookup(pid, stat, key)
            entry = self._roots.get(root[0]) if root is not None else None
            if root is not None and entry is not None and entry[0] == root[1]:
                found[pid] = entry[1]
            elif (kid := kernel_of(pid)) is not None and kid in self._kernels():
                found[pid] = kid  # out of the tree (a double-forked daemon), not out of the kernel's cgroup
        self._recent = seen
        if len(self._owner) > len(seen):  # forget processes no longer on a GPU
            keys = {v[0] for v in seen.values()}
            for key in [k for k in self._owner if k not in keys]:
                self._owner.pop(key, None)
                self._negative_version.pop(key, None)
        return found

    def _kernels(self) -> set[str]:
        return {kid for _, kid in self._roots.values()}

    def _lookup(self, pid: int, stat: tuple[int, int], key: tuple[int, int]) -> tuple[int, int] | None:
        if key in self._owner:
            root = self._owner[key]
            if root is not None or self._negative_version.get(key) == self._roots_version:
                return root
        root = None
        cur_pid, (ppid, start) = pid, stat
        for _ in range(MAX_DEPTH):
            entry = self._roots.get(cur_pid)
            if entry is not None and entry[0] == start:
                root = (cur_pid, start)
                break
            if ppid <= 1:
                break
            parent = _proc_stat(ppid)
            if parent is None or parent[1] > start:  # gone, or younger than its child: the pid was reused
                break
            cur_pid, (ppid, start) = ppid, parent
        self._owner[key] = root
        if root is None:
            self._negative_version[key] = self._roots_version
        return root


def tree_pids(pid: int) -> set[int]:
    """A process and all its descendants, as they are now; empty when it is gone."""
    try:
        return {pid} | {child.pid for child in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


def describe(pid: int) -> dict[str, str | None]:
    """The user and command line of a process (None where this host does not show them)."""
    try:
        proc = psutil.Process(pid)
        return {"user": proc.username(), "command": " ".join(proc.cmdline())[:120] or proc.name()}
    except (psutil.Error, KeyError):  # gone, another namespace's pid, or a uid without a name
        return {"user": None, "command": None}


# -- containers and a /proc that hides other users ----------------------------------------------------


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
