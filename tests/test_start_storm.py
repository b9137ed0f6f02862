"""A whole class opens its notebooks at once: every kernel starts and runs a cell, none is lost to a port.

Kernels are started through a real jupyter-server (sessions, as JupyterLab opens notebooks) and driven
through its kernel websocket, as JupyterLab drives them. The forced-collision test takes a kernel's
port between the kernel's death and its automatic restart, which is what another socket did to one
kernel of 26 on the H100 study run.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket

import pytest
from jupyter_client.jsonutil import json_default
from jupyter_client.session import Session
from tornado.httpclient import HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

KERNELS = 40
ROUNDS = 2
TIMEOUT = 180  # generous: 40 kernels starting on the 2 cores of CI


@pytest.fixture
def gpushare_config(gpushare_config):
    # 40 reservations of 256 MiB + 512 MiB context reserve = 30 GiB: everyone is admitted at once.
    return {**gpushare_config, "simulated_cards": "40GiB", "default_quota": "256MiB"}


async def open_notebook(jp_fetch, path: str) -> tuple[str, str]:
    """Start a kernel for ``path`` as JupyterLab does (POST /api/sessions); return (session id, kernel id)."""
    body = {"path": path, "type": "notebook", "name": os.path.basename(path), "kernel": {"name": "python3"}}
    r = await jp_fetch(
        "api", "sessions", method="POST", body=json.dumps(body), request_timeout=TIMEOUT, connect_timeout=TIMEOUT
    )
    session = json.loads(r.body)
    return session["id"], session["kernel"]["id"]


@pytest.fixture
def kernel_ws(jp_http_port, jp_base_url, jp_auth_header):
    """Open a kernel's websocket as JupyterLab does (jp_ws_fetch's fixed 20 s request timeout is too
    short while 40 kernels start on 2 cores: the server answers once the kernel replies)."""

    async def connect(kernel_id: str, session_id: str) -> WebSocketClientConnection:
        url = f"ws://localhost:{jp_http_port}{jp_base_url}api/kernels/{kernel_id}/channels?session_id={session_id}"
        request = HTTPRequest(url, headers=jp_auth_header, connect_timeout=TIMEOUT, request_timeout=TIMEOUT)
        return await websocket_connect(request)

    return connect


async def run_cell(kernel_ws, kernel_id: str, code: str) -> str:
    """Connect to a kernel's websocket, run ``code`` and return its ``text/plain`` result."""
    session = Session()
    ws = await kernel_ws(kernel_id, session.session)
    try:
        request = session.msg(
            "execute_request",
            {"code": code, "silent": False, "store_history": False, "user_expressions": {}, "allow_stdin": False},
        )
        ws.write_message(json.dumps({**request, "channel": "shell"}, default=json_default))
        replies = await asyncio.wait_for(_replies(ws, kernel_id, request["header"]["msg_id"]), TIMEOUT)
        assert replies["execute_reply"]["status"] == "ok", f"kernel {kernel_id}: {code!r} failed: {replies}"
        return replies["execute_result"]["data"]["text/plain"]
    finally:
        ws.close()


async def _replies(ws: WebSocketClientConnection, kernel_id: str, msg_id: str) -> dict[str, dict]:
    """The content of the execute_result and execute_reply to ``msg_id``."""
    replies: dict[str, dict] = {}
    while len(replies) < 2:
        raw = await ws.read_message()
        if raw is None:
            raise AssertionError(f"the server closed kernel {kernel_id}'s websocket")
        msg = json.loads(raw)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] in ("execute_result", "execute_reply"):
            replies[msg["msg_type"]] = msg["content"]
    return replies


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
