"""Process identity: a process is its pid and its start time, never its pid alone (pids are reused)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Union

import psutil


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
