"""Over-quota and idle policies on a real server with real kernels; GPU use from the fake NVML."""

from __future__ import annotations

import asyncio

import psutil
import pytest
from kernels import run_in_kernel

from jupyter_gpushare.core.words import event_words


def fake_of(jp_serverapp):
    return jp_serverapp.web_app.settings["gpushare_manager"].backend.fake


async def events_of(gpushare, kid):
    return [e for e in (await gpushare.get("events"))["events"] if e["kernel_id"] == kid]


class TestOverQuotaRestart:
    @pytest.fixture
    def gpushare_config(self, gpushare_config):
        return {
            **gpushare_config,
            "sample_interval": 0.2,
            "over_quota_grace": 1.0,
            "over_quota_action": "restart",
            "idle_timeout": 0,
        }

    async def test_kernel_over_its_reservation_is_warned_then_restarted_after_the_grace(self, gpushare, jp_serverapp):
        kid = await gpushare.start_kernel()
        before = await gpushare.kernel(kid)
        fake_of(jp_serverapp).add_process(before["pid"], 3000)  # reservation: 2 GiB + 512 MiB = 2560 MiB

        async def warned():
            kinds = [e["kind"] for e in await events_of(gpushare, kid)]
            return "over-quota" in kinds and (await gpushare.kernel(kid))["state"] in ("over_quota", "running")

        await gpushare.wait_for(warned, what="over-quota warning")
        action = await gpushare.wait_for(
            lambda: _event(gpushare, kid, "over-quota-restart"), timeout=30, what="restart"
        )
        warning = next(e for e in await events_of(gpushare, kid) if e["kind"] == "over-quota")
        assert warning["used_mib"] == 3000 and warning["reserved_mib"] == 2560 and warning["pids"] == [before["pid"]]
        assert warning["message"] == "Uses 2.9 GiB, over its 2.5 GiB reservation: it is restarted if still over in 1 s."
        assert warning["code"] == "over-quota-then-restart" and warning["grace_s"] == 1
        assert action["over_s"] >= 1.0 and action["action"] == "restart" and action["time"] - warning["time"] >= 1.0
        after = await gpushare.kernel(kid)
        assert after["pid"] != before["pid"] and after["reserved_mib"] == 2560  # restarted, reservation kept
        # the old process is gone; the driver listing its pid makes it nobody's: back to running
        rec = await gpushare.wait_for(lambda: _state(gpushare, kid, "running", used=0), what="running again")
        assert rec["used_mib"] == 0
        assert [e["kind"] for e in await events_of(gpushare, kid)].count("over-quota-restart") == 1


class TestOverQuotaNotifyOnly:
    @pytest.fixture
    def gpushare_config(self, gpushare_config):
        return {
            **gpushare_config,
            "sample_interval": 0.2,
            "over_quota_grace": 0,
            "over_quota_action": "notify",
            "idle_timeout": 0,
        }

    async def test_notify_leaves_the_kernel_alone(self, gpushare, jp_serverapp):
        kid = await gpushare.start_kernel()
        pid = (await gpushare.kernel(kid))["pid"]
        fake_of(jp_serverapp).add_process(pid, 2600)
        rec = await gpushare.wait_for(lambda: _state(gpushare, kid, "over_quota"), what="over_quota")
        assert rec["used_mib"] == 2600 and rec["pid"] == pid
        notified = await gpushare.wait_for(lambda: _event(gpushare, kid, "over-quota-notify"), what="notify event")
        assert notified["used_mib"] == 2600
        await asyncio.sleep(0.6)
        assert (await gpushare.kernel(kid))["pid"] == pid
        assert [e["kind"] for e in await events_of(gpushare, kid)].count("over-quota-notify") == 1


class TestProtect:
    """The default over-quota action: neighbours first. On a card another kernel shares, over-use that the card's
    unreserved room covers: interrupt at the grace, then restart as soon as the interrupt is seen to have freed
    nothing; alone on its card: notify only."""

    @pytest.fixture
    def gpushare_config(self, gpushare_config):
        return {**gpushare_config, "sample_interval": 0.2, "over_quota_grace": 1.0, "idle_timeout": 0}

    async def test_on_a_shared_card_interrupt_then_restart(self, gpushare, jp_serverapp):
        kid, neighbour = await gpushare.start_kernel(), await gpushare.start_kernel()
        assert (await gpushare.kernel(kid))["held"]["watchdog"] == "protect"  # the default
        await run_in_kernel(jp_serverapp, kid, "pass")  # up (an interrupt during its start would end it)
        before = await gpushare.kernel(kid)
        fake_of(jp_serverapp).add_process(before["pid"], 3000)  # held whatever an interrupt does
        interrupted = await gpushare.wait_for(lambda: _event(gpushare, kid, "over-quota-interrupt"), what="interrupt")
        restarted = await gpushare.wait_for(
            lambda: _event(gpushare, kid, "over-quota-restart"), timeout=30, what="restart"
        )
        assert restarted["time"] - interrupted["time"] >= 1.0
        warning = next(e for e in await events_of(gpushare, kid) if e["kind"] == "over-quota")
        assert "what holds the excess is stopped in 1 s" in warning["message"], warning
        state = await gpushare.get("state")
        (event,) = [e for e in state["events"] if e["kind"] == "over-quota-restart" and e["kernel_id"] == kid]
        assert event["severity"] == "warning" and event["params"]["used_mib"] >= 3000
        assert event_words(event["code"], event["params"]).startswith("Restarted: it used ")
        assert (await gpushare.kernel(kid))["pid"] != before["pid"]
        assert [e["kind"] for e in await events_of(gpushare, neighbour) if e["kind"].startswith("over")] == []

    async def test_alone_on_its_card_it_is_only_told(self, gpushare, jp_serverapp):
        kid = await gpushare.start_kernel()
        pid = (await gpushare.kernel(kid))["pid"]
        fake_of(jp_serverapp).add_process(pid, 3000)
        await gpushare.wait_for(lambda: _event(gpushare, kid, "over-quota-notify"), what="notify")
        await asyncio.sleep(1.5)
        assert (await gpushare.kernel(kid))["pid"] == pid
        assert not [
            e for e in await events_of(gpushare, kid) if e["kind"] in ("over-quota-interrupt", "over-quota-restart")
        ]


class TestIdle:
    @pytest.fixture
    def gpushare_config(self, gpushare_config):
        return {**gpushare_config, "sample_interval": 0.2, "idle_timeout": 1.5, "idle_action": "warn"}

    async def test_idle_kernel_is_warned_and_a_running_cell_is_not_idle(self, gpushare, jp_serverapp):
        kid = await gpushare.start_kernel()
        pid = (await gpushare.kernel(kid))["pid"]
        fake_of(jp_serverapp).add_process(pid, 800)
        rec = await gpushare.wait_for(lambda: _state(gpushare, kid, "idle"), what="idle")
        assert rec["used_mib"] == 800
        warning = await _event(gpushare, kid, "idle")
        assert (
            warning["idle_s"] >= 1.5
            and warning["reserved_mib"] == 2560
            and "of GPU memory unused for" in warning["message"]
        )

        # A cell that runs for a while, with 0% GPU, is not idle (execution_state busy).
        client = jp_serverapp.kernel_manager.get_kernel(kid).client()
        client.start_channels()
        try:
            await client.wait_for_ready(timeout=60)
            client.execute("import time; time.sleep(60)")
            await gpushare.wait_for(lambda: _state(gpushare, kid, "running"), what="busy kernel not idle")
            await asyncio.sleep(2.5)  # longer than idle_timeout, still inside the cell
            assert (await gpushare.kernel(kid))["state"] == "running"
            await jp_serverapp.kernel_manager.interrupt_kernel(kid)
        finally:
            client.stop_channels()
        assert kid in jp_serverapp.kernel_manager.list_kernel_ids()  # warn only: never shut down


class TestIdleShutdown:
    @pytest.fixture
    def gpushare_config(self, gpushare_config):
        return {
            **gpushare_config,
            "sample_interval": 0.2,
            "idle_timeout": 1.0,
            "idle_action": "shutdown",
            "idle_shutdown_delay": 0.5,
        }

    async def test_idle_kernel_is_shut_down_after_the_warning(self, gpushare, jp_serverapp):
        kid = await gpushare.start_kernel()
        await gpushare.wait_for(lambda: _event(gpushare, kid, "idle-shutdown"), timeout=30, what="idle shutdown")
        await gpushare.wait_for(lambda: _gone(gpushare, kid), what="kernel gone")
        assert kid not in jp_serverapp.kernel_manager.list_kernel_ids()
        kinds = [e["kind"] for e in await events_of(gpushare, kid)]
        assert kinds.index("idle") < kinds.index("idle-shutdown") and "released" in kinds
        warning = await _event(gpushare, kid, "idle")  # it says what comes next
        assert warning["code"] == "idle-then-shutdown" and "unless it runs something" in warning["message"], warning


async def _gone(gpushare, kid):
    return await gpushare.kernel(kid) is None


async def _event(gpushare, kid, kind):
    return next((e for e in await events_of(gpushare, kid) if e["kind"] == kind), None)


async def _state(gpushare, kid, state, used=None):
    rec = await gpushare.kernel(kid)
    if rec and rec["state"] == state and (used is None or rec["used_mib"] == used):
        return rec
    return None


class TestTheft:
    """At the product's defaults (1 s readings, 30 s grace, 'protect'): on a card filled by reservations, memory a
    kernel takes from its neighbours' reservations is acted on at the next reading, on the processes that hold it;
    over-use the card's unreserved room covers keeps its grace, and the neighbours are never touched."""

    @pytest.fixture
    def gpushare_config(self, gpushare_config):
        return {**gpushare_config, "idle_timeout": 0}  # 10 GiB card, 2 GiB quotas + 512 MiB: 4 kernels fill it

    async def _kernels(self, gpushare, n: int):
        kids = [await gpushare.start_kernel() for _ in range(n)]
        pids = [(await gpushare.kernel(k))["pid"] for k in kids]
        return kids, pids

    async def test_memory_taken_from_reservations_in_the_kernels_own_process_restarts_it_at_once(
        self, gpushare, jp_serverapp
    ):
        (kid, *neighbours), (pid, *neighbour_pids) = await self._kernels(gpushare, 4)
        claimed = await run_in_kernel(
            jp_serverapp,
            kid,
            "import gpushare_simulate, time; t = time.time(); gpushare_simulate.use('6GiB'); print(t)",
        )
        restarted = await gpushare.wait_for(lambda: _event(gpushare, kid, "over-quota-restart"), what="restart")
        assert restarted["time"] - float(claimed) <= 3.0  # acted on within 3 s of the claim (the grace is 30 s)
        assert restarted["why"] == "theft" and restarted["stolen_mib"] == 3584 and restarted["over_s"] is None
        assert event_words(restarted["code"], restarted) == (
            "Restarted at once: it took 3.5 GiB of GPU memory other kernels had reserved. Ask for a larger quota."
        )
        await gpushare.wait_for(lambda: _state(gpushare, kid, "running", used=0), what="running again")
        assert (await gpushare.kernel(kid))["pid"] != pid
        for n, npid in zip(neighbours, neighbour_pids):
            assert (await gpushare.kernel(n))["pid"] == npid
            assert not [e for e in await events_of(gpushare, n) if e["kind"].startswith("over")]

    async def test_a_child_that_takes_reserved_memory_is_stopped_alone(self, gpushare, jp_serverapp):
        (kid, *_), (pid, *_) = await self._kernels(gpushare, 4)
        child = await run_in_kernel(
            jp_serverapp,
            kid,
            "import subprocess, sys\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import gpushare_simulate, time; "
            'print(time.time(), flush=True); gpushare_simulate.use("6GiB"); time.sleep(120)\'], stdout=subprocess.PIPE)\n'
            "print(p.pid)",
        )
        stopped = await gpushare.wait_for(lambda: _event(gpushare, kid, "over-quota-stop"), what="stop")
        claimed = await run_in_kernel(jp_serverapp, kid, "print(p.stdout.readline().decode().strip())")
        assert stopped["time"] - float(claimed) <= 3.0  # (the child's own clock: its start is not counted)
        assert stopped["stopped"] == [int(child)] and stopped["why"] == "theft" and stopped["processes"] == 1
        assert event_words(stopped["code"], stopped) == (
            "Ended 1 process it started, which took 3.5 GiB other kernels had reserved. It runs on."
        )
        assert not psutil.pid_exists(int(child)) or psutil.Process(int(child)).status() == psutil.STATUS_ZOMBIE
        await gpushare.wait_for(lambda: _state(gpushare, kid, "running", used=0), what="back within its lease")
        assert (await gpushare.kernel(kid))["pid"] == pid  # the kernel runs on, its state kept
        assert await run_in_kernel(jp_serverapp, kid, "print(p.wait())") == "-9\n"

    async def test_over_use_within_the_unreserved_room_keeps_its_grace(self, gpushare, jp_serverapp):
        (kid, neighbour), (pid, neighbour_pid) = await self._kernels(gpushare, 2)  # 5 GiB of 10 unreserved
        await run_in_kernel(jp_serverapp, kid, "import gpushare_simulate; gpushare_simulate.use('4GiB')")
        await gpushare.wait_for(lambda: _state(gpushare, kid, "over_quota"), what="over quota")
        await asyncio.sleep(4)
        assert (await gpushare.kernel(kid))["pid"] == pid
        kinds = [e["kind"] for e in await events_of(gpushare, kid)]
        assert "over-quota" in kinds and not [k for k in kinds if k.startswith("over-quota-")]
        warning = next(e for e in await events_of(gpushare, kid) if e["kind"] == "over-quota")
        assert "what holds the excess is stopped in 30 s" in warning["message"], warning
        assert (await gpushare.kernel(neighbour))["pid"] == neighbour_pid
        assert not [e for e in await events_of(gpushare, neighbour) if e["kind"].startswith("over")]


class TestOverUseAcrossDips:
    """Over for most of the time with short dips under: acted on within one grace window (twice the grace),
    though never over for a whole grace in one go."""

    @pytest.fixture
    def gpushare_config(self, gpushare_config):
        return {**gpushare_config, "sample_interval": 0.2, "over_quota_grace": 2.0, "idle_timeout": 0}

    async def test_a_kernel_over_in_bursts_is_acted_on(self, gpushare, jp_serverapp):
        kid, _neighbour = await gpushare.start_kernel(), await gpushare.start_kernel()
        code = (
            "import gpushare_simulate, threading, time\n"
            "def cycle():\n"
            "    while True:\n"
            "        gpushare_simulate.use('3GiB'); time.sleep(1.8); gpushare_simulate.use(0); time.sleep(0.4)\n"
            "started = time.time()\n"
            "threading.Thread(target=cycle, daemon=True).start()\n"
            "print(started)"
        )
        started = float(await run_in_kernel(jp_serverapp, kid, code))
        acted = await gpushare.wait_for(lambda: _event(gpushare, kid, "over-quota-interrupt"), what="action")
        assert acted["why"] == "grace" and acted["over_s"] >= 2.0
        assert acted["time"] - started <= 2 * 2.0 + 1.0  # (from the cycle's start, in the kernel)


class TestAnotherCard:
    """Issue 33, #9: memory a kernel uses on a card other than its lease's is over-use on that card, all of it,
    in the server's own enforcer as in the broker's (it used to be summed over cards: 20 GiB on card 1 of a kernel
    reserved on card 0 read as "near quota", and nothing was done)."""

    @pytest.fixture
    def gpushare_config(self, gpushare_config):
        return {**gpushare_config, "simulated_cards": "10GiB,24GiB", "sample_interval": 0.2,
                "over_quota_grace": 1.0, "over_quota_action": "restart", "idle_timeout": 0}  # fmt: skip

    async def test_use_on_a_card_outside_the_lease_is_over_use_there(self, gpushare, jp_serverapp):
        kid = await gpushare.start_kernel()
        before = await gpushare.kernel(kid)
        assert before["card"]["index"] == 0 and before["reserved_mib"] == 2560  # best fit: the smaller card
        fake_of(jp_serverapp).add_process(before["pid"], 1000, card=0)  # within its lease on card 0...
        fake_of(jp_serverapp).add_process(before["pid"], 1024, card=1)  # ...and 1 GiB on card 1
        rec = await gpushare.wait_for(lambda: _state(gpushare, kid, "over_quota"), what="over quota on card 1")
        assert rec["used_mib"] == 2024  # under its 2.5 GiB in all: the old sum read it as near quota
        warning = next(e for e in await events_of(gpushare, kid) if e["kind"] == "over-quota")
        assert warning["used_mib"] == 2024
        await gpushare.wait_for(lambda: _event(gpushare, kid, "over-quota-restart"), timeout=30, what="restart")
