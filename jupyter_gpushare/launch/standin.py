"""The process of a kernel that waits for a GPU, until it is granted: then it becomes the kernel.

Run by the provisioner (held.py) as ``python -I -S standin.py <fd> <kernel command...>``, with the kernel's
working directory, session and environment, so that Jupyter has a kernel process from the first moment (the
start answers at once; the kernel is listed, can be shut down, restarted or interrupted). It reads one JSON
object from the pipe ``<fd>``: the kernel's whole environment, written once its reservation is granted. It then
replaces itself with the kernel (``execve``: the same pid, process group and start time, so the lease's
process identity holds). End of file without an environment (the wait ended, or the server is gone) ends it.

Where the server keeps kernels in cgroups (cgroups.py), it is also how every kernel enters its group before it
runs: ``standin.py --cgroup <cgroup.procs>... <fd | -> <kernel command...>`` writes its own pid to each file
first (``-``: no wait, become the kernel at once). A group that cannot be entered ends the start with the
reason: a kernel never runs outside the group that holds its cards.

Standard library only, and nothing imported from jupyter_gpushare: it runs in isolated mode (``-I -S``).
"""

import json
import os
import signal
import sys


def main(argv: list) -> int:
    args = argv[1:]
    groups = []
    while len(args) > 1 and args[0] == "--cgroup":
        groups.append(args[1])
        args = args[2:]
    if len(args) < 2:
        sys.stderr.write("usage: standin.py [--cgroup <cgroup.procs>]... <fd | -> <kernel command...>\n")
        return 2
    for procs in groups:
        try:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        except OSError as e:
            sys.stderr.write(f"jupyter-gpushare: the kernel could not enter its cgroup {procs}: {e}\n")
            return 126
    if args[0] == "-":
        return run(args[1:], dict(os.environ))
    fd, cmd = int(args[0]), args[1:]
    # An interrupt while waiting does nothing (there is no code running). A handler, not SIG_IGN: an ignored
    # signal stays ignored across exec, and the kernel must get its interrupts.
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    chunks = []
    with os.fdopen(fd, "rb") as pipe:
        while True:
            chunk = pipe.read(65536)
            if not chunk:
                break
            chunks.append(chunk)
    data = b"".join(chunks)
    if not data:
        return 0  # the wait ended without a grant: the server shuts this kernel down
    env = json.loads(data)
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        sys.stderr.write("jupyter-gpushare: the kernel's environment is not a JSON object of strings\n")
        return 2
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    return run(cmd, env)


def run(cmd: list, env: dict) -> int:
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as e:
        sys.stderr.write(f"jupyter-gpushare: the kernel command {cmd[0]!r} could not be run: {e}\n")
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv))
