"""Parking's faults on a real GPU, through a real jupyter-server (issue 46, item 3): each ends with the kernel usable
(same pid, its data intact) or ended and said, and nothing left locked in the driver.

Run on a GPU machine after `source bench/gpu/device_env.sh`, as root:

    python3 bench/gpu/check_park_faults.py OUT_DIR [--runs 1] [--cases no-room,kill-mid-park,...]

Each case runs against a fresh server (quota 30% of the card, parking only when asked: POST …/park), with a
notebook ``a`` whose kernel holds 4 GiB of known data through PyTorch (``empty_cache()`` done):

- ``no-room``: ``a`` is parked; a process outside any reservation takes all but 1 GiB of the card; ``a`` is asked
  back. It must not be restored into a full card (a restore that runs out of memory breaks the process for good:
  cuda-checkpoint#44): it stays parked and says why. Once the memory is freed, it comes back intact.
- ``no-room-cell``: as ``no-room``, but a cell that uses ``a``'s tensor asks for it back: its GPU call waits in the
  driver, so the cell must say why while it waits, and go on intact once the memory is freed.
- ``kill-mid-park`` / ``kill-mid-resume``: the server is killed (SIGKILL) while its checkpoint helper moves ``a``'s
  state (the helper's CPU time is seen rising). Nothing may stay locked or held on the card: the helper finishes
  its call, then ends a kernel it parked and nobody resumed (its server is gone); ipykernel ends a kernel whose
  server is gone anyway; one still running must be intact (checked through its own connection file). A new server
  on the same ledger then starts a kernel on the GPU.
- ``two-at-once``: ``a`` and ``b`` (4 GiB each) are parked at the same moment, then resumed at the same moment.
- ``child``: ``a`` runs a child process that holds CUDA memory: a park is refused (409) and says why.
- ``jax``: ``a`` has JAX on the card: a park is refused (not on the allow-list) and says why.
- ``host-budget``: the server's ``park_host_budget`` is 2 GiB: a park of 4 GiB is refused and says why.

The driver's state of each kernel process is read at the end of each case with the helper run once by hand
(`checkpoint.py state PID`). Every run: OUT_DIR/check_park_faults-runN.json, one record per case with ``ok``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_escapes import Server, nvml_use, run  # noqa: E402
from check_park_server import ALLOC, card_meta, session, state, wait_state  # noqa: E402

from jupyter_gpushare.host import checkpoint  # noqa: E402

SETTINGS = {"gpu_backend": "nvml", "default_quota": "30%", "park_after": 3600.0, "queue_timeout": 20,
            "over_quota_action": "notify"}  # fmt: skip
CHECK = "print(float(x[::4096].double().sum()), os.getpid())"
THIEF = r"""
import sys, time, torch
free, _ = torch.cuda.mem_get_info()
x = torch.empty(free - (1 << 30) - (600 << 20), dtype=torch.uint8, device='cuda'); x.fill_(1); torch.cuda.synchronize()
print("taken", (free >> 20) - x.numel() // 2**20, flush=True)
time.sleep(600)
"""
KILL_AFTER_S = {"park": 2.0, "resume": 0.9}  # into the checkpoint (2.6 s of 4 GiB) and the restore (1.1 s), measured
CASES = ("no-room", "no-room-cell", "kill-mid-park", "kill-mid-resume", "two-at-once", "child", "jax", "host-budget")


def driver_state(pid: int) -> str:
    """The driver's word on a process, asked by a helper run once (or ``gone``)."""
    try:
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return "gone"  # (exited; a container's init may not reap it)
    except (OSError, IndexError):
        return "gone"
    out = subprocess.run([sys.executable, "-I", "-S", checkpoint.__file__, "state", str(pid)], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    reply = json.loads(out.stdout.strip().splitlines()[-1])
    return reply["states"][str(pid)] if reply.get("ok") else f"unknown: {reply.get('error')}"


def helpers() -> list[int]:
    out = subprocess.run(["pgrep", "-f", "checkpoint.py serve"], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError):
        return 0.0


def move(server: Server, kid: str, what: str) -> tuple[int, str]:
    """POST …/park or …/resume: (HTTP status, the state it answered or the refusal's message)."""
    try:
        return 200, server.call("POST", f"api/gpushare/kernels/{kid}/{what}")["state"]
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}").get("message", "")


def loaded(server: Server, name: str) -> tuple[str, object, float, int]:
    """A notebook whose kernel holds 4 GiB: (kernel id, its client, the checksum, its pid)."""
    _, kid = session(server, f"{name}.ipynb")
    kc = server.client(kid)
    status, said = run(kc, ALLOC)
    assert status == "ok", said
    checksum, pid = said.strip().splitlines()[-1].split()  # (after any line of ours: a wait for the GPU)
    return kid, kc, float(checksum), int(pid)


def intact(kc, checksum: float, pid: int) -> dict:
    status, said = run(kc, CHECK, timeout=60)
    got = said.split()
    return {"intact": status == "ok" and float(got[0]) == checksum, "same_pid": status == "ok" and int(got[1]) == pid}


def codes(server: Server, kid: str) -> list[str]:
    with contextlib.suppress(Exception):
        return [e.get("code") or e.get("kind") for e in server.events(kid)]
    return []


def case_no_room(server: Server, work: Path) -> dict:
    a, kc, checksum, pid = loaded(server, "a")
    out: dict = {"park": move(server, a, "park"), "state_parked": driver_state(pid)}
    thief = subprocess.Popen([sys.executable, "-c", THIEF], stdout=subprocess.PIPE, text=True)
    try:
        out["thief"] = thief.stdout.readline().strip()  # type: ignore[union-attr]
        out["resume_while_full"] = move(server, a, "resume")
        out["state_while_full"] = state(server, a)
        out["driver_while_full"] = driver_state(pid)
    finally:
        thief.kill()
        thief.wait()
    time.sleep(2.0)
    out["resume_after"] = move(server, a, "resume")
    out.update(intact(kc, checksum, pid), events=codes(server, a))
    out["ok"] = (out["state_while_full"] == "parked" and out["driver_while_full"] == "checkpointed"
                 and "resume-failed" not in out["events"] and out["intact"] and out["same_pid"])  # fmt: skip
    return out


def case_no_room_cell(server: Server, work: Path) -> dict:
    """``a`` is parked; the card is filled outside any reservation; a cell of ``a`` uses its tensor. Its GPU call
    waits in the driver (the state cannot come back), so the cell must say why within its wait, and come back
    intact, same pid, once the memory is freed (the server tries again while the kernel is busy)."""
    a, kc, checksum, pid = loaded(server, "a")
    out: dict = {"park": move(server, a, "park")}
    thief = subprocess.Popen([sys.executable, "-c", THIEF], stdout=subprocess.PIPE, text=True)
    try:
        out["thief"] = thief.stdout.readline().strip()  # type: ignore[union-attr]
        msg_id = kc.execute(CHECK)
        t0 = time.monotonic()
        said, out["said_in_cell"] = cell_text(kc, msg_id, lambda text: "did not come back" in text, 60)
        out["said_after_s"] = round(time.monotonic() - t0, 2)
        out["state_while_full"], out["driver_while_full"] = state(server, a), driver_state(pid)
    finally:
        thief.kill()
        thief.wait()
    t0 = time.monotonic()
    rest, out["cell_done"] = cell_text(kc, msg_id, None, 90)
    out["done_after_freed_s"] = round(time.monotonic() - t0, 2)
    out["cell_output"] = (said + rest)[-1500:]
    got = (said + rest).strip().splitlines()[-1].split() if (said + rest).strip() else []
    out["intact"] = len(got) == 2 and float(got[0]) == checksum and int(got[1]) == pid
    out.update(state_after=state(server, a), events=codes(server, a))
    out["ok"] = (out["said_in_cell"] and out["state_while_full"] == "parked"
                 and out["driver_while_full"] == "checkpointed" and out["cell_done"] and out["intact"]
                 and out["state_after"] == "running" and "resume-failed" not in out["events"])  # fmt: skip
    return out


def cell_text(kc, msg_id: str, until, timeout: float) -> tuple[str, bool]:
    """What the cell ``msg_id`` prints, read until ``until(text)`` holds (None: until the kernel is idle again), or
    ``timeout``; and whether it did."""
    text, deadline = "", time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = kc.get_iopub_msg(timeout=1)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            text += msg["content"]["text"]
        idle = msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle"
        if (until is not None and until(text)) or (until is None and idle):
            return text, True
    return text, False


def kill_mid(server: Server, work: Path, what: str) -> dict:
    a, kc, checksum, pid = loaded(server, "a")
    out: dict = {"pid": pid}
    if what == "resume":
        out["park"] = move(server, a, "park")
    kc.stop_channels()
    helper = next(iter(helpers()), None)
    before = cpu_s(helper) if helper else 0.0

    def ask() -> None:
        try:
            out["answer"] = move(server, a, what)
        except OSError as e:  # (the server was killed meanwhile)
            out["answer"] = repr(e)

    threading.Thread(target=ask, daemon=True).start()
    t0 = time.monotonic()
    time.sleep(KILL_AFTER_S[what])  # (the driver's copy is DMA: the helper's CPU time does not show it)
    out["answered_before_kill"] = "answer" in out
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()
    out["killed_after_s"] = round(time.monotonic() - t0, 2)
    out["helper_was_working"] = bool(helper) and cpu_s(helper) - before >= 0.05
    deadline = time.monotonic() + 60
    while helpers() and time.monotonic() < deadline:
        time.sleep(0.2)
    out["helpers_left"] = len(helpers())
    out["driver_after"] = driver_state(pid)
    out["card_mib_after"] = nvml_use().get(pid) if out["driver_after"] == "running" else card_freed(pid)
    if what == "resume" and out["driver_after"] == "running":  # an orphan kernel, usable through its own file
        try:
            kc = server.client(a)
            out.update(intact(kc, checksum, pid))
            kc.stop_channels()
        except (RuntimeError, TimeoutError) as e:  # (ipykernel ends it meanwhile: its server is gone)
            out["kernel_after"] = f"{type(e).__name__}: {e}; {driver_state(pid)}"
            out["driver_after"] = driver_state(pid)
            out["card_mib_after"] = card_freed(pid)  # (read again: it held its state while it ran)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    again = Server(work, SETTINGS)  # the same ledger: the dead server's reservations must not hold the card
    try:
        b = session(again, "after.ipynb")[1]
        out["new_server_kernel"] = wait_state(again, b, "running", 60) is not None and state(again, b)
    finally:
        again.stop()
    # ipykernel ends a kernel whose server is gone ("Parent appears to have exited"), parked or not: nothing of it
    # may stay locked in the driver or held on the card; one that runs on must be intact
    settled = out["driver_after"] in ("gone", "running") and out["helpers_left"] == 0
    freed = out["driver_after"] == "running" or out["card_mib_after"] is None
    out["ok"] = settled and freed and out["new_server_kernel"] == "running" and out.get("intact", True) is True
    return out


def card_freed(pid: int, within_s: float = 15.0) -> int | None:
    """What the card shows ``pid`` holding once it has had ``within_s`` to let go (NVML lists an ended process's
    memory until the driver has torn its context down): None when it shows nothing."""
    deadline = time.monotonic() + within_s
    while (held := nvml_use().get(pid)) is not None and time.monotonic() < deadline:
        time.sleep(0.5)
    return held


def case_two_at_once(server: Server, work: Path) -> dict:
    loaded_ = [loaded(server, n) for n in ("a", "b")]
    out: dict = {}
    for what in ("park", "resume"):
        answers: dict = {}
        threads = [threading.Thread(target=lambda k=k, w=what, got=answers: got.update({k: move(server, k, w)}))
                   for k, *_ in loaded_]  # fmt: skip
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        out[what] = {"answers": list(answers.values()), "seconds": round(time.monotonic() - t0, 2),
                     "driver": [driver_state(p) for *_, p in loaded_]}  # fmt: skip
    checks = [intact(kc, checksum, pid) for _, kc, checksum, pid in loaded_]
    out["checks"] = checks
    out["ok"] = (all(a == (200, "parked") for a in out["park"]["answers"])
                 and all(a == (200, "running") for a in out["resume"]["answers"])
                 and all(c["intact"] and c["same_pid"] for c in checks))  # fmt: skip
    return out


def refused(server: Server, kid: str, kc, checksum: float, pid: int, words: str) -> dict:
    out: dict = {"park": move(server, kid, "park"), "state": state(server, kid)}
    out.update(intact(kc, checksum, pid), driver=driver_state(pid))
    out["ok"] = (out["park"][0] == 409 and words in out["park"][1] and out["state"] == "running" and out["intact"]
                 and out["driver"] == "running")  # fmt: skip
    return out


def case_child(server: Server, work: Path) -> dict:
    a, kc, checksum, pid = loaded(server, "a")
    code = ("import subprocess, sys\nchild = subprocess.Popen([sys.executable, '-c', 'import torch, time; "
            "x = torch.ones(2**26, device=\"cuda\"); torch.cuda.synchronize(); time.sleep(600)'])\n"
            "import time; time.sleep(8); print(child.poll())")  # fmt: skip
    out = {"child": run(kc, code)}
    try:
        return {**out, **refused(server, a, kc, checksum, pid, "is not parked")}
    finally:
        run(kc, "child.kill()")


def case_jax(server: Server, work: Path) -> dict:
    a, kc, checksum, pid = loaded(server, "a")
    out = {"jax": run(kc, "os.environ['XLA_PYTHON_CLIENT_PREALLOCATE'] = 'false'\nimport jax.numpy as jnp\n"
                          "y = jnp.ones(2**20); y.block_until_ready(); print(float(y.sum()))")}  # fmt: skip
    return {**out, **refused(server, a, kc, checksum, pid, "is not parked")}


def case_host_budget(server: Server, work: Path) -> dict:
    a, kc, checksum, pid = loaded(server, "a")
    return refused(server, a, kc, checksum, pid, "is not parked")


RUNNERS = {
    "no-room": (case_no_room, {}),
    "no-room-cell": (case_no_room_cell, {}),
    "kill-mid-park": (lambda s, w: kill_mid(s, w, "park"), {}),
    "kill-mid-resume": (lambda s, w: kill_mid(s, w, "resume"), {}),
    "two-at-once": (case_two_at_once, {}),
    "child": (case_child, {}),
    "jax": (case_jax, {}),
    "host-budget": (case_host_budget, {"park_host_budget": "2GiB"}),
}


def one_run(work: Path, cases: list[str], save) -> dict:
    """Each case against a fresh server; ``save(out)`` after each (a run cut short keeps what it did)."""
    out: dict = {}
    for name in cases:
        fn, extra = RUNNERS[name]
        folder = work / name
        t0 = time.monotonic()
        server = Server(folder, {**SETTINGS, **extra})
        try:
            out[name] = fn(server, folder)
        except Exception as e:  # noqa: BLE001 (recorded)
            out[name] = {"ok": False, "error": f"{type(e).__name__}: {e}",
                         "server_log_tail": (folder / "server.log").read_text()[-3000:]}  # fmt: skip
        finally:
            with contextlib.suppress(Exception):
                server.stop()
            subprocess.run(["pkill", "-9", "-f", "ipykernel_launcher"], check=False)
        out[name]["seconds"] = round(time.monotonic() - t0, 1)
        print(name, json.dumps({k: v for k, v in out[name].items() if k != "server_log_tail"})[:700], flush=True)
        out["all_ok"] = all(out[c].get("ok") for c in cases if c in out)
        out["helpers_left"] = len(helpers())  # after every case: none may be
        save(out)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--first-run", type=int, default=1)
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = card_meta(SETTINGS)
    for n in range(args.first_run, args.first_run + args.runs):
        path = out_dir / f"check_park_faults-run{n}.json"
        with tempfile.TemporaryDirectory() as work:
            head = {**meta, "run": n}
            one_run(
                Path(work),
                args.cases.split(","),
                lambda out, p=path, h=head: p.write_text(json.dumps({**h, **out}, indent=1)),
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
