"""PyTorch and TensorFlow import while their kernel waits for the GPU, and the wait comes before the import returns:
a real jupyter-server, real kernels, the real (CPU) PyTorch and TensorFlow, a simulated card.

Its import's seconds then pass in line, not after the grant. An interrupt during the wait fails the import as before
(the kernel keeps its place), and the next ``import torch`` takes the module whose code already ran: PyTorch's code
cannot run twice in a process.
"""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from jupyter_client.session import Session
from kernels import cell_result, mapped, send_cell, stream_until
from test_waiting import _state, _true, full_card, standin_pid

NAMES = {"torch": "PyTorch", "tensorflow": "TensorFlow"}  # as the sidebar says them (_gpushare_wait.NAMES)

pytest.importorskip("torch")


@pytest.fixture
def gpushare_config(gpushare_config):
    return {**gpushare_config, "default_quota": "4GiB", "queue_timeout": 120}


async def reply_of(ws, msg_id: str, streams: list | None = None) -> dict:
    """The cell's execute_reply, once the kernel is idle again after it; what it printed meanwhile, in order, into
    ``streams`` (the reply comes on the shell channel, its output on iopub: only iopub's idle follows all of it)."""
    reply, idle = None, False
    while reply is None or not idle:
        msg = json.loads(await asyncio.wait_for(ws.read_message(), 60))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream" and streams is not None:
            streams.append((msg["content"]["name"], msg["content"]["text"]))
        if msg["msg_type"] == "execute_reply":
            reply = msg["content"]
        idle = idle or (msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle")
    return reply


async def first_in_line(gpushare, jp_serverapp, kernel_ws, framework: str, code: str | None = None):
    """A notebook opened on a full card, its kernel #1 in line, a cell importing ``framework`` sent: the card's
    sessions, the kernel's id, its session, websocket and pid, and the cell's message id (its place said, before
    the framework's code runs)."""
    sessions = await full_card(gpushare)
    _, kid = await gpushare.open_notebook(f"{framework}.ipynb")
    session = Session()
    ws = await kernel_ws(kid, session.session)
    cell = send_cell(ws, session, code or f"import {framework}")
    await stream_until(ws, cell, f"{NAMES[framework]} waits for this kernel's GPU: #1 in line")
    return sessions, kid, session, ws, standin_pid(jp_serverapp, kid), cell


async def test_torch_imports_while_its_kernel_waits_and_an_interrupted_wait_keeps_the_module(
    gpushare, jp_fetch, jp_serverapp, kernel_ws
):
    sessions, kid, session, ws, pid, waiting = await first_in_line(gpushare, jp_serverapp, kernel_ws, "torch")
    # The student interrupts at once, while PyTorch's code runs: it runs to its end, and the cell stops then
    await jp_fetch("api", "kernels", kid, "interrupt", method="POST", body="{}")
    said: list = []
    reply = await reply_of(ws, waiting, said)
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"
    assert "the interrupt stops this cell once torch's import has run" in "".join(text for _, text in said)
    assert mapped(pid, "libtorch_cpu")  # its code ran while the kernel waits
    assert await gpushare.state_of(kid) == "queued"  # the kernel keeps its place
    check = send_cell(ws, session, "import sys; 'torch' in sys.modules, 'torch._C' in sys.modules")
    assert await cell_result(ws, kid, check) == "(False, True)"  # the import failed; PyTorch's code had run

    again = send_cell(ws, session, "import torch; ran = float(torch.ones(3).sum()); print('ran')")
    await stream_until(ws, again, "PyTorch waits for this kernel's GPU")  # waits again, its code not run again
    await gpushare.close_notebook(sessions[0])
    await gpushare.wait_for(lambda: _state(gpushare, kid, "running"), what="the grant")
    streams: list = []
    assert (await reply_of(ws, again, streams))["status"] == "ok"
    # the import returns at once after its wait: the wait's last word comes before the cell's own output, and
    # none of it is an error's red (stdout)
    printed = "".join(text for _, text in streams)
    assert {name for name, _ in streams} == {"stdout"}, streams
    assert printed.index("the GPU is this kernel's now; PyTorch goes on.") < printed.index("ran"), printed
    done = send_cell(ws, session, "import os; ran, os.environ['GPUSHARE_MODE'], os.getpid()")
    assert await cell_result(ws, kid, done) == f"(3.0, 'gpu', {pid})"
    ws.close()


async def test_only_kernels_near_the_front_of_the_line_import_while_they_wait(gpushare, jp_serverapp, kernel_ws):
    """As many kernels as half the host's CPUs import PyTorch while they wait, the first in line; one behind them
    imports once it comes that near (so many imports at once do not slow the kernels that compute)."""
    near = max(1, len(os.sched_getaffinity(0)) // 2)
    sessions = await full_card(gpushare)
    waiting = []
    for i in range(near + 1):  # in line in this order
        _, kid = await gpushare.open_notebook(f"line-{i}.ipynb")
        session = Session()
        ws = await kernel_ws(kid, session.session)
        waiting.append((kid, ws, send_cell(ws, session, "import torch"), standin_pid(jp_serverapp, kid)))
    for _, ws, cell, _ in waiting:
        await stream_until(ws, cell, "PyTorch waits for this kernel's GPU")
    for *_, pid in waiting[:near]:
        await gpushare.wait_for(lambda pid=pid: _true(mapped(pid, "libtorch_cpu")), what="its import while it waits")
    last_kid, *_, last_pid = waiting[-1]
    await asyncio.sleep(2)  # (the imports near the front were done; this one did not begin)
    assert not mapped(last_pid, "libtorch_cpu")
    await gpushare.close_notebook(sessions[0])  # the first is granted: the last comes near the front
    await gpushare.wait_for(lambda: _true(mapped(last_pid, "libtorch_cpu")), what="its import, near the front now")
    assert await gpushare.state_of(last_kid) == "queued"
    for _, ws, *_ in waiting:
        ws.close()


async def test_tensorflow_imports_while_its_kernel_waits_and_is_set_up_for_the_grant(gpushare, jp_serverapp, kernel_ws):
    """Keras 3 and TensorFlow imported in a waiting kernel: TensorFlow's code runs while it waits, and its set-up
    (the logical device within the quota, on a real card) comes after the grant, not before it."""
    pytest.importorskip("tensorflow")
    sessions, kid, session, ws, pid, cell = await first_in_line(
        gpushare, jp_serverapp, kernel_ws, "tensorflow", "import keras, tensorflow as tf; print(tf.__version__)"
    )
    await gpushare.wait_for(lambda: _true(mapped(pid, "libtensorflow_framework")), 90, "its import while it waits")
    assert await gpushare.state_of(kid) == "queued"
    await gpushare.close_notebook(sessions[0])
    await gpushare.wait_for(lambda: _state(gpushare, kid, "running"), what="the grant")
    streams: list = []
    assert (await reply_of(ws, cell, streams))["status"] == "ok"
    assert "the GPU is this kernel's now; TensorFlow goes on." in "".join(text for _, text in streams)
    # set up for the grant: the simulated card's word, not a waiting kernel's "no GPU quota" (the hooks' order
    # is test_bootstrap's: the caps' hooks run after the wait)
    report = "import _gpushare_report as r; r.STATE['frameworks'].get('tensorflow', {}).get('detail')"
    assert "the card is simulated" in await cell_result(ws, kid, send_cell(ws, session, report))
    ws.close()
