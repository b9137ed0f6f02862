"""A teacher's actions from the host view (server/teacher.py, ledger/notices.py), through a real jupyter-server
on a simulated 10 GiB card: two 4 GiB notebooks fit (4.5 GiB reserved each), the next two wait. The owner of a
ledger file is its admin (through a broker, its admins are: tests/broker/test_broker.py)."""

from __future__ import annotations

import json

import pytest
from tornado.httpclient import HTTPClientError

from jupyter_gpushare.ledger.ledger import Ledger


@pytest.fixture
def gpushare_config(gpushare_config):
    return {**gpushare_config, "default_quota": "4GiB", "queue_timeout": 120, "park_after": 3600}


async def _act(jp_fetch, kernel_id: str, body: object) -> dict:
    raw = body if isinstance(body, str) else json.dumps(body)
    r = await jp_fetch("api", "gpushare", "host", "kernels", kernel_id, method="POST", body=raw)
    return json.loads(r.body)


async def _said(gpushare, kernel_id: str, kind: str) -> dict | None:
    found = [e for e in (await gpushare.get("events"))["events"] if e["kernel_id"] == kernel_id and e["kind"] == kind]
    return found[-1] if found else None


async def test_a_teacher_moves_one_to_the_front_takes_one_out_and_gives_a_reservation_back(gpushare, jp_fetch):
    sessions = {}
    for name in ("a", "b", "c", "d"):
        sessions[name] = await gpushare.open_notebook(f"{name}.ipynb")
    kid = {name: s[1] for name, s in sessions.items()}
    assert [await gpushare.state_of(kid[n]) for n in "abcd"] == ["running", "running", "queued", "queued"]

    said = await _act(jp_fetch, kid["d"], {"action": "front", "why": "her lab is due today"})
    assert said["action"] == "front" and said["why"] == "her lab is due today" and said["by"]
    queue = (await gpushare.get("queue"))["queue"]
    assert [q["kernel_id"] for q in queue] == [kid["d"], kid["c"]]
    front = await gpushare.wait_for(lambda: _said(gpushare, kid["d"], "teacher-front"), what="d told of the move")
    assert front["params"]["by"] == said["by"] and front["params"]["why"] == "her lab is due today"
    assert front["severity"] == "info"

    await _act(jp_fetch, kid["c"], {"action": "remove", "why": "the lab is closed"})
    await gpushare.wait_for(lambda: _said(gpushare, kid["c"], "teacher-remove"), what="c told it left the line")
    rec = await gpushare.kernel(kid["c"])
    assert rec["state"] == "cpu" and "the lab is closed" in rec["reason"]  # it runs on, without a GPU

    await _act(jp_fetch, kid["a"], {"action": "release", "why": "idle for an hour"})
    released = await gpushare.wait_for(lambda: _said(gpushare, kid["a"], "teacher-release"), what="a's release")
    assert released["code"] == "teacher-release-parked" and await gpushare.state_of(kid["a"]) == "parked"
    await gpushare.wait_for(lambda: _running(gpushare, kid["d"]), what="d, first in line, granted a's room")
    for session, _ in sessions.values():
        await gpushare.close_notebook(session)


async def _running(gpushare, kernel_id: str) -> bool:
    return await gpushare.state_of(kernel_id) == "running"


async def test_bad_requests_are_refused_with_what_to_send(gpushare, jp_fetch):
    session, kid = await gpushare.open_notebook("a.ipynb")
    for body, status, words in [
        ("not json", 400, "not JSON"),
        ({"action": "evict"}, 400, "the action is one of front, remove, release"),
        ({"action": "front", "why": "two\nlines"}, 400, "one line of at most 200 characters"),
        ({"action": "front", "why": "x" * 201}, 400, "one line of at most 200 characters"),
        ({"action": "front", "why": 7}, 400, "one line"),
        ({"action": "front", "by": "someone else"}, 400, "Send"),
        ({"action": "remove", "why": ""}, 409, "is not in line now"),  # it holds its reservation
    ]:
        with pytest.raises(HTTPClientError) as e:
            await _act(jp_fetch, kid, body)
        assert e.value.code == status and words in e.value.response.body.decode(), (body, e.value.response.body)
    with pytest.raises(HTTPClientError) as e:
        await _act(jp_fetch, "no-such-kernel", {"action": "release"})
    assert e.value.code == 409 and "holds no GPU reservation" in e.value.response.body.decode()
    await gpushare.close_notebook(session)


class TestTakenOutElsewhere:
    @pytest.fixture
    def gpushare_config(self, gpushare_config):
        return {**gpushare_config, "reconcile_interval": 3600}  # this server takes no notice while the test runs

    async def test_a_kernel_taken_out_before_its_server_takes_the_notice_runs_on_without_a_gpu(
        self, gpushare, jp_fetch, ledger_file
    ):
        """The take-out is written in the ledger (by the broker, or the teacher's own server) and the line asks for
        the kernel (room came) before its server takes the notice: the ledger refuses it as taken out, and the kernel runs on
        without a GPU, as the notice would have it, its notebook still open. Before, that refusal shut the kernel
        down with its notebook's session (seen once in the browser tests: its record was gone)."""
        sessions = [await gpushare.open_notebook(f"{name}.ipynb") for name in "abc"]
        session, kid = sessions[2]
        assert await gpushare.state_of(kid) == "queued"
        Ledger(ledger_file).act(kid, "remove", "root", "the lab is closed")
        await gpushare.close_notebook(sessions[0][0])  # room: the line asks for the kernel again

        async def ran_on() -> dict | None:
            rec = await gpushare.kernel(kid)
            return rec if rec is None or rec["state"] != "queued" else None

        rec = await gpushare.wait_for(ran_on, what="the line to hear the take-out")
        assert rec is not None and rec["state"] == "cpu" and "the lab is closed" in rec["reason"], rec
        sessions_now = json.loads((await jp_fetch("api", "sessions")).body)
        assert session in [s["id"] for s in sessions_now]
