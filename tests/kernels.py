"""Running code in real kernels of the in-process test server (pytest-jupyter's ``jp_serverapp``), directly or
through the kernel websocket as JupyterLab does."""

from __future__ import annotations

import asyncio
import json
import os
import time
import weakref

from jupyter_client.jsonutil import json_default
from jupyter_client.session import Session
from tornado.websocket import WebSocketClientConnection

TIMEOUT = int(os.environ.get("GPUSHARE_TEST_TIMEOUT", 180))  # generous: tens of kernels starting on the 2 cores of CI


async def kernel_gone(jp_serverapp, kernel_id: str) -> bool:
    """Whether jupyter_server no longer lists the kernel (shut down, or never started)."""
    return kernel_id not in jp_serverapp.kernel_manager.list_kernel_ids()


async def run_in_kernel(jp_serverapp, kernel_id: str, code: str, status: str = "ok") -> str:
    """Run code in a real kernel, which must end with ``status`` ("error": it raises); its printed output."""
    client = jp_serverapp.kernel_manager.get_kernel(kernel_id).client()
    client.start_channels()
    out: list = []
    try:
        await client.wait_for_ready(timeout=60)
        reply = await client.execute_interactive(code, output_hook=out.append, timeout=60)
        assert reply["content"]["status"] == status, reply["content"]
    finally:
        client.stop_channels()
    return "".join(m["content"].get("text", "") for m in out if m["msg_type"] == "stream")


async def open_notebook(jp_fetch, path: str, kernel: str = "python3") -> tuple[str, str]:
    """Start a kernel for ``path`` as JupyterLab does (POST /api/sessions); return (session id, kernel id)."""
    body = {"path": path, "type": "notebook", "name": os.path.basename(path), "kernel": {"name": kernel}}
    r = await jp_fetch(
        "api", "sessions", method="POST", body=json.dumps(body), request_timeout=TIMEOUT, connect_timeout=TIMEOUT
    )
    session = json.loads(r.body)
    return session["id"], session["kernel"]["id"]


def send_cell(ws: WebSocketClientConnection, session: Session, code: str) -> str:
    """Send an execute_request for ``code`` on an open kernel websocket, as JupyterLab does; its msg_id."""
    request = session.msg(
        "execute_request",
        {"code": code, "silent": False, "store_history": False, "user_expressions": {}, "allow_stdin": False},
    )
    ws.write_message(json.dumps({**request, "channel": "shell"}, default=json_default))
    return request["header"]["msg_id"]


async def cell_result(ws: WebSocketClientConnection, kernel_id: str, msg_id: str, timeout: float = TIMEOUT) -> str:
    """The ``text/plain`` result of the cell ``msg_id`` (its reply must be ok)."""
    replies = await asyncio.wait_for(_replies(ws, kernel_id, msg_id), timeout)
    assert replies["execute_reply"]["status"] == "ok", f"kernel {kernel_id}: the cell failed: {replies}"
    return replies["execute_result"]["data"]["text/plain"]


# Messages read from a websocket while looking for others (``stream_until``): a cell's result may come before its
# printed text is flushed (a loaded machine), and is then read from here by ``cell_result``.
_read_ahead: weakref.WeakKeyDictionary[WebSocketClientConnection, list[dict]] = weakref.WeakKeyDictionary()


async def stream_until(ws: WebSocketClientConnection, msg_id: str, text: str, timeout: float = 60) -> str:
    """What the cell ``msg_id`` printed, once it printed ``text``."""
    got = ""
    deadline = time.monotonic() + timeout
    while text not in got:
        raw = await asyncio.wait_for(ws.read_message(), max(0.1, deadline - time.monotonic()))
        assert raw is not None, "the websocket closed"
        msg = json.loads(raw)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
            got += msg["content"]["text"]
        else:
            _read_ahead.setdefault(ws, []).append(msg)
    return got


async def result_after_error(ws: WebSocketClientConnection, kernel_id: str, session: Session, code: str) -> str:
    """``cell_result`` of a cell sent just after one that failed: ipykernel aborts requests that reach it in the
    moment after an error (``stop_on_error``), so an aborted one is sent again (as a student would run it again)."""
    for _ in range(3):
        try:
            return await cell_result(ws, kernel_id, send_cell(ws, session, code))
        except AssertionError as e:
            if "'aborted'" not in str(e):
                raise
    raise AssertionError(f"kernel {kernel_id}: the cell was aborted three times")


async def run_cell(kernel_ws, kernel_id: str, code: str) -> str:
    """Connect to a kernel's websocket, run ``code`` and return its ``text/plain`` result."""
    session = Session()
    ws = await kernel_ws(kernel_id, session.session)
    try:
        return await cell_result(ws, kernel_id, send_cell(ws, session, code))
    finally:
        ws.close()


async def _replies(ws: WebSocketClientConnection, kernel_id: str, msg_id: str) -> dict[str, dict]:
    """The content of the execute_result and execute_reply to ``msg_id``."""
    replies: dict[str, dict] = {}
    ahead = _read_ahead.get(ws, [])
    while len(replies) < 2:
        if ahead:
            msg = ahead.pop(0)
        else:
            raw = await ws.read_message()
            if raw is None:
                raise AssertionError(f"the server closed kernel {kernel_id}'s websocket")
            msg = json.loads(raw)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] in ("execute_result", "execute_reply"):
            replies[msg["msg_type"]] = msg["content"]
            # A cell that failed sends no result: say its error now, not a timeout later
            reply = replies.get("execute_reply", {"status": "ok"})
            assert reply["status"] == "ok", f"kernel {kernel_id}: the cell failed: {reply}"
    return replies


async def stdout_of(client, msg_id: str) -> str:
    """What the request ``msg_id`` printed, read on ``client``'s iopub channel until the kernel is idle again."""
    out = ""
    while True:
        msg = await client.get_iopub_msg(timeout=30)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            out += msg["content"]["text"]
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return out


def mapped(pid: int, library: str) -> bool:
    """Whether a process has a shared library (a framework's code ran in it)."""
    with open(f"/proc/{pid}/maps") as f:
        return library in f.read()
