"""jupyter_server's own kernel and session tests give the same results with our provisioner as every kernel's
default, and a warm kernel kept by each server, as without them, pending kernels on and off (their tests run both).
A kernelspec whose process cannot start is an error at once, as Jupyter says it (test_kernel_handler_startup_error,
test_create_bad, test_create_bad_pending, test_cull_dead). The time ratio is a benchmark: bench/jupyter_server_suite.py.

The outcomes without us are the installed version's recorded baseline where there is one (they depend on
jupyter_server's version, not on our code: ``--record`` keeps them); every test whose outcome differs is run again
both ways, live, and a difference counts only when it repeats. A version with no baseline runs both ways at once."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "bench"))
from jupyter_server_suite import confirmed, differences, prepare, recorded, run  # noqa: E402

WARM = {"warm_kernels": 1}
MAX_TO_CONFIRM = 12  # differences confirmed one by one (each ~40 s); more at once: both runs again, once


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_jupyter_servers_kernel_and_session_tests_give_the_same_results_with_our_provisioner(tmp_path):
    python, src = prepare(tmp_path)
    baseline = recorded()

    # the two ways at once (each in its own directories, on ports of its own): the suite waits on its kernels and
    # servers more than it computes, and run one after the other it was CI's longest test (466 s on 2 cores)
    # ours with a warm kernel (server/warm.py): each server's first kernel, and those after a refill, are handed over
    def both_ways() -> tuple[dict, dict]:
        with ThreadPoolExecutor(2) as pool:
            without, ours = pool.map(
                lambda on: run(python, src, tmp_path, gpushare=on, extra=WARM if on else None), (False, True)
            )
        return without, ours

    def first_runs() -> tuple[dict, dict]:
        if baseline is None:
            return both_ways()
        return baseline, run(python, src, tmp_path, gpushare=True, extra=WARM)

    without, ours = first_runs()
    if min(without["counts"].get("passed", 0), ours["counts"].get("passed", 0)) <= 50:
        # a run that ended midway: the suite's own teardown hung past its timeout under CI's load, without us (CI
        # run 46: shutdown_all waiting in jupyter_core's thread; no summary, so no outcomes): again, once. With us,
        # CI run 56's hung in pytest_jupyter's jp_server_cleanup at the shared zmq context's destroy(), where
        # jupyter_server's own CI timed out too (jupyter-server/jupyter_server#677, #689); not met in 4 runs of ours
        # here, two at once (2026-11-30)
        print(f"a run ended midway:\n{without['tail']}\n{ours['tail']}")
        without, ours = first_runs()
    assert without["counts"].get("passed", 0) > 50, without["tail"]
    assert ours["ledger_used"], "the suite's kernels did not go through our provisioner"
    # a difference counts when it repeats: the test run again on its own, twice each way (some of the suite's
    # tests are timing-sensitive on a loaded machine, with or without us)
    diff = differences(without, ours)
    if len(diff) > MAX_TO_CONFIRM:  # many at once: one whole run went wrong (seen once in CI); both again, live
        print(f"{len(diff)} differ in the first runs: {list(diff)[:20]}\n{without['tail']}\n{ours['tail']}")
        again = differences(*both_ways())
        diff = {name: outcomes for name, outcomes in again.items() if name in diff}
    # (confirming more one by one would take past the test's timeout, with nothing said)
    assert len(diff) <= MAX_TO_CONFIRM, f"{len(diff)} differ again: {list(diff.items())[:20]}\n{ours['tail']}"
    assert confirmed(python, src, tmp_path, diff, tries=2, extra=WARM) == {}, ours["tail"]
    # the kernelspecs that cannot start ran (in the one-process run some fail with and without us alike: the
    # confirmation above reruns each alone, where they must give what they give without us)
    assert [name for name in ours["outcomes"] if "startup_error" in name or "create_bad" in name]
