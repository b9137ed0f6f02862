"""Enforcement levels (levels.py): each kernel's level said in one word, and the admin's required level refused
below, by the server (before the kernel gets a GPU) and by the broker (from what /proc says of the process); the
driver's per-cgroup limit (cgroups.DeviceMemoryLimits), written on a stand-in of the cgroup filesystem, since
neither this machine nor the lent GPU (driver 580, no dmem controller) has one."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
import tornado.httpclient

from jupyter_gpushare.broker import BrokerRefused, Caller
from jupyter_gpushare.core.levels import LEVELS, check_required, level_of
from jupyter_gpushare.core.policy import PolicyError
from jupyter_gpushare.core.words import event_words, render
from jupyter_gpushare.host.cgroups import DeviceMemoryLimits, KernelCgroups
from jupyter_gpushare.ledger.ledger import ProcessRef

REGION = "nvidia/00000000:01:00.0/vidmem"


def test_each_level_needs_the_ones_below():
    assert level_of(False, "protect", "cgroup", "dmem") == "caps"  # nothing reads the card
    assert level_of(True, "notify", "cgroup", "dmem") == "caps"  # over-use is only reported
    assert level_of(True, "protect", "tree", "dmem") == "watchdog"
    assert level_of(True, "restart", "cgroup", None) == "cgroup"
    assert level_of(True, "protect", "cgroup", "dmem") == "allocation"


@pytest.mark.parametrize("level", LEVELS)
def test_a_level_below_the_required_one_is_refused_with_what_is_missing(level):
    for required in ("none", *LEVELS):
        if required == "none" or LEVELS.index(level) >= LEVELS.index(required):
            check_required(level, required, "why")
            continue
        with pytest.raises(PolicyError) as e:
            check_required(level, required, "kernels are tracked by their process tree")
        assert e.value.code == "level-below-required" and e.value.params == {"level": level, "required": required}
        assert f"requires '{required}'" in str(e.value) and "kernels are tracked by their process tree" in str(e.value)


# -- the driver's per-cgroup limit, on a stand-in of the cgroup filesystem --------------------------------------


@pytest.fixture
def cgroupfs(tmp_path):
    """The files the kernel's dmem controller shows: the root's capacity (an NVIDIA GPU and another driver's card),
    and a kernels' base whose ancestors hand the controller on."""
    (tmp_path / "dmem.capacity").write_text(f"{REGION} 85520809984\ndrm/0000:03:00.0/vram0 17163091968\n")
    base = tmp_path / "system.slice" / "jupyter.service" / "gpushare-kernels"
    base.mkdir(parents=True)
    for d in (tmp_path, base.parent.parent, base.parent, base):
        (d / "cgroup.subtree_control").write_text("cpu memory dmem\n")
    kernel = base / "k1"
    kernel.mkdir()
    (kernel / "dmem.max").write_text(f"{REGION} max\n")
    return tmp_path, base, kernel


def test_the_limit_is_written_on_the_kernels_group_for_its_card(cgroupfs):
    root, base, kernel = cgroupfs
    limits = DeviceMemoryLimits(str(root))
    assert limits.regions() == {"00000000:01:00": REGION}  # another driver's card is not one of ours
    assert limits.enable(str(base)) is None
    assert limits.set(str(kernel), "0000:01:00.0", 4736)  # NVML's short form of the bus id names the same card
    assert (kernel / "dmem.max").read_text().split() == [REGION, str(4736 * 2**20)]
    assert not limits.set(str(kernel), "00000000:02:00.0", 4736)  # a card the driver did not register
    assert not limits.set(str(kernel), None, None)  # no GPU: no limit left
    assert (kernel / "dmem.max").read_text().split() == [REGION, "max"]


def test_a_host_without_the_drivers_regions_or_a_busy_group_says_why(cgroupfs):
    root, base, _ = cgroupfs
    (root / "dmem.capacity").write_text("drm/0000:03:00.0/vram0 17163091968\n")
    assert "registers no GPU with the cgroup dmem controller" in DeviceMemoryLimits(str(root)).enable(str(base))
    (root / "dmem.capacity").write_text(f"{REGION} 85520809984\n")
    (base.parent / "cgroup.subtree_control").unlink()
    (base.parent / "cgroup.subtree_control").mkdir()  # cannot be read or written, as EBUSY would refuse a write
    why = DeviceMemoryLimits(str(root)).enable(str(base))
    assert why.startswith(f"the dmem controller cannot be turned on for {base.parent}") and "DelegateSubgroup" in why


def test_a_kernels_group_gets_the_limit_through_kernel_cgroups(cgroupfs):
    root, base, kernel = cgroupfs
    groups = KernelCgroups(enabled=False)
    assert groups.level.allocation is None and groups.level.allocation_reason
    groups.unified, groups.dmem = str(base), DeviceMemoryLimits(str(root))
    assert groups.limit("k1", "00000000:01:00.0", 2048)
    assert (kernel / "dmem.max").read_text().split() == [REGION, str(2048 * 2**20)]


# -- required_enforcement, in a real server ----------------------------------------------------------------------


class TestRequiredInTheServer:
    @pytest.fixture
    def gpushare_config(self, gpushare_config):
        # process trees only: the 'watchdog' level, whatever this machine allows
        return {**gpushare_config, "kernel_cgroups": "off", "required_enforcement": "cgroup"}

    async def test_a_kernel_is_refused_a_gpu_below_the_required_level(self, gpushare, jp_fetch):
        state = await gpushare.get("state")
        assert (state["enforcement"]["level"], state["enforcement"]["required"]) == ("watchdog", "cgroup")
        with pytest.raises(tornado.httpclient.HTTPClientError) as e:
            await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "python3"}))
        message = json.loads(e.value.response.body)["message"]
        assert "held at" not in message and "requires 'cgroup'" in message and "kernel cgroups are off" in message
        (event,) = [x for x in state["events"] + (await gpushare.get("state"))["events"] if x["kind"] == "refused"][-1:]
        assert event["code"] == "refused-level-below-required"
        assert event_words(event["code"], event["params"]) == (
            "Not started: this host holds kernels at enforcement level watchdog, and the admin requires cgroup."
        )
        assert render("policy.level-below-required", {"level": "watchdog", "required": "cgroup"}).startswith(
            "This host holds kernels at enforcement level watchdog"
        )


class TestLevelSaid:
    @pytest.fixture
    def gpushare_config(self, gpushare_config):
        return {**gpushare_config, "kernel_cgroups": "off", "required_enforcement": "watchdog"}

    async def test_each_kernel_says_its_level(self, gpushare):
        kid = await gpushare.start_kernel()
        held = (await gpushare.kernel(kid))["held"]
        assert (held["level"], held["tracking"], held["allocation"]) == ("watchdog", "tree", None)


# -- required_enforcement, in the broker ---------------------------------------------------------------------------


def test_the_broker_ends_a_kernel_held_below_the_required_level(tmp_path):
    from conftest import broker_in_process

    broker = broker_in_process(tmp_path)
    object.__setattr__(broker.policy, "required_level", "cgroup")
    kernel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        me = ProcessRef.me()
        alice = Caller("alice", 0, process=me)  # (uid 0: the process is this test's own)
        assert "lease" in broker.handle(alice, "reserve", {"kernel_id": "k1", "mib": 2048})
        with pytest.raises(BrokerRefused, match="held at the 'watchdog' enforcement level") as e:
            broker.handle(alice, "attach", {"kernel_id": "k1", "pid": kernel.pid})
        assert "requires 'cgroup'" in str(e.value)
        assert kernel.wait(5) == -signal.SIGKILL
        assert broker._ledger.get("k1") is None
    finally:
        if kernel.poll() is None:
            kernel.kill()
        broker._ledger.close()
