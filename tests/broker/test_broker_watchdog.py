"""The broker's over-quota watchdog (broker/watchdog.py): real processes, a real ledger, the broker's own
reading of a simulated card. The kernel here ignores SIGINT, as a kernel stuck in a CUDA call or a daemon in a
session of its own would: the interrupt does not free anything, so 'protect' ends it as soon as that is seen.
Memory taken from other leases' reservations gets no grace at all."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time

import psutil
import pytest

from jupyter_gpushare.broker.watchdog import Watchdog
from jupyter_gpushare.core.overuse import SETTLE_S

STUBBORN = (
    "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); print('ready', flush=True); time.sleep(120)"
)


@pytest.fixture
def kernel():
    proc = subprocess.Popen([sys.executable, "-c", STUBBORN], start_new_session=True, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    yield proc
    proc.kill()
    proc.wait()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _setup(inproc, kernel, others: bool):
    broker, who = inproc
    assert "lease" in broker.handle(who["alice"], "reserve", {"kernel_id": "k1", "mib": 2048})  # 2,560 reserved
    broker.handle(who["admin"], "attach", {"kernel_id": "k1", "pid": kernel.pid})  # (the kernel is root's here)
    if others:
        assert "lease" in broker.handle(who["bob"], "reserve", {"kernel_id": "k2", "mib": 2048})
    broker.backend.fake.add_process(kernel.pid, 6000)  # 3,440 MiB past its reservation
    return broker


def _sweep(broker, watchdog):
    broker.reading.stale()  # a fresh reading each time
    return watchdog.sweep(broker.reading.latest(), broker._ledger.leases())


def test_protect_on_a_shared_card_interrupts_then_ends_the_kernel(inproc, kernel, caplog):
    broker, clock = _setup(inproc, kernel, others=True), Clock()
    watchdog = Watchdog("protect", 5.0, logging.getLogger("test"), clock=clock)
    assert _sweep(broker, watchdog) == []  # over, but not for the grace yet
    clock.now += 5
    with caplog.at_level(logging.WARNING):
        assert _sweep(broker, watchdog) == [("k1", "interrupt")]
    assert "kernel k1 of alice uses 3.4 GiB on GPU-simulated-0 beyond its lease, for 5 s: interrupted" in caplog.text
    time.sleep(0.3)
    assert kernel.poll() is None  # it ignores SIGINT and keeps the memory
    clock.now += SETTLE_S / 2
    assert _sweep(broker, watchdog) == []  # the interrupt is given time to free it
    clock.now += SETTLE_S / 2
    assert _sweep(broker, watchdog) == [("k1", "restart")]  # it freed nothing: no second grace
    assert kernel.wait(5) == -signal.SIGKILL
    assert "ended (processes" in caplog.text and "its server restarts it" in caplog.text


def test_protect_alone_on_its_card_and_notify_only_log(inproc, kernel, caplog):
    broker, clock = _setup(inproc, kernel, others=False), Clock()
    for action in ("protect", "notify"):
        watchdog = Watchdog(action, 0.0, logging.getLogger("test"), clock=clock)
        with caplog.at_level(logging.WARNING):
            assert _sweep(broker, watchdog) == [("k1", "notify")]
            clock.now += 1
            _sweep(broker, watchdog)
    assert kernel.poll() is None and psutil.Process(kernel.pid).status() != psutil.STATUS_ZOMBIE
    assert "(over_quota_action protect: logged)" in caplog.text


def test_use_on_another_card_is_over_use_there(tmp_path, kernel):
    """A kernel reserved on card 0 that uses 1 GiB on card 1 is over by all of it, whatever its own card holds."""
    from conftest import broker_in_process

    from jupyter_gpushare.broker import Caller
    from jupyter_gpushare.ledger.ledger import ProcessRef

    broker = broker_in_process(tmp_path, "2x10GiB")
    try:
        alice = Caller("alice", 5001, process=ProcessRef.me())
        lease = broker.handle(alice, "reserve", {"kernel_id": "k1", "mib": 2048})["lease"]
        broker.handle(
            Caller("root", 0, admin=True, process=ProcessRef.me()), "attach", {"kernel_id": "k1", "pid": kernel.pid}
        )
        other = 1 - lease["card_index"]
        broker.backend.fake.add_process(kernel.pid, 1024, card=other)
        watchdog = Watchdog("interrupt", 0.0, logging.getLogger("test"), clock=Clock())
        assert _sweep(broker, watchdog) == [("k1", "interrupt")]
        broker.backend.fake.remove_process(kernel.pid)
        assert _sweep(broker, watchdog) == []
    finally:
        broker._ledger.close()


def test_an_unknown_action_is_refused():
    with pytest.raises(ValueError, match="one of protect, notify, interrupt, restart"):
        Watchdog("explode", 1.0, logging.getLogger("test"))


PARENT = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
    "print(child.pid, flush=True); time.sleep(120)"
)


def _fill(broker, who, kernel_pid: int) -> None:
    """alice's k1 (2 GiB + 512 MiB) attached to ``kernel_pid``; bob's k2 reserves the rest of the 10 GiB card."""
    assert "lease" in broker.handle(who["alice"], "reserve", {"kernel_id": "k1", "mib": 2048})
    broker.handle(who["admin"], "attach", {"kernel_id": "k1", "pid": kernel_pid})
    assert "lease" in broker.handle(who["bob"], "reserve", {"kernel_id": "k2", "mib": 7168})  # 7.5 GiB reserved


def test_memory_taken_from_other_reservations_ends_the_kernel_at_the_first_reading(inproc, kernel, caplog):
    broker, who = inproc
    _fill(broker, who, kernel.pid)
    broker.backend.fake.add_process(kernel.pid, 6000)  # 3,440 MiB over; 4,240 free where bob may still take 7,680
    watchdog = Watchdog("protect", 30.0, logging.getLogger("test"), clock=Clock())
    with caplog.at_level(logging.WARNING):
        assert _sweep(broker, watchdog) == [("k1", "restart")]
    assert kernel.wait(5) == -signal.SIGKILL
    assert "3.4 GiB of it reserved by other kernels: ended" in caplog.text
    assert watchdog.hurry  # while a kernel is over, the driver is read every FAST_INTERVAL_S


def test_a_child_that_holds_the_excess_is_ended_alone(inproc):
    broker, who = inproc
    parent = subprocess.Popen([sys.executable, "-c", PARENT], start_new_session=True, stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        _fill(broker, who, parent.pid)
        broker.backend.fake.add_process(parent.pid, 1000)
        broker.backend.fake.add_process(child, 6000)  # an env -i child would look the same: same process tree
        watchdog = Watchdog("protect", 30.0, logging.getLogger("test"), clock=Clock())
        assert _sweep(broker, watchdog) == [("k1", "stop")]
        assert wait_gone(child)
        assert parent.poll() is None  # the kernel runs on
        broker.backend.fake.remove_process(child)
        assert _sweep(broker, watchdog) == []
        assert not watchdog.hurry
    finally:
        parent.kill()
        parent.wait()


def test_over_use_the_unreserved_room_covers_waits_for_the_grace(inproc, kernel):
    broker, who = inproc
    assert "lease" in broker.handle(who["alice"], "reserve", {"kernel_id": "k1", "mib": 2048})
    broker.handle(who["admin"], "attach", {"kernel_id": "k1", "pid": kernel.pid})
    assert "lease" in broker.handle(who["bob"], "reserve", {"kernel_id": "k2", "mib": 2048})
    broker.backend.fake.add_process(kernel.pid, 4000)  # 1,440 over; 6,240 free, bob may take 2,560
    clock = Clock()
    watchdog = Watchdog("protect", 30.0, logging.getLogger("test"), clock=clock)
    for _ in range(29):
        assert _sweep(broker, watchdog) == []
        clock.now += 1
    clock.now += 1
    assert _sweep(broker, watchdog) == [("k1", "interrupt")]


def wait_gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False
