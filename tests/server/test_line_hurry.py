"""A kernel in line yields the CPU for real, but never so long that its client's connection is given up: a real
jupyter-server, a real kernel starved by real busy processes, the real scheduler, a simulated card.

Busy processes stand for the running kernels: each leads a session of its own, as a kernel does. Where the scheduler
groups processes by session (autogroup: on on this project's VM), SCHED_IDLE alone did not make a kernel in line
yield to them (it answered in 2.5 s beside three busy processes per CPU); its session's group yields too now
(host/priority.py). jupyter_server gives a client's websocket up when the kernel has not answered within
``kernel_info_timeout`` (60 s; 40 s here), and a kernel in line that still starts gets almost no CPU beside busy
kernels: on the GPU host a class of 88 lost five kernels so (bench/README.md, run 33). So once its client has waited
a share of that timeout the kernel is hurried: it runs at normal priority until the client is connected, then yields
again while it still waits; once per launch (launch/line_cpu.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time

import pytest
from jupyter_client.session import Session
from test_waiting import _true, full_card, standin_pid

from jupyter_gpushare.host import priority
from jupyter_gpushare.launch.line_cpu import LineCpu
from jupyter_gpushare.server.seam import connection

BUSY_PER_CPU = 3
TIMEOUT_S = 40  # jupyter_server's kernel_info_timeout in these tests
HURRY_AT = 0.2  # of it: the kernel is hurried at 8 s here (a server: at half), leaving a starved start 32 s

pytestmark = [
    pytest.mark.skipif(not priority.can_lift(), reason="a kernel in line yields the CPU only where it can be lifted"),
    pytest.mark.alone,  # it keeps every CPU busy for a while: kernels in line of tests beside it would starve
]


@pytest.fixture
def gpushare_config(gpushare_config):
    return {**gpushare_config, "default_quota": "4GiB", "queue_timeout": 120}


@pytest.fixture
def jp_server_config(jp_server_config):
    return {**jp_server_config, "ZMQChannelsWebsocketConnection": {"kernel_info_timeout": TIMEOUT_S}}


def busy_cpus() -> list[subprocess.Popen]:
    """Processes that never sleep, at normal priority, each leading a session as a running kernel does: more than
    the CPUs, as a class's running kernels are (22 on 16 CPUs on the GPU host)."""
    return [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(BUSY_PER_CPU * len(os.sched_getaffinity(0)))
    ]


async def started_starved(gpushare, jp_serverapp, kernel_ws):
    """A kernel in line started while the busy processes run, and its client's websocket opening: (kernel id, pid,
    the opening, when it started)."""
    t0 = time.monotonic()
    kid = await gpushare.start_kernel()  # (a client without a notebook, as the study's harness: POST /api/kernels)
    pid = standin_pid(jp_serverapp, kid)
    assert priority.policy_of(pid) == "idle"
    return kid, pid, asyncio.ensure_future(kernel_ws(kid, Session().session)), t0


async def policies_until(pid: int, opening: asyncio.Future) -> set[str]:
    """What the scheduler says of the kernel's main thread, every 0.2 s until its client's websocket is open."""
    seen = set()
    while not opening.done():
        seen.add(priority.policy_of(pid))
        await asyncio.sleep(0.2)
    return seen


async def test_a_kernel_starved_in_line_is_hurried_before_its_clients_connection_is_given_up(
    gpushare, jp_serverapp, kernel_ws, monkeypatch
):
    """Starved beside busy kernels, a kernel in line has not answered its client when the hurry comes; hurried, it
    answers before jupyter_server would give the client up, then yields again, still in line."""
    monkeypatch.setattr(connection, "HURRY_AT", HURRY_AT)
    await full_card(gpushare)
    busy = busy_cpus()
    try:
        kid, pid, opening, t0 = await started_starved(gpushare, jp_serverapp, kernel_ws)
        seen = asyncio.ensure_future(policies_until(pid, opening))
        await asyncio.sleep(TIMEOUT_S * HURRY_AT - 1)
        assert not opening.done()  # starved, it has not answered (unstarved it does in about a second)
        ws = await opening
        assert time.monotonic() - t0 < TIMEOUT_S  # answered before jupyter_server would give the client up
        assert "normal" in await seen  # hurried to answer
        await gpushare.wait_for(lambda: _true(priority.policy_of(pid) == "idle"), what="the kernel to yield again")
        assert await gpushare.state_of(kid) == "queued"
    finally:
        for process in busy:
            process.kill()
            process.wait()
    ws.close()


async def test_unhurried_the_starved_kernels_client_waits_until_jupyter_server_gives_up(
    gpushare, jp_serverapp, kernel_ws, monkeypatch
):
    """The control, and the check that a kernel in line yields for real: the same kernel, never hurried, has not
    answered when jupyter_server gives its client up (without its session group's yield it answered in 2.5 s)."""
    monkeypatch.setattr(connection, "HURRY_AT", 10.0)  # (never within the timeout)
    await full_card(gpushare)
    busy = busy_cpus()
    try:
        _, pid, opening, t0 = await started_starved(gpushare, jp_serverapp, kernel_ws)
        ws = await opening  # (jupyter_server opens it once it gives the answer up)
        assert time.monotonic() - t0 >= TIMEOUT_S - 1
        assert priority.policy_of(pid) == "idle"
    finally:
        for process in busy:
            process.kill()
            process.wait()
    ws.close()


class Kernel(LineCpu):
    """The provisioner's part on a real process of its own session (as a kernel is launched), without a server."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.pid, self.kernel_id, self.log, self.process = process.pid, "k", logging.getLogger("test"), process

    def _manager(self):
        return self

    async def blocking(self, fn, *args):
        return fn(*args)

    def waits_in_line(self) -> bool:
        return True


async def test_a_kernel_is_hurried_once_per_launch_and_yields_again_after():
    """Hurried, the kernel's threads and session group run at normal priority; after, all of it yields again; a second
    client's wait does not hurry it again (one websocket after another would otherwise keep a kernel in line at normal
    priority). The scheduler's word is the check."""
    process = subprocess.Popen(
        [sys.executable, "-c", "import threading, time; threading.Thread(target=time.sleep, args=(60,)).start()"],
        start_new_session=True,
    )
    try:
        kernel = Kernel(process)
        kernel.yield_in_line()
        await asyncio.sleep(0.5)  # (its thread started, under the policy it inherits)
        threads = [int(t) for t in os.listdir(f"/proc/{process.pid}/task")]
        assert len(threads) == 2 and {priority.policy_of(t) for t in threads} == {"idle"}
        grouped = autogroup_on()  # (this project's VM: on) its session's group yields too
        assert not grouped or session_nice(process.pid) == 19
        assert await kernel.hurry(30) is True
        assert {priority.policy_of(t) for t in threads} == {"normal"}
        assert not grouped or session_nice(process.pid) == 0
        await kernel.unhurry()
        assert {priority.policy_of(t) for t in threads} == {"idle"}
        assert not grouped or session_nice(process.pid) == 19
        assert await kernel.hurry(30) is False  # once per launch
        assert {priority.policy_of(t) for t in threads} == {"idle"}
        await kernel.normal_cpu()  # its grant
        assert {priority.policy_of(t) for t in threads} == {"normal"}
        assert not grouped or session_nice(process.pid) == 0
    finally:
        process.kill()
        process.wait()


def autogroup_on() -> bool:
    with open(priority.AUTOGROUP) as f:
        return f.read().strip() == "1"


def session_nice(pid: int) -> int:
    """The nice of ``pid``'s session group, as the scheduler says it (/proc/PID/autogroup)."""
    with open(f"/proc/{pid}/autogroup") as f:
        return int(f.read().split()[-1])
