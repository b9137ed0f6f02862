"""Quotas learned from history, in a real jupyter-server with real kernels on the simulated card.

Kernels "use" memory with gpushare_simulate, which the simulated card shows as the process's NVML figure, so
the sampler's peak is what the kernel said. What must hold: a notebook's peak is recorded when its kernel
shuts down or restarts; the next kernel of that notebook is told it (GPUSHARE_PEAK_BEFORE_MIB, the API, the
state) whether or not the policy is on; with the policy off its quota is the default as before; with it on,
the quota is the peak plus the margin less the context reserve, within the admin's bounds, and a quota the
student asked for wins; the history survives a server restart; a kernel started without a notebook
(POST /api/kernels, as the study harness does) is keyed by its kernelspec.
"""

from __future__ import annotations

import getpass
import json
import math

import pytest
from apispec import conforms
from kernels import run_in_kernel
from servers import SimulatedServer, wait_until

from jupyter_gpushare.core.history import HistoryRules
from jupyter_gpushare.ledger.ledger import Ledger

NB = "course/lab3.ipynb"
RESERVE = 512  # conftest's context reserve


async def start_session(jp_fetch, path: str) -> tuple[str, str]:
    body = {"path": path, "type": "notebook", "name": path.rsplit("/", 1)[-1], "kernel": {"name": "python3"}}
    session = json.loads((await jp_fetch("api", "sessions", method="POST", body=json.dumps(body))).body)
    return session["id"], session["kernel"]["id"]


async def use(gpushare, jp_serverapp, kid: str, size: str, mib: int) -> None:
    """The kernel uses ``size`` until the sampler has measured it."""
    await run_in_kernel(jp_serverapp, kid, f"import gpushare_simulate; gpushare_simulate.use({size!r})")

    async def measured():
        k = await gpushare.kernel(kid)
        return k if k and k["used_mib"] == mib and k["peak_mib"] == mib else None

    await gpushare.wait_for(measured, what=f"{size} measured")


ENV = "import os; print(os.environ.get('GPUSHARE_PEAK_BEFORE_MIB', 'none'))"


def learned(ledger_file, path: str = NB):
    ledger = Ledger(ledger_file)
    try:
        return ledger.learned_peak(getpass.getuser(), "python3", path, HistoryRules())
    finally:
        ledger.close()


@pytest.fixture
def gpushare_config(gpushare_config, jp_root_dir):
    (jp_root_dir / "course").mkdir()  # (a session's notebook path counts from its folder, which must exist)
    return {**gpushare_config, "sample_interval": 0.2, "idle_timeout": 0}


async def test_with_the_policy_off_a_peak_is_recorded_and_shown_but_the_quota_is_the_default(
    gpushare, jp_fetch, jp_serverapp, ledger_file
):
    session, kid = await start_session(jp_fetch, NB)
    first = await gpushare.kernel(kid)
    assert first["learned_peak_mib"] is None and first["quota_source"] == "default"
    assert (await run_in_kernel(jp_serverapp, kid, ENV)).strip() == "none"  # no history yet: no variable
    await use(gpushare, jp_serverapp, kid, "1.5GiB", 1536)
    assert learned(ledger_file) is None  # recorded when the kernel stops, not before
    await jp_fetch("api", "sessions", session, method="DELETE")
    assert learned(ledger_file).peak_mib == 1536

    session, kid = await start_session(jp_fetch, NB)
    k = await gpushare.kernel(kid)
    conforms(k, "Kernel")
    assert (k["learned_peak_mib"], k["learned_from"], k["quota_source"]) == (1536, "own", "default")
    assert (k["quota_mib"], k["reserved_mib"]) == (2048, 2048 + RESERVE)  # the policy is off: as before
    assert (await run_in_kernel(jp_serverapp, kid, ENV)).strip() == "1536"
    state = json.loads((await jp_fetch("api", "gpushare", "state")).body)
    conforms(state, "State")
    assert state["kernels"][0]["learned_peak_mib"] == 1536
    _, other = await start_session(jp_fetch, "course/lab4.ipynb")  # another notebook has no history
    assert (await gpushare.kernel(other))["learned_peak_mib"] is None
    assert not [e for e in (await gpushare.get("events"))["events"] if e["kind"] == "learned"]
    await jp_fetch("api", "sessions", session, method="DELETE")


class TestPolicyOn:
    @pytest.fixture
    def gpushare_config(self, gpushare_config):
        return {**gpushare_config, "quota_from_history": True, "history_margin": 0.2, "max_quota": "3GiB"}

    async def test_the_next_kernel_gets_the_learned_quota_and_a_requested_one_wins(
        self, gpushare, jp_fetch, jp_serverapp, ledger_file
    ):
        session, kid = await start_session(jp_fetch, NB)
        assert (await gpushare.kernel(kid))["quota_mib"] == 2048  # no history: the default
        await use(gpushare, jp_serverapp, kid, "1.5GiB", 1536)
        await jp_fetch("api", "sessions", session, method="DELETE")

        session, kid = await start_session(jp_fetch, NB)
        k = await gpushare.kernel(kid)
        quota = math.ceil(1536 * 1.2) - RESERVE  # the reservation is the peak + 20 %
        assert (k["quota_source"], k["quota_mib"], k["reserved_mib"]) == ("learned", quota, quota + RESERVE)
        assert k["requested_quota_mib"] == quota and k["learned_peak_mib"] == 1536
        assert (
            await run_in_kernel(jp_serverapp, kid, "import os; print(os.environ['GPUSHARE_QUOTA_MIB'])")
        ).strip() == str(quota)
        events = [e for e in (await gpushare.get("events"))["events"] if e["kind"] == "learned"]
        assert events and events[-1]["kernel_id"] == kid and "peak 1.5 GiB" in events[-1]["message"]

        # a restart records the run that ended: this one peaked higher
        await use(gpushare, jp_serverapp, kid, "3GiB", 3072)
        await jp_fetch("api", "kernels", kid, "restart", method="POST", body="{}")
        assert learned(ledger_file).peak_mib == 3072
        # the student asks for a quota: it wins over the learned one
        await jp_fetch("api", "gpushare", "kernels", kid, method="PATCH", body=json.dumps({"quota": "1GiB"}))
        await jp_fetch("api", "kernels", kid, "restart", method="POST", body="{}")
        k = await gpushare.kernel(kid)
        assert (k["quota_source"], k["quota_mib"]) == ("requested", 1024)
        await jp_fetch("api", "sessions", session, method="DELETE")

        _, kid = await start_session(jp_fetch, NB)  # learned from the highest recent run, within max_quota
        k = await gpushare.kernel(kid)
        assert (k["quota_source"], k["quota_mib"], k["learned_peak_mib"]) == ("learned", 3072, 3072)


def test_history_survives_a_server_restart_and_keys_a_kernel_without_a_notebook_by_its_kernelspec(tmp_path):
    """The study harness's way: POST /api/kernels (no session, no notebook); a warm-up teaches the batch."""
    from jupyter_client import BlockingKernelClient

    flags = ("--GpuShareApp.sample_interval=0.2", "--GpuShareApp.quota_from_history=True")
    server = SimulatedServer(tmp_path, *flags)
    try:
        server.wait_ready()
        kid = server.call("POST", "api/kernels", {"name": "python3"})["id"]
        client = BlockingKernelClient(connection_file=str(tmp_path / "runtime" / f"kernel-{kid}.json"))
        client.load_connection_file()
        client.start_channels(hb=False)  # (without a kernel manager, a kernel still starting misses heartbeats and
        try:  # is called dead: "Kernel died before replying to kernel_info", on a loaded host)
            client.wait_for_ready(timeout=60)
            reply = client.execute_interactive("import gpushare_simulate; gpushare_simulate.use('3GiB')", timeout=60)
            assert reply["content"]["status"] == "ok"
        finally:
            client.stop_channels()

        def measured():
            k = next(k for k in server.call("GET", "api/gpushare/kernels")["kernels"] if k["kernel_id"] == kid)
            return k["peak_mib"] == 3072

        wait_until(measured, what="the warm-up's use measured")
        server.call("DELETE", f"api/kernels/{kid}")
    finally:
        server.stop()
    server = SimulatedServer(tmp_path, *flags)  # the same ledger file
    try:
        server.wait_ready()
        batch = [server.call("POST", "api/kernels", {"name": "python3"})["id"] for _ in range(2)]
        kernels = server.call("GET", "api/gpushare/kernels")["kernels"]
        quota = math.ceil(3072 * 1.2) - RESERVE
        assert sorted(
            (k["kernel_id"], k["quota_source"], k["quota_mib"], k["learned_peak_mib"]) for k in kernels
        ) == sorted((kid, "learned", quota, 3072) for kid in batch)
    finally:
        server.stop()


class TestLearnFromFailure:
    @pytest.fixture
    def gpushare_config(self, gpushare_config):
        return {**gpushare_config, "quota_from_history": True, "history_margin": 0.2, "max_quota": "6GiB"}

    async def test_an_out_of_memory_error_raises_what_the_notebook_learns_and_offers_a_restart_with_more(
        self, gpushare, jp_fetch, jp_serverapp, ledger_file
    ):
        """A real JAX RESOURCE_EXHAUSTED in the notebook (JAX on the CPU, the kernel on the simulated card): the
        note says the notebook learns from it and what to restart with; the API offers that quota; the next
        kernel of the notebook learns it, and good runs after it never bring it below."""
        session, kid = await start_session(jp_fetch, NB)
        assert (await gpushare.kernel(kid))["quota_mib"] == 2048
        await use(gpushare, jp_serverapp, kid, "1GiB", 1024)
        out = await run_in_kernel(
            jp_serverapp,
            kid,
            "import jax.numpy as jnp\njnp.zeros((2**44,), dtype=jnp.uint8).block_until_ready()",
            status="error",
        )
        assert "This notebook learns from it: its next kernel gets at least 3 GiB." in out
        assert "restart it with 3 GiB (GPU panel: Restart with 3 GiB; it waits if the GPU is full" in out

        async def offered():
            state = json.loads((await jp_fetch("api", "gpushare", "state")).body)
            return next((k["oom"] for k in state["kernels"] if k["kernel_id"] == kid and k["oom"]), None)

        assert await gpushare.wait_for(offered, what="the offer") == {
            "framework": "jax",
            "retry_quota_mib": 3072,
        }
        conforms(await gpushare.kernel(kid), "Kernel")
        events = [e for e in (await gpushare.get("events"))["events"] if e["kind"] == "out-of-memory"]
        assert events and "restart with 3 GiB" in events[-1]["message"]
        await jp_fetch("api", "sessions", session, method="DELETE")
        got = learned(ledger_file)
        assert (got.need_mib, got.failed) == (3072, True)  # 1.5 x 2 GiB, not NVML's 1 GiB

        session, kid = await start_session(jp_fetch, NB)
        k = await gpushare.kernel(kid)
        assert (k["quota_source"], k["quota_mib"], k["oom"]) == ("learned", 3072, None)
        events = [e for e in (await gpushare.get("events"))["events"] if e["kind"] == "learned"]
        assert "a run that ran out of memory" in events[-1]["message"]
        await use(gpushare, jp_serverapp, kid, "512MiB", 512)  # a good run that needed little
        await jp_fetch("api", "sessions", session, method="DELETE")
        _, kid = await start_session(jp_fetch, NB)
        assert (await gpushare.kernel(kid))["quota_mib"] == 3072  # the failed run stays the floor
