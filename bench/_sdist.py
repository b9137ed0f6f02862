"""A package's own test suite, from its sdist: what bench/nbclient_suite.py and bench/jupyter_server_suite.py run."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import sysconfig
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
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        see_this_environment(python)
        subprocess.run([str(python), *pip[1:], "install", *deps], check=True, timeout=600)
    return python, src


def suite_env(**changes: str) -> dict[str, str]:
    """This process's environment for a package's own suite, less what a pytest running this one set in it (an
    xdist worker's PYTEST_XDIST_* would make the suite's own pytest think it is one), with ``changes``."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}, **changes}


def see_this_environment(python: Path) -> None:
    """Make the virtualenv of ``python`` see this interpreter's packages, behind its own: whatever this one is (the
    system's, a virtualenv's, a conda environment's). ``venv --system-site-packages`` would not do: made from inside
    a virtualenv it sees the base interpreter's packages, not the virtualenv's (the README's test command then ran
    these suites without jupyter_client). A .pth file in the new environment adds this one's site directories the
    way site.py adds its own (their .pth files, an editable install's among them, are read)."""
    own = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    dirs = dict.fromkeys([*site.getsitepackages(), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        dirs[site.getusersitepackages()] = None
    lines = [f"import site; site.addsitedir({d!r})" for d in dirs if os.path.isdir(d)]
    (Path(own) / "zz_this_environment.pth").write_text("\n".join(lines) + "\n")
