"""Warm kernels (server/warm.py): a real jupyter-server keeps kernels started ahead of time on a simulated card, and a
notebook that opens is handed one, set exactly as a fresh kernel of it would be: its working directory, its whole
environment, its kernel id and grant. A changed kernelspec, a warm kernel that died, or one that does not answer
gives a fresh kernel; a warm kernel holds no reservation and runs at idle priority until it is handed over."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import pytest
from jupyter_client.session import Session
from kernels import cell_result, mapped, run_cell, send_cell, stream_until
from test_waiting import _state, full_card, standin_pid

from jupyter_gpushare.host import priority
from jupyter_gpushare.server import warm as warm_pool

# What the kernel reports of itself: where it runs, its environment, its import path and %cd's history
ITSELF = (
    "import os, sys, json; json.dumps([os.getcwd(), dict(os.environ), sys.path, "
    "[str(d) for d in _dh], sorted(sys.modules)])"
)
OWN = {"GPUSHARE_KERNEL_ID", "GPUSHARE_ROOT_PID", "JPY_SESSION_NAME"}  # each kernel's own


@pytest.fixture
def gpushare_config(gpushare_config, request):
    return {**gpushare_config, "warm_kernels": 2, **getattr(request, "param", {})}


def pool_of(jp_serverapp):
    return jp_serverapp.web_app.settings["gpushare_manager"].warm


async def warm_pids(gpushare, jp_serverapp, count: int = 2, anew: bool = True) -> set[int]:
    """The pool's kernels' processes, once it holds ``count`` of them. ``anew``: those started so far are ended first
    (pytest changes the server's environment between a test's set-up and its call: PYTEST_CURRENT_TEST; a warm
    kernel started before a change of the environment is not handed over)."""
    pool = pool_of(jp_serverapp)
    if anew:
        await gpushare.wait_for(lambda: asyncio.sleep(0, not pool._filling), timeout=120, what="the first fill")
        for warm in list(pool.ready["python3"]):
            pool.ready["python3"].remove(warm)
            pool.discard(warm)
        pool.discarded = 0

    async def full():
        return len(pool.ready["python3"]) >= count

    await gpushare.wait_for(full, timeout=120, what=f"{count} warm kernels")
    return {w.km.provisioner.pid for w in pool.ready["python3"]}


async def itself(kernel_ws, kernel_id: str) -> tuple[str, dict, list, list, list]:
    return json.loads(eval(await run_cell(kernel_ws, kernel_id, ITSELF)))


def empty(pool) -> None:
    """No warm kernel from now on: the next notebook's kernel starts fresh."""
    pool.count = 0
    for warm in list(pool.ready["python3"]):
        pool.ready["python3"].remove(warm)
        pool.discard(warm)


async def test_a_notebook_gets_a_warm_kernel_set_exactly_as_a_fresh_one(gpushare, jp_serverapp, jp_root_dir, kernel_ws):
    warm = await warm_pids(gpushare, jp_serverapp)
    assert (await gpushare.get("kernels"))["kernels"] == []  # a warm kernel holds no reservation and is nobody's
    assert (await gpushare.get("cards"))["cards"][0]["reserved_mib"] == 0
    assert (await gpushare.get("queue"))["queue"] == []
    assert {priority.policy_of(pid) for pid in warm} == {"idle"}
    (jp_root_dir / "course" / "week1").mkdir(parents=True)
    _, kid = await gpushare.open_notebook("course/week1/lab.ipynb")
    pid = standin_pid(jp_serverapp, kid)
    assert pid in warm
    assert priority.policy_of(pid) == "normal"  # granted at once: it computes at normal priority
    cwd, env, path, dh, _ = await itself(kernel_ws, kid)
    here = str(jp_root_dir / "course" / "week1")
    assert (cwd, dh) == (here, [here])
    assert str(jp_root_dir) not in path  # (the warm kernel's directory, which the interpreter put first)
    assert env["GPUSHARE_KERNEL_ID"] == kid and env["GPUSHARE_MODE"] == "gpu"
    assert env["JPY_SESSION_NAME"].endswith("course/week1/lab.ipynb")
    assert "GPUSHARE_WARM_IMPORTS" not in env
    assert (await gpushare.kernel(kid))["state"] == "running"
    # the same notebook's kernel started fresh (no warm kernel left) has the same environment, but for its own
    empty(pool_of(jp_serverapp))
    _, fresh = await gpushare.open_notebook("course/week1/lab-2.ipynb")
    assert standin_pid(jp_serverapp, fresh) not in warm
    cwd2, env2, path2, dh2, _ = await itself(kernel_ws, fresh)
    assert (cwd2, dh2) == (here, [here])
    assert {k: v for k, v in env.items() if k not in OWN} == {k: v for k, v in env2.items() if k not in OWN}
    assert [p for p in path if p != here] == [p for p in path2 if p != here]


async def test_a_handed_over_kernel_restarts_and_shuts_down_as_any(gpushare, jp_serverapp, jp_fetch, kernel_ws):
    warm = await warm_pids(gpushare, jp_serverapp)
    _, kid = await gpushare.open_notebook("restart.ipynb")
    assert standin_pid(jp_serverapp, kid) in warm
    assert await run_cell(kernel_ws, kid, "x = 41; x + 1") == "42"
    await jp_fetch("api", "kernels", kid, "restart", method="POST", body="{}")
    assert await run_cell(kernel_ws, kid, "'x' in dir()") == "False"
    assert (await gpushare.kernel(kid))["state"] == "running"
    pid = standin_pid(jp_serverapp, kid)
    await gpushare.stop_kernel(kid)
    assert (await gpushare.get("kernels"))["kernels"] == []
    await gpushare.wait_for(lambda: asyncio.sleep(0, not os.path.exists(f"/proc/{pid}")), what="the kernel's end")


@pytest.mark.parametrize("gpushare_config", [{"default_quota": "4GiB", "queue_timeout": 120}], indirect=True)
async def test_a_warm_kernel_handed_to_a_notebook_in_line_waits_at_idle_priority_and_is_granted(
    gpushare, jp_serverapp, kernel_ws
):
    sessions = await full_card(gpushare)
    warm = await warm_pids(gpushare, jp_serverapp)
    _, kid = await gpushare.open_notebook("third.ipynb")
    assert await gpushare.state_of(kid) == "queued"
    pid = standin_pid(jp_serverapp, kid)
    assert pid in warm and priority.policy_of(pid) == "idle"
    _, env, _, _, _ = await itself(kernel_ws, kid)  # a CPU cell runs while it waits
    assert (env["GPUSHARE_MODE"], env["CUDA_VISIBLE_DEVICES"]) == ("queued", "")
    await gpushare.close_notebook(sessions[0])
    await gpushare.wait_for(lambda: _state(gpushare, kid, "running"), what="the grant")
    await gpushare.wait_for(lambda: asyncio.sleep(0, priority.policy_of(pid) == "normal"), what="normal priority")
    # (its priority is lifted before its grant is written to it, and the server reads running before either:
    # the kernel's own word, once it has read its grant)
    mode = "import os; os.environ['GPUSHARE_MODE']"
    await gpushare.wait_for(lambda: _says(run_cell(kernel_ws, kid, mode), "'gpu'"), what="the kernel's grant")


async def test_a_changed_kernelspec_gets_a_fresh_kernel(gpushare, jp_serverapp, jp_data_dir, kernel_ws):
    warm = await warm_pids(gpushare, jp_serverapp)
    spec = jp_serverapp.kernel_manager.kernel_spec_manager.get_kernel_spec("python3").to_dict()
    folder = jp_data_dir / "kernels" / "python3"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kernel.json").write_text(json.dumps({**spec, "env": {"COURSE": "ml101"}}))
    _, kid = await gpushare.open_notebook("changed.ipynb")
    assert standin_pid(jp_serverapp, kid) not in warm
    assert await run_cell(kernel_ws, kid, "import os; os.environ.get('COURSE')") == "'ml101'"
    assert pool_of(jp_serverapp).discarded == 1


async def test_a_warm_kernel_that_died_gives_a_fresh_kernel_and_the_pool_refills(gpushare, jp_serverapp, kernel_ws):
    warm = await warm_pids(gpushare, jp_serverapp)
    for pid in warm:
        os.kill(pid, signal.SIGKILL)
    pool = pool_of(jp_serverapp)
    await gpushare.wait_for(
        lambda: asyncio.sleep(0, all(w.km.provisioner.process.poll() is not None for w in pool.ready["python3"])),
        what="the warm kernels' deaths",
    )
    _, kid = await gpushare.open_notebook("after-death.ipynb")
    assert standin_pid(jp_serverapp, kid) not in warm
    assert await run_cell(kernel_ws, kid, "1 + 1") == "2"
    refilled = await warm_pids(gpushare, jp_serverapp, anew=False)
    assert not refilled & warm
    assert {priority.policy_of(pid) for pid in refilled} == {"idle"}  # the refill yields to the kernels that compute


async def test_a_warm_kernel_that_does_not_answer_is_ended_and_the_notebook_starts_fresh(
    gpushare, jp_serverapp, kernel_ws
):
    warm = await warm_pids(gpushare, jp_serverapp)
    for pid in warm:
        os.kill(pid, signal.SIGSTOP)  # alive, and deaf to its hand-over
    _, kid = await gpushare.open_notebook("deaf.ipynb")
    assert standin_pid(jp_serverapp, kid) not in warm
    assert await run_cell(kernel_ws, kid, "1 + 1") == "2"
    assert pool_of(jp_serverapp).discarded >= 1
    await gpushare.wait_for(
        lambda: asyncio.sleep(0, any(not os.path.exists(f"/proc/{pid}") for pid in warm)), what="the deaf one's end"
    )
    for pid in warm:  # (the other, never asked)
        if os.path.exists(f"/proc/{pid}"):
            os.kill(pid, signal.SIGCONT)


@pytest.mark.parametrize("gpushare_config", [{"line_place": "first-use", "default_quota": "4GiB"}], indirect=True)
async def test_a_warm_kernel_handed_to_a_notebook_that_asks_at_first_use_asks_then(gpushare, jp_serverapp, kernel_ws):
    warm = await warm_pids(gpushare, jp_serverapp)
    _, kid = await gpushare.open_notebook("first-use.ipynb")
    assert standin_pid(jp_serverapp, kid) in warm
    await gpushare.wait_for(lambda: _state(gpushare, kid, "standby"), what="standby")
    assert (await gpushare.get("cards"))["cards"][0]["reserved_mib"] == 0
    assert await run_cell(kernel_ws, kid, "import os, torch; os.environ['GPUSHARE_QUOTA_MIB']") == "'4096'"
    assert await gpushare.state_of(kid) == "running"


@pytest.mark.parametrize(
    "gpushare_config", [{"warm_imports": ["colorsys", "no_such_module_of_ours"], "warm_kernels": 1}], indirect=True
)
async def test_warm_imports_are_imported_before_the_hand_over_and_a_bad_one_is_named(
    gpushare, jp_serverapp, kernel_ws, capfd
):
    warm = await warm_pids(gpushare, jp_serverapp, count=1)
    _, kid = await gpushare.open_notebook("imports.ipynb")
    assert standin_pid(jp_serverapp, kid) in warm
    *_, modules = await itself(kernel_ws, kid)
    assert "colorsys" in modules
    assert "could not import 'no_such_module_of_ours' (GpuShareApp.warm_imports)" in capfd.readouterr().err


@pytest.mark.parametrize(
    "gpushare_config",
    [{"warm_imports": ["torch"], "warm_kernels": 1, "default_quota": "4GiB", "queue_timeout": 120}],
    indirect=True,
)
async def test_pytorch_imported_warm_runs_its_code_before_the_hand_over_and_waits_for_the_gpu_after(
    gpushare, jp_serverapp, kernel_ws
):
    """PyTorch's code runs in the warm kernel, no notebook's yet (its library is mapped); the notebook's own
    ``import torch`` takes that module, waits in line for the GPU as any, and sets its cap at the grant."""
    pytest.importorskip("torch")
    sessions = await full_card(gpushare)
    (pid,) = await warm_pids(gpushare, jp_serverapp, count=1)
    await gpushare.wait_for(lambda: asyncio.sleep(0, mapped(pid, "libtorch_cpu")), what="PyTorch's code, warm")
    _, kid = await gpushare.open_notebook("warm-torch.ipynb")
    assert standin_pid(jp_serverapp, kid) == pid and await gpushare.state_of(kid) == "queued"
    imported = "import sys; 'torch' in sys.modules, 'torch._C' in sys.modules"
    assert await run_cell(kernel_ws, kid, imported) == "(False, True)"  # its code ran; the import waits for it
    session = Session()
    ws = await kernel_ws(kid, session.session)
    cell = send_cell(ws, session, "import torch, os; float(torch.ones(3).sum()), os.environ['GPUSHARE_QUOTA_MIB']")
    await stream_until(ws, cell, "PyTorch waits for this kernel's GPU: #1 in line")
    await gpushare.close_notebook(sessions[0])
    assert await cell_result(ws, kid, cell) == "(3.0, '4096')"
    capped = "import _gpushare_report as r; 'torch' in r.STATE['frameworks']"
    assert await run_cell(kernel_ws, kid, capped) == "True"  # its hooks ran, after the grant
    ws.close()


async def test_the_pool_starts_as_many_kernels_at_once_as_it_may(gpushare, jp_serverapp, monkeypatch):
    """Half the CPUs at once (warm.fill_at_once): on a 16-core host, 32 kernels filled one at a time took minutes."""
    pool = pool_of(jp_serverapp)
    await warm_pids(gpushare, jp_serverapp)
    empty(pool)
    monkeypatch.setattr(warm_pool, "fill_at_once", lambda: 2)
    starting, most = 0, 0
    start = pool._start

    async def counted(name: str):
        nonlocal starting, most
        starting += 1
        most = max(most, starting)
        try:
            return await start(name)
        finally:
            starting -= 1

    monkeypatch.setattr(pool, "_start", counted)
    pool.count = 2
    pool.start()
    assert len(await warm_pids(gpushare, jp_serverapp, anew=False)) == 2
    assert most == 2


async def test_a_warm_kernel_refuses_a_gpu_framework_and_the_server_stop_ends_the_pool(gpushare, jp_serverapp):
    warm = await warm_pids(gpushare, jp_serverapp)
    pool = pool_of(jp_serverapp)
    km = pool.ready["python3"][0].km
    out = await run_in_kernel_km(
        km, "import sys\ntry:\n    import jax\nexcept ImportError as e:\n    print(e)\nprint('jax' in sys.modules)"
    )
    assert "a warm kernel imports no GPU framework (jax)" in out and out.endswith("False\n")
    await pool.stop()
    await gpushare.wait_for(
        lambda: asyncio.sleep(0, not any(os.path.exists(f"/proc/{pid}") for pid in warm)), what="the pool's end"
    )


async def run_in_kernel_km(km, code: str) -> str:
    client = km.client()
    client.start_channels()
    out: list = []
    try:
        await client.wait_for_ready(timeout=60)
        await client.execute_interactive(code, output_hook=out.append, timeout=60)
    finally:
        client.stop_channels()
    return "".join(m["content"].get("text", "") for m in out if m["msg_type"] == "stream")


async def _says(answer, expected: str) -> bool:
    return await answer == expected
