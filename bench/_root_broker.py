"""A root broker for a benchmark, and the Unix users it serves: made for the run, all gone afterwards.

Used by bench_broker_flood.py and bench_fair_line.py (as root: useradd, the broker runs as root).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


@dataclass
class RootBroker:
    socket: str
    base: Path  # its config, log and ledger (lib/ledger.sqlite) are here

    @property
    def log_path(self) -> Path:
        return self.base / "broker.log"

    @property
    def ledger_path(self) -> Path:
        return self.base / "lib" / "ledger.sqlite"


def ensure_user(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True)
        return pwd.getpwnam(name)


def as_user(name: str) -> None:
    """Become ``name`` (in a forked child)."""
    user = pwd.getpwnam(name)
    os.setgroups([])
    os.setgid(user.pw_gid)
    os.setuid(user.pw_uid)


@contextmanager
def root_broker(script: str, users: tuple[str, ...], settings: str, source: str | None = None) -> Iterator[RootBroker]:
    """A broker on a simulated card (``settings``: config lines, c.GpuShareApp.* and c.GpuShareBroker.*), the Unix
    ``users`` made for it; ``script`` names the benchmark in the refusal when this is not root. ``source``: the
    broker runs that source tree's jupyter_gpushare (a checkout of the code before), not this one's."""
    if os.geteuid() != 0 or not shutil.which("useradd"):
        sys.exit(f"{script} needs root and useradd (Unix users of its own, a root broker).")
    base = Path(tempfile.mkdtemp(prefix="gpushare-bench-"))
    os.chmod(base, 0o755)
    root_mode = os.stat("/root").st_mode
    os.chmod("/root", root_mode | 0o001)  # the users reach this interpreter under /root (restored at the end)
    broker = RootBroker(str(base / "run" / "broker.sock"), base)
    process = None
    try:
        for name in users:
            ensure_user(name)
        (base / "config.py").write_text(
            textwrap.dedent(settings)
            + f"\nc.GpuShareBroker.socket_path = {broker.socket!r}\nc.GpuShareBroker.ledger_path = {str(broker.ledger_path)!r}\n"
        )
        log = open(broker.log_path, "w+")
        process = subprocess.Popen(
            [sys.executable, "-m", "jupyter_gpushare.cli.main", "broker", f"--config={base / 'config.py'}"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, **({"PYTHONPATH": source} if source else {})},
        )  # fmt: skip
        for _ in range(200):
            if os.path.exists(broker.socket):
                break
            time.sleep(0.1)
        else:
            log.seek(0)
            sys.exit(f"the broker did not start:\n{log.read()[-3000:]}")
        yield broker
    finally:
        if process is not None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(30)
        for name in users:
            subprocess.run(["userdel", name], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
        os.chmod("/root", root_mode)
