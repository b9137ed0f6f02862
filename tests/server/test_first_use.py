"""line_place = 'first-use': a notebook's kernel asks for its GPU at its first GPU framework import, not at its
start. A real jupyter-server, real kernels, a simulated card of 10 GiB: each kernel reserves 4 GiB + 512 MiB, so
two fit.

A kernel starts holding nothing and no place (``standby``); CPU cells run; its first `import torch` asks through a
pipe of its own and waits in its cell for the grant, in the same process. The kernel that imports first is served
first, whoever opened first. What the kernel writes on that pipe is the student's: anything but the one ask is
dropped, and the server's line does not move for it.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from jupyter_client.session import Session
from kernels import cell_result, send_cell, stream_until


@pytest.fixture
def gpushare_config(gpushare_config):
    return {**gpushare_config, "default_quota": "4GiB", "queue_timeout": 120, "line_place": "first-use"}


def kernel_pid(jp_serverapp, kernel_id: str) -> int:
    return jp_serverapp.kernel_manager.get_kernel(kernel_id).provisioner.pid


async def test_a_kernel_asks_at_its_first_gpu_import_and_the_first_to_ask_is_served_first(
    gpushare, jp_serverapp, kernel_ws
):
    """Three notebooks open; none holds a reservation or a place until it imports torch. The last one opened
    imports first and is granted at once; the first one opened then waits in line (its cell says so) and goes on,
    in the same process with its variables, when the other's notebook closes."""
    opened = [await gpushare.open_notebook(f"nb{i}.ipynb") for i in range(3)]
    kids = [kid for _, kid in opened]
    for kid in kids:
        await gpushare.wait_for(lambda kid=kid: _state_is(gpushare, kid, "standby"), what="standby")
    rec = next(k for k in (await gpushare.get("state"))["kernels"] if k["kernel_id"] == kids[0])
    assert rec["status"]["code"] == "standby" and rec["status"]["label"] == "GPU at first use"
    assert "asks for one (a 4 GiB quota)" in rec["status"]["detail"]
    assert rec.get("position") is None and rec.get("card") is None
    assert (await gpushare.get("queue"))["queue"] == []
    assert (await gpushare.get("cards"))["cards"][0]["reserved_mib"] == 0

    session = Session()
    first = await kernel_ws(kids[0], session.session)
    cpu = send_cell(first, session, "import os; kept = 41; os.getpid(), os.environ['CUDA_VISIBLE_DEVICES']")
    pid = kernel_pid(jp_serverapp, kids[0])
    assert await cell_result(first, kids[0], cpu, timeout=15) == f"({pid}, '')"  # a CPU cell: nothing asked
    assert await gpushare.state_of(kids[0]) == "standby"

    # The last notebook opened uses the GPU first, then the second: both fit, granted at once.
    for kid in (kids[2], kids[1]):
        s = Session()
        ws = await kernel_ws(kid, s.session)
        result = await cell_result(ws, kid, send_cell(ws, s, "import os, torch; os.environ['GPUSHARE_QUOTA_MIB']"))
        assert result == "'4096'"
        ws.close()
        assert await gpushare.state_of(kid) == "running"
    assert (await gpushare.get("cards"))["cards"][0]["reserved_mib"] == 2 * 4608

    # The first notebook opened asks last: it waits, in its cell, as #1.
    gpu = send_cell(first, session, "import torch; kept + 1, os.environ['GPUSHARE_QUOTA_MIB'], os.getpid()")
    said = await stream_until(first, gpu, "waits for this kernel's GPU")
    assert "PyTorch waits for this kernel's GPU: #1 in line, needs 4.5 GiB" in said
    assert await gpushare.state_of(kids[0]) == "queued"
    await gpushare.close_notebook(opened[2][0])
    assert await cell_result(first, kids[0], gpu) == f"(42, '4096', {pid})"  # same process, its variable kept
    first.close()
    assert await gpushare.state_of(kids[0]) == "running"


async def test_what_a_kernel_writes_on_its_ask_pipe_besides_the_ask_moves_nothing(gpushare, jp_serverapp, kernel_ws):
    """The student's code finds the ask pipe (its number is in the process's first environment) and writes to it:
    near-misses and 4 KiB of junk are dropped (the kernel stays in standby, the line empty), and past the limit
    the server closes the pipe: the kernel's GPU import then goes on without a GPU, saying why, and the server
    serves others."""
    _, kid = await gpushare.open_notebook("hostile.ipynb")
    await gpushare.wait_for(lambda: _state_is(gpushare, kid, "standby"), what="standby")
    session = Session()
    ws = await kernel_ws(kid, session.session)
    find = "fd = int(dict(v.split(b'=', 1) for v in open('/proc/self/environ', 'rb').read().split(b'\\0') if v)[b'GPUSHARE_ASK_FD'])"
    junk = "b'askk\\nASK\\n ask\\nask \\n' + b'x' * 5000"
    code = f"import os\n{find}\nos.write(fd, {junk})"
    assert await cell_result(ws, kid, send_cell(ws, session, code)) == "5019"
    await asyncio.sleep(0.5)
    assert await gpushare.state_of(kid) == "standby"
    assert (await gpushare.get("queue"))["queue"] == []
    gpu = send_cell(ws, session, "import torch; os.environ['GPUSHARE_MODE'], os.environ['CUDA_VISIBLE_DEVICES']")
    said = await stream_until(ws, gpu, "runs without a GPU")
    assert "could not ask for one (its pipe to the server is closed)" in said
    assert await cell_result(ws, kid, gpu) == "('standby', '')"
    assert await gpushare.state_of(kid) == "standby"
    ws.close()
    # Another notebook asks as a kernel does, and is served.
    _, other = await gpushare.open_notebook("other.ipynb")
    await gpushare.wait_for(lambda: _state_is(gpushare, other, "standby"), what="standby")
    s = Session()
    ws = await kernel_ws(other, s.session)
    assert await cell_result(ws, other, send_cell(ws, s, "import torch, os; os.environ['GPUSHARE_MODE']")) == "'gpu'"
    ws.close()


async def _state_is(gpushare, kernel_id: str, state: str) -> bool:
    return await gpushare.state_of(kernel_id) == state


async def test_a_new_quota_before_the_first_gpu_use_needs_no_restart(gpushare, jp_fetch, jp_serverapp, kernel_ws):
    """A kernel in standby holds nothing: a quota asked for now applies at its first GPU use, in the same process
    with its variables (no restart), and the event says so."""
    _, kid = await gpushare.open_notebook("small.ipynb")
    await gpushare.wait_for(lambda: _state_is(gpushare, kid, "standby"), what="standby")
    session = Session()
    ws = await kernel_ws(kid, session.session)
    pid = kernel_pid(jp_serverapp, kid)
    assert await cell_result(ws, kid, send_cell(ws, session, "kept = 7; kept")) == "7"
    body = json.dumps({"quota": "2GiB"})
    await jp_fetch("api", "gpushare", "kernels", kid, method="PATCH", body=body)
    events = [e for e in (await gpushare.get("events"))["events"] if e["kernel_id"] == kid]
    assert events[-1]["code"] == "quota-at-first-use"
    assert events[-1]["message"] == "Quota 2 GiB requested; it applies at the first GPU use, without a restart."
    code = "import torch, os; kept, os.environ['GPUSHARE_QUOTA_MIB'], os.getpid()"
    assert await cell_result(ws, kid, send_cell(ws, session, code)) == f"(7, '2048', {pid})"
    ws.close()
    rec = await gpushare.kernel(kid)
    assert rec["state"] == "running" and rec["quota_mib"] == 2048 and rec.get("pending_quota_mib") is None


async def test_a_restart_in_standby_stays_there_and_one_in_line_keeps_its_place(
    gpushare, jp_fetch, jp_serverapp, kernel_ws
):
    """A standby kernel restarted is a standby kernel again (a new process, nothing reserved); one that asked and
    waits keeps its place in line through a restart, as any kernel in line does."""
    _, kid = await gpushare.open_notebook("again.ipynb")
    await gpushare.wait_for(lambda: _state_is(gpushare, kid, "standby"), what="standby")
    pid = kernel_pid(jp_serverapp, kid)
    await jp_fetch("api", "kernels", kid, "restart", method="POST", body="")
    await gpushare.wait_for(lambda: _state_is(gpushare, kid, "standby"), what="standby again")
    assert kernel_pid(jp_serverapp, kid) != pid
    assert (await gpushare.get("cards"))["cards"][0]["reserved_mib"] == 0

    holders = []
    for i in range(2):  # the card is full
        _, holder = await gpushare.open_notebook(f"holder{i}.ipynb")
        await _first_gpu_cell(kernel_ws, holder)
        holders.append(holder)
    session = Session()
    ws = await kernel_ws(kid, session.session)
    await stream_until(ws, send_cell(ws, session, "import torch"), "#1 in line")
    ws.close()
    await jp_fetch("api", "kernels", kid, "restart", method="POST", body="")
    await gpushare.wait_for(lambda: _state_is(gpushare, kid, "queued"), what="in line after its restart")
    assert [q["kernel_id"] for q in (await gpushare.get("queue"))["queue"]] == [kid]


class TestAskRefused:
    @pytest.fixture
    def gpushare_config(self, gpushare_config):
        return {**gpushare_config, "queue_max_per_user": 1}

    async def test_an_ask_that_a_rule_refuses_leaves_the_kernel_on_the_cpu_with_why(self, gpushare, kernel_ws):
        """The user's one place in line is taken: a standby kernel's first GPU import is refused by that rule, runs
        on without a GPU with the reason in its cell, and its notebook offers Join again (a wait that ended)."""
        for i in range(2):  # the card is full
            _, holder = await gpushare.open_notebook(f"holder{i}.ipynb")
            await _first_gpu_cell(kernel_ws, holder)
        _, waiting = await gpushare.open_notebook("waiting.ipynb")
        session = Session()
        ws = await kernel_ws(waiting, session.session)
        await stream_until(ws, send_cell(ws, session, "import torch"), "#1 in line")
        _, late = await gpushare.open_notebook("late.ipynb")
        s = Session()
        ws2 = await kernel_ws(late, s.session)
        cell = send_cell(ws2, s, "import torch, os; os.environ['GPUSHARE_MODE']")
        said = await stream_until(ws2, cell, "runs without a GPU")
        assert "has 1 kernel waiting for a GPU already, the most one user may have in line here" in said
        assert await cell_result(ws2, late, cell) == "'cpu'"
        ws.close()
        ws2.close()
        rec = await gpushare.kernel(late)
        assert (rec["state"], rec["wait_ended"]) == ("cpu", "cancelled")
        assert [q["kernel_id"] for q in (await gpushare.get("queue"))["queue"]] == [waiting]


async def _first_gpu_cell(kernel_ws, kernel_id: str) -> None:
    session = Session()
    ws = await kernel_ws(kernel_id, session.session)
    assert await cell_result(ws, kernel_id, send_cell(ws, session, "import torch; 1")) == "1"
    ws.close()
