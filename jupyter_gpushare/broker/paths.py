"""Paths the broker (root) writes to, checked so that no student can have prepared them."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def untrusted_dir(directory: Path) -> str | None:
    """Why a directory is not safe for the broker's files, or None: it, or one of its parents, belongs to another
    user than root and the broker's, or may be written by others (a parent with the sticky bit, as /tmp, may: no
    one else can move what is in it). A student could otherwise prepare the path: own the directory, link a
    file in it to another, or bind the socket first."""
    me = {0, os.geteuid()}
    path = directory.resolve()
    for level, d in enumerate([path, *path.parents]):
        try:
            info = d.stat()
        except OSError as e:
            return f"{d} cannot be read ({e.strerror})"
        if info.st_uid not in me:
            return f"{d} belongs to uid {info.st_uid}"
        writable = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if writable and (level == 0 or not info.st_mode & stat.S_ISVTX):
            return f"{d} is writable by other users (mode {stat.S_IMODE(info.st_mode):o})"
    return None


WRITABLE_BY_STUDENTS = ("/tmp", "/var/tmp", "/dev/shm", "/home")


def fillable_by_students(path: Path, shared: tuple[str, ...] = WRITABLE_BY_STUDENTS) -> str | None:
    """Which directory students may write to lies on the same filesystem as ``path`` (a file or directory), or
    None: a student who fills that filesystem makes every reserve fail for everyone (each is refused with the
    reason, never overbooked, but no kernel gets a GPU until there is space again)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        device = p.stat().st_dev
    except OSError:
        return None
    for d in shared:
        try:
            if os.stat(d).st_dev == device:
                return d
        except OSError:
            continue
    return None
