"""Run a command with a root filesystem of its own, as a container has, but the same PID namespace
(`docker run --pid=host`, Apptainer). Run as root under `unshare --mount --fork`:

    unshare --mount --fork python tests/newroot.py ROOTDIR COMMAND...

ROOTDIR becomes a tmpfs holding bind mounts of this host's directories (so the same Python and files
are there), the command runs chrooted into it, and the mounts go with the mount namespace.
"""

import os
import subprocess
import sys

SKIP = {"proc", "sys", "lost+found"}


def main(root: str, argv: list[str]) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "newroot", root], check=True)
    for name in os.listdir("/"):
        src, dst = os.path.join("/", name), os.path.join(root, name)
        if name in SKIP:
            os.mkdir(dst)
        elif os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        elif os.path.isdir(src):
            os.mkdir(dst)
            subprocess.run(["mount", "--rbind", src, dst], check=True)
    subprocess.run(["mount", "-t", "proc", "proc", os.path.join(root, "proc")], check=True)
    os.chroot(root)
    os.chdir("/")
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
