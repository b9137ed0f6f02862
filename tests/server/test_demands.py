"""Any demand brings a parked kernel back (server/parking.py, bootstrap/_gpushare_wait.py), through a real
jupyter-server on a simulated 10 GiB card, with real kernels: a cell sent straight to the kernel's own ZMQ shell (as
`jupyter console --existing`, an IDE or a script does, never passing the server's websocket), and a comm message. A
kernel whose GPU calls could come from no cell (a thread its notebook started, a child process) is not parked, and a
kernel that does not answer, or answers nonsense, is refused with why; nothing else is affected."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import uuid

import psutil
import pytest
from jupyter_client import AsyncKernelClient
from kernels import run_in_kernel, stdout_of
from tornado.httpclient import HTTPClientError

from jupyter_gpushare.ledger.ledger import Lease
from jupyter_gpushare.server import app, kernel_word, parking


@pytest.fixture
def gpushare_config(gpushare_config):
    return {**gpushare_config, "default_quota": "4GiB", "queue_timeout": 120, "park_after": 3600}


async def _state(gpushare, kernel_id: str, *states: str) -> bool:
    return await gpushare.state_of(kernel_id) in states


async def _park(jp_fetch, kernel_id: str) -> None:
    await jp_fetch("api", "gpushare", "kernels", kernel_id, "park", method="POST", body="")


async def _refused(jp_fetch, kernel_id: str) -> str:
    with pytest.raises(HTTPClientError) as e:
        await _park(jp_fetch, kernel_id)
    assert e.value.code == 409, e.value
    return json.loads(e.value.response.body)["message"]


def _own_client(jp_serverapp, kernel_id: str) -> AsyncKernelClient:
    """A client of the kernel's own ZMQ channels, by its connection file: the server sees none of what it sends."""
    client = AsyncKernelClient(connection_file=jp_serverapp.kernel_manager.get_kernel(kernel_id).connection_file)
    client.load_connection_file()
    client.start_channels()
    return client


async def test_a_cell_sent_to_the_kernels_own_shell_brings_it_back_and_runs_at_once(gpushare, jp_serverapp, jp_fetch):
    """`jupyter console --existing` (or an IDE) sends a cell to a parked kernel's ZMQ shell: the cell runs at once and
    says in one line that the GPU comes back, and the kernel asks for its GPU itself. It used to hang: the server never
    saw the cell, and the kernel stayed parked (5 of 24 students' second jobs, in each of two runs)."""
    _, kid = await gpushare.open_notebook("console.ipynb")
    await run_in_kernel(jp_serverapp, kid, "kept = 41")
    await _park(jp_fetch, kid)
    await gpushare.wait_for(lambda: _state(gpushare, kid, "parked"), what="the kernel to be parked")
    client = _own_client(jp_serverapp, kid)
    try:
        msg_id = client.execute("kept + 1")
        reply = await client.get_shell_msg(timeout=30)
        assert reply["content"]["status"] == "ok"
        said = await stdout_of(client, msg_id)
        assert "this kernel was parked; its GPU state comes back now" in said, said
        await gpushare.wait_for(lambda: _state(gpushare, kid, "running"), what="the kernel back on its GPU")
        assert (await gpushare.kernel(kid))["parked"] is None
    finally:
        client.stop_channels()


async def test_a_comm_message_brings_it_back(gpushare, jp_serverapp, jp_fetch):
    """A widget's comm message (here, on the kernel's own shell) is a demand as a cell is."""
    _, kid = await gpushare.open_notebook("widget.ipynb")
    await _park(jp_fetch, kid)
    await gpushare.wait_for(lambda: _state(gpushare, kid, "parked"), what="the kernel to be parked")
    client = _own_client(jp_serverapp, kid)
    try:
        message = client.session.msg("comm_msg", {"comm_id": uuid.uuid4().hex, "data": {"method": "update"}})
        client.shell_channel.send(message)
        await gpushare.wait_for(lambda: _state(gpushare, kid, "running"), what="the kernel back on its GPU")
    finally:
        client.stop_channels()


async def test_a_kernel_whose_gpu_calls_could_come_from_no_cell_is_not_parked(gpushare, jp_serverapp, jp_fetch):
    """A notebook serving a model from a thread (a Gradio or Flask demo) or running a program in a child process: a
    park would stall their GPU calls with nothing to bring the kernel back (a demo's thread stalled 39 s). Such a
    kernel is not parked, and asked to be, it is refused with why; once the thread is done, it may be."""
    _, kid = await gpushare.open_notebook("demo.ipynb")
    await run_in_kernel(jp_serverapp, kid, (
        "import threading, subprocess, sys, time\n"
        "stop = threading.Event()\n"
        "def serve(): stop.wait(120)\n"
        "threading.Thread(target=serve, name='demo-server', daemon=True).start()"
    ))  # fmt: skip
    said = await _refused(jp_fetch, kid)
    assert "threads its notebook started run (demo-server)" in said and "come from no cell" in said, said
    await run_in_kernel(jp_serverapp, kid, "stop.set(); time.sleep(0.2); child = subprocess.Popen(['sleep', '120'])")
    assert "child processes run" in await _refused(jp_fetch, kid)
    await run_in_kernel(jp_serverapp, kid, "child.kill(); child.wait()")
    await _park(jp_fetch, kid)
    await gpushare.wait_for(lambda: _state(gpushare, kid, "parked"), what="the kernel parked once they are done")


@pytest.mark.parametrize("answer", ["nonsense", "silence"])
async def test_a_kernel_that_answers_nonsense_or_nothing_is_refused_and_nothing_else_moves(
    gpushare, jp_serverapp, jp_fetch, answer, monkeypatch
):
    """The kernel's word is read only for "ok": a kernel that says anything else (64 KiB of it) is refused with what
    it said, cut short; one that does not answer in time (its bootstrap's answer replaced by a sleep) is refused for
    that. Neither is parked, and another kernel of the server parks as before."""
    monkeypatch.setattr(kernel_word, "PARKABLE_ASK_S", 2.0)
    _, kid = await gpushare.open_notebook("liar.ipynb")
    _, other = await gpushare.open_notebook("other.ipynb")
    fake = "lambda *_: 'x' * 65536" if answer == "nonsense" else "lambda *_: __import__('time').sleep(8)"
    await run_in_kernel(jp_serverapp, kid, f"import _gpushare_wait; _gpushare_wait.parkable = {fake}")
    said = await _refused(jp_fetch, kid)
    if answer == "nonsense":
        assert "xxxx" in said and len(said) < 600, len(said)
    else:
        assert "it did not say whether it may be parked" in said, said
    assert await gpushare.state_of(kid) == "running"
    await _park(jp_fetch, other)
    await gpushare.wait_for(lambda: _state(gpushare, other, "parked"), what="the other kernel parked")


async def test_a_parked_kernel_that_is_stopped_or_killed_takes_nothing_with_it(gpushare, jp_serverapp, jp_fetch):
    """A parked kernel's process is stopped (SIGSTOP): its next demand cannot come from it, but its websocket's cell
    (or the server's resume) still brings it back on its card, and it runs its cells once it is let go. A parked
    kernel that is killed is restarted by Jupyter as after any crash: its parked state is gone, and the host memory
    it held for the parked state is given back (the host's one budget, in the ledger)."""
    manager = jp_serverapp.web_app.settings["gpushare_manager"]
    _, kid = await gpushare.open_notebook("stopped.ipynb")
    await _park(jp_fetch, kid)
    await gpushare.wait_for(lambda: _state(gpushare, kid, "parked"), what="the kernel parked")
    pid = (await gpushare.kernel(kid))["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        await jp_fetch("api", "gpushare", "kernels", kid, "resume", method="POST", body="")
        await gpushare.wait_for(lambda: _state(gpushare, kid, "running"), what="a stopped kernel back on its card")
    finally:
        os.kill(pid, signal.SIGCONT)
    assert await run_in_kernel(jp_serverapp, kid, "print(6 * 7)") == "42\n"
    await _park(jp_fetch, kid)
    await gpushare.wait_for(lambda: _state(gpushare, kid, "parked"), what="the kernel parked again")
    assert kid in await manager.ledger.on(lambda ledger: ledger.parked())
    psutil.Process(pid).kill()
    await gpushare.wait_for(lambda: _state(gpushare, kid, "running"), what="the kernel restarted")
    # (and ready: a kernel shut down while Jupyter restarts it makes jupyter_client raise InvalidStateError)
    assert await run_in_kernel(jp_serverapp, kid, "print(6 * 7)") == "42\n"
    for _ in range(50):
        if kid not in await manager.ledger.on(lambda ledger: ledger.parked()):
            break
        await asyncio.sleep(0.1)
    assert kid not in await manager.ledger.on(lambda ledger: ledger.parked())


@pytest.mark.parametrize("how", ["admitted at once", "granted in line"])
async def test_a_resume_waits_for_the_room_the_card_shows_not_the_ledger(
    gpushare, jp_serverapp, jp_fetch, monkeypatch, how
):
    """Memory is taken on the card right after a parked kernel's reservation is granted (a process outside any
    reservation): the ledger agrees to the resume, the card does not have the room. A restore then would run out of
    memory, and that breaks the process for good (cuda-checkpoint#44): the kernel stays parked, says why with the
    card's figures, and gives its reservation back. Once the memory is freed, its next demand brings it back."""
    manager = jp_serverapp.web_app.settings["gpushare_manager"]
    standin = manager.parking.checkpointer
    _, kid = await gpushare.open_notebook("taken.ipynb")
    await run_in_kernel(jp_serverapp, kid, "import gpushare_simulate; gpushare_simulate.use('1GiB'); kept = 41")
    await gpushare.wait_for(
        lambda: _used(gpushare, kid, 1024), what="the kernel's use on the card"
    )  # (read before the park: what it moves)
    await _park(jp_fetch, kid)
    await gpushare.wait_for(lambda: _state(gpushare, kid, "parked"), what="the kernel parked")
    pid = (await gpushare.kernel(kid))["pid"]
    resumed: list = []
    monkeypatch.setattr(standin, "resume", lambda pids: resumed.append(pids) or {"restore": 0.0, "unlock": 0.0})
    full = [(await gpushare.open_notebook(f"full-{i}.ipynb"))[0] for i in range(2 if how == "granted in line" else 0)]
    thief = await _taken_at_the_grant(manager, monkeypatch)
    try:
        asked = asyncio.ensure_future(jp_fetch("api", "gpushare", "kernels", kid, "resume", method="POST", body=""))
        if full:  # (the card is full of reservations: the resume waits in line, and is granted when one closes)
            await gpushare.wait_for(lambda: _state(gpushare, kid, "queued"), what="the resume in line")
            await gpushare.close_notebook(full.pop())
        await asked
        if how == "granted in line":  # its grant is said as a start's is (the student's toast: "GPU ready after...")
            assert await _event(gpushare, kid, "admitted") is not None
        said = await gpushare.wait_for(lambda: _event(gpushare, kid, "resume-no-room"), what="the resume refused")
        assert "1 GiB free on its card, 1 GiB needed (used outside the line)" in said["message"], said
        assert resumed == [] and await gpushare.state_of(kid) == "parked"
        assert (await gpushare.get("cards"))["cards"][0]["reserved_mib"] == 4608 * len(full)  # its own went back
    finally:
        await thief.go()
    monkeypatch.undo()
    await jp_fetch("api", "gpushare", "kernels", kid, "resume", method="POST", body="")
    await gpushare.wait_for(lambda: _state(gpushare, kid, "running"), what="the kernel back once the card has room")
    assert await run_in_kernel(jp_serverapp, kid, "print(kept + 1, __import__('os').getpid())") == f"42 {pid}\n"


class _Thief:
    """A process outside any reservation that takes the card's memory right after the ledger grants a reservation
    (it leaves 1 GiB free: a parked state of 1 GiB, without the restore's margin), until it goes."""

    def __init__(self, manager, monkeypatch, proc) -> None:
        self.manager, self.proc, self.real = manager, proc, manager.reserve
        self.monkeypatch = monkeypatch
        monkeypatch.setattr(manager, "reserve", self.granted_then_taken)

    def granted_then_taken(self, *args, **kwargs):
        got = self.real(*args, **kwargs)
        if isinstance(got, Lease):
            self.manager.backend.fake.add_process(self.proc.pid, 10240 - 1024)
        return got

    async def go(self) -> None:
        self.monkeypatch.setattr(self.manager, "reserve", self.real)
        self.manager.backend.fake.remove_process(self.proc.pid)
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


async def _taken_at_the_grant(manager, monkeypatch) -> _Thief:
    return _Thief(manager, monkeypatch, await asyncio.create_subprocess_exec("sleep", "60"))


async def test_a_cell_that_waits_on_a_resume_that_did_not_happen_says_why_and_asks_again(
    gpushare, jp_serverapp, jp_fetch, monkeypatch
):
    """A cell (here from the kernel's own shell) brings a parked kernel back, but its card has no room for the state
    (used outside the line): the resume does not happen. The cell's GPU call waits in the driver until the state is
    back, and the kernel is busy, so no other cell or comm message could ask again: it used to wait with no word, for
    good. Now the cell says why in one line, with the server's words, and the kernel asks again while the cell runs:
    once the room is back, the cell goes on, with its variables and the same process."""
    monkeypatch.setattr(parking, "ASK_AGAIN_S", 2.0)
    manager = jp_serverapp.web_app.settings["gpushare_manager"]
    monkeypatch.setattr(manager.parking.checkpointer, "resume", lambda pids: {"restore": 0.0, "unlock": 0.0})
    _, kid = await gpushare.open_notebook("waits.ipynb")
    await run_in_kernel(jp_serverapp, kid, "import gpushare_simulate; gpushare_simulate.use('1GiB'); kept = 41")
    await gpushare.wait_for(lambda: _used(gpushare, kid, 1024), what="the kernel's use on the card")
    await _park(jp_fetch, kid)
    await gpushare.wait_for(lambda: _state(gpushare, kid, "parked"), what="the kernel parked")
    pid = (await gpushare.kernel(kid))["pid"]
    thief = await _taken_at_the_grant(manager, monkeypatch)
    client = _own_client(jp_serverapp, kid)
    try:  # (the cell waits as a GPU call does in a checkpointed process: until the kernel hears it is back)
        msg_id = client.execute(
            "import _gpushare_wait as w, os, time\nwhile w._state['parked'] is not None: time.sleep(0.05)\n"
            "print('back', kept + 1, os.getpid())"
        )
        said = await gpushare.wait_for(lambda: _event(gpushare, kid, "resume-no-room"), what="the resume refused")
        assert said["message"].endswith("Retried while a cell runs.") and said["again_s"] == 2.0, said
        await asyncio.sleep(3)  # (tried again meanwhile, with the same words: said once)
        events = (await gpushare.get("events"))["events"]
        assert [e["code"] for e in events if e["kernel_id"] == kid].count("resume-no-room") == 1, events
        await thief.go()  # (the room comes back: the kernel's own second ask brings it back, no other cell)
        reply = await client.get_shell_msg(timeout=60)
        assert reply["content"]["status"] == "ok", reply
        out = await stdout_of(client, msg_id)
    finally:
        await thief.go()
        client.stop_channels()
    # (its place in line, where the server gave one while the cell ran: a line of its own each time it changed)
    place = "jupyter-gpushare: its GPU state comes back when the card has room: #"
    lines = [line for line in out.splitlines() if not line.startswith(place)]
    for line in out.splitlines():
        if line.startswith(place):
            assert re.fullmatch(r"\d+ in line\.", line[len(place) :]), out
    assert lines[0].startswith("jupyter-gpushare: this kernel was parked; its GPU state comes back now"), out
    assert lines[1] == (
        "jupyter-gpushare: its GPU state did not come back. Still parked: 1 GiB free on its card, 1 GiB needed (used "
        "outside the line). Retried while a cell runs. To give up instead, restart the kernel (its variables are "
        "lost)."
    ), out
    assert lines[2:] == [f"back 42 {pid}"], out
    assert await gpushare.state_of(kid) == "running"


async def _used(gpushare, kernel_id: str, mib: int) -> bool:
    return ((await gpushare.kernel(kernel_id)) or {}).get("used_mib") == mib


async def _event(gpushare, kernel_id: str, code: str) -> dict | None:
    events = (await gpushare.get("events"))["events"]
    return next((e for e in reversed(events) if e["kernel_id"] == kernel_id and e["code"] == code), None)


BUDGET_CONFIG = {"gpu_backend": "simulated", "simulated_cards": "10GiB", "card_headroom": "0MiB",
                 "context_reserve": "512MiB", "default_quota": "4GiB", "reconcile_interval": 0.5,
                 "queue_timeout": 120, "park_after": 3600, "park_host_budget": "512MiB"}  # fmt: skip


@pytest.mark.parametrize("gpushare_config", [BUDGET_CONFIG])
async def test_a_park_past_the_host_budget_is_refused_with_why_and_nothing_moves(gpushare, jp_serverapp, jp_fetch):
    """The host's memory for parked state is one budget: a kernel whose 1 GiB does not fit in 512 MiB is not
    parked; asked by hand, the answer says why (409), and the kernel runs on with its variables."""
    _, kid = await gpushare.open_notebook("big.ipynb")
    await run_in_kernel(jp_serverapp, kid, "import gpushare_simulate; gpushare_simulate.use('1GiB'); kept = 41")
    await gpushare.wait_for(lambda: _used(gpushare, kid, 1024), what="the kernel's use on the card")
    said = await _refused(jp_fetch, kid)
    assert f"Kernel {kid} is not parked:" in said and "512 MiB" in said, said
    assert await gpushare.state_of(kid) == "running"
    assert await run_in_kernel(jp_serverapp, kid, "print(kept + 1)") == "42\n"


async def test_a_kernel_with_a_framework_off_the_allow_list_is_not_parked_even_by_hand(
    gpushare, jp_serverapp, jp_fetch
):
    """JAX's GPU state did not survive a park on the GPU (bench/results/check_park-*): a kernel that imported it is
    not parked, by the line or by hand (POST …/park, a teacher's or its student's), and the answer names it."""
    _, kid = await gpushare.open_notebook("jax.ipynb")
    await run_in_kernel(jp_serverapp, kid, "import jax.numpy as jnp; kept = int(jnp.ones(3).sum())")
    said = await _refused(jp_fetch, kid)
    assert "it imported JAX, whose GPU state is not known to survive a park (park_frameworks)" in said, said
    assert await gpushare.state_of(kid) == "running"
    assert await run_in_kernel(jp_serverapp, kid, "print(kept)") == "3\n"


async def test_a_park_right_after_a_cell_moves_what_the_card_shows_now(gpushare, jp_serverapp, jp_fetch):
    """Parked by hand just after a cell took memory: what moves is what the card shows after the request, not the
    last reading before the cell (on the GPU, such a park moved nothing and gave the reservation to the line while
    4 GiB stayed on the card)."""
    manager = jp_serverapp.web_app.settings["gpushare_manager"]
    _, kid = await gpushare.open_notebook("fresh.ipynb")
    await run_in_kernel(jp_serverapp, kid, "import os; kept = 41")
    await gpushare.wait_for(lambda: _used(gpushare, kid, 0), what="a reading of the kernel without GPU use")
    await run_in_kernel(jp_serverapp, kid, "import gpushare_simulate; gpushare_simulate.use('1GiB')")
    await _park(jp_fetch, kid)  # (at once: the last reading still says 0)
    parked = await _event(gpushare, kid, "parked")
    assert parked is not None and parked["parked_mib"] == 1024, parked
    pid = (await gpushare.kernel(kid))["pid"]
    assert pid in manager.backend._parked


@pytest.mark.parametrize("answer", ["a lie", "silence"])
async def test_a_kernel_that_lies_in_its_trim_answer_or_never_gives_one(
    gpushare, jp_serverapp, jp_fetch, answer, monkeypatch
):
    """Before a park the kernel is asked to give its caches back (``_gpushare_alloc.trim``). Its answer is read only
    for the names it may say: a kernel that claims every framework, 64 KiB of it, is parked with what the card shows
    it holding, nothing more or less. One that does not answer in time (a cell runs, or it hangs) is not parked,
    and the refusal says why. Another kernel of the server parks as before."""
    monkeypatch.setattr(app, "TRIM_TIMEOUT_S", 2.0)
    _, kid = await gpushare.open_notebook("trim.ipynb")
    _, other = await gpushare.open_notebook("other.ipynb")
    await run_in_kernel(jp_serverapp, kid, "import gpushare_simulate; gpushare_simulate.use('1GiB'); kept = 41")
    fake = (
        "lambda: ['torch', 'tensorflow', 'x' * 65536]" if answer == "a lie" else "lambda: __import__('time').sleep(8)"
    )
    await run_in_kernel(jp_serverapp, kid, f"import _gpushare_alloc; _gpushare_alloc.trim = {fake}")
    if answer == "a lie":
        await _park(jp_fetch, kid)
        parked = await _event(gpushare, kid, "parked")
        assert parked["parked_mib"] == 1024 and parked["trimmed"] == ["torch"], parked
    else:
        said = await _refused(jp_fetch, kid)
        assert "it did not answer the request to give its cached GPU memory back" in said, said
        assert await gpushare.state_of(kid) == "running"
    await _park(jp_fetch, other)
    await gpushare.wait_for(lambda: _state(gpushare, other, "parked"), what="the other kernel parked")


async def test_a_demand_that_comes_while_the_park_is_under_way_is_not_lost(gpushare, jp_serverapp, jp_fetch):
    """The server marks the kernel parked and tells it so through its pipe; a comm message (or a cell) that reaches
    the kernel before it has read that (its reader thread slowed here by 2 s, as on a loaded host) still brings it
    back. It was lost: the kernel, not yet knowing it was parked, let the demand pass, and stayed parked (CI)."""
    _, kid = await gpushare.open_notebook("race.ipynb")
    slow = "import _gpushare_wait as w, time\n_take = w._take\nw._take = lambda m: (time.sleep(2) if 'parked' in m else None, _take(m))"
    await run_in_kernel(jp_serverapp, kid, slow)
    await _park(jp_fetch, kid)
    await gpushare.wait_for(lambda: _state(gpushare, kid, "parked"), what="the kernel to be parked")
    client = _own_client(jp_serverapp, kid)
    try:
        client.shell_channel.send(client.session.msg("comm_msg", {"comm_id": uuid.uuid4().hex, "data": {}}))
        await gpushare.wait_for(lambda: _state(gpushare, kid, "running"), what="the kernel back on its GPU")
    finally:
        client.stop_channels()
