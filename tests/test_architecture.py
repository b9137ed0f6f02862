"""The shape of the package: no import cycles, functions a person can follow (ruff's complexity rule), and types
that check (mypy).

Whether a module holds one job is for reviews to judge, not a line count (a file trimmed to pass a count is
worse than a long one).

Every import counts, also one inside a function (that is how cycles hide) and one only the type checker runs; a
package's ``__init__`` counts as importing only what it imports itself. docs/architecture.md draws the result.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "jupyter_gpushare"


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if "labextension" in parts or "bootstrap" in parts:  # (the bootstrap runs in kernels, stdlib only)
            continue
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(
        tree
    ):  # (imports only type checkers run count too: a type-only cycle is a tangle all the same)
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_one_that_imports_it_back():
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert cycles(graph) == []


# The package's folders, lowest first (docs/architecture.md draws them). A module imports its own folder and the
# folders below it, never one above: the rules know nothing of the host, the host nothing of the ledger, the
# ledger nothing of the broker or a server, and so on up to the command line.
LAYERS = ("core", "host", "ledger", "config", "broker", "server", "launch", "cli")


def layer_of(name: str) -> str | None:
    """A module's folder ('jupyter_gpushare.ledger.view' -> 'ledger'); None for the package's own __init__."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for name, deps in graph.items():
        here = layer_of(name)
        if here is None:
            continue
        for dep in deps:
            there = layer_of(dep)
            if there is not None and LAYERS.index(there) > LAYERS.index(here):
                found.append(f"{name} -> {dep}")
    return sorted(found)


def test_every_module_sits_in_a_layer_and_imports_none_above_it():
    known = modules()
    assert {layer_of(name) for name in known} - {None} == set(LAYERS)  # no module at the package's root
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert upward_imports(graph) == []


def test_the_layer_rule_finds_an_upward_import():
    graph = {"p.core.policy": {"p.server.app"}, "p.server.app": {"p.core.policy"}, "p.cli.main": {"p.host.procs"}}
    assert upward_imports(graph) == ["p.core.policy -> p.server.app"]


def test_no_bootstrap_module_imports_one_that_imports_it_back():
    """The bootstrap's modules are top-level names in the kernel (its folder is on PYTHONPATH): the hooks sit on
    the report, and the module that installs them on the hooks, never the other way round."""
    folder = PACKAGE / "bootstrap"
    known = {path.stem: path for path in folder.glob("*.py")}
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert cycles(graph) == []
    assert {name for name, deps in graph.items() if "_gpushare_boot" in deps} == {"sitecustomize"}  # no call back


def test_no_module_or_class_is_a_place_where_everything_goes():
    """A module past 600 lines, or a class past 400 lines of methods, is where unrelated jobs pile up (QuotaManager
    was 656 lines of methods doing admission, the line, cgroups and the state at once): split it where its concepts
    part. The bounds are a backstop for that review, not a goal."""
    too_long = []
    for name, path in modules().items():
        text = path.read_text()
        if len(text.splitlines()) > 600:
            too_long.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                methods = [m for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
                size = sum(m.end_lineno - m.lineno + 1 for m in methods)
                if size > 400:
                    too_long.append(f"{name}.{node.name}: {size} lines of methods")
    assert too_long == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is in the test extras")
def test_lint_and_complexity_are_clean():
    out = subprocess.run(
        ["ruff", "check", "jupyter_gpushare", "tests", "bench"], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is in the test extras")
def test_the_package_type_checks():
    """mypy on the package (pyproject.toml's [tool.mypy]), then on the bootstrap on its own: its modules are
    top-level names in the kernel (its folder is on PYTHONPATH), not the package's. It found real bugs when it
    came: a card without a device minor made the kernel's cgroup rule `c 195:None`."""
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stdout + out.stderr
    bootstrap = PACKAGE / "bootstrap"
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", "--config-file", os.devnull, "--explicit-package-bases",
         "--ignore-missing-imports", "--warn-unused-ignores", *sorted(p.name for p in bootstrap.glob("*.py"))],
        cwd=bootstrap, env={**os.environ, "MYPYPATH": "."}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
