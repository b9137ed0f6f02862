"""Room given back goes to the next kernel in line as soon as the card shows it free: a real jupyter-server, real
kernels, the simulated card (10 GiB; each kernel reserves 4 GiB + 512 MiB, so two fit and the third waits).

The sampler here reads the card every 10 minutes, so a grant that waits for its next reading does not come within
the test's wait."""

from __future__ import annotations

import time

import pytest
from jupyter_client.session import Session
from kernels import cell_result, send_cell

from jupyter_gpushare.server.manager import process_manager


@pytest.fixture
def gpushare_config(gpushare_config):
    return {**gpushare_config, "default_quota": "4GiB", "queue_timeout": 120, "sample_interval": 600.0}


async def test_a_closed_notebooks_room_goes_to_the_next_in_line_once_the_card_is_read_again(gpushare, kernel_ws):
    """A kernel that used the card shuts down. The last reading of the card still lists its process, gone now, as
    one without a reservation, whose memory admission counts as taken. The room goes to the next kernel in line
    once a reading taken after the release shows it, asked for at once: not at the sampler's next reading. A
    class's hand-off waited for that (a release to the next grant: 0.67 s median on an H200, sample_interval 1 s)."""
    used, kid = await gpushare.open_notebook("used.ipynb")
    await gpushare.open_notebook("other.ipynb")
    session = Session()
    ws = await kernel_ws(kid, session.session)
    cell = send_cell(ws, session, "import gpushare_simulate; gpushare_simulate.use('3GiB'); 'used'")
    assert await cell_result(ws, kid, cell) == "'used'"
    ws.close()
    manager = process_manager()
    assert manager is not None
    reading = await manager.services.readings.fresh(time.time(), 10)  # the card read with the kernel's 3 GiB
    assert reading is not None and reading.kernels[kid].used_mib == 3072, reading
    _, waiter = await gpushare.open_notebook("waiter.ipynb")
    assert await gpushare.state_of(waiter) == "queued"
    await gpushare.close_notebook(used)
    await gpushare.wait_for(lambda: _running(gpushare, waiter), timeout=20, what="the waiting kernel's grant")
    assert time.time() - reading.time < 600  # (granted before the sampler's next reading of its own)


async def _running(gpushare, kernel_id: str) -> bool:
    return await gpushare.state_of(kernel_id) == "running"
