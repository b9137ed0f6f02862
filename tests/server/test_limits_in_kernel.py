"""What a kernel is told it could ask for is what its user may have: a real broker with per-user limits, a real
jupyter-server and kernel on a simulated 24 GiB card. The in-kernel out-of-memory note says "ask for up to"
GPUSHARE_MAX_QUOTA_MIB; a student limited to 4 GiB was told 22,912 MiB."""

from __future__ import annotations

import pytest
from kernels import run_in_kernel
from multiuser import Broker


@pytest.fixture(params=[{"max_kernel": "4GiB"}, {"max_total": "6GiB", "max_kernel": "8GiB"}, {}])
def limits(request):
    return request.param


@pytest.fixture
def broker(tmp_path, limits):
    broker = Broker(tmp_path, gpu={"gpu_backend": "simulated", "simulated_cards": "24GiB"}, limits=limits).start()
    yield broker
    broker.stop()


@pytest.fixture
def gpushare_config(gpushare_config, broker):
    return {**gpushare_config, "broker_socket": broker.socket, "simulated_cards": "24GiB", "default_quota": "2GiB"}


async def test_a_kernel_is_told_the_most_its_user_may_ask_for(gpushare, jp_serverapp, limits):
    _, kid = await gpushare.open_notebook("limited.ipynb")
    assert await gpushare.state_of(kid) == "running"
    most = int(await run_in_kernel(jp_serverapp, kid, "import os; print(os.environ['GPUSHARE_MAX_QUOTA_MIB'])"))
    # the card's bound: 24 GiB less the broker's 512 MiB context reserve (no headroom)
    assert most == {"4GiB": 4096, "8GiB": 6144, None: 24 * 1024 - 512}[limits.get("max_kernel")]
