"""Prometheus metrics on the server's /metrics, fed from the sampler's snapshot."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

MIB = 2**20


@pytest.fixture
def gpushare_config(gpushare_config):
    return {**gpushare_config, "sample_interval": 0.2, "over_quota_action": "notify", "idle_timeout": 0}


async def scrape(jp_fetch) -> dict[tuple[str, tuple], float]:
    r = await jp_fetch("metrics", method="GET")
    out = {}
    for family in text_string_to_metric_families(r.body.decode()):
        if family.name.startswith("gpushare_"):
            for s in family.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_card_and_kernel_gauges_and_gone_kernels_lose_their_series(gpushare, jp_fetch, jp_serverapp):
    kid = await gpushare.start_kernel()
    pid = (await gpushare.kernel(kid))["pid"]
    jp_serverapp.web_app.settings["gpushare_manager"].backend.fake.add_process(pid, 1200, utilization=50)
    card = (("card", "0"), ("uuid", "GPU-simulated-0"))
    kernel = (("card", "0"), ("kernel_id", kid))

    async def ready():
        m = await scrape(jp_fetch)
        return m if m.get(("gpushare_kernel_memory_used_bytes", kernel)) == 1200 * MIB else None

    m = await gpushare.wait_for(ready, what="kernel series")
    assert m[("gpushare_card_memory_total_bytes", card)] == 10240 * MIB
    assert m[("gpushare_card_memory_used_bytes", card)] == 1200 * MIB
    assert m[("gpushare_card_memory_used_by_kernels_bytes", card)] == 1200 * MIB
    assert m[("gpushare_card_memory_used_by_others_bytes", card)] == 0
    assert m[("gpushare_card_memory_reserved_bytes", card)] == 2560 * MIB
    assert m[("gpushare_card_utilization_ratio", card)] == 0.5
    assert m[("gpushare_kernel_memory_reserved_bytes", kernel)] == 2560 * MIB
    assert m[("gpushare_kernel_memory_quota_bytes", kernel)] == 2048 * MIB
    assert m[("gpushare_kernel_memory_peak_bytes", kernel)] == 1200 * MIB
    assert m[("gpushare_kernel_utilization_ratio", kernel)] == 0.5
    assert m[("gpushare_kernel_over_quota", kernel)] == 0
    assert m[("gpushare_gpu_measured", ())] == 1

    await gpushare.stop_kernel(kid)

    async def gone():
        m = await scrape(jp_fetch)
        return m if not any(kid in dict(labels).get("kernel_id", "") for _, labels in m) else None

    m = await gpushare.wait_for(gone, what="kernel series removed")
    assert ("gpushare_card_memory_total_bytes", card) in m


async def test_metrics_need_authentication(gpushare, jp_base_url, jp_http_port):
    from tornado.httpclient import AsyncHTTPClient, HTTPClientError

    with pytest.raises(HTTPClientError) as e:
        await AsyncHTTPClient().fetch(f"http://localhost:{jp_http_port}{jp_base_url}metrics")
    assert e.value.code in (401, 403)
