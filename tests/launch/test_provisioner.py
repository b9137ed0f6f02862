"""Quotas through a real jupyter-server and real ipykernel kernels (simulated 10 GiB card)."""

from __future__ import annotations

import subprocess
import sys

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


def test_the_provisioner_loads_without_jupyter_server():
    """Every jupyter_client program of the environment loads the provisioner (the .pth makes it their default):
    `jupyter console`, `jupyter kernel`, a script's KernelManager. It must not bring jupyter_server, whose kernel
    manager imports jupyter_events, whose jsonschema builds its IRI parsers at import (rfc3987-syntax): the
    provisioner's import took 4.0 s with it and 0.8 s without, on the 2-core machine."""
    heavy = ("jupyter_server", "jupyter_events", "jsonschema")
    code = f"import sys, jupyter_gpushare.launch.provisioner; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
