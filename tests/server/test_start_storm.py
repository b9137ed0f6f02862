"""A whole class opens its notebooks at once: every kernel starts and runs a cell, none is lost to a port.

Kernels are started through a real jupyter-server (sessions, as JupyterLab opens notebooks) and driven
through its kernel websocket, as JupyterLab drives them. The forced-collision test takes a kernel's
port between the kernel's death and its automatic restart, which is what another socket did to one
kernel of 26 on the H100 study run.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket

import pytest
from kernels import TIMEOUT, open_notebook, run_cell

KERNELS = 40
ROUNDS = 2


@pytest.fixture
def gpushare_config(gpushare_config):
    # 40 reservations of 256 MiB + 512 MiB context reserve = 30 GiB: everyone is admitted at once.
    return {**gpushare_config, "simulated_cards": "40GiB", "default_quota": "256MiB"}


@pytest.mark.alone
async def test_forty_notebooks_opened_at_once_all_start_and_run_a_cell(gpushare, jp_fetch, kernel_ws):
    async def student(i: int) -> tuple[str, str]:
        session_id, kernel_id = await open_notebook(jp_fetch, f"class/student-{i}.ipynb")
        assert await run_cell(kernel_ws, kernel_id, "1+1") == "2"
        return session_id, kernel_id

    for _ in range(ROUNDS):
        started = await asyncio.gather(*(student(i) for i in range(KERNELS)))
        kernels = {k["kernel_id"]: k for k in (await gpushare.get("kernels"))["kernels"]}
        assert sorted(kernels) == sorted(kernel_id for _, kernel_id in started)
        assert {k["state"] for k in kernels.values()} == {"running"}
        await asyncio.gather(
            *(
                jp_fetch("api", "sessions", session_id, method="DELETE", request_timeout=TIMEOUT)
                for session_id, _ in started
            )
        )
        assert (await gpushare.get("kernels"))["kernels"] == []
        assert (await gpushare.get("cards"))["cards"][0]["reserved_mib"] == 0


class TestPortTakenBeforeTheKernelBindsIt:
    @pytest.fixture
    def jp_server_config(self, jp_server_config):
        # Notice the death within a second. The kernel dies long before the restarter's
        # stable_start_time (10 s), so the restarter asks for new ports, as it did on the study run.
        return {**jp_server_config, "KernelRestarter": {"time_to_dead": 1.0}}

    async def test_the_restart_picks_fresh_ports_and_keeps_the_reservation(self, gpushare, jp_serverapp, kernel_ws):
        kernel_id = await gpushare.start_kernel()
        before = await gpushare.kernel(kernel_id)
        km = jp_serverapp.kernel_manager.get_kernel(kernel_id)
        first_ports = list(km.ports)

        # The kernel dies before it is ready, and another socket takes its shell port meanwhile.
        os.kill(before["pid"], signal.SIGKILL)
        squatter = await take_port(km.ip, km.shell_port)
        try:
            await gpushare.wait_for(
                lambda: restarted_on_new_ports(gpushare, km, kernel_id, first_ports),
                timeout=TIMEOUT,
                what="the automatic restart on new ports",
            )
            assert await run_cell(kernel_ws, kernel_id, "1+1") == "2"
        finally:
            squatter.close()

        after = await gpushare.kernel(kernel_id)
        assert after["state"] == "running" and after["pid"] != before["pid"]
        same = ("card", "quota_mib", "reserve_mib", "reserved_mib", "since")
        assert {k: after[k] for k in same} == {k: before[k] for k in same}
        assert (await gpushare.get("cards"))["cards"][0]["reserved_mib"] == before["reserved_mib"]
        kinds = [e["kind"] for e in (await gpushare.get("events"))["events"] if e["kernel_id"] == kernel_id]
        assert kinds.count("reserved") == 1 and "released" not in kinds and "queued" not in kinds


async def test_a_restart_the_user_asks_for_keeps_the_ports(gpushare, jp_serverapp, jp_fetch, kernel_ws):
    kernel_id = await gpushare.start_kernel()
    assert await run_cell(kernel_ws, kernel_id, "1+1") == "2"
    km = jp_serverapp.kernel_manager.get_kernel(kernel_id)
    ports = list(km.ports)
    await jp_fetch("api", "kernels", kernel_id, "restart", method="POST", body="{}")
    assert km.ports == ports
    assert await run_cell(kernel_ws, kernel_id, "1+1") == "2"


async def take_port(ip: str, port: int) -> socket.socket:
    """Listen on ``port`` as soon as the dead kernel's socket has let go of it."""
    sock = socket.socket()
    # Connections to the dead kernel linger in TIME_WAIT, and the server may hold the port.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    for _ in range(3000):
        try:
            sock.bind((ip, port))
            break
        except OSError:
            await asyncio.sleep(0.01)
    else:
        raise AssertionError(f"port {port} stayed in use after the kernel died")
    sock.listen()
    return sock


async def restarted_on_new_ports(gpushare, km, kernel_id: str, first_ports: list[int]):
    """The kernel's record once it runs on none of ``first_ports``, else None."""
    rec = await gpushare.kernel(kernel_id)
    if rec is None:
        raise AssertionError(f"kernel {kernel_id} is gone: every restart failed (ports {km.ports})")
    return rec if set(km.ports).isdisjoint(first_ports) and await km.is_alive() else None
