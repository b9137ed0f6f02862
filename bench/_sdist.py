"""A package's own test suite, from its sdist: what bench/nbclient_suite.py and bench/jupyter_server_suite.py run."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path


def prepare(package: str, version: str, deps: Sequence[str], workdir: Path) -> tuple[Path, Path]:
    """The source tree of ``package`` ``version`` (its tests; pip download: wheels have none) and a Python that
    has ``deps``, the suite's test-only dependencies, in a virtualenv that sees this environment's packages (so
    they do not change the environment our own tests run in): (python, source)."""
    workdir.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    src = workdir / f"{package}-{version}"
    if not (src / "tests").is_dir():
        subprocess.run([*pip, "download", "--no-deps", "--no-binary", ":all:", f"{package}=={version}",
                        "-d", str(workdir)], check=True, timeout=300)  # fmt: skip
        with tarfile.open(workdir / f"{package}-{version}.tar.gz") as tar:
            tar.extractall(workdir, filter="data")
    venv = workdir / "venv"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
        subprocess.run([str(python), *pip[1:], "install", *deps], check=True, timeout=600)
    return python, src
