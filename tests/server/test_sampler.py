"""The sampler on the fake NVML: attribution through real process trees, vanished processes,
a card lost mid-run, no NVML at all, fields the driver does not support, peaks."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest
from jupyter_server.services.kernels.kernelmanager import ServerKernelManager

from jupyter_gpushare.core.policy import EnforcePolicy, Policy, Size
from jupyter_gpushare.host.gpu import FakeNvml, NoGpuBackend, SimulatedBackend
from jupyter_gpushare.host.gpu.nvml import NvmlBackend
from jupyter_gpushare.ledger.attribution import unreserved_use
from jupyter_gpushare.ledger.ledger import Lease, Ledger, ProcessRef, Request, SessionRef
from jupyter_gpushare.server.enforce import Enforcer, _Watch
from jupyter_gpushare.server.manager import QuotaManager
from jupyter_gpushare.server.sampler import Readings, Sampler, UsageSnapshot

TREE = (
    "import subprocess, sys, time\n"
    "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "print(c.pid, flush=True)\n"
    "c.wait()\n"  # reap the child if it is killed, so its pid is gone
    "time.sleep(60)\n"
)


@pytest.fixture
def tree():
    """A real two-level process tree: (root pid, child pid)."""
    root = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    child = int(root.stdout.readline())
    yield root.pid, child
    subprocess.run(["pkill", "-P", str(root.pid)], check=False)
    root.kill()
    root.wait()


def make_manager(backend, tmp_path) -> QuotaManager:
    policy = Policy(default_quota=Size(mib=2048), context_reserve_mib=512, headroom=Size(mib=0))
    return QuotaManager(policy, backend, str(tmp_path / "ledger.sqlite"))


def add_kernel(manager: QuotaManager, kernel_id: str, pid: int | None) -> None:
    rec = manager.record(kernel_id, "python3", "python")
    manager.update(rec, pid=pid)  # (the sampler measures a kernel by its process, whatever its state)


@pytest.fixture
def sim(tmp_path):
    backend = SimulatedBackend([10240, 8192])
    manager = make_manager(backend, tmp_path)
    yield manager, backend.fake
    manager.close()


def test_child_process_memory_counts_for_its_kernel_and_strangers_count_as_others(sim, tree):
    manager, fake = sim
    root, child = tree
    add_kernel(manager, "k1", root)
    add_kernel(manager, "k2", None)  # not started yet: not measured
    fake.add_process(child, 1500, card=0, utilization=40)
    fake.add_process(root, 600, card=1)
    fake.add_process(os.getpid(), 700, card=0)  # this test process: not a kernel of the server
    snap = Sampler(manager).tick()
    k1 = snap.kernels["k1"]
    assert k1.used_mib == 2100 and k1.peak_mib == 2100 and k1.utilization == 40.0
    assert sorted((p.pid, p.card_index, p.used_mib) for p in k1.processes) == sorted([(child, 0, 1500), (root, 1, 600)])
    assert snap.kernels["k2"].used_mib is None
    card0 = snap.cards["GPU-simulated-0"]
    assert (card0.used_mib, card0.used_by_kernels_mib, card0.used_by_others_mib, card0.free_mib) == (
        2200,
        1500,
        700,
        8040,
    )
    assert snap.error is None


def test_vanished_process_counts_as_other_and_peak_stays(sim, tree):
    manager, fake = sim
    root, child = tree
    add_kernel(manager, "k1", root)
    sampler = Sampler(manager)
    fake.add_process(child, 3000)
    assert sampler.tick().kernels["k1"].used_mib == 3000
    subprocess.run(["kill", "-9", str(child)], check=True)
    deadline = time.monotonic() + 10
    while sampler.tick().kernels["k1"].used_mib != 0 and time.monotonic() < deadline:
        time.sleep(0.05)  # the driver still lists the dead pid: it is nobody's kernel now
    snap = sampler.tick()
    assert snap.kernels["k1"].used_mib == 0 and snap.kernels["k1"].peak_mib == 3000
    assert snap.cards["GPU-simulated-0"].used_by_others_mib == 3000
    assert snap.kernels["k1"].utilization == 0.0  # no samples = 0%


def test_reused_pid_is_not_taken_for_the_kernel(sim, tree):
    """A record whose pid now names a younger process (pid reuse) gets nothing of it."""
    manager, fake = sim
    root, child = tree
    add_kernel(manager, "k1", root)
    sampler = Sampler(manager)
    sampler._trees._roots[root] = (0, "k1")  # as if the kernel's process had started at boot
    fake.add_process(child, 1000)
    assert sampler.tick().kernels["k1"].used_mib == 0


def test_card_lost_mid_run_then_back(sim, tree):
    manager, fake = sim
    root, child = tree
    add_kernel(manager, "k1", root)
    sampler = Sampler(manager)
    fake.add_process(child, 1000, card=0)
    fake.add_process(root, 500, card=1)
    assert sampler.tick().kernels["k1"].used_mib == 1500
    fake.lose(0)
    snap = sampler.tick()
    lost = snap.cards["GPU-simulated-0"]
    assert lost.lost and lost.used_mib is None and lost.used_by_kernels_mib is None and "lost" in lost.errors["card"]
    assert snap.cards["GPU-simulated-1"].used_mib == 500  # the other card still reads
    assert snap.kernels["k1"].used_mib == 500
    fake.lose(0, False)
    snap = sampler.tick()
    assert not snap.cards["GPU-simulated-0"].lost and snap.kernels["k1"].used_mib == 1500


def test_the_idle_clock_starts_at_the_drivers_last_sample_of_use_not_at_the_reading(sim, tree):
    """The driver's per-process samples carry their own time: a process last seen using the SM 2 s before the
    reading has been idle 2 s at the reading, not 0 (the reading's time put up to a sampler interval into every
    park's start: bench/README.md). A sample time outside the reading's window (a driver's clock that is not the
    host's) is not believed: the reading's time is kept."""
    manager, fake = sim
    root, child = tree
    add_kernel(manager, "k1", root)
    enforcer = Enforcer(manager, SimpleNamespace(get_kernel=lambda kid: SimpleNamespace(execution_state="idle")),
                        EnforcePolicy())  # fmt: skip
    for ago, idle_s in ((2.0, 2.0), (600.0, 0.0)):
        fake.add_process(child, 900, utilization=40, sampled_at=time.time() - ago)
        usage = Sampler(manager).tick().kernels["k1"]
        assert usage.utilization == 40.0 and usage.active_at == pytest.approx(time.time() - ago, abs=0.5)
        now = time.time()
        idle_for, _ = enforcer._idle_for("k1", usage, _Watch(pid=root, started=now - 60), now)
        assert idle_for == pytest.approx(idle_s, abs=0.5)
    # a kernel whose start is finishing: Jupyter's activity trait is unset and raises (TraitError), and is not known
    starting = Enforcer(manager, SimpleNamespace(get_kernel=lambda kid: ServerKernelManager()), EnforcePolicy())
    now = time.time()
    assert starting._idle_for("k1", usage, _Watch(pid=root, started=now - 60), now)[0] == pytest.approx(0, abs=0.5)


def test_unsupported_and_unreported_fields_are_null_not_zero(sim, tree):
    manager, fake = sim
    root, child = tree
    add_kernel(manager, "k1", root)
    fake.not_supported(0, "nvmlDeviceGetProcessUtilization", "nvmlDeviceGetUtilizationRates")
    fake.add_process(child, None, utilization=50)  # the driver does not say how much (WDDM, MIG)
    snap = Sampler(manager).tick()
    assert snap.kernels["k1"].used_mib is None and snap.kernels["k1"].utilization is None
    card = snap.cards["GPU-simulated-0"]
    assert card.utilization is None and "utilization" in card.errors and "process_utilization" in card.errors
    assert card.used_mib == 0


def test_a_gpu_in_mig_mode_is_its_mig_instances(tmp_path, tree, caplog):
    """A GPU in MIG mode runs nothing itself: each MIG instance this host (or pod) is given is a card with
    its own memory and UUID, kernels are placed and measured on it, per-process utilisation unknown."""
    fake = FakeNvml([81920, 81920], name="NVIDIA H100 80GB HBM3")
    fake.enable_mig(0, [10240, None, 40960])  # slot 1: an instance this pod is not given
    backend = NvmlBackend(library=fake)
    # Instances of one GPU share its index; their GPU instance IDs (not the slots) tell them apart.
    assert [(c.label, c.uuid, c.name, c.total_mib) for c in backend.cards()] == [
        ("GPU 0 MIG 1", "MIG-GPU-fake-0-0", "NVIDIA H100 80GB HBM3 MIG 10g", 10240),
        ("GPU 0 MIG 3", "MIG-GPU-fake-0-2", "NVIDIA H100 80GB HBM3 MIG 40g", 40960),
        ("GPU 1", "GPU-fake-1", "NVIDIA H100 80GB HBM3", 81920),
    ]
    manager = make_manager(backend, tmp_path)
    try:
        root, child = tree
        grant = asyncio.run(manager.admit("k1", "python3", "python", Size(mib=16384)))
        assert grant.card.uuid == "MIG-GPU-fake-0-2"  # best fit: too big for the 10 GiB instance
        assert manager.records["k1"].to_dict(0.0)["card"]["label"] == "GPU 0 MIG 3"  # what the sidebar shows
        add_kernel(manager, "k1", root)
        fake.add_process(child, 800, card=0, slot=2, utilization=30)
        fake.add_process(os.getpid(), 500, card=0, slot=0)  # someone else, on the other instance
        snap = Sampler(manager).tick()
        mine, other = snap.cards["MIG-GPU-fake-0-2"], snap.cards["MIG-GPU-fake-0-0"]
        assert mine.mig and mine.utilization is None and mine.used_by_kernels_mib == 800
        assert other.used_by_others_mib == 500 and other.total_mib == 10240
        assert snap.kernels["k1"].used_mib == 800 and snap.kernels["k1"].utilization is None
    finally:
        manager.close()
    fake = FakeNvml([81920])
    fake.enable_mig(0, [None, None])  # MIG on, nothing given to this pod
    backend = NvmlBackend(library=fake)
    assert backend.cards() == [] and "GPU 0 is in MIG mode, but no MIG instance of it is visible" in backend.reason
    fake = FakeNvml([81920, 81920])
    fake.enable_mig(1, [])  # beside a whole GPU: that one is the card, and the log says why GPU 1 is not
    backend = NvmlBackend(library=fake)
    with caplog.at_level("WARNING", logger="jupyter_gpushare"):
        assert [c.uuid for c in backend.cards()] == ["GPU-fake-0"] and backend.reason is None
    assert "GPU 1 is in MIG mode, but no MIG instance" in caplog.text


def test_memory_of_processes_outside_kernels_is_taken_when_placing(tmp_path, tree):
    """A script in a terminal (a process in no lease's kernel tree) holding GPU memory is taken when the next
    kernel is placed, until it exits. Kernels of other servers sharing the ledger are not counted again,
    however little of their reservation they use; a pid that names no process here (another user's behind
    hidepid, another namespace's) is counted, as nothing reserved it in this ledger."""
    backend = SimulatedBackend([20480])
    manager = make_manager(backend, tmp_path)
    manager.policy = dataclasses.replace(manager.policy, on_full="cpu")  # say why at once instead of queueing
    sampler = Sampler(manager, readings=manager.services.readings)  # as app.py makes it
    other = Ledger(tmp_path / "ledger.sqlite", owner=ProcessRef.me())  # another server of this host
    script, other_kernel, gone = (subprocess.Popen(["sleep", "60"]) for _ in range(3))
    gone.kill()
    gone.wait()
    try:
        root, child = tree
        assert asyncio.run(manager.admit("k1", "python3", "python", Size(mib=2048))).mode == "gpu"  # 2560
        add_kernel(manager, "k1", root)
        asyncio.run(manager.attach("k1", root))
        assert isinstance(other.reserve(Request("o1", Size(mib=8192)), manager.policy, manager.cards, False), Lease)
        other.attach("o1", ProcessRef.of(other_kernel.pid))  # reserves 8704, uses 500 of it
        backend.fake.add_process(child, 800)  # k1's child
        backend.fake.add_process(other_kernel.pid, 500)
        backend.fake.add_process(script.pid, 5120)
        backend.fake.add_process(gone.pid, 1024)  # no such process here: nobody's reservation
        sampler.tick()
        leases = asyncio.run(manager.ledger.on(lambda ledger: ledger.leases()))  # on its thread
        assert unreserved_use(sampler.latest_samples(), leases) == {manager.cards[0].uuid: 6144}
        # 20480 - 2560 - 8704 reserved - 6144 outside = 3072: a 3 GiB kernel (3584) does not fit, 2 GiB does
        grant = asyncio.run(manager.admit("k2", "python3", "python", Size(mib=3072)))
        assert grant.mode == "cpu" and "the most unreserved on any card is 3 GiB" in grant.reason
        assert "hold no reservation (a script in a terminal" in grant.reason and "use 6 GiB of the GPU" in grant.reason
        assert asyncio.run(manager.admit("k3", "python3", "python", Size(mib=2048))).mode == "gpu"
        for proc in (script, gone):
            backend.fake.remove_process(proc.pid)
        script.kill()
        sampler.tick()
        assert asyncio.run(manager.admit("k4", "python3", "python", Size(mib=3072))).mode == "gpu"
    finally:
        for proc in (script, other_kernel):
            proc.kill()
        other.close()
        manager.close()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare")
def test_container_processes_are_set_against_session_reservations():
    """A server in a container is known by its Hub token; the ledger has no pids of its kernels. Processes in
    a PID namespace below ours are taken to be those kernels up to what their sessions reserve on the card;
    a process on the host in no lease's tree counts in full."""
    backend = SimulatedBackend([20480])
    card = backend.cards()[0]
    container = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "sleep", "60"])
    script = subprocess.Popen(["sleep", "60"])
    try:
        inner = wait_for_child(container.pid)
        backend.fake.add_process(inner, 3000)  # the container's kernel, past its 2560
        backend.fake.add_process(script.pid, 1000)
        session = Lease("c1", card.uuid, 0, 2048, 512, "jovyan", "python3", SessionRef("s1"), None, 0.0)
        assert unreserved_use(backend.sample(), [session]) == {card.uuid: 1000 + 3000 - 2560}
        assert unreserved_use(backend.sample(), []) == {card.uuid: 4000}  # no session: all of it
    finally:
        container.kill()
        script.kill()


def wait_for_child(pid: int, timeout: float = 10) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
        if children:
            return int(children[0])
        time.sleep(0.05)
    raise AssertionError(f"process {pid} started no child")


def test_no_nvml_at_all(tmp_path):
    fake = FakeNvml([8192])
    fake.init_error = 9  # NVML_ERROR_DRIVER_NOT_LOADED
    manager = make_manager(NvmlBackend(library=fake), tmp_path)
    try:
        add_kernel(manager, "k1", 1)
        snap = Sampler(manager).tick()
        assert "NVML could not start" in snap.error and snap.cards == {} and snap.kernels["k1"].used_mib is None
    finally:
        manager.close()
    manager = make_manager(NoGpuBackend("no driver here"), tmp_path)
    try:
        snap = Sampler(manager).tick()
        assert snap.error == "No GPU: no driver here"
    finally:
        manager.close()


def test_thread_publishes_snapshots_and_stops(sim):
    manager, fake = sim
    sampler = Sampler(manager, interval_s=0.01)
    assert sampler.interval_s == 0.2  # the floor
    sampler.start()
    deadline = time.monotonic() + 10
    while sampler.snapshot.seq < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    sampler.stop()
    assert sampler.snapshot.seq >= 2 and sampler._thread is None


def test_a_reading_asked_for_comes_now_not_at_the_next_interval(sim):
    """A park waits on the card's word (parking.py): a reading asked for (``Readings.fresh``) is taken now, by the
    sampler's own thread, even when its interval is half a minute; one that nobody reads still comes at the
    interval only. The reading's time is when the driver was read."""
    manager, _ = sim
    sampler = Sampler(manager, interval_s=30.0)
    sampler.start()
    try:

        async def case():
            first = await sampler.readings.fresh(0.0, 10)  # the thread's first tick
            assert first is not None
            await asyncio.sleep(0.5)
            assert sampler.readings.usage is first  # nobody asked: no new reading before the interval
            since = time.time()
            asked = await sampler.readings.fresh(since, 10)
            assert asked is not None and asked.seq == first.seq + 1 and asked.time > since

        asyncio.run(case())
    finally:
        sampler.stop()


def test_a_reading_begun_before_the_wait_asks_for_the_next_at_once_and_that_one_answers():
    """``fresh`` is answered by the publish itself (no poll): a reading taken before the wait began does not answer
    it, and asks the sampler for the next one at once; the next answers it as it is published; a wait that no
    reading answers ends with None, and leaves nothing behind."""
    readings = Readings()

    def publish_from_the_samplers_thread(taken_at: float) -> None:
        thread = threading.Thread(target=readings.publish, args=(UsageSnapshot(time=taken_at),))
        thread.start()
        thread.join()

    async def case():
        since = time.time()
        waiting = asyncio.ensure_future(readings.fresh(since, 10))
        await asyncio.sleep(0.05)
        assert readings.wanted.is_set()
        readings.wanted.clear()  # (the sampler's thread takes the request and reads)
        publish_from_the_samplers_thread(since - 0.5)  # begun before the wait asked
        await asyncio.sleep(0.1)
        assert not waiting.done() and readings.wanted.is_set()  # asked for the next one at once
        t0 = time.monotonic()
        publish_from_the_samplers_thread(time.time())
        got = await waiting
        assert got.time > since and time.monotonic() - t0 < 0.5
        assert await readings.fresh(since, 0.1) is got  # a fresh enough reading answers at once
        assert await readings.fresh(time.time() + 60, 0.2) is None
        assert readings._waiting == []

    asyncio.run(case())
