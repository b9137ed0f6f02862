"""A kernel in line yields the CPU to the kernels that hold a GPU (host/priority.py): a real jupyter-server, real
kernels, a simulated 10 GiB card that two notebooks fill. The third notebook's kernel runs, and what it runs (its
threads, the programs it starts) runs under SCHED_IDLE until its grant; from then on all of it runs at normal
priority. With line_cpu = 'normal' nothing changes. The scheduler's word (sched_getscheduler) is the check."""

from __future__ import annotations

import os

import pytest
from jupyter_client.session import Session
from kernels import cell_result, send_cell
from test_waiting import _state, full_card, standin_pid

from jupyter_gpushare.host import priority

pytestmark = pytest.mark.skipif(not priority.can_lift(), reason="this host could not give a kernel its priority back")

# A thread and a child process started while the kernel waits, and what the scheduler says of each
START = (
    "import threading, subprocess, os\n"
    "stop = threading.Event()\n"
    "worker = threading.Thread(target=stop.wait, daemon=True); worker.start()\n"
    "child = subprocess.Popen(['sleep', '300'])\n"
    "worker.native_id, child.pid"
)


def policies(pid: int, tid: int, child: int) -> tuple[str, str, str]:
    return priority.policy_of(pid), priority.policy_of(tid), priority.policy_of(child)


async def _normal(pid: int, tid: int, child: int) -> bool:
    return policies(pid, tid, child) == ("normal", "normal", "normal")


@pytest.fixture
def gpushare_config(gpushare_config, request):
    return {**gpushare_config, "default_quota": "4GiB", "queue_timeout": 120, **getattr(request, "param", {})}


async def test_a_kernel_in_line_yields_the_cpu_until_its_grant(gpushare, jp_serverapp, kernel_ws):
    sessions = await full_card(gpushare)
    _, kid = await gpushare.open_notebook("third.ipynb")
    assert await gpushare.state_of(kid) == "queued"
    pid = standin_pid(jp_serverapp, kid)
    session = Session()
    ws = await kernel_ws(kid, session.session)
    tid, child = eval(await cell_result(ws, kid, send_cell(ws, session, START)))
    assert policies(pid, tid, child) == ("idle", "idle", "idle")  # its cells, threads and programs yield
    await gpushare.close_notebook(sessions[0])
    await gpushare.wait_for(lambda: _state(gpushare, kid, "running"), what="the grant")
    # all of it, from the grant's hand-over on (the server reads running a moment before the provisioner hands over)
    await gpushare.wait_for(lambda: _normal(pid, tid, child), timeout=10, what="normal priority after the grant")
    await cell_result(ws, kid, send_cell(ws, session, "stop.set(); child.kill(); child.wait(); 0"))
    ws.close()


@pytest.mark.parametrize("gpushare_config", [{"line_cpu": "normal"}], indirect=True)
async def test_with_line_cpu_normal_a_kernel_in_line_keeps_its_priority(gpushare, jp_serverapp):
    await full_card(gpushare)
    _, kid = await gpushare.open_notebook("third.ipynb")
    assert await gpushare.state_of(kid) == "queued"
    assert priority.policy_of(standin_pid(jp_serverapp, kid)) == "normal"


def test_a_granted_kernel_is_never_left_yielding_where_it_could_not_be_lifted(monkeypatch):
    """No CAP_SYS_NICE and an RLIMIT_NICE below 20 (most hosts' unprivileged users): the priority could not be
    given back, so the kernel is not made to yield at all."""
    monkeypatch.setattr(priority.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(priority.resource, "getrlimit", lambda _: (0, 0))
    assert not priority.can_lift()
    assert priority.yield_cpu(os.getpid()) is False
    assert priority.policy_of(os.getpid()) == "normal"
