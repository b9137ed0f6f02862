"""Reproduce the shared-GPU failure study on one card, with and without jupyter-gpushare.

Each job runs in a notebook kernel started through a real jupyter-server (POST /api/kernels) and
driven over the kernel websocket, the way JupyterLab does. Per job it records: admitted, queued or
failed; wait, run time; peak GPU memory of the kernel's process (NVML); and the card's totals over
time. Scenarios (same job, same job counts):

  defaults   framework defaults, no extension (JAX preallocates 75% of the card)
  growth     memory growth (PyTorch's caching allocator as is; JAX without preallocation), no extension
  gpushare   the extension with quotas (kernels that do not fit wait in the queue)
  learned    the extension with quotas learned from history: one warm-up job (with a generous quota) teaches
             its measured peak, then the batch gets that peak plus --learn-margin each (quota_from_history)
  generous   the extension with a fixed quota of twice what the last learned scenario before it learned (or
             --learned-quota-mib): a generous guess at the job's need, as an admin without history sets one

    python bench/study/harness.py --out results/ [--frameworks torch,jax] [--runs torch:growth:24,...]
    python bench/study/harness.py --simulate --out /tmp/smoke     # CPU smoke test, simulated card
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import math
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _kernels import kernels_with  # noqa: E402
from jobs import job_code  # noqa: E402

TOKEN = "study-" + uuid.uuid4().hex[:8]
EXTENSION = ("gpushare", "learned", "generous", "parking")  # the scenarios that run with the extension
CONTEXT_RESERVE_MIB = 640
HEADROOM_MIB = 1024  # the product's default card_headroom (512 until 2026-11-26: an H200's CUDA sees 616 MiB less)
# What a job allocates on top of its working set (data 188 MiB, model, allocator slack), measured
# on the H200 (bench/results/study): PyTorch peaks 6,496 MiB with a 5,487 MiB working set; JAX
# peaks ~9,000 MiB with the same, from XLA's autotuning scratch and BFC rounding.
# TensorFlow's is an estimate before its first GPU run: CUDA context, cuDNN/cuBLAS workspaces and BFC growth.
JOB_OVERHEAD_MIB = {"torch": 384, "jax": 3072, "tensorflow": 1024, "numpy": 384}


# -- the card ---------------------------------------------------------------------------------------


class Nvml:
    """Card totals and per-process memory, sampled on a thread (None when there is no GPU)."""

    def __init__(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        self.nv = pynvml
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.name = pynvml.nvmlDeviceGetName(self.handle)
        self.driver = pynvml.nvmlSystemGetDriverVersion()
        self.total_mib = pynvml.nvmlDeviceGetMemoryInfo(self.handle).total // 2**20

    def sample(self) -> tuple[int, dict[int, int], float]:
        nv = self.nv
        used = nv.nvmlDeviceGetMemoryInfo(self.handle).used // 2**20
        procs = {}
        try:
            for p in nv.nvmlDeviceGetComputeRunningProcesses(self.handle):
                procs[p.pid] = (p.usedGpuMemory or 0) // 2**20
        except nv.NVMLError:
            pass
        try:
            util = nv.nvmlDeviceGetUtilizationRates(self.handle).gpu
        except nv.NVMLError:
            util = float("nan")
        return used, procs, util


class Monitor(threading.Thread):
    def __init__(self, nvml: Nvml | None, t0: float, interval: float = 0.25):
        super().__init__(daemon=True)
        self.nvml, self.t0, self.interval = nvml, t0, interval
        self.timeline: list[dict] = []
        self.peak_by_pid: dict[int, int] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            if self.nvml is not None:
                used, procs, util = self.nvml.sample()
                for pid, mib in procs.items():
                    self.peak_by_pid[pid] = max(self.peak_by_pid.get(pid, 0), mib)
                self.timeline.append(
                    {"t": round(time.time() - self.t0, 2), "used_mib": used, "processes": len(procs), "util": util}
                )
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join(5)


# -- the server -------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A jupyter-server subprocess, with or without the extension, in its own temp dirs."""

    def __init__(self, with_extension: bool, gpushare: dict, env: dict[str, str], workdir: Path, connections: int = 6):
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="study-", dir=workdir))
        for sub in ("config", "data", "runtime", "root"):
            (self.dir / sub).mkdir()
        config = {"ServerApp": {"jpserver_extensions": {"jupyter_gpushare": with_extension}}}
        if with_extension:
            config["GpuShareApp"] = {"ledger_path": str(self.dir / "ledger.sqlite"), **gpushare}
        (self.dir / "config" / "jupyter_server_config.json").write_text(json.dumps(config))
        self.env = {
            **os.environ,
            **env,
            "JUPYTER_CONFIG_DIR": str(self.dir / "config"),
            "JUPYTER_DATA_DIR": str(self.dir / "data"),
            "JUPYTER_RUNTIME_DIR": str(self.dir / "runtime"),
        }
        self.log = open(self.dir / "server.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", "--allow-root", f"--port={self.port}", f"--IdentityProvider.token={TOKEN}",
             "--ServerApp.open_browser=False", f"--ServerApp.root_dir={self.dir / 'root'}",
             "--ServerApp.shutdown_no_activity_timeout=0", "--MappingKernelManager.cull_idle_timeout=0"],
            env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{self.port}"
        # As a browser talks to one server: at most `connections` HTTP requests at a time (websockets apart).
        self.http = AsyncHTTPClient(force_instance=True, max_clients=connections)

    async def call(self, method: str, path: str, body: dict | None = None, timeout: float = 60):
        r = await self.http.fetch(
            HTTPRequest(f"{self.url}/{path}", method=method, headers={"Authorization": f"token {TOKEN}"},
                        body=json.dumps(body) if body is not None else None, request_timeout=timeout, allow_nonstandard_methods=True)
        )  # fmt: skip
        return json.loads(r.body) if r.body else None

    async def wait_warm(self, count: int, library: str | None, timeout: float = 600) -> None:
        """Until the server's warm pool holds ``count`` kernels (with ``library``, e.g. libtorch, loaded in each)."""
        deadline = time.monotonic() + timeout
        while kernels_with(self.proc.pid, library) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the warm pool did not fill: {kernels_with(self.proc.pid, library)} of {count}")
            await asyncio.sleep(0.5)

    async def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {(self.dir / 'server.log').read_text()[-3000:]}")
            try:
                await self.call("GET", "api/status", timeout=5)
                return
            except (ConnectionError, OSError, HTTPClientError):
                await asyncio.sleep(0.3)
        raise RuntimeError("server did not start")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


# -- one job ------------------------------------------------------------------------------------------


@dataclass
class Job:
    index: int
    attempt: int = 0  # 0: the batch; 1, 2...: run again after the others, as a student reruns a failed job
    requested: float = 0.0
    admitted: float | None = None
    finished: float | None = None
    deleted: float | None = None  # its kernel's DELETE answered (jupyter_server: once the kernel is shut down)
    kernel_id: str | None = None
    pid: int | None = None
    status: str = "pending"  # ok | failed | refused
    error: str | None = None
    wait_s: float | None = None
    run_s: float | None = None
    job_s: float | None = None  # as timed inside the kernel
    peak_mib: int | None = None
    output: list[str] = field(default_factory=list)
    first_output: float | None = None  # the cell's first output (a cell held for a resume waits for it)
    gpu_at: float | None = None  # its first GPU operation done (the job's "GPU" line; PyTorch and simulated NumPy)
    # the idle study: the first run's own time and end, when the job ran again, and how long that cell waited
    first_s: float | None = None
    first_done: float | None = None
    again: float | None = None
    again_wait_s: float | None = None


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


async def run_job(server: Server, job: Job, code: str, t0: float, timeout: float, idle: Idle | None = None) -> None:
    """One student: a kernel, the job in it; with ``idle``, the notebook then sits idle and runs the job again in
    the same kernel (its state kept), and the kernel goes only after that."""
    job.requested = time.time() - t0
    try:
        model = await server.call("POST", "api/kernels", {"name": "python3"}, timeout=timeout)
    except HTTPClientError as e:
        job.status, job.error = "refused", _message(e)
        return
    job.kernel_id = model["id"]  # at once: a kernel in line runs; its first GPU import waits for the grant
    session = uuid.uuid4().hex
    try:
        ws = await websocket_connect(
            HTTPRequest(f"ws://127.0.0.1:{server.port}/api/kernels/{job.kernel_id}/channels?session_id={session}",
                        headers={"Authorization": f"token {TOKEN}"}, connect_timeout=timeout, request_timeout=timeout)
        )  # fmt: skip
    except (HTTPClientError, OSError, asyncio.TimeoutError) as e:
        job.status, job.error = "failed", f"could not connect to the kernel: {e}"
        return
    deadline = time.monotonic() + timeout
    start = time.time() - t0
    reply = await run_cell(server, ws, session, code, job, t0, deadline)
    if idle is not None:
        await granted_at(server, job, t0)  # (before a parked kernel's resume is granted too)
    if idle is not None and job.status == "pending" and reply and reply.get("status") == "ok":
        job.first_s, job.first_done = job.job_s, time.time() - t0
        job.job_s = None
        idle.since[job.kernel_id] = time.time()
        await asyncio.sleep(idle.seconds)
        job.again = time.time() - t0
        del idle.since[job.kernel_id]
        job.first_output = None
        reply = await run_cell(server, ws, session, code, job, t0, time.monotonic() + timeout)
        if job.first_output is not None:  # a parked kernel's cell waits for its resume (the server holds it)
            job.again_wait_s = round(job.first_output - job.again, 2)
    ws.close()
    job.finished = time.time() - t0
    try:  # the job is over: its kernel goes, as the study's container did (first: the room goes to the next)
        await server.call("DELETE", f"api/kernels/{job.kernel_id}")
    except (HTTPClientError, OSError):
        pass  # a kernel that died is already gone
    job.deleted = time.time() - t0
    if idle is None:  # (the figures after the room is given back: their request no longer delays the next grant)
        await granted_at(server, job, t0)
    job.run_s = round(job.finished - start, 2)
    if job.status == "pending":
        job.status = "ok" if reply and reply.get("status") == "ok" and job.job_s is not None else "failed"


async def run_cell(server: Server, ws, session: str, code: str, job: Job, t0: float, deadline: float) -> dict | None:
    """Run ``code`` in the job's kernel as a notebook's cell; its execute_reply, or None (``job`` says why)."""
    msg_id = uuid.uuid4().hex
    header = {"msg_id": msg_id, "username": "study", "session": session, "msg_type": "execute_request",
              "version": "5.3", "date": datetime.now(timezone.utc).isoformat()}  # fmt: skip
    content = {"code": code, "silent": False, "store_history": False, "user_expressions": {}, "allow_stdin": False,
               "stop_on_error": True}  # fmt: skip
    message = {"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": "shell",
               "buffers": []}  # fmt: skip
    await ws.write_message(json.dumps(message))
    reply, idle, pending = None, False, ""
    try:
        while not (reply and idle):
            raw = await asyncio.wait_for(ws.read_message(), max(1.0, deadline - time.monotonic()))
            if raw is None:  # the server shut the kernel down: its wait ended (refused), or it died
                refused = await refusal(server, job.kernel_id)
                job.status = "refused" if refused else "failed"
                job.error = refused or "the kernel's connection closed (kernel died)"
                return None
            msg = json.loads(raw)
            kind, body = msg["header"]["msg_type"], msg["content"]
            if kind == "status" and body.get("execution_state") in ("restarting", "dead"):
                job.status = "failed"
                job.error = f"the kernel died ({body['execution_state']}): {job.error or 'no Python error'}"
                return None
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if job.admitted is None:
                job.admitted = time.time() - t0  # the kernel runs the job (a kernel in line: see granted_at)
                job.wait_s = round(job.admitted - job.requested, 2)
            if kind == "stream":  # the kernel flushes on a timer, so one print can arrive in pieces
                if job.first_output is None:
                    job.first_output = time.time() - t0
                pending += body["text"]
                *lines, pending = pending.split("\n")
                for line in lines:
                    job.output.append(line)
                    if line.startswith("PID "):
                        job.pid = int(line.split()[1])
                    if line.startswith("GPU ") and job.gpu_at is None:
                        job.gpu_at = time.time() - t0
                    if line.startswith("DONE "):
                        job.job_s = float(line.split()[1])
            elif kind == "error":
                job.error = f"{body['ename']}: {body['evalue']}"[:400]
            elif kind == "execute_reply":
                reply = body
            elif kind == "status" and body["execution_state"] == "idle":
                idle = True
    except asyncio.TimeoutError:
        job.status, job.error = "failed", "no reply in time"
        return None
    return reply


@dataclass
class Idle:
    """The idle study: how long each notebook sits idle between its two runs, and who is idle now."""

    seconds: float
    since: dict[str, float] = field(default_factory=dict)  # kernel id -> (Unix time) idle since
    held_mib_s: float = 0.0  # reserved MiB × seconds held by idle kernels (idle_held)
    held_waited_mib_s: float = 0.0  # the same while a kernel waited in line
    cpu_jobs: list = field(default_factory=list)  # the students whose notebooks never touch the GPU
    cpu_held_waited_mib_s: float = 0.0  # reserved MiB × seconds held by those while a kernel waited in line


async def granted_at(server: Server, job: Job, t0: float) -> None:
    """A kernel that waited in line: its wait is until it was granted its GPU (the server's first 'admitted' event
    for it). The kernel itself runs from the start: its job's first output is not the grant, its first GPU import
    waits for it. A kernel that never waited keeps its first output as its start."""
    try:
        events = (await server.call("GET", "api/gpushare/events"))["events"]
    except (HTTPClientError, OSError, ValueError, KeyError):
        return
    times = [e["time"] for e in events if e.get("kernel_id") == job.kernel_id and e["kind"] == "admitted"]
    if times:
        job.admitted = times[0] - t0
        job.wait_s = round(job.admitted - job.requested, 2)


async def refusal(server: Server, kernel_id: str) -> str | None:
    """Why the extension refused a kernel that waited (its event), or None."""
    try:
        events = (await server.call("GET", "api/gpushare/events"))["events"]
    except (HTTPClientError, OSError, ValueError, KeyError):
        return None
    said = [e["message"] for e in events if e.get("kernel_id") == kernel_id and e["kind"] in ("refused", "cancelled")]
    return said[-1] if said else None


def _message(e: HTTPClientError) -> str:
    try:
        return json.loads(e.response.body)["message"]
    except Exception:
        return str(e)


# -- one scenario -------------------------------------------------------------------------------------


async def run_scenario(args, nvml: Nvml | None, framework: str, scenario: str, n_jobs: int, sizing: dict) -> dict:
    env = {"PYTHONUNBUFFERED": "1"}
    if framework == "jax" and scenario == "growth":
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    gpushare = {
        "default_quota": f"{sizing['quota_mib']}MiB",
        "context_reserve": f"{CONTEXT_RESERVE_MIB}MiB",
        "card_headroom": f"{HEADROOM_MIB}MiB",
        "on_full": args.on_full,
        "queue_timeout": args.job_timeout,
        "queue_max_per_user": 0,  # one user runs the whole class here
    }
    if scenario == "generous":
        gpushare["default_quota"] = f"{2 * sizing['learned_quota_mib']}MiB"
    if args.idle and scenario in EXTENSION:  # the idle study: parking on (its scenario) or off (the others)
        gpushare["park_after"] = args.park_after if scenario == "parking" else 0
    if scenario in EXTENSION:
        gpushare["line_place"] = args.line_place
        if args.warm:  # warm kernels (issue 48): the class's first kernels are handed over, started ahead
            gpushare.update(warm_kernels=args.warm, warm_imports=[m for m in args.warm_imports.split(",") if m])
    if scenario == "learned":  # the warm-up runs at a quarter of the card, so its peak is not cut by the quota
        gpushare.update(
            quota_from_history=True, history_margin=args.learn_margin, default_quota=f"{sizing['card_mib'] // 4}MiB"
        )
    if args.simulate:
        gpushare.update(gpu_backend="simulated", simulated_cards=f"{sizing['card_mib']}MiB", sample_interval=0.25)
    server = Server(scenario in EXTENSION, gpushare, env, Path(args.workdir), args.connections)
    label = f"{framework}/{scenario}/{n_jobs}"
    print(f"[{label}] starting server", flush=True)
    jobs: list[Job] = []
    cpu_jobs: list[Job] = []
    attempts: list[Job] = []
    try:
        await server.wait_ready()
        if args.warm and scenario in EXTENSION:
            await server.wait_warm(args.warm, "libtorch" if "torch" in args.warm_imports.split(",") else None)
        code = job_code(
            framework, sizing["ws_mib"][framework], epochs=args.epochs, n=args.images, growth=scenario != "defaults",
            free_scratch=bool(args.idle),
        )  # fmt: skip
        idle = Idle(args.idle) if args.idle else None
        warmup = None
        if scenario == "learned":  # one job alone teaches the peak (recorded when its kernel is shut down)
            warmup = Job(-1)
            await run_job(server, warmup, code, time.time(), args.job_timeout)
            print(f"[{label}] warm-up: {warmup.status} in {warmup.run_s} s", flush=True)
            await settled(server)
        t0 = time.time()
        monitor = Monitor(nvml, t0)
        monitor.start()
        jobs = [Job(i) for i in range(n_jobs)]
        # students whose notebooks never touch the GPU (a NumPy job), their notebooks opened among the others'
        cpu_jobs = [Job(n_jobs + i) for i in range(args.cpu_students)]
        cpu_code = job_code("numpy", 0, epochs=args.cpu_epochs, n=args.images, free_scratch=bool(args.idle))
        order = sorted([(j.index, j, code) for j in jobs] + [((i + 0.5) * n_jobs / max(1, len(cpu_jobs)), j, cpu_code)
                        for i, j in enumerate(cpu_jobs)], key=lambda o: o[0])  # fmt: skip
        if idle is not None:
            idle.cpu_jobs = cpu_jobs
        quotas = asyncio.ensure_future(kernel_quotas(server, scenario))
        held = asyncio.ensure_future(idle_held(server, idle)) if idle and scenario in EXTENSION else None
        await asyncio.gather(*(run_job(server, j, c, t0, args.job_timeout, idle) for _, j, c in order))
        if held is not None:
            held.cancel()
        batch_s = round(time.time() - t0, 2)
        # said now, not only in the summary: a run cut during its reruns still tells why the batch failed
        if quotas.done():
            print(f"[{label}] quotas: {quotas.result()}", flush=True)
        for err in sorted({(j.error or "")[:160] for j in jobs if j.status != "ok"})[:3]:
            print(f"[{label}]   batch error: {err}", flush=True)
        attempts = list(jobs)
        for attempt in range(1, args.reruns + 1):  # failed jobs again, together, after the others
            again = [Job(j.index, attempt) for j in attempts if j.attempt == attempt - 1 and j.status != "ok"]
            if not again:
                break
            print(f"[{label}] rerun {attempt}: {len(again)} failed jobs again", flush=True)
            await asyncio.gather(*(run_job(server, j, code, t0, args.job_timeout, idle) for j in again))
            attempts += again
        monitor.stop()
        events = []
        if scenario in EXTENSION:
            events = (await server.call("GET", "api/gpushare/events"))["events"]
        for j in attempts:
            j.peak_mib = monitor.peak_by_pid.get(j.pid) if j.pid else None
    finally:
        server.stop()
        if any(j.status != "ok" for j in attempts):  # keep the server's log to explain the failures
            shutil.copy(server.dir / "server.log", Path(args.out) / f"server-{label.replace('/', '-')}.log")
        shutil.rmtree(server.dir, ignore_errors=True)
    await drain(nvml)
    ok = [j for j in jobs if j.status == "ok"]
    run_times = sorted(j.job_s for j in ok)
    # wave 1: the jobs granted without a place in line; the later waves: those that waited (grant -> done each)
    in_line = {e.get("kernel_id") for e in events if e["kind"] == "queued"}
    waves = [
        sorted(j.finished - j.admitted for j in ok if j.admitted is not None and (j.kernel_id in in_line) == later)
        for later in (False, True)
    ]
    done = {j.index: j.finished for j in attempts if j.status == "ok"}
    first_wave = [j for j in ok if j.kernel_id not in in_line and j.requested is not None]
    # when the server gave each kernel's reservation back (its event): the hand-off's middle (study/waves.py)
    released = {e.get("kernel_id"): round(e["time"] - t0, 3) for e in events if e["kind"] == "released"}
    result = {
        "framework": framework,
        "scenario": scenario,
        "jobs": n_jobs,
        "fit": sizing["fit"],
        "ok": len(ok),
        "failed": sum(j.status == "failed" for j in jobs),
        "refused": sum(j.status == "refused" for j in jobs),
        "queued": [e["kind"] for e in events].count("queued"),  # only the extension queues
        "max_wait_s": max((j.wait_s or 0 for j in jobs), default=0),
        "total_s": batch_s,
        # the figure users live by: until every job has finished successfully, failed ones rerun after the others
        "reruns": len(attempts) - len(jobs),
        "rerun_rounds": max((j.attempt for j in attempts), default=0),
        "never_ok": n_jobs - len(done),
        "all_ok_s": round(max(done.values()), 2) if len(done) == n_jobs else None,
        "run_s_min": run_times[0] if run_times else None,
        "run_s_median": run_times[len(run_times) // 2] if run_times else None,
        "run_s_max": run_times[-1] if run_times else None,
        "wave1_grant_to_done_median_s": round(waves[0][len(waves[0]) // 2], 2) if waves[0] else None,
        "later_grant_to_done_median_s": round(waves[1][len(waves[1]) // 2], 2) if waves[1] else None,
        "first_grant_s": round(min((j.admitted for j in ok if j.admitted is not None), default=0.0), 3),
        # wave 1 (no place in line): from the request of its kernel to the job's first output, as a notebook's
        # first cell's answer, and to its first GPU operation done
        "open_to_first_output_median_s": _median([j.first_output - j.requested for j in first_wave if j.first_output]),
        "open_to_gpu_op_median_s": _median([j.gpu_at - j.requested for j in first_wave if j.gpu_at]),
        "warm_kernels": args.warm if scenario in EXTENSION else 0,
        "max_concurrent_processes": max((s["processes"] for s in monitor.timeline), default=None),
        "peak_card_used_mib": max((s["used_mib"] for s in monitor.timeline), default=None),
        "errors": sorted({(j.error or "")[:160] for j in attempts if j.status != "ok"}),
        "events": [e["kind"] for e in events],
        "event_messages": [
            f"{e['kind']}: {e['message']}" for e in events if e["kind"] in ("learned", "queued", "refused")
        ],
        "quotas": quotas.result() if quotas.done() else None,
        "warmup": {k: v for k, v in asdict(warmup).items() if k != "output"} | {"output_tail": warmup.output[-3:]}
        if warmup
        else None,
        "per_job": [
            {k: v for k, v in asdict(j).items() if k != "output"}
            | {"output_tail": j.output[-3:], "released": released.get(j.kernel_id)}
            for j in attempts
        ],
        "timeline": monitor.timeline,
    }
    if args.idle:
        result.update(idle_figures(jobs, events, idle, sizing["fit"], args.idle, result["all_ok_s"]))
        result["moves"] = moves(jobs, events, t0, cpu_jobs)
    result["line_place"] = args.line_place if scenario in EXTENSION else None
    if cpu_jobs:
        result["cpu_students"] = cpu_figures(cpu_jobs, events, idle)
        print(f"[{label}] students without a GPU: { {k: v for k, v in result['cpu_students'].items() if k != 'per_job'} }",
              flush=True)  # fmt: skip
    if args.idle:
        print(f"[{label}] idle {args.idle} s: held by idle kernels {result['idle_held_gib_h']} GiB-h "
              f"({result['idle_held_while_waited_gib_h']} while one waited), parked "
              f"{result['parked']}, resumed {result['resumed']}, ideal {result['ideal_s']} s, "
              f"{result['of_ideal']} of it", flush=True)  # fmt: skip
    print(f"[{label}] ok {result['ok']}, failed {result['failed']}, refused {result['refused']}, queued {result['queued']}, "
          f"batch {batch_s} s, every job ok after {result['reruns']} reruns: {result['all_ok_s']} s, run {result['run_s_min']}..{result['run_s_max']} s, peak card {result['peak_card_used_mib']} MiB", flush=True)  # fmt: skip
    for err in result["errors"][:3]:
        print(f"[{label}]   error: {err}", flush=True)
    return result


async def idle_held(server: Server, idle: Idle, every: float = 1.0) -> None:
    """Reserved MiB × seconds held by kernels while their notebook sits idle (not parked, not in line), read from
    the server's API every ``every`` s until cancelled; the sum is in ``idle.held_mib_s``."""
    idle.held_mib_s = 0.0
    last = time.time()
    while True:
        await asyncio.sleep(every)
        try:
            kernels = (await server.call("GET", "api/gpushare/kernels", timeout=10))["kernels"]
        except (HTTPClientError, OSError, ValueError, KeyError):
            continue
        now = time.time()
        held = sum(k.get("reserved_mib") or 0 for k in kernels if k["kernel_id"] in idle.since)
        cpu = {j.kernel_id for j in idle.cpu_jobs}
        cpu_held = sum(k.get("reserved_mib") or 0 for k in kernels if k["kernel_id"] in cpu)
        idle.held_mib_s += held * (now - last)
        if any(k["state"] == "queued" for k in kernels):  # what it costs: held while someone waits
            idle.held_waited_mib_s += held * (now - last)
            idle.cpu_held_waited_mib_s += cpu_held * (now - last)
        last = now


def idle_figures(jobs: list[Job], events: list[dict], idle: Idle | None, fit: int, idle_s: float,
                 all_ok_s: float | None) -> dict:  # fmt: skip
    """The idle study's figures: what idle kernels held, the parks and resumes, and the shortest schedule (every
    switch free) against the time until every job was ok."""
    kinds = [e["kind"] for e in events]
    ok = [j for j in jobs if j.status == "ok" and j.first_done is not None and j.again is not None]
    # each run's time on the card: from its grant (or first output) to its end; the second from its resume
    first = sorted(j.first_done - j.admitted for j in ok if j.admitted is not None)
    second = sorted(j.finished - j.again - (j.again_wait_s or 0) for j in ok)
    ideal = ideal_schedule(len(jobs), fit, first[len(first) // 2], second[len(second) // 2], idle_s) if ok else None
    params = [e.get("params") or {} for e in events]
    parks = [p["park_s"] for p, k in zip(params, kinds) if k == "parked" and "park_s" in p]
    resumes = [p["resume_s"] for p, k in zip(params, kinds) if k == "resumed" and "resume_s" in p]
    waits = sorted(j.again_wait_s for j in ok if j.again_wait_s is not None)
    return {
        "idle_s": idle_s,
        "idle_held_gib_h": round((idle.held_mib_s if idle else 0) / 1024 / 3600, 4),
        "idle_held_while_waited_gib_h": round((idle.held_waited_mib_s if idle else 0) / 1024 / 3600, 4),
        "parked": kinds.count("parked"),
        "park_failed": kinds.count("park-failed"),
        "resumed": kinds.count("resumed"),
        "resume_failed": kinds.count("resume-failed"),
        "park_s": [min(parks), sorted(parks)[len(parks) // 2], max(parks)] if parks else None,
        "resume_s": [min(resumes), sorted(resumes)[len(resumes) // 2], max(resumes)] if resumes else None,
        "again_wait_s": [waits[0], waits[len(waits) // 2], waits[-1]] if waits else None,
        "run1_s_median": round(first[len(first) // 2], 2) if first else None,
        "run2_s_median": round(second[len(second) // 2], 2) if second else None,
        "ideal_s": round(ideal, 2) if ideal else None,
        "of_ideal": round(ideal / all_ok_s, 3) if ideal and all_ok_s else None,
    }


def cpu_figures(cpu_jobs: list[Job], events: list[dict], idle: Idle | None) -> dict:
    """The students whose notebooks never touch the GPU: how many were ok and when, how many of their kernels held
    a GPU place at some time (``line_place`` 'start' gives each one), and what they held while a kernel waited."""
    ids = {j.kernel_id for j in cpu_jobs}
    placed = {e.get("kernel_id") for e in events if e["kind"] in ("reserved", "admitted")} & ids
    ok = [j for j in cpu_jobs if j.status == "ok"]
    return {
        "students": len(cpu_jobs),
        "ok": len(ok),
        "all_ok_s": round(max(j.finished for j in ok), 2) if len(ok) == len(cpu_jobs) else None,
        "got_a_gpu_place": len(placed),
        "stood_by": sum(1 for e in events if e["kind"] == "stood-by" and e.get("kernel_id") in ids),
        "held_while_waited_gib_h": round((idle.cpu_held_waited_mib_s if idle else 0) / 1024 / 3600, 4),
        "per_job": [{k: v for k, v in asdict(j).items() if k != "output"} for j in cpu_jobs],
    }


MOVE_FIGURES = ("park_s", "resume_s", "waited_s", "lock", "checkpoint", "restore", "unlock", "parked_mib", "held_s")


def moves(jobs: list[Job], events: list[dict], t0: float, cpu_jobs: Sequence[Job] = ()) -> list[dict]:
    """Each park, resume, stand-by and grant as the server told it: when (s after the class began), whose job (a
    CPU-only student's: ``cpu<n>``), and the figures of the move (its steps' seconds): where a wave change's time
    goes."""
    job_of: dict[str | None, int | str] = {j.kernel_id: j.index for j in jobs}
    job_of.update({j.kernel_id: f"cpu{j.index}" for j in cpu_jobs})
    return [
        {"at": round(e["time"] - t0, 2), "kind": e["kind"], "job": job_of.get(e.get("kernel_id"))}
        | {k: v for k, v in (e.get("params") or {}).items() if k in MOVE_FIGURES}
        for e in events
        if e["kind"] in ("parked", "park-failed", "resumed", "admitted", "stood-by")
    ]


def ideal_schedule(students: int, fit: int, run1: float, run2: float, idle_s: float) -> float:
    """The shortest time for ``students`` each to run a job (``run1`` s), sit idle ``idle_s``, and run it again
    (``run2`` s), ``fit`` at a time on the card, with every switch free (no start, park or resume cost): first
    come, first served among the ready. The idle study's ideal waves."""
    ready = [(0.0, i, 1) for i in range(students)]  # (ready at, student, which run)
    slots = [0.0] * fit  # when each slot is free
    end = 0.0
    while ready:
        ready.sort()
        at, student, run = ready.pop(0)
        slots.sort()
        begin = max(at, slots[0])
        slots[0] = begin + (run1 if run == 1 else run2)
        end = max(end, slots[0])
        if run == 1:
            ready.append((slots[0] + idle_s, student, 2))
    return end


async def settled(server: Server, timeout: float = 15) -> None:
    """Until the card shows no memory used outside reservations: the warm-up's process has gone from the
    usage samples (until then its memory counts as taken, as any process without a reservation does)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cards = (await server.call("GET", "api/gpushare/cards"))["cards"]
        if all(not c.get("outside_mib") for c in cards):
            return
        await asyncio.sleep(0.25)


async def kernel_quotas(server: Server, scenario: str, timeout: float = 30) -> dict | None:
    """What the server gave the batch's first running kernels: their quotas and where each came from."""
    if scenario not in EXTENSION:
        return None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        try:
            kernels = (await server.call("GET", "api/gpushare/kernels"))["kernels"]
        except (HTTPClientError, OSError) as e:
            return {"error": str(e)}
        running = [k for k in kernels if k.get("quota_mib") and k.get("state") != "queued"]
        if running:
            seen = sorted({(k["quota_mib"], k.get("quota_source")) for k in running}, key=str)
            peaks = sorted({k.get("learned_peak_mib") for k in running} - {None})
            return {"quota_mib_and_source": seen, "learned_peak_mib": peaks}
    return None


async def drain(nvml: Nvml | None, timeout: float = 30) -> None:
    """Wait until the card is back to (almost) empty, so one scenario does not bleed into the next."""
    deadline = time.monotonic() + timeout
    while nvml is not None and time.monotonic() < deadline:
        _, procs, _ = nvml.sample()
        if not procs:
            return
        await asyncio.sleep(0.5)


def sizing_for(card_mib: int, fit: int) -> dict:
    """Reservation per job so that `fit` jobs fill the card (less headroom), and the job's working set."""
    reservation = (card_mib - HEADROOM_MIB) // fit
    quota = reservation - CONTEXT_RESERVE_MIB
    ws = {fw: max(0, quota - overhead) for fw, overhead in JOB_OVERHEAD_MIB.items()}
    return {"card_mib": card_mib, "fit": fit, "reservation_mib": reservation, "quota_mib": quota, "ws_mib": ws}


def learned_quota_mib(results: list[dict], framework: str) -> int | None:
    """The largest quota the last learned scenario of ``framework`` gave its kernels (from what it learned)."""
    for r in reversed(results):
        if r.get("framework") == framework and r.get("scenario") == "learned":
            quotas = (r.get("quotas") or {}).get("quota_mib_and_source") or []
            learned = [mib for mib, source in quotas if source == "learned"]
            return max(learned) if learned else None
    return None


def parse_runs(text: str) -> list[tuple[str, str, float]]:
    """'torch:growth:1.1,jax:defaults:1' -> [(framework, scenario, factor of the fitting job count)]."""
    runs = []
    for item in filter(None, text.split(",")):
        fw, sc, factor = item.split(":")
        runs.append((fw, sc, float(factor)))
    return runs


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for results.json, jobs.csv and the log")
    ap.add_argument(
        "--runs",
        default="jax:defaults:1,torch:growth:1.1,torch:growth:1.2,torch:gpushare:1.1,torch:gpushare:1.2,jax:growth:1.2,jax:gpushare:1.2",
    )
    ap.add_argument(
        "--fit", type=int, default=22, help="jobs that fit the card's memory (the study: 23 of 1,205 MiB on 24 GiB)"
    )
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--images", type=int, default=60000)
    ap.add_argument("--job-timeout", type=float, default=300)
    ap.add_argument(
        "--budget", type=float, default=0, help="stop starting new scenarios after this many seconds (0 = none)"
    )
    ap.add_argument("--learn-margin", type=float, default=0.1, help="learned scenario: the margin on the learned peak")
    ap.add_argument(
        "--learned-quota-mib",
        type=int,
        default=0,
        help="generous scenario: the learned quota, if no learned run before",
    )
    ap.add_argument(
        "--on-full", default="queue", choices=["queue", "reject"], help="the extension's on_full: wait or refuse"
    )
    ap.add_argument("--reruns", type=int, default=3, help="rounds of running failed jobs again after the others")
    ap.add_argument(
        "--simulate",
        action="store_true",
        help="CPU smoke test: simulated card, NumPy and TensorFlow (CPU) jobs, small counts",
    )
    ap.add_argument(
        "--runs-simulated", default="numpy,tensorflow", help="with --simulate: FRAMEWORK[:SCENARIO],... (gpushare)"
    )
    ap.add_argument("--workdir", default=tempfile.gettempdir())
    ap.add_argument("--connections", type=int, default=6, help="HTTP requests at a time to the server (a browser: 6)")
    ap.add_argument("--idle", type=float, default=0, help="the idle study: each notebook runs its job, sits idle "
                    "this many seconds, and runs it again (0: one run)")  # fmt: skip
    ap.add_argument("--park-after", type=float, default=15, help="the idle study's parking scenario: park_after")
    ap.add_argument("--line-place", default="start", choices=("start", "first-use"), help="GpuShareApp.line_place")
    ap.add_argument("--cpu-students", type=int, default=0, help="more students, whose notebooks never touch the GPU "
                    "(a NumPy job), opened among the others'")  # fmt: skip
    ap.add_argument("--cpu-epochs", type=int, default=20, help="the NumPy job's epochs (--cpu-students)")
    ap.add_argument("--warm", type=int, default=0, help="GpuShareApp.warm_kernels (the extension's scenarios)")
    ap.add_argument("--warm-imports", default="", help="GpuShareApp.warm_imports, comma-separated, e.g. torch")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.simulate:
        nvml, card_mib, device = None, 4096 + HEADROOM_MIB, "simulated card (no GPU): harness smoke test"
        runs = [(*(item.split(":") + ["gpushare"])[:2], 1.5) for item in args.runs_simulated.split(",")]
        args.fit = 2
    else:
        nvml = Nvml()
        card_mib, device = nvml.total_mib, f"{nvml.name} ({nvml.total_mib} MiB), driver {nvml.driver}"
        runs = parse_runs(args.runs)
    sizing = sizing_for(card_mib, args.fit)
    print(f"device: {device}; sizing: {sizing}", flush=True)
    started = time.monotonic()
    results = []
    for framework, scenario, factor in runs:
        if args.budget and time.monotonic() - started > args.budget:
            results.append({"framework": framework, "scenario": scenario, "skipped": "time budget spent"})
            continue
        n = max(1, math.ceil(args.fit * factor - 0.5)) if scenario != "defaults" else args.fit
        if scenario == "generous":
            learned = learned_quota_mib(results, framework) or args.learned_quota_mib
            if not learned:
                results.append({"framework": framework, "scenario": scenario, "skipped": "no learned quota known"})
                continue
            sizing = {**sizing, "learned_quota_mib": learned}
        results.append(await run_scenario(args, nvml, framework, scenario, n, sizing))
        write(out, device, sizing, args, results)
    write(out, device, sizing, args, results)
    return 0


def write(out: Path, device: str, sizing: dict, args, results: list[dict]) -> None:
    doc = {
        "study": "shared-GPU failure study, reproduced with and without jupyter-gpushare",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "host": f"{platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "sizing": sizing,
        "job": {"epochs": args.epochs, "images": args.images, "batch": 32},
        "results": results,
    }
    (out / "results.json").write_text(json.dumps(doc, indent=1))
    with open(out / "jobs.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "framework",
                "scenario",
                "jobs",
                "job",
                "attempt",
                "status",
                "wait_s",
                "run_s",
                "job_s",
                "peak_mib",
                "error",
            ]
        )
        for r in results:
            for j in r.get("per_job", []):
                w.writerow(
                    [
                        r["framework"],
                        r["scenario"],
                        r["jobs"],
                        j["index"],
                        j["attempt"],
                        j["status"],
                        j["wait_s"],
                        j["run_s"],
                        j["job_s"],
                        j["peak_mib"],
                        j["error"] or "",
                    ]
                )


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
