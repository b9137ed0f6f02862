"""Another server's release reaches this server's line at once, pushed by the broker (broker/room.py,
server/room_watch.py), not found at a poll: a real broker process, a real jupyter-server and kernels on a simulated
10 GiB card. The other server is a broker client of its own holding the card, as a second server would."""

from __future__ import annotations

import asyncio
import time

import pytest
from multiuser import Broker

from jupyter_gpushare.broker.client import BrokerLedger
from jupyter_gpushare.core.policy import Size
from jupyter_gpushare.ledger.ledger import Lease, Request
from jupyter_gpushare.server import line


@pytest.fixture
def broker(tmp_path):
    broker = Broker(tmp_path, limits={}).start()
    yield broker
    broker.stop()


@pytest.fixture
def gpushare_config(gpushare_config, broker):
    return {**gpushare_config, "broker_socket": broker.socket, "default_quota": "4GiB", "queue_timeout": 120}


async def test_a_release_by_another_server_grants_the_next_in_line_at_once(gpushare, jp_serverapp, broker, monkeypatch):
    # The line's own poll is slowed to 30 s: only the broker's word can grant the waiting kernel within seconds
    monkeypatch.setattr(line, "PUSHED_POLL_S", 30.0)
    other = BrokerLedger(broker.socket)  # another server of this host
    try:
        held = other.reserve(Request("other-server-kernel", Size(mib=9 * 1024), "someone", "python3"))
        assert isinstance(held, Lease)
        _, waiting = await gpushare.open_notebook("next.ipynb")
        assert await gpushare.state_of(waiting) == "queued"
        # the first answers of the ledger, and the watch held at the broker (after its first count)
        watch = jp_serverapp.web_app.settings["gpushare_manager"].line._watch
        await gpushare.wait_for(lambda: _live(watch), what="the server to watch the broker")
        await asyncio.sleep(1.0)  # past the line's last short poll (QUEUE_POLL_S): it waits 30 s now
        released = time.monotonic()
        other.release("other-server-kernel")
        await gpushare.wait_for(lambda: _running(gpushare, waiting), timeout=20, what="the grant")
        took = time.monotonic() - released
    finally:
        other.close()
    assert took < 15.0, f"granted {took:.2f} s after another server's release: not pushed (the poll is 30 s)"


async def _live(watch) -> bool:
    return watch is not None and watch.live


async def _running(gpushare, kernel_id: str) -> bool:
    return await gpushare.state_of(kernel_id) == "running"
