"""Quotas through a real jupyter-server and real ipykernel kernels (simulated 10 GiB card)."""

from __future__ import annotations

from kernels import stdout_of


async def test_kernel_start_reserves_on_a_card(gpushare):
    kid = await gpushare.start_kernel()
    k = await gpushare.kernel(kid)
    assert k["state"] == "running"
    assert k["quota_mib"] == 2048 and k["reserve_mib"] == 512 and k["reserved_mib"] == 2560
    assert k["card"]["uuid"] == "GPU-simulated-0" and k["card"]["simulated"] is True
    cards = await gpushare.get("cards")
    assert cards["simulated"] is True
    assert cards["cards"][0]["reserved_mib"] == 2560
    await gpushare.stop_kernel(kid)
    cards = await gpushare.get("cards")
    assert cards["cards"][0]["reserved_mib"] == 0
    assert await gpushare.kernel(kid) is None


async def test_kernel_env_carries_the_quota(gpushare, jp_serverapp):
    kid = await gpushare.start_kernel()
    km = jp_serverapp.kernel_manager.get_kernel(kid)
    client = km.client()
    client.start_channels()
    await client.wait_for_ready(timeout=30)
    msg_id = client.execute(
        "import os; print(os.environ['GPUSHARE_QUOTA_MIB'], os.environ['GPUSHARE_CARD_UUID'], repr(os.environ['CUDA_VISIBLE_DEVICES']))"
    )
    out = await stdout_of(client, msg_id)
    client.stop_channels()
    assert out.split() == ["2048", "GPU-simulated-0", "''"]
    await gpushare.stop_kernel(kid)
