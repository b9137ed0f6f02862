"""A student's bad day on one server: a quota of nothing, shutdown with a kernel in the queue, a full disk,
ledger files removed under running servers, a forged report, a restart that is refused.

Real jupyter-servers (in-process through pytest-jupyter, or whole processes), real kernels, real SQLite on
a real (small) tmpfs filled with dd. What must hold: no request answers 500, no kernel escapes its
quota, no record is left 'starting', nothing is overbooked, and every refusal says why.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
from pathlib import Path

import psutil
import pytest
from servers import SimulatedServer, wait_until
from tornado.httpclient import HTTPClientError

from jupyter_gpushare.host.reports import report_dir
from jupyter_gpushare.ledger.file import LedgerError
from jupyter_gpushare.ledger.ledger import read_ledger

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a small tmpfs")


# -- a quota of nothing ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "quota, why",
    [
        ("0MiB", "at least 256 MiB"),
        ("0.000001MiB", "at least 256 MiB"),
        ("100MiB", "less than the smallest a kernel may have here (256 MiB)"),
        ("1" * 5000 + "MiB", "is not a size"),
        ("١٠GiB", "is not a size"),
        (True, "is not a size"),
        (4096, "is not a size"),
    ],
    ids=["zero", "almost-zero", "below-minimum", "5000-digits", "arabic-indic", "bool", "bare-int"],
)
async def test_a_quota_below_the_minimum_or_not_a_size_is_a_400(gpushare, jp_fetch, quota, why):
    kid = await gpushare.start_kernel()
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("api", "gpushare", "kernels", kid, method="PATCH", body=json.dumps({"quota": quota}))
    assert e.value.code == 400 and why in json.loads(e.value.response.body)["message"]
    assert (await gpushare.kernel(kid))["pending_quota_mib"] is None
    await gpushare.stop_kernel(kid)


@pytest.fixture
def gpushare_config(gpushare_config, request):
    return {**gpushare_config, **getattr(request, "param", {})}


@pytest.mark.parametrize("gpushare_config", [{"kernel_quotas": {"python3": "0MiB"}}], indirect=True)
async def test_a_kernel_without_a_quota_sees_no_gpu(gpushare, jp_serverapp):
    """'No GPU' is the admin's explicit choice (a kernelspec's quota of 0): the kernel reserves nothing and
    every GPU is hidden from it, instead of all of them being visible without a cap."""
    kid = await gpushare.start_kernel()
    rec = await gpushare.kernel(kid)
    assert rec["state"] == "none" and rec["reserved_mib"] is None
    client = jp_serverapp.kernel_manager.get_kernel(kid).client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=60)
        printed: list[str] = []
        reply = await client.execute_interactive(
            "import os; print(repr(os.environ.get('CUDA_VISIBLE_DEVICES')))",
            output_hook=lambda m: printed.append(m["content"]["text"]) if m["msg_type"] == "stream" else None,
            timeout=60,
        )
        assert reply["content"]["status"] == "ok" and "".join(printed).strip() == "''"
    finally:
        client.stop_channels()
    assert (await gpushare.get("cards"))["cards"][0]["reserved_mib"] == 0
    await gpushare.stop_kernel(kid)


# -- a restart that is refused ---------------------------------------------------------------------------


@pytest.mark.parametrize("gpushare_config", [{"on_full": "reject"}], indirect=True)
async def test_a_larger_quota_on_a_full_card_is_refused_before_the_restart_not_by_it(gpushare, jp_fetch):
    """A restart once gave the reservation back and failed to get the larger one (the kernel was left 'failed').
    Now the larger quota is refused when asked for, and the restart keeps what the kernel holds."""
    kernels = [await gpushare.start_kernel() for _ in range(4)]  # 4 x 2.5 GiB: the 10 GiB card is full
    k1 = kernels[0]
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("api", "gpushare", "kernels", k1, method="PATCH", body=json.dumps({"quota": "3GiB"}))
    assert e.value.code == 409
    await jp_fetch("api", "kernels", k1, "restart", method="POST", body="{}")
    rec = await gpushare.kernel(k1)
    assert (rec["state"], rec["quota_mib"], rec["reserved_mib"]) == ("running", 2048, 2560)
    assert (await gpushare.get("cards"))["cards"][0]["reserved_mib"] == 4 * 2560
    for kid in kernels:
        await gpushare.stop_kernel(kid)
    await gpushare.wait_for(lambda: _gone(gpushare, k1), what="the kernel forgotten")


async def _gone(gpushare, kernel_id: str) -> bool:
    return await gpushare.kernel(kernel_id) is None


# -- what a kernel says about itself ---------------------------------------------------------------------


async def test_a_forged_report_is_shown_as_the_kernels_word_and_changes_nothing(gpushare, jp_serverapp):
    kid = await gpushare.start_kernel()
    pid = jp_serverapp.kernel_manager.get_kernel(kid).provisioner.pid
    forged = {
        "pid": pid, "kernel_id": kid, "root": True, "started": time.time(), "time": time.time(),
        "frameworks": {
            "torch": {"capped": True, "limit_mib": 1, "detail": "x" * 10_000},
            "jax": {"capped": "yes", "limit_mib": 1},
            "evil": {"capped": True, "limit_mib": 1, "detail": "<img src=x onerror=alert(1)>"},
        },
        "warnings": ["w"] * 1000,
    }  # fmt: skip
    Path(report_dir(), f"{kid}.{pid}.json").write_text(json.dumps(forged))
    Path(report_dir(), f"{kid}.{pid + 1}.json").write_text(json.dumps({**forged, "pid": pid + 1}) + " " * 100_000)

    async def reported():
        snap = await jp_serverapp.web_app.settings["gpushare_manager"].snapshot()
        return next(k for k in snap["kernels"] if k["kernel_id"] == kid)["frameworks"]

    frameworks = await reported()
    assert set(frameworks) == {"torch"}  # unknown names and malformed entries are dropped
    assert frameworks["torch"]["limit_mib"] == 1 and len(frameworks["torch"]["detail"]) == 500
    rec = await gpushare.kernel(kid)
    assert rec["quota_mib"] == 2048 and rec["reserved_mib"] == 2560  # what is enforced is the server's
    await gpushare.stop_kernel(kid)


async def test_a_fifo_or_a_link_named_like_a_report_stalls_nothing(gpushare, jp_serverapp, tmp_path):
    """A notebook can os.mkfifo() a file named like a report (or a simulated claim) in the report directory: a
    blocking open() of it never returns. Such names, and links to other files, are skipped at once."""
    kid = await gpushare.start_kernel()
    pid = jp_serverapp.kernel_manager.get_kernel(kid).provisioner.pid
    directory = Path(report_dir())
    (directory / f"{kid}.{pid}.json").unlink(missing_ok=True)  # (its own report, if it wrote one already)
    os.mkfifo(directory / f"{kid}.{pid}.json")
    os.mkfifo(directory / f"{kid}.{pid}.simulated")
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"pid": pid, "kernel_id": kid, "frameworks": {"torch": {"capped": True}}}))
    os.symlink(secret, directory / f"{kid}.{pid + 1}.json")
    try:
        t0 = time.monotonic()
        snap = await jp_serverapp.web_app.settings["gpushare_manager"].snapshot()
        assert time.monotonic() - t0 < 5
        (mine,) = [k for k in snap["kernels"] if k["kernel_id"] == kid]
        assert "torch" not in (mine["frameworks"] or {})  # the link's target was not read
        assert (await gpushare.kernel(kid))["state"] == "running"
        kid2 = await gpushare.start_kernel()  # and starts go on
        await gpushare.stop_kernel(kid2)
    finally:
        for name in (f"{kid}.{pid}.json", f"{kid}.{pid}.simulated", f"{kid}.{pid + 1}.json"):
            (directory / name).unlink(missing_ok=True)
    await gpushare.stop_kernel(kid)


# -- shutdown with a kernel in the queue -----------------------------------------------------------------


def test_sigterm_with_a_queued_kernel_ends_its_wait_releases_all_and_exits(tmp_path):
    # The kernels write their stderr to a file of their own: a kernel still starting when the server ends may
    # print a traceback of its own (CI saw ipykernel's "Event loop is closed" and a selector's KeyError), and
    # this test asks only that the server print none.
    spec = tmp_path / "data" / "kernels" / "own-stderr"
    spec.mkdir(parents=True)
    launch = 'exec "$0" -m ipykernel_launcher -f "$1" 2>>"$2"'
    argv = ["sh", "-c", launch, sys.executable, "{connection_file}", str(tmp_path / "kernels.log")]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "Python", "language": "python"}))
    server = SimulatedServer(tmp_path, "--GpuShareApp.default_quota=4GiB", "--GpuShareApp.queue_timeout=600")
    try:
        server.wait_ready()
        kernels = [server.call("POST", "api/kernels", {"name": "own-stderr"})["id"] for _ in range(3)]  # 2 fit
        queue = server.call("GET", "api/gpushare/queue")["queue"]
        assert [q["kernel_id"] for q in queue] == [kernels[2]]
        standin = server.call("GET", f"api/gpushare/kernels/{kernels[2]}")
        assert standin["state"] == "queued"
        processes = server.kernel_processes()  # JupyterLab may have its own children (CI saw an npm, a zombie)
        assert len(processes) == 3  # two kernels and the waiting one's stand-in
        # The three kernels finish starting first (the waiting one runs too, without a GPU), so that the
        # signal meets a server with three kernels. A kernel listens on its five ports once its imports are
        # done (the waiting one's stand-in has become its kernel by then: the same process).
        deadline = time.monotonic() + 60
        while any(len([c for c in p.net_connections() if c.status == psutil.CONN_LISTEN]) < 5 for p in processes):
            assert time.monotonic() < deadline, "the kernels never opened their ports"
            time.sleep(0.2)
        server.proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        server.proc.wait(30)
        took = time.monotonic() - t0
        output = server.output()
        assert took < 15, output[-3000:]
        gone, alive = psutil.wait_procs(processes, timeout=10)
        assert alive == [], output[-3000:]  # no kernel, and no stand-in, outlives the server
        # The server prints no traceback.
        tracebacks = output.split("Traceback")[1:]
        assert tracebacks == [], output[-3000:]
        assert " 404 " not in output, output[-3000:]
        leases, waiters = read_ledger(tmp_path / "ledger.sqlite")
        assert leases == [] and waiters == []
    finally:
        server.stop()


# -- a full disk, a ledger that vanishes ------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs for the ledger; ``fill()`` fills it with dd, ``free()`` empties it again."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")

    class Disk:
        path = disk

        def fill(self) -> None:
            subprocess.run(["dd", "if=/dev/zero", f"of={disk / 'fill'}", "bs=4k"], capture_output=True)

        def free(self) -> None:
            (disk / "fill").unlink(missing_ok=True)

    try:
        yield Disk()
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def kernel_ids(server) -> set[str]:
    return {k["id"] for k in server.call("GET", "api/kernels")}


def gpu_kernel(server, kid: str) -> dict | None:
    return next((k for k in server.call("GET", "api/gpushare/kernels")["kernels"] if k["kernel_id"] == kid), None)


@needs_root
def test_a_full_disk_never_answers_500_and_the_room_comes_back_with_the_space(tmp_path, small_disk):
    ledger = small_disk.path / "ledger.sqlite"
    server = SimulatedServer(tmp_path, f"--GpuShareApp.ledger_path={ledger}")
    try:
        server.wait_ready()
        k1 = server.call("POST", "api/kernels", {"name": "python3"})["id"]
        assert gpu_kernel(server, k1)["state"] == "running"
        small_disk.fill()
        server.call("DELETE", f"api/kernels/{k1}")  # 204, not 500: the kernel goes; its room comes back later
        assert k1 not in kernel_ids(server) and gpu_kernel(server, k1) is None
        k2 = server.call("POST", "api/kernels", {"name": "python3"})["id"]  # 201: started without a GPU, says why
        rec = gpu_kernel(server, k2)
        assert rec["state"] == "cpu" and "cannot be used now" in rec["reason"] and "df -h" in rec["reason"]
        assert [lease.kernel_id for lease in read_ledger(ledger)[0]] == [k1]  # could not be written yet
        small_disk.free()
        wait_until(lambda: not read_ledger(ledger)[0], what="k1's room given back once there is space")
        k3 = server.call("POST", "api/kernels", {"name": "python3"})["id"]
        assert gpu_kernel(server, k3)["state"] == "running"
        assert " 500 " not in server.output()
        for kid in (k2, k3):
            server.call("DELETE", f"api/kernels/{kid}")
    finally:
        server.stop()


@needs_root
def test_a_ledger_that_cannot_be_opened_at_start_is_opened_once_it_can(tmp_path, small_disk):
    small_disk.fill()  # no room even for the ledger file
    server = SimulatedServer(tmp_path, f"--GpuShareApp.ledger_path={small_disk.path / 'ledger.sqlite'}")
    try:
        server.wait_ready()
        k1 = server.call("POST", "api/kernels", {"name": "python3"})["id"]
        assert gpu_kernel(server, k1)["state"] == "cpu"
        assert server.call("GET", "api/gpushare/cards")["ledger"]["error"]
        small_disk.free()

        def admitted() -> bool:
            kid = server.call("POST", "api/kernels", {"name": "python3"})["id"]
            state = gpu_kernel(server, kid)["state"]
            server.call("DELETE", f"api/kernels/{kid}")
            return state == "running"

        wait_until(admitted, timeout=30, what="a kernel admitted on the GPU once the ledger opens")
        assert server.call("GET", "api/gpushare/cards")["ledger"]["error"] is None
    finally:
        server.stop()


def test_ledger_files_removed_under_running_servers_are_recreated_and_nothing_is_overbooked(tmp_path):
    """Two servers of one user share a ledger; its files are deleted under them. Each notices at its next
    transaction, re-creates the file at the path and enters again every reservation it knew; new
    reservations wait while the file settles, so nothing is booked twice."""
    ledger = tmp_path / "shared" / "ledger.sqlite"
    servers = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        server = SimulatedServer(
            tmp_path / name, f"--GpuShareApp.ledger_path={ledger}", "--GpuShareApp.default_quota=4GiB",
            "--GpuShareApp.on_full=reject",
        )  # fmt: skip
        servers.append(server)
    try:
        a, b = (server.wait_ready() for server in servers)
        ka = a.call("POST", "api/kernels", {"name": "python3"})["id"]
        kb = b.call("POST", "api/kernels", {"name": "python3"})["id"]  # 2 x 4.5 GiB of 10 GiB
        a.call("GET", "api/gpushare/cards")  # each has read the whole table since
        for suffix in ("", "-wal", "-shm", ".lock"):
            Path(f"{ledger}{suffix}").unlink(missing_ok=True)

        def entered_again() -> bool:
            try:
                return {x.kernel_id for x in read_ledger(ledger)[0]} == {ka, kb}
            except LedgerError:  # not there yet, or created and its tables not yet
                return False

        # Each server re-enters at its next transaction (every reconcile_interval, 0.5 s here), but one may wait for
        # the other's lock or SQLite's busy timeout (30 s) on a loaded machine: CI once took longer than 30 s.
        wait_until(
            entered_again,
            timeout=60,
            what="both reservations entered again into a re-created ledger",
        )
        with pytest.raises(urllib.error.HTTPError) as e:  # while it settles, nothing new is granted
            b.call("POST", "api/kernels", {"name": "python3"})
        assert e.value.code == 503 and "was removed or replaced" in json.loads(e.value.read())["message"]
        total = sum(x.reserved_mib for x in read_ledger(ledger)[0])
        assert total <= 10240
        assert "ledger.sqlite was removed while this process used it" in a.output() + b.output()
        config = tmp_path / "doctor_config.py"
        config.write_text(f"c.GpuShareApp.ledger_path = {str(ledger)!r}\n")
        doctor = subprocess.run(
            ["jupyter", "gpushare", "doctor", "--json", f"--config={config}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "re-created" in doctor.stdout, doctor.stdout + doctor.stderr
        with sqlite3.connect(ledger) as db:  # (the settling ends by its own clock)
            db.execute("UPDATE meta SET value = 0 WHERE key = 'settle_until'")
        with pytest.raises(urllib.error.HTTPError) as e:  # room counts both kernels again: the card is full
            a.call("POST", "api/kernels", {"name": "python3"})
        assert "No GPU has room" in json.loads(e.value.read())["message"]
        for server, kid in ((a, ka), (b, kb)):
            server.call("DELETE", f"api/kernels/{kid}")
    finally:
        for server in servers:
            server.stop()


async def test_no_record_is_left_starting_when_a_start_fails(gpushare, jp_serverapp):
    """A start that fails inside the ledger (here: its file made unwritable) starts without a GPU, says why,
    and leaves no record in 'starting'."""
    manager = jp_serverapp.web_app.settings["gpushare_manager"]

    def break_it(ledger) -> None:
        ledger._file._db.execute("PRAGMA query_only = 1")  # every write now fails, as on a full disk

    await manager.ledger.on(break_it)
    kid = await gpushare.start_kernel()
    rec = await gpushare.kernel(kid)
    assert rec["state"] == "cpu" and "cannot be used now" in rec["reason"]
    assert not [k for k in (await gpushare.get("kernels"))["kernels"] if k["state"] == "starting"]
    await gpushare.stop_kernel(kid)


@needs_root
def test_a_full_disk_while_a_kernel_waits_keeps_its_place_and_it_is_granted_after(tmp_path, small_disk):
    """The ledger cannot be written while a notebook waits (a full disk; a broker that is down takes the same
    path): the kernel stays in line, says why, and is granted once the ledger answers and room frees."""
    ledger = small_disk.path / "ledger.sqlite"
    server = SimulatedServer(tmp_path, f"--GpuShareApp.ledger_path={ledger}", "--GpuShareApp.default_quota=4GiB")
    try:
        server.wait_ready()
        full = [server.call("POST", "api/sessions", _session(f"full{i}.ipynb")) for i in range(2)]
        late = server.call("POST", "api/sessions", _session("late.ipynb"))["kernel"]["id"]
        assert gpu_kernel(server, late)["state"] == "queued"
        small_disk.fill()
        wait_until(lambda: "no GPU reservation can be made now" in (gpu_kernel(server, late)["reason"] or ""),
                   what="the kernel in line to say that the ledger cannot be asked")  # fmt: skip
        time.sleep(2)  # several turns of the line with the disk full
        assert gpu_kernel(server, late)["state"] == "queued"
        small_disk.free()
        server.call("DELETE", f"api/sessions/{full[0]['id']}")
        wait_until(lambda: gpu_kernel(server, late)["state"] == "running", timeout=30, what="the grant")
        assert gpu_kernel(server, late)["reason"] is None and " 500 " not in server.output()
    finally:
        server.stop()


def _session(path: str) -> dict:
    return {"path": path, "type": "notebook", "name": path, "kernel": {"name": "python3"}}
