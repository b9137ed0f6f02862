"""How every kernel enters its cgroups before it runs: then it becomes the kernel.

Run by the provisioner as ``python -I -S standin.py [--cgroup <cgroup.procs>]... <kernel command...>`` with the
kernel's working directory, session and environment, where the server keeps kernels in cgroups (cgroups.py). It
writes its own pid to each ``cgroup.procs`` file, then replaces itself with the kernel (``execve``: the same pid,
process group and start time, so the lease's process identity holds). A group that cannot be entered ends the
start with the reason: a kernel never runs outside the group that holds its cards.

Standard library only, and nothing imported from jupyter_gpushare: it runs in isolated mode (``-I -S``).
"""

import os
import sys


def main(argv: list) -> int:
    args = argv[1:]
    groups = []
    while len(args) > 1 and args[0] == "--cgroup":
        groups.append(args[1])
        args = args[2:]
    if not args:
        sys.stderr.write("usage: standin.py [--cgroup <cgroup.procs>]... <kernel command...>\n")
        return 2
    for procs in groups:
        try:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        except OSError as e:
            sys.stderr.write(f"jupyter-gpushare: the kernel could not enter its cgroup {procs}: {e}\n")
            return 126
    return run(args, dict(os.environ))


def run(cmd: list, env: dict) -> int:
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as e:
        sys.stderr.write(f"jupyter-gpushare: the kernel command {cmd[0]!r} could not be run: {e}\n")
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv))
