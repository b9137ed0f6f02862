"""A kernel in line yields the CPU to the kernels that hold a GPU (issue 48): its start, its framework's import and
its CPU cells run under SCHED_IDLE, and at its grant (or at the end of its wait, when it runs on without a GPU) it
runs at normal priority again.

Leaving SCHED_IDLE needs CAP_SYS_NICE or an RLIMIT_NICE that allows nice 0 (20: the kernel checks the process's own
limit; most hosts give 0). A kernel that could not be given its priority back is never made to yield: ``can_lift``
is asked first, and where it says no the kernel runs at normal priority all along (docs/admin-guide.md).

The policy is per thread: a process's threads and the processes it starts inherit the one they were created under.
``yield_cpu`` is called as the kernel starts (one thread); ``restore`` walks every thread of the kernel and of the
processes below it.

Where the scheduler groups processes by session (autogroup, sched(7): on by default in Debian's and Ubuntu's kernels),
SCHED_IDLE ranks a thread only within its session's group, and every kernel leads a session of its own (jupyter_client
starts it so): its group would share the CPU with each running kernel's as an equal, SCHED_IDLE or not (on this
project's 2-core VM a kernel in line started in under a second beside a busy process per CPU). So the kernel's
session group yields as well: its nice becomes 19 (weight 15 against a normal group's 1024), and 0 again when the
kernel is lifted.
"""

from __future__ import annotations

import functools
import os
import resource

from .procs import tree_pids

NICE_ZERO_RLIMIT = 20  # RLIMIT_NICE's value that lets a process return to nice 0 (setrlimit(2): 20 - rlim_cur)
AUTOGROUP = "/proc/sys/kernel/sched_autogroup_enabled"
YIELD_NICE = 19  # a yielding kernel's session group (autogroup)


def can_lift() -> bool:
    """Whether a process started by this one may be given normal priority back once it yielded."""
    if not hasattr(os, "SCHED_IDLE"):
        return False
    if os.geteuid() == 0:
        return True
    soft, _hard = resource.getrlimit(resource.RLIMIT_NICE)
    return soft == resource.RLIM_INFINITY or soft >= NICE_ZERO_RLIMIT


def yield_cpu(pid: int, session_group: bool = True) -> bool:
    """Run ``pid`` (its threads from now on, and what it starts) under SCHED_IDLE, and with ``session_group`` its
    session's group at nice 19 too; False where it cannot be lifted again or the process is gone."""
    if not can_lift():
        return False
    try:
        os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
    except (ProcessLookupError, PermissionError):
        return False
    if session_group:
        _session_nice(pid, YIELD_NICE)
    return True


def restore(pid: int) -> int:
    """Normal priority (SCHED_OTHER) for every thread of ``pid`` and of the processes below it that yielded; how
    many threads were changed. Threads and processes that end meanwhile are skipped."""
    _session_nice(pid, 0)
    return _move_below(pid, os.SCHED_IDLE, os.SCHED_OTHER)


def yield_tree(pid: int) -> int:
    """SCHED_IDLE again for every thread of ``pid`` and of the processes below it that runs at normal priority (a
    kernel in line given normal priority for a while: ``restore``'s reverse); how many threads were changed."""
    _session_nice(pid, YIELD_NICE)
    return _move_below(pid, os.SCHED_OTHER, os.SCHED_IDLE)


def _session_nice(pid: int, nice: int) -> None:
    """Give ``pid``'s session group ``nice``, where the scheduler groups by session and ``pid`` leads its session (a
    kernel); nothing otherwise, or where the process is gone."""
    if not _groups_by_session():
        return
    try:
        if os.getsid(pid) != pid:
            return
        with open(f"/proc/{pid}/autogroup", "w") as f:
            f.write(str(nice))
    except OSError:  # (gone)
        return


@functools.cache
def _groups_by_session() -> bool:
    """Whether this host's scheduler groups processes by session (read once: ``yield_cpu`` runs on the server's
    loop at each launch in line)."""
    try:
        with open(AUTOGROUP) as f:
            return f.read().strip() == "1"
    except OSError:  # (a kernel without autogroup support)
        return False


def _move_below(pid: int, policy: int, to: int) -> int:
    changed = 0
    for tid in _threads_below(pid):
        try:
            if os.sched_getscheduler(tid) == policy:
                os.sched_setscheduler(tid, to, os.sched_param(0))
                changed += 1
        except (ProcessLookupError, PermissionError):
            continue
    return changed


def policy_of(pid: int) -> str:
    """ "idle" or "normal" (any other policy) for ``pid``'s main thread; "gone" once it ended."""
    try:
        return "idle" if os.sched_getscheduler(pid) == os.SCHED_IDLE else "normal"
    except ProcessLookupError:
        return "gone"


def _threads_below(pid: int) -> list[int]:
    """The threads of ``pid`` and of every process below it (Linux's /proc)."""
    found = []
    for process in tree_pids(pid):
        try:
            found += [int(tid) for tid in os.listdir(f"/proc/{process}/task")]
        except OSError:  # gone meanwhile
            continue
    return found
