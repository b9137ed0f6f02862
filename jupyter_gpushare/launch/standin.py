"""How every kernel enters its cgroups before it runs: then it becomes the kernel.

Run by the provisioner as ``python -I -S standin.py [--cgroup <cgroup.procs>]... <kernel command...>`` with the
kernel's working directory, session and environment, where the server keeps kernels in cgroups (cgroups.py). It
writes its own pid to each ``cgroup.procs`` file, then replaces itself with the kernel (``execve``: the same pid,
process group and start time, so the lease's process identity holds). A group that cannot be entered ends the
start with the reason: a kernel never runs outside the group that holds its cards.

``--broker <socket> <kernel id>`` in place of ``--cgroup``: the host's broker owns the kernel's group (root: the
student can move nothing out of it); the stand-in asks it, on its Unix socket, to move this process in (the
broker knows the asking process by the socket's peer credentials).

Standard library only, and nothing imported from jupyter_gpushare: it runs in isolated mode (``-I -S``).
"""

import os
import sys


def main(argv: list) -> int:
    args = argv[1:]
    groups, broker = [], None
    while len(args) > 1 and args[0] == "--cgroup":
        groups.append(args[1])
        args = args[2:]
    if len(args) > 2 and args[0] == "--broker":
        broker, args = (args[1], args[2]), args[3:]
    if not args:
        sys.stderr.write(
            "usage: standin.py [--cgroup <cgroup.procs>]... [--broker <socket> <kernel id>] <kernel command...>\n"
        )
        return 2
    if broker is not None:
        why = enter_through(*broker)
        if why:
            sys.stderr.write(f"jupyter-gpushare: the kernel could not enter its cgroup through the broker: {why}\n")
            return 126
    for procs in groups:
        try:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        except OSError as e:
            sys.stderr.write(f"jupyter-gpushare: the kernel could not enter its cgroup {procs}: {e}\n")
            return 126
    return run(args, dict(os.environ))


def enter_through(socket_path: str, kernel_id: str) -> str:
    """Ask the broker to move this process into the kernel's group; what went wrong, or "" once it is in."""
    import json
    import socket
    import struct

    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(30)
            s.connect(socket_path)
            _pid, uid, _gid = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            if uid != 0:  # only a root broker makes groups a kernel cannot leave: anyone else's answer is not one
                return f"the process at {socket_path} runs as uid {uid}, not root: it is not the host's broker"
            s.sendall(json.dumps({"op": "enter_group", "args": {"kernel_id": kernel_id}}).encode() + b"\n")
            reply = json.loads(s.makefile("rb").readline() or b"{}")
    except (OSError, ValueError) as e:
        return f"the broker at {socket_path} did not answer ({e})"
    if not isinstance(reply, dict) or reply.get("ok") is not True:
        return str(reply.get("message") if isinstance(reply, dict) else reply) or "refused"
    return ""


def run(cmd: list, env: dict) -> int:
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as e:
        sys.stderr.write(f"jupyter-gpushare: the kernel command {cmd[0]!r} could not be run: {e}\n")
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv))
