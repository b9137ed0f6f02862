"""nbclient's own test suite with our provisioner as every kernel's default: a real program that starts kernels
from threads, asyncio tasks and forked workers (test_many_parallel_notebooks), which once hung with our
provisioner (a forked worker inherited its parent's manager and SQLite connection). The time against a run
without the provisioner is a benchmark, not asserted here: bench/nbclient_suite.py prints the ratio."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "bench"))
from nbclient_suite import prepare, run  # noqa: E402


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_nbclient_suite_passes_with_our_provisioner(tmp_path):
    python, src = prepare(tmp_path)
    result = run(python, src, tmp_path, gpushare=True, timeout=900)
    assert result["rc"] == 0, result["tail"]
    assert result["failures"] == [] and result["counts"].get("passed", 0) > 50, result["counts"]
    # the suite's kernels went through our provisioner (it made the ledger); no reservation is left but those
    # of kernels that ended with the suite's process (reaped, as the next reservation would)
    assert result["ledger_used"] and result["leases_left"] == 0, result
