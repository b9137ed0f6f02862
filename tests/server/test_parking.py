"""Parking idle kernels on a simulated card, with the stand-in for the driver's checkpoint API (host/checkpoint.py):
a real jupyter-server, real kernels, and the simulated card's own readings as the card's truth.

The card has 10 GiB; each kernel reserves 4 GiB + 512 MiB, so two fit and a third waits. A kernel that "uses"
1 GiB (gpushare_simulate) and then runs nothing is parked once a third kernel waits: what it used leaves the
card, its reservation goes to the one in line, and its next cell brings it back, in the same process, with its
variables and its use. Of two idle kernels, the one with the least GPU state is parked first.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import threading
import time

import pytest
from jupyter_client.session import Session
from kernels import cell_result, kernel_gone, run_in_kernel, send_cell, stream_until
from tornado.httpclient import HTTPClientError


@pytest.fixture
def gpushare_config(gpushare_config, request):
    here = {"default_quota": "4GiB", "queue_timeout": 120, "park_after": 1.0}
    return {**gpushare_config, **here, **getattr(request, "param", {})}


async def _state(gpushare, kernel_id: str, state: str) -> bool:
    return await gpushare.state_of(kernel_id) == state


async def _event(gpushare, kernel_id: str, kind: str) -> dict | None:
    found = [e for e in (await gpushare.get("events"))["events"] if e["kernel_id"] == kernel_id and e["kind"] == kind]
    return found[-1] if found else None


async def _used_on_card(gpushare) -> int:
    return (await gpushare.get("cards"))["cards"][0]["used_by_kernels_mib"] or 0


async def test_an_idle_kernel_is_parked_for_one_in_line_and_its_next_cell_brings_it_back(
    gpushare, jp_serverapp, kernel_ws
):
    idle_session, idle = await gpushare.open_notebook("idle.ipynb")
    busy_session, busy = await gpushare.open_notebook("busy.ipynb")
    await run_in_kernel(jp_serverapp, idle, "import gpushare_simulate, os; gpushare_simulate.use('1GiB'); kept = 7")
    # The other uses more: the one with the least GPU state is parked first (the cheapest to move)
    await run_in_kernel(jp_serverapp, busy, "import gpushare_simulate; gpushare_simulate.use('2GiB')")
    pid = (await gpushare.kernel(idle))["pid"]
    await gpushare.wait_for(lambda: _used(gpushare, 3072), what="the card to show the 1 + 2 GiB in use")

    _, late = await gpushare.open_notebook("late.ipynb")  # no room: it waits, and the idle kernel is parked for it
    await gpushare.wait_for(lambda: _state(gpushare, idle, "parked"), what="the idle kernel to be parked")
    rec = await gpushare.kernel(idle)
    assert rec["parked"]["parked_mib"] == 1024 and rec["parked"]["reserved_mib"] == 4608
    assert rec["reserved_mib"] is None
    said = next(k for k in (await gpushare.get("state"))["kernels"] if k["kernel_id"] == idle)["status"]
    assert said["code"] == "parked" and said["params"]["parked_mib"] == 1024
    await gpushare.wait_for(lambda: _state(gpushare, late, "running"), what="the kernel in line to be granted")
    assert await _used_on_card(gpushare) == 2048  # the card's word: the parked process holds nothing
    await asyncio.sleep(4)  # past the settling time: nobody waits now, so nothing else is parked
    assert await gpushare.state_of(busy) == "running"
    parked = await _event(gpushare, idle, "parked")
    assert parked["params"]["parked_mib"] == 1024

    # Its next cell brings it back: the cell runs at once (its CPU work does not wait for the GPU) and says in one
    # line that the GPU comes back; the kernel waits in line for it (the card is full: the other kernel runs a cell,
    # so it is not parked for it) and is back once one leaves.
    busy_client = Session()
    send_cell(await kernel_ws(busy, busy_client.session), busy_client, "import time; time.sleep(120)")
    session = Session()
    ws = await kernel_ws(idle, session.session)
    msg_id = send_cell(ws, session, "kept + 1, os.getpid()")
    said = await stream_until(ws, msg_id, "comes back now")
    assert "this kernel was parked" in said and "CPU work runs at once" in said, said
    assert await cell_result(ws, idle, msg_id) == f"(8, {pid})"  # the same process, its variables kept, at once
    await gpushare.wait_for(lambda: _state(gpushare, idle, "queued"), what="the parked kernel to ask for its GPU")
    await gpushare.close_notebook(busy_session)
    await gpushare.wait_for(lambda: _state(gpushare, idle, "running"), what="the kernel back on its GPU")
    ws.close()
    rec = await gpushare.kernel(idle)
    assert rec["state"] == "running" and rec["parked"] is None and rec["reserved_mib"] == 4608
    await gpushare.wait_for(lambda: _used(gpushare, 1024), what="its use back on the card (the other one left)")
    resumed = await _event(gpushare, idle, "resumed")
    assert resumed["params"]["waited_s"] > 0
    await gpushare.close_notebook(idle_session)


async def test_a_kernel_gives_its_cached_memory_back_before_it_is_parked(gpushare, jp_serverapp):
    """An allocator's cache (PyTorch's after its tensors are freed) is given back before the park, which then moves
    only what is in use: on the GPU, about half the time (bench/README.md)."""
    idle_session, idle = await gpushare.open_notebook("cached.ipynb")
    busy_session, busy = await gpushare.open_notebook("busy.ipynb")
    await run_in_kernel(jp_serverapp, idle, "import gpushare_simulate; gpushare_simulate.use('1GiB', cached='1GiB')")
    await run_in_kernel(jp_serverapp, busy, "import gpushare_simulate; gpushare_simulate.use('3GiB')")
    await gpushare.wait_for(lambda: _used(gpushare, 5120), what="the card to show 1 + 1 cached + 3 GiB in use")
    _, late = await gpushare.open_notebook("late.ipynb")
    await gpushare.wait_for(lambda: _state(gpushare, idle, "parked"), what="the idle kernel to be parked")
    parked = await _event(gpushare, idle, "parked")
    assert parked["params"]["trimmed"] == ["simulated"]
    assert parked["params"]["parked_mib"] == 1024  # what was in use, not the 2 GiB the card showed before
    assert (await gpushare.kernel(idle))["parked"]["parked_mib"] == 1024
    await gpushare.wait_for(lambda: _state(gpushare, late, "running"), what="the kernel in line to be granted")
    for session in (idle_session, busy_session):
        await gpushare.close_notebook(session)


async def _used(gpushare, mib: int) -> bool:
    return await _used_on_card(gpushare) == mib


@pytest.mark.parametrize("gpushare_config", [{"park_after": 0}], indirect=True)
async def test_parking_off_keeps_an_idle_kernel_and_the_one_in_line_waits(gpushare, jp_serverapp):
    _, idle = await gpushare.open_notebook("idle.ipynb")
    await gpushare.open_notebook("busy.ipynb")
    _, late = await gpushare.open_notebook("late.ipynb")
    await asyncio.sleep(3)
    assert await gpushare.state_of(idle) == "running" and await gpushare.state_of(late) == "queued"


@pytest.mark.parametrize("gpushare_config", [{"park_after": 3600}], indirect=True)
async def test_park_and_resume_on_request_and_what_cannot_be_parked(gpushare, jp_fetch, jp_serverapp):
    _, kid = await gpushare.open_notebook("asked.ipynb")
    r = await jp_fetch("api", "gpushare", "kernels", kid, "park", method="POST", body="")
    assert json.loads(r.body)["state"] == "parked"
    assert (await gpushare.get("cards"))["cards"][0]["reserved_mib"] == 0  # its reservation went back
    parking = (await gpushare.get("cards"))["parking"]
    assert parking["available"] and parking["by"] == "stand-in" and parking["parked_kernels"] == 1
    metrics = (await jp_fetch("metrics", method="GET")).body.decode()
    assert "gpushare_parked_kernels 1.0" in metrics and "gpushare_park_seconds" in metrics
    r = await jp_fetch("api", "gpushare", "kernels", kid, "resume", method="POST", body="")
    assert json.loads(r.body)["state"] == "running"
    assert (await gpushare.get("cards"))["cards"][0]["reserved_mib"] == 4608
    assert (await gpushare.get("cards"))["parking"]["given_back_gib_h"] > 0
    assert await run_in_kernel(jp_serverapp, kid, "print('still here')") == "still here\n"
    r = await jp_fetch("api", "gpushare", "kernels", kid, "resume", method="POST", body="")  # not parked: no-op
    assert json.loads(r.body)["state"] == "running"
    _, late = await gpushare.open_notebook("late.ipynb")
    await gpushare.open_notebook("third.ipynb")  # waits: a kernel in line cannot be parked
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("api", "gpushare", "kernels", (await _queued(gpushare)), "park", method="POST", body="")
    assert e.value.code == 409 and "nothing to park" in json.loads(e.value.response.body)["message"]


async def test_a_resume_that_fails_shuts_the_kernel_down_and_gives_its_room_back(
    gpushare, jp_fetch, jp_serverapp, ledger_file, monkeypatch
):
    """The driver cannot bring a parked kernel's GPU state back: its process cannot run on, so it is shut down and
    says why, and its record is never left 'parked' without its parked state (the kernel's life, life.py, raises under
    the tests): it reads 'failed' until it is gone. The reservation its resume got goes back."""
    from jupyter_gpushare.host.checkpoint import CheckpointError
    from jupyter_gpushare.ledger.ledger import Ledger

    manager = jp_serverapp.web_app.settings["gpushare_manager"]
    _, kid = await gpushare.open_notebook("lost.ipynb")
    await run_in_kernel(jp_serverapp, kid, "import gpushare_simulate; gpushare_simulate.use('1GiB')")
    await gpushare.wait_for(lambda: _at_least(gpushare, 1024), what="the kernel's use on the card")
    r = await jp_fetch("api", "gpushare", "kernels", kid, "park", method="POST", body="")
    assert json.loads(r.body)["state"] == "parked"

    def cannot(pids):
        raise CheckpointError("the driver refused the restore")

    monkeypatch.setattr(manager.parking.checkpointer, "resume", cannot)
    r = await jp_fetch("api", "gpushare", "kernels", kid, "resume", method="POST", body="")
    answer = json.loads(r.body)
    assert answer["state"] in ("failed", None)  # (None: gone already)
    assert answer["state"] is None or "could not be brought back" in answer["reason"]
    said = await _event(gpushare, kid, "resume-failed")
    assert said is not None and "the driver refused the restore" in said["message"]
    await gpushare.wait_for(lambda: kernel_gone(jp_serverapp, kid), what="the kernel shut down")
    await gpushare.wait_for(lambda: _no_lease(Ledger(ledger_file), kid), what="its reservation given back")


@pytest.mark.parametrize("gpushare_config", [{"queue_timeout": 3}], indirect=True)
async def test_a_resume_whose_wait_in_line_ends_leaves_the_kernel_parked_and_says_why(gpushare, jp_fetch, jp_serverapp):
    """A parked kernel's resume waits in line (the card is full) and its wait ends (queue_timeout) without a grant.
    Its way back is no start: it stays parked, with its parked state, and says why. It used to be settled as a start
    that timed out (state 'cpu', holding its parked state and an ended wait) and then parked again, a record its
    state does not allow (life.py raises under the tests)."""
    _, kid = await gpushare.open_notebook("back.ipynb")
    await run_in_kernel(jp_serverapp, kid, "import gpushare_simulate; gpushare_simulate.use('1GiB'); kept = 5")
    await gpushare.wait_for(lambda: _at_least(gpushare, 1024), what="the kernel's use on the card")
    r = await jp_fetch("api", "gpushare", "kernels", kid, "park", method="POST", body="")
    assert json.loads(r.body)["state"] == "parked"
    for i in range(2):  # the card is full of reservations
        await gpushare.open_notebook(f"full-{i}.ipynb")
    r = await jp_fetch("api", "gpushare", "kernels", kid, "resume", method="POST", body="")  # waits, then ends
    rec = await gpushare.kernel(kid)
    assert json.loads(r.body)["state"] == rec["state"] == "parked" and rec["parked"]["parked_mib"] == 1024
    assert rec["position"] is None and rec["reserved_mib"] is None
    said = await _event(gpushare, kid, "resume-waited-out")
    assert said is not None, [e["kind"] for e in (await gpushare.get("events"))["events"] if e["kernel_id"] == kid]


async def _at_least(gpushare, mib: int) -> bool:
    return await _used_on_card(gpushare) >= mib


async def _no_lease(ledger, kernel_id: str) -> bool:
    return all(lease.kernel_id != kernel_id for lease in ledger.leases())


async def _queued(gpushare) -> str:
    return next(k["kernel_id"] for k in (await gpushare.get("kernels"))["kernels"] if k["state"] == "queued")


@pytest.mark.parametrize("gpushare_config", [{"park_frameworks": ["cupy"]}], indirect=True)
async def test_a_kernel_with_a_framework_off_the_list_is_not_parked(gpushare, jp_serverapp):
    kernels = [(await gpushare.open_notebook(f"torch{i}.ipynb"))[1] for i in range(2)]
    for kid in kernels:
        await run_in_kernel(jp_serverapp, kid, "import torch")
        await gpushare.wait_for(lambda kid=kid: _has_framework(gpushare, kid, "torch"), what="the report of torch")
    _, late = await gpushare.open_notebook("late.ipynb")
    await asyncio.sleep(3)
    assert [await gpushare.state_of(kid) for kid in kernels] == ["running", "running"]
    assert await gpushare.state_of(late) == "queued"


async def _has_framework(gpushare, kernel_id: str, name: str) -> bool:
    return name in ((await gpushare.kernel(kernel_id)).get("frameworks") or {})


@pytest.mark.parametrize("gpushare_config", [{"park_after": 3600}], indirect=True)
async def test_a_cell_sent_while_the_kernel_is_being_parked_brings_it_back(
    gpushare, jp_fetch, jp_serverapp, kernel_ws, monkeypatch
):
    # The stand-in's checkpoint takes as long as a real one of a few GiB (1–2 s on the H100: bench/README.md),
    # so that the cell meets the park under way; it says when it begins (the API's parking_now lives only as long
    # as the park, and a loaded host's snapshot could miss it: seen in CI)
    checkpointer = parking_of(jp_serverapp).checkpointer
    park, begun = checkpointer.park, threading.Event()
    monkeypatch.setattr(
        checkpointer, "park", lambda pids, timeout: (begun.set(), time.sleep(2.0), park(pids, timeout))[2]
    )
    _, kid = await gpushare.open_notebook("racing.ipynb")
    session = Session()
    ws = await kernel_ws(kid, session.session)
    code = "import gpushare_simulate; gpushare_simulate.use('1GiB'); kept = 5; kept"
    assert await cell_result(ws, kid, send_cell(ws, session, code)) == "5"
    await gpushare.wait_for(lambda: _used(gpushare, 1024), what="the card to show the 1 GiB in use")
    parking = asyncio.ensure_future(jp_fetch("api", "gpushare", "kernels", kid, "park", method="POST", body=""))
    await gpushare.wait_for(lambda: asyncio.sleep(0, begun.is_set()), what="the park to start")
    assert parking_of(jp_serverapp).view()["parking_now"] == kid  # what the API's next snapshot says
    msg_id = send_cell(ws, session, "kept * 2")  # sent while the park is under way
    # the park ends, parked; the cell may bring it back before the park's own reply is written (seen under load)
    assert json.loads((await parking).body)["state"] in ("parked", "queued", "running")
    assert await cell_result(ws, kid, msg_id) == "10"  # a CPU cell runs at once, parked or not
    await gpushare.wait_for(lambda: _state(gpushare, kid, "running"), what="the kernel back for the cell")
    kinds = [e["kind"] for e in (await gpushare.get("events"))["events"] if e["kernel_id"] == kid]
    assert kinds.index("parked") < kinds.index("resumed")  # it was parked, then brought back by the cell
    ws.close()


@pytest.mark.parametrize("gpushare_config", [{"simulated_cards": "23GiB", "park_after": 3600}], indirect=True)
async def test_as_many_idle_kernels_are_parked_as_the_line_needs_at_once(gpushare, jp_serverapp, monkeypatch):
    """A wave of a class: five idle kernels fill the card and five wait. All five are parked side by side, each
    checkpoint taking 2 s (a real one of 1 GiB takes 0.5–2.2 s): all five are under way at one time, not in pairs
    (two threads for every blocking call made one wave's parks land so on the H100: bench/README.md) nor four and
    one."""
    parking = jp_serverapp.web_app.settings["gpushare_manager"].parking
    park = parking.checkpointer.park
    spans: list[tuple[float, float]] = []  # each checkpoint's (begin, end), monotonic

    def slow_park(pids, timeout):
        begin = time.monotonic()
        time.sleep(2.0)
        try:
            return park(pids, timeout)
        finally:
            spans.append((begin, time.monotonic()))

    monkeypatch.setattr(parking.checkpointer, "park", slow_park)
    idle = [(await gpushare.open_notebook(f"idle{i}.ipynb"))[1] for i in range(5)]
    for kid in idle:
        await run_in_kernel(jp_serverapp, kid, "import gpushare_simulate; gpushare_simulate.use('1GiB')")
    await gpushare.wait_for(lambda: _used(gpushare, 5 * 1024), what="the card to show the 5 × 1 GiB in use")
    late = [(await gpushare.open_notebook(f"late{i}.ipynb"))[1] for i in range(5)]
    for kid in late:
        await gpushare.wait_for(lambda kid=kid: _state(gpushare, kid, "queued"), what="five kernels in line")
    monkeypatch.setattr(parking, "rules", dataclasses.replace(parking.rules, after_s=1.0))  # they are idle now
    for kid in late:
        await gpushare.wait_for(lambda kid=kid: _state(gpushare, kid, "running"), what="all in line to be granted")
    assert [await gpushare.state_of(kid) for kid in idle] == ["parked"] * 5
    # All five under way at one moment: the last began before the first ended (two threads: 0–2, 0–2, 2–4, 2–4, 4–6 s)
    assert len(spans) == 5 and max(b for b, _ in spans) < min(e for _, e in spans), spans


@pytest.fixture
def slow_kernel(jp_data_dir):
    """A Python kernel that takes 4 s to start (a kernel's start under a class's load, on 2 cores)."""
    boot = "import os, sys, time; time.sleep(4); os.execv(sys.executable, [sys.executable, '-m', 'ipykernel_launcher', '-f', sys.argv[1]])"
    spec = jp_data_dir / "kernels" / "slow"
    spec.mkdir(parents=True)
    # (-S: the first process runs no bootstrap: the kernel it becomes takes its pipes to the server, as any kernel)
    argv = [sys.executable, "-S", "-c", boot, "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "Slow", "language": "python"}))
    return "slow"


async def test_a_kernel_still_starting_is_not_parked_for_one_in_line(gpushare, jp_serverapp, kernel_ws, slow_kernel):
    """A notebook whose kernel still starts keeps its place, however long the start: its first cell waits for it.
    A class that opened at once on the H100 had its first eight kernels parked 1.8 s in, before they had run
    anything, and sent to the back of the line (bench/README.md). Once started, it is idle like any other."""
    _, slow = await gpushare.open_notebook("slow.ipynb", slow_kernel)
    await gpushare.open_notebook("other.ipynb")
    _, late = await gpushare.open_notebook("late.ipynb")
    await gpushare.wait_for(lambda: _state(gpushare, late, "queued"), what="the third kernel to wait")
    session = Session()
    connecting = asyncio.ensure_future(kernel_ws(slow, session.session))  # its open waits for the kernel's start
    while not connecting.done():
        assert await gpushare.state_of(slow) == "running", "parked while it started"
        await asyncio.sleep(0.2)
    ws = await connecting
    started = time.monotonic()

    async def gave_its_place_up() -> bool:  # (it never used its GPU: it stands by, as a parked kernel gives it up)
        return await gpushare.state_of(slow) in ("parked", "standby")

    await gpushare.wait_for(gave_its_place_up, what="the started, idle kernel to give its place up")
    assert time.monotonic() - started < 15  # idle 1 s, then given up: not kept for the 30 s a start may take
    ws.close()


async def test_a_cell_held_for_a_parked_kernel_survives_a_reload_and_runs_at_its_resume(
    gpushare, jp_serverapp, kernel_ws
):
    _, idle = await gpushare.open_notebook("idle.ipynb")
    busy_session, busy = await gpushare.open_notebook("busy.ipynb")
    await run_in_kernel(jp_serverapp, idle, "import gpushare_simulate; gpushare_simulate.use('1GiB'); kept = 7")
    await run_in_kernel(jp_serverapp, busy, "import gpushare_simulate; gpushare_simulate.use('2GiB')")  # (kept)
    await gpushare.wait_for(lambda: _used(gpushare, 3072), what="the card to show the 1 + 2 GiB in use")
    await gpushare.open_notebook("late.ipynb")
    await gpushare.wait_for(lambda: _state(gpushare, idle, "parked"), what="the idle kernel to be parked")
    session = Session()
    ws = await kernel_ws(idle, session.session)
    send_cell(ws, session, "ran = kept + 1")  # it runs at once (CPU work), and asks the kernel back
    await gpushare.wait_for(lambda: _state(gpushare, idle, "queued"), what="the parked kernel to ask for its GPU")
    ws.close()  # the page reloads while its cell waits for the resume
    await gpushare.close_notebook(busy_session)
    await gpushare.wait_for(lambda: _state(gpushare, idle, "running"), what="the resume")
    again = Session()
    ws = await kernel_ws(idle, again.session)
    assert await cell_result(ws, idle, send_cell(ws, again, "ran")) == "8"
    ws.close()


async def until_closed(ws) -> None:
    """Read a websocket until the server closes it."""
    while await ws.read_message() is not None:
        pass


@pytest.mark.parametrize("gpushare_config", [{"park_after": 3600}], indirect=True)
async def test_cells_sent_to_a_parked_kernel_from_several_tabs_are_never_held(gpushare, jp_fetch, kernel_ws):
    """A student opens websockets to a parked kernel that waits to come back and sends cells on each: none is held by
    the server (it used to hold them all until the resume, bounded for the kernel); each runs at once, its CPU work
    not waiting for the GPU, and the kernel comes back once there is room."""
    _, kid = await gpushare.open_notebook("parked.ipynb")
    await jp_fetch("api", "gpushare", "kernels", kid, "park", method="POST", body="")
    full = [(await gpushare.open_notebook(f"full{i}.ipynb"))[0] for i in range(2)]  # its room is taken
    padding = "#" + "x" * (20 << 10)
    sockets = []
    for i in range(3):  # three tabs, 20 KiB each
        session = Session()
        ws = await kernel_ws(kid, session.session)
        assert await cell_result(ws, kid, send_cell(ws, session, f"tab{i} = {i}; {i}  {padding}")) == str(i)
        sockets.append(ws)
    await gpushare.wait_for(lambda: _state(gpushare, kid, "queued"), what="the parked kernel to ask back")
    await gpushare.close_notebook(full[0])
    await gpushare.wait_for(lambda: _state(gpushare, kid, "running"), what="the resume")
    session = Session()
    ws = await kernel_ws(kid, session.session)
    assert await cell_result(ws, kid, send_cell(ws, session, "tab0 + tab1 + tab2")) == "3"
    for w in (*sockets, ws):
        w.close()


def parking_of(jp_serverapp):
    return jp_serverapp.web_app.settings["gpushare_manager"].parking
