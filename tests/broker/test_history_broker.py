"""Quotas learned from history on a multi-user host: a real broker process, Jupyter servers run as three Unix users.

What must hold: the servers write no ledger file; each run's peak goes through the broker, keyed by the user the
kernel says is calling; one student's huge run of a notebook (here: kernels without a notebook, keyed by their
kernelspec, as every student's are) teaches only that student, whose learned quota stays within their per-user
limit; a teacher's run (the broker's history_teachers) teaches the others; a student cannot write history for
another user's kernel, nor for their own from any process but its server, nor send a path or a figure out of
bounds. Needs root (useradd, servers as other users).
"""

from __future__ import annotations

import math

import pytest
from multiuser import (
    ALICE,
    BOB,
    SIMULATED,
    STAFF,
    UserServer,
    as_user,
    needs_root,
    run_in_kernel,
    running_host,
)
from servers import wait_until

RESERVE = 512
HISTORY = {**SIMULATED, "quota_from_history": "True", "sample_interval": "0.2", "idle_timeout": "0"}


@pytest.fixture(scope="module")
def host():
    with running_host("gpushare-history-", gpu=HISTORY, extra=f"c.GpuShareApp.history_teachers = [{STAFF!r}]\n") as got:
        yield got


def run_use(server: UserServer, kid: str, size: str, mib: int) -> None:
    """The kernel (the user's process) says it uses ``size`` of the simulated card, until its server measured it."""
    run_in_kernel(server, kid, f"import gpushare_simulate; gpushare_simulate.use({size!r})")
    wait_until(lambda: server.kernel(kid)["peak_mib"] == mib, timeout=60, what=f"{size} measured")


def one_run(server: UserServer, size: str, mib: int) -> None:
    kid = server.start_kernel()
    run_use(server, kid, size, mib)
    server.call("DELETE", f"api/kernels/{kid}")


@needs_root
def test_history_goes_through_the_broker_and_one_student_teaches_no_one_else(host):
    broker, servers = host
    alice, bob, carol = servers[ALICE], servers[BOB], servers[STAFF]
    one_run(bob, "9GiB", 9216)  # the attack: a run that "needs" 9 GiB, keyed like everyone's kernels
    assert not any((s.home / "data" / "gpushare" / "ledger.sqlite").exists() for s in servers.values())

    a1 = alice.start_kernel()
    k = alice.kernel(a1)
    assert (k["learned_peak_mib"], k["quota_source"], k["quota_mib"]) == (None, "default", 2048)  # bob's run: not hers
    b1 = bob.start_kernel()
    k = bob.kernel(b1)  # his own history teaches him, within his per-user limit (max_total 4 GiB)
    assert (k["learned_peak_mib"], k["learned_from"], k["quota_source"], k["quota_mib"]) == (
        9216,
        "own",
        "learned",
        4096,
    )
    assert k["state"] == "running"

    got = as_user(
        bob.user,
        bob.home,
        f"""
        import json
        from jupyter_gpushare.broker import BrokerLedger
        from jupyter_gpushare.ledger.ledger import LedgerError
        client, out = BrokerLedger({broker.socket!r}), {{}}
        for name, args in {{
            "alice's kernel": dict(kernel_id={a1!r}, path="", peak_mib=64),
            "a long path": dict(kernel_id={b1!r}, path="x" * 5000, peak_mib=64),
            "a control character": dict(kernel_id={b1!r}, path="a\\nb", peak_mib=64),
            "a huge figure": dict(kernel_id={b1!r}, path="", peak_mib=10**12),
            "his kernel, not from its server": dict(kernel_id={b1!r}, path="", peak_mib=64),
            "a boolean": dict(kernel_id={b1!r}, path="", peak_mib=True),
        }}.items():
            try:
                out[name] = client._call("record_peak", **args)
            except LedgerError as e:
                out[name] = str(e)
        print(json.dumps(out))
        """,
    )
    assert "another user's; you may not record the peak of it" in got["alice's kernel"]
    assert all("must be text matching" in got[k] for k in ("a long path", "a control character"))
    assert all("'peak_mib' must be a whole number" in got[k] for k in ("a huge figure", "a boolean"))
    assert "Only the Jupyter server that holds kernel" in got["his kernel, not from its server"]

    one_run(carol, "1GiB", 1024)  # staff: the broker's history_teachers
    a2 = alice.start_kernel()
    k = alice.kernel(a2)
    quota = math.ceil(1024 * 1.2) - RESERVE
    assert (k["learned_peak_mib"], k["learned_from"], k["quota_source"], k["quota_mib"]) == (
        1024,
        "others",
        "learned",
        quota,
    )
    for server, kid in ((alice, a1), (alice, a2), (bob, b1)):
        server.call("DELETE", f"api/kernels/{kid}")
