"""A kernel that holds a GPU it does not use gives it back while others wait (line_place = 'start', parking.py's
stand-by): a real jupyter-server, real kernels, a simulated card that fits two kernels.

Under 'start' a notebook takes its place in line when it opens; one that then runs only CPU cells held its place
while the GPU class waited (bench/README.md: 27.5% of the ideal with eight such notebooks, on the H100). Now such a
kernel, granted in line, with nothing on the card and no GPU framework imported, stands by once it has held its
reservation ``park_after`` while another kernel waits, busy or not: its cells run on, and its next GPU use asks
again, as under 'first-use'.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest
from jupyter_client.session import Session
from kernels import cell_result, send_cell, stream_until

from jupyter_gpushare.core.words import event_words
from jupyter_gpushare.launch.kernel_env import BOOTSTRAP_DIR


@pytest.fixture
def gpushare_config(gpushare_config):
    return {**gpushare_config, "default_quota": "4GiB", "queue_timeout": 120, "park_after": 1.0}


async def _state(gpushare, kernel_id: str, state: str) -> bool:
    return await gpushare.state_of(kernel_id) == state


async def _event(gpushare, kernel_id: str, kind: str) -> dict | None:
    found = [e for e in (await gpushare.get("events"))["events"] if e["kernel_id"] == kernel_id and e["kind"] == kind]
    return found[-1] if found else None


async def _exists(path) -> bool:
    return path.exists()


async def _reports(gpushare, kernel_id: str, framework: str) -> bool:
    return framework in ((await gpushare.kernel(kernel_id)).get("frameworks") or [])


async def test_a_kernel_with_a_child_process_or_a_gpu_import_keeps_its_gpu(gpushare, jp_serverapp, kernel_ws, tmp_path):
    """A child process may use the card it was started with (``!python train.py``): its kernel does not stand by,
    though it imported no GPU framework itself and runs a CPU cell. Nor is a kernel asked whose GPU framework import
    began (it says so first: one loading a framework may answer slowly, and its answer would be no)."""
    _, parent = await gpushare.open_notebook("parent.ipynb")
    _, other = await gpushare.open_notebook("other.ipynb")
    session = Session()
    ws = await kernel_ws(parent, session.session)
    other_ws = await kernel_ws(other, session.session)
    started = tmp_path / "started"
    child = f"import subprocess, pathlib; child = subprocess.Popen(['sleep', '600']); pathlib.Path({str(started)!r}).touch()"
    send_cell(ws, session, f"{child}\n{_long_cell(tmp_path / 'stop')}\nchild.kill(); child.wait()")
    # The other said that a GPU framework import began (as its first one says, before it runs; forged here, in a
    # CPU cell): it is not asked either
    said = tmp_path / "said"
    using = f"import _gpushare_wait as w, os, pathlib; os.write(w._state['ask_fd'], b'using\\n'); pathlib.Path({str(said)!r}).touch()"
    send_cell(other_ws, session, f"{using}\n{_long_cell(tmp_path / 'stop')}")
    await gpushare.wait_for(lambda: _exists(started), what="the child process running")
    await gpushare.wait_for(lambda: _exists(said), what="the other kernel's word")
    _, late = await gpushare.open_notebook("late.ipynb")
    await gpushare.wait_for(lambda: _state(gpushare, late, "queued"), what="the late one to wait")
    await asyncio.sleep(4)  # past park_after, and the question's answer
    assert await gpushare.state_of(late) == "queued"
    for kid in (parent, other):
        assert await gpushare.state_of(kid) == "running" and not await _event(gpushare, kid, "stood-by")
    (tmp_path / "stop").touch()
    ws.close()
    other_ws.close()


def _long_cell(stop) -> str:  # a CPU cell that runs until ``stop`` exists
    return f"import pathlib, time\nwhile not pathlib.Path({str(stop)!r}).exists(): time.sleep(0.1)"


async def test_a_busy_kernel_that_never_used_its_gpu_stands_by_for_one_in_line(
    gpushare, jp_fetch, jp_serverapp, kernel_ws, tmp_path
):
    km = jp_serverapp.kernel_manager
    _, first = await gpushare.open_notebook("first.ipynb")
    _, busy = await gpushare.open_notebook("busy.ipynb")  # both granted at their start
    first_pid = km.get_kernel(first).provisioner.pid
    session = Session()
    first_ws = await kernel_ws(first, session.session)  # its notebook is open (a kernel nobody connected to is
    # still "starting" for Jupyter, and judged only after STARTING_S)
    busy_ws = await kernel_ws(busy, session.session)
    # busy all along, with a GPU framework: neither parked nor stood by
    send_cell(busy_ws, session, f"import torch\n{_long_cell(tmp_path / 'stop-busy')}")
    await gpushare.wait_for(lambda: _reports(gpushare, busy, "torch"), what="the busy kernel's torch import")

    # The first, granted at its start and idle, never used its GPU: it stands by for the third
    _, cpu = await gpushare.open_notebook("cpu.ipynb")
    await gpushare.wait_for(lambda: _state(gpushare, cpu, "running"), what="the third granted in line")
    assert await gpushare.state_of(first) == "standby" and await _event(gpushare, first, "stood-by")
    seen = send_cell(first_ws, session, "import os; os.environ['GPUSHARE_MODE'], os.environ['CUDA_VISIBLE_DEVICES']")
    assert await cell_result(first_ws, first, seen, timeout=30) == "('standby', '')"
    assert km.get_kernel(first).provisioner.pid == first_pid
    pid = km.get_kernel(cpu).provisioner.pid

    # What it says on its pipe unasked changes nothing (its student controls every byte of it)
    ws = await kernel_ws(cpu, session.session)
    forged = "import _gpushare_wait as w, os; os.write(w._state['ask_fd'], b'standby\\nkept:x\\n<b>junk</b>\\n'); 1"
    assert await cell_result(ws, cpu, send_cell(ws, session, forged), timeout=30) == "1"
    await asyncio.sleep(1)
    assert (await gpushare.kernel(cpu))["state"] == "running" and not await _event(gpushare, cpu, "stood-by")

    # It runs a long CPU cell, and someone opens a notebook: it gives its place to them, its cell running on
    started = tmp_path / "started"
    send_cell(ws, session, f"import pathlib; pathlib.Path({str(started)!r}).touch()\n{_long_cell(tmp_path / 'stop')}")
    await gpushare.wait_for(lambda: _exists(started), what="the CPU cell running")
    _, late = await gpushare.open_notebook("late.ipynb")
    late_ws = await kernel_ws(late, session.session)  # (its notebook open, as the first's)
    await gpushare.wait_for(lambda: _state(gpushare, late, "running"), what="the late one granted")
    assert await gpushare.state_of(cpu) == "standby" and km.get_kernel(cpu).provisioner.pid == pid
    stood = await _event(gpushare, cpu, "stood-by")
    assert stood["reserved_mib"] == 4608 and stood["path"] == "cpu.ipynb"
    assert event_words(stood["code"], stood["params"]).startswith("Gave its 4.5 GiB GPU reservation to the line")
    got = await gpushare.get("cards")
    assert got["cards"][0]["reserved_mib"] == 2 * 4608  # the busy one's and the late one's: nothing held for it
    assert got["parking"]["stood_by"] == 2  # the first's and this one's

    # Its next cells run at once, without a GPU; its next GPU import asks again, waits, and is granted in place
    (tmp_path / "stop").touch()
    seen = send_cell(
        ws, session, "import os; kept = 6; os.environ['GPUSHARE_MODE'], os.environ['CUDA_VISIBLE_DEVICES']"
    )
    assert await cell_result(ws, cpu, seen, timeout=30) == "('standby', '')"
    gpu = send_cell(ws, session, "import torch; kept * 7, os.environ['GPUSHARE_MODE'], os.getpid()")
    await stream_until(ws, gpu, "waits for this kernel's GPU")
    # The late one holds its GPU idle, unused: it stands by in turn, and the first GPU use is granted
    assert await cell_result(ws, cpu, gpu, timeout=60) == f"(42, 'gpu', {pid})"
    assert await gpushare.state_of(late) == "standby" and await _event(gpushare, late, "stood-by")
    assert (await gpushare.kernel(cpu))["state"] == "running"
    metrics = (await jp_fetch("metrics", method="GET")).body.decode()
    assert "gpushare_stood_by_kernels 3.0" in metrics
    (tmp_path / "stop-busy").touch()
    for each in (ws, busy_ws, first_ws, late_ws):
        each.close()


def test_the_kernel_stands_by_only_if_it_imported_no_gpu_framework():
    """The kernel's side (_gpushare_wait), in a process of its own: asked to stand by, it applies the server's
    variables and says so, unless a GPU framework was imported or a child process runs (then it keeps its GPU, and
    says why); a kernel in line, not granted, keeps what it has."""
    script = f"""
import json, os, subprocess, sys
sys.path.insert(0, {str(BOOTSTRAP_DIR)!r})
import _gpushare_wait as w
r, fd = os.pipe()
w._state.update(ask_fd=fd, reading=True)
os.environ.update(GPUSHARE_MODE="queued", CUDA_VISIBLE_DEVICES="")
said = []
standby = {{"standby": {{"GPUSHARE_MODE": "standby", "CUDA_VISIBLE_DEVICES": "", "GPUSHARE_QUOTA_MIB": None}}}}
w._take(standby)  # in line: nothing to give back
said.append([os.read(r, 100).decode(), os.environ["GPUSHARE_MODE"]])
w._take({{"grant": {{"GPUSHARE_MODE": "gpu", "CUDA_VISIBLE_DEVICES": "GPU-1", "GPUSHARE_QUOTA_MIB": "4096"}}}})
w._take(standby)
said.append([os.read(r, 100).decode(), os.environ["GPUSHARE_MODE"], os.environ["CUDA_VISIBLE_DEVICES"],
             os.environ.get("GPUSHARE_QUOTA_MIB"), w._state["granted"]])
w._take({{"grant": {{"GPUSHARE_MODE": "gpu", "CUDA_VISIBLE_DEVICES": "GPU-1"}}}})
child = subprocess.Popen(["sleep", "60"])
w._take(standby)
said.append([os.read(r, 100).decode(), os.environ["GPUSHARE_MODE"]])
child.kill(); child.wait()
sys.modules["cupy"] = type(sys)("cupy")  # (as an import leaves it)
w._take(standby)
said.append([os.read(r, 100).decode(), os.environ["GPUSHARE_MODE"], os.environ["CUDA_VISIBLE_DEVICES"]])
w.wait_for_gpu(type(sys)("torch"))  # a GPU import begins: it says so once, before the import runs
w.wait_for_gpu(type(sys)("jax"))
os.set_blocking(r, False)
said.append(os.read(r, 100).decode())
import contextlib, io
w._state["reading"] = False  # a program the kernel started, after it stood by: it cannot ask, and says so
os.environ.update(GPUSHARE_MODE="standby", GPUSHARE_ROOT_PID=str(os.getppid()))
with contextlib.redirect_stderr(io.StringIO()) as err:
    w.wait_for_gpu(type(sys)("torch"))
said.append("cannot ask for one" in err.getvalue() and "in a cell of the notebook first" in err.getvalue())
print(json.dumps(said))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [
        ["kept:not-granted\n", "queued"],
        ["standby\n", "standby", "", None, False],
        ["kept:children\n", "gpu"],
        ["kept:cupy\n", "gpu", "GPU-1"],
        "using\n",
        True,
    ]
