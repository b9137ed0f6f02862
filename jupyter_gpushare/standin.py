"""The process of a kernel that waits for a GPU, until it is granted: then it becomes the kernel.

Run by the provisioner (held.py) as ``python -I -S standin.py <fd> <kernel command...>``, with the kernel's
working directory, session and environment, so that Jupyter has a kernel process from the first moment (the
start answers at once; the kernel is listed, can be shut down, restarted or interrupted). It reads one JSON
object from the pipe ``<fd>``: the kernel's whole environment, written once its reservation is granted. It then
replaces itself with the kernel (``execve``: the same pid, process group and start time, so the lease's
process identity holds). End of file without an environment (the wait ended, or the server is gone) ends it.

Standard library only, and nothing imported from jupyter_gpushare: it runs in isolated mode (``-I -S``).
"""

import json
import os
import signal
import sys


def main(argv: list) -> int:
    if len(argv) < 3:
        sys.stderr.write("usage: standin.py <fd> <kernel command...>\n")
        return 2
    fd, cmd = int(argv[1]), argv[2:]
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
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as e:
        sys.stderr.write(f"jupyter-gpushare: the kernel command {cmd[0]!r} could not be run: {e}\n")
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv))
