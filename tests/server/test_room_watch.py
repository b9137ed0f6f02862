"""Another server's release reaches this server's line at once, pushed by the broker (broker/room.py,
server/room_watch.py), not found at a poll: a real broker process, a real jupyter-server and kernels on a simulated
10 GiB card. The other server is a broker client of its own holding the card, as a second server would. A watch held
at the broker ends at once when its server (or a terminal job) closes: the program does not idle until it ends."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time

import pytest
from multiuser import Broker

from jupyter_gpushare.broker.client import BrokerLedger
from jupyter_gpushare.ledger.ledger import LedgerError
from jupyter_gpushare.server import line


@pytest.fixture
def broker(tmp_path):
    broker = Broker(tmp_path, limits={}).start()
    yield broker
    broker.stop()


@pytest.fixture
def gpushare_config(gpushare_config, broker):
    return {**gpushare_config, "broker_socket": broker.socket, "default_quota": "4GiB", "queue_timeout": 120}


# Another server of this host: its own process (the broker tells servers apart by process, and a server releases
# what its own process holds for kernels it no longer has). It holds 9 GiB until a line on stdin, then releases.
OTHER_SERVER = """
import sys
from jupyter_gpushare.broker.client import BrokerLedger
from jupyter_gpushare.core.policy import Size
from jupyter_gpushare.ledger.ledger import Lease, Request
other = BrokerLedger(sys.argv[1])
held = other.reserve(Request("other-server-kernel", Size(mib=9 * 1024), "someone", "python3"))
print("held" if isinstance(held, Lease) else f"not held: {held!r}", flush=True)
sys.stdin.readline()
other.release("other-server-kernel")
print("released", flush=True)
sys.stdin.readline()
"""


async def test_a_release_by_another_server_grants_the_next_in_line_at_once(gpushare, jp_serverapp, broker, monkeypatch):
    # The line's own poll is slowed to 30 s: only the broker's word can grant the waiting kernel within seconds
    monkeypatch.setattr(line, "PUSHED_POLL_S", 30.0)
    with subprocess.Popen(
        [sys.executable, "-c", OTHER_SERVER, broker.socket], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as other:
        assert other.stdin is not None and other.stdout is not None
        out = other.stdout

        async def said() -> str:  # its next line (a minute at most: a broker that does not answer fails here)
            return await asyncio.wait_for(asyncio.to_thread(out.readline), 60)

        try:
            assert await said() == "held\n"
            _, waiting = await gpushare.open_notebook("next.ipynb")
            assert await gpushare.state_of(waiting) == "queued"
            # the first answers of the ledger, and the watch held at the broker (after its first count)
            watch = jp_serverapp.web_app.settings["gpushare_manager"].line._watch
            await gpushare.wait_for(lambda: _live(watch), what="the server to watch the broker")
            await asyncio.sleep(1.0)  # past the line's last short poll (QUEUE_POLL_S): it waits 30 s now
            released = time.monotonic()
            other.stdin.write("\n")
            other.stdin.flush()
            assert await said() == "released\n"
            await gpushare.wait_for(lambda: _running(gpushare, waiting), timeout=20, what="the grant")
            took = time.monotonic() - released
        finally:
            other.kill()
    assert took < 15.0, f"granted {took:.2f} s after another server's release: not pushed (the poll is 30 s)"


async def _live(watch) -> bool:
    return watch is not None and watch.live


async def _running(gpushare, kernel_id: str) -> bool:
    return await gpushare.state_of(kernel_id) == "running"


def test_closing_a_client_ends_the_watch_it_holds_at_once(broker):
    """A terminal job that waited holds a watch (up to room_watch.WATCH_S, 25 s); as it exits, its manager closes
    the client from another thread. Closing a socket whose file another thread reads waits for that read: the job
    idled about 25 s after its work (2 of 2 runs). The close must end the held watch now."""
    client = BrokerLedger(broker.socket)
    seen = client.watch(0, 0.001)
    ended: list[BaseException] = []

    def hold() -> None:
        try:
            client.watch(seen, 25.0)
        except BaseException as e:  # (the closed connection's LedgerError)
            ended.append(e)

    watching = threading.Thread(target=hold, daemon=True)
    watching.start()
    time.sleep(0.5)  # the watch is held at the broker now
    closing = time.monotonic()
    client.close()
    took = time.monotonic() - closing
    watching.join(10)
    assert not watching.is_alive() and ended, "the watch was still held after its client closed"
    assert took < 10.0, f"close() waited {took:.1f} s for the watch's read (it is held for 25 s)"


def test_a_close_between_a_watchs_send_and_its_read_ends_it_as_a_ledger_error(broker):
    """The close from another thread can come after the watch has sent its request and before it reads the answer.
    The watch must end as a LedgerError, which the room watch takes as stopped: CI run 50's papermill printed the
    room watch thread's AttributeError traceback (the read found the connection's file already dropped)."""
    client = BrokerLedger(broker.socket)
    client.watch(0, 0.001)  # connected
    sock = client._sock

    class ClosedAfterSend:  # the connection's socket, closed by "another thread" right after the request went out
        def __getattr__(self, name):
            return getattr(sock, name)

        def sendall(self, data: bytes) -> None:
            sock.sendall(data)
            client.close()

    client._sock = ClosedAfterSend()
    with pytest.raises(LedgerError):
        client.watch(1, 5.0)
