"""The usage API on a real server with real kernels and the simulated card's fake NVML.

Replies are checked against the component schemas of api/openapi.yaml.
"""

from __future__ import annotations

import json
import os

import pytest
from apispec import SPEC, conforms
from kernels import run_in_kernel


@pytest.fixture
def gpushare_config(gpushare_config):
    return {**gpushare_config, "sample_interval": 0.2, "over_quota_action": "notify", "idle_timeout": 0}


CHILD = "import subprocess, sys; child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); print(child.pid)"


async def test_a_child_process_of_a_kernel_is_measured_as_the_kernel(gpushare, jp_serverapp):
    kid = await gpushare.start_kernel()
    child = int(await run_in_kernel(jp_serverapp, kid, CHILD))
    fake = jp_serverapp.web_app.settings["gpushare_manager"].backend.fake
    fake.add_process(child, 1500, utilization=25)
    fake.add_process(os.getpid(), 700)  # the test process itself: not a kernel, so "other"

    rec = await gpushare.wait_for(lambda: _used(gpushare, kid, 1500), what="the child's memory on the kernel")
    conforms(rec, "Kernel")
    assert rec["used_mib"] == 1500 and rec["peak_mib"] == 1500 and rec["utilization"] == 25.0
    assert rec["processes"] == [{"pid": child, "card_index": 0, "used_mib": 1500, "utilization": 25.0}]
    assert rec["state"] == "running"

    cards = await gpushare.get("cards")
    conforms(cards, "CardsReply")
    card = cards["cards"][0]
    assert card["used_mib"] == 2200 and card["used_by_kernels_mib"] == 1500 and card["used_by_others_mib"] == 700
    assert card["free_mib"] == 10240 - 2200 and card["reserved_mib"] == 2048 + 512
    assert cards["sampler"]["error"] is None and cards["sampler"]["interval_s"] == 0.2

    one = await gpushare.get(f"kernels/{kid}")
    conforms(one, "Kernel")
    assert one["used_mib"] == 1500

    fake.remove_process(child)
    rec = await gpushare.wait_for(lambda: _used(gpushare, kid, 0), what="the memory given back")
    assert rec["peak_mib"] == 1500 and rec["utilization"] == 0.0
    await run_in_kernel(jp_serverapp, kid, "child.kill(); child.wait()")


async def test_near_quota_state_and_event(gpushare, jp_serverapp):
    kid = await gpushare.start_kernel()
    pid = (await gpushare.kernel(kid))["pid"]
    jp_serverapp.web_app.settings["gpushare_manager"].backend.fake.add_process(pid, 2400)  # of 2560 reserved
    rec = await gpushare.wait_for(lambda: _state(gpushare, kid, "near_quota"), what="near_quota")
    conforms(rec, "Kernel")
    events = [e for e in (await gpushare.get("events"))["events"] if e["kind"] == "near-quota"]
    assert len(events) == 1 and events[0]["used_mib"] == 2400 and events[0]["reserved_mib"] == 2560
    conforms(events[0], "Event")


async def test_every_reply_conforms_without_any_use(gpushare):
    kid = await gpushare.start_kernel()
    await gpushare.wait_for(lambda: _used(gpushare, kid, 0), what="first reading")
    for path, schema in (("cards", "CardsReply"), (f"kernels/{kid}", "Kernel")):
        conforms(await gpushare.get(path), schema)
    for k in (await gpushare.get("kernels"))["kernels"]:
        conforms(k, "Kernel")
    for e in (await gpushare.get("events"))["events"]:
        conforms(e, "Event")


class TestLostCard:
    async def test_card_lost_mid_run_is_reported_with_null_figures(self, gpushare, jp_serverapp):
        kid = await gpushare.start_kernel()
        fake = jp_serverapp.web_app.settings["gpushare_manager"].backend.fake
        fake.add_process((await gpushare.kernel(kid))["pid"], 1000)
        await gpushare.wait_for(lambda: _used(gpushare, kid, 1000), what="use")
        fake.lose(0)
        rec = await gpushare.wait_for(lambda: _used(gpushare, kid, None), what="use unknown")
        assert rec["state"] == "running" and rec["peak_mib"] == 1000
        cards = await gpushare.get("cards")
        conforms(cards, "CardsReply")
        card = cards["cards"][0]
        assert card["lost"] and card["used_mib"] is None and "lost" in card["errors"]["card"]
        fake.lose(0, False)
        await gpushare.wait_for(lambda: _used(gpushare, kid, 1000), what="use again")


class TestNoGpu:
    @pytest.fixture
    def gpushare_config(self, gpushare_config):
        return {**gpushare_config, "gpu_backend": "auto", "simulated_cards": ""}

    async def test_without_gpu_use_is_null_and_the_sampler_says_why(self, gpushare, jp_serverapp):
        if jp_serverapp.web_app.settings["gpushare_manager"].cards:
            pytest.skip("this host has a GPU")
        kid = await gpushare.start_kernel()
        cards = await gpushare.wait_for(lambda: _sampled(gpushare), what="a reading")
        conforms(cards, "CardsReply")
        assert cards["cards"] == [] and cards["sampler"]["error"].startswith("No GPU")
        rec = await gpushare.kernel(kid)
        conforms(rec, "Kernel")
        assert rec["used_mib"] is None and rec["state"] == "cpu"


async def _sampled(gpushare):
    cards = await gpushare.get("cards")
    return cards if cards["sampler"]["time"] else None


async def _used(gpushare, kid, mib):
    rec = await gpushare.kernel(kid)
    return rec if rec and rec["used_mib"] == mib and "used_mib" in rec else None


async def _state(gpushare, kid, state):
    rec = await gpushare.kernel(kid)
    return rec if rec and rec["state"] == state else None


def test_openapi_file_is_valid():
    from openapi_spec_validator import validate as validate_spec

    validate_spec(SPEC)
    json.dumps(SPEC)
