"""A kernel in line yields the CPU to the kernels that hold a GPU (issue 48): its start, its framework's import and
its CPU cells run under SCHED_IDLE, and at its grant (or at the end of its wait, when it runs on without a GPU) it
runs at normal priority again.

Leaving SCHED_IDLE needs CAP_SYS_NICE or an RLIMIT_NICE that allows nice 0 (20: the kernel checks the process's own
limit; most hosts give 0). A kernel that could not be given its priority back is never made to yield: ``can_lift``
is asked first, and where it says no the kernel runs at normal priority all along (docs/admin-guide.md).

The policy is per thread: a process's threads and the processes it starts inherit the one they were created under.
``yield_cpu`` is called as the kernel starts (one thread); ``restore`` walks every thread of the kernel and of the
processes below it.
"""

from __future__ import annotations

import os
import resource

from .procs import tree_pids

NICE_ZERO_RLIMIT = 20  # RLIMIT_NICE's value that lets a process return to nice 0 (setrlimit(2): 20 - rlim_cur)


def can_lift() -> bool:
    """Whether a process started by this one may be given normal priority back once it yielded."""
    if not hasattr(os, "SCHED_IDLE"):
        return False
    if os.geteuid() == 0:
        return True
    soft, _hard = resource.getrlimit(resource.RLIMIT_NICE)
    return soft == resource.RLIM_INFINITY or soft >= NICE_ZERO_RLIMIT


def yield_cpu(pid: int) -> bool:
    """Run ``pid`` (its threads from now on, and what it starts) under SCHED_IDLE; False where it cannot be lifted
    again or the process is gone."""
    if not can_lift():
        return False
    try:
        os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
    except (ProcessLookupError, PermissionError):
        return False
    return True


def restore(pid: int) -> int:
    """Normal priority (SCHED_OTHER) for every thread of ``pid`` and of the processes below it that yielded; how
    many threads were changed. Threads and processes that end meanwhile are skipped."""
    changed = 0
    for tid in _threads_below(pid):
        try:
            if os.sched_getscheduler(tid) == os.SCHED_IDLE:
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
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
