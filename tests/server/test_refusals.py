"""A start refused by a rule, on every route that starts a kernel: a 4xx JSON error with the rule's code and figures
(as PATCH /api/gpushare/kernels/<id> gives), and no traceback in the server's log (seam/refusals.py)."""

from __future__ import annotations

import json
import logging

import pytest
from multiuser import Broker
from tornado.httpclient import HTTPClientError

from jupyter_gpushare.core.words import render


def tracebacks(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]


async def refused(jp_fetch, route: str, body: dict) -> tuple[int, dict]:
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("api", route, method="POST", body=json.dumps(body))
    assert e.value.response.headers["Content-Type"].startswith("application/json")
    return e.value.code, json.loads(e.value.response.body)


def session_body(path: str) -> dict:
    return {"path": path, "type": "notebook", "name": path, "kernel": {"name": "python3"}}


class TestAPerUserLimitOfTheBroker:
    @pytest.fixture
    def broker(self, tmp_path):
        broker = Broker(tmp_path, limits={"max_kernels": 1}).start()
        yield broker
        broker.stop()

    @pytest.fixture
    def gpushare_config(self, gpushare_config, broker):
        return {**gpushare_config, "broker_socket": broker.socket}

    async def test_a_second_notebook_past_max_kernels_is_a_400_with_the_rule(self, gpushare, jp_fetch, caplog):
        await gpushare.open_notebook("first.ipynb")
        code, body = await refused(jp_fetch, "sessions", session_body("second.ipynb"))
        assert code == 400
        assert body["code"] == "user-max-kernels" and body["params"]["max_kernels"] == 1
        assert "at most 1 GPU kernel" in body["message"]
        assert render(f"policy.{body['code']}", body["params"]).startswith("You may run only 1 GPU kernel at a time")
        # The same rule through /api/kernels; each refusal is one event (the manager logs it, once), and jupyter's
        # log holds no traceback and no error
        code, again = await refused(jp_fetch, "kernels", {"name": "python3"})
        assert code == 400 and again["code"] == "user-max-kernels"
        events = (await gpushare.get("events"))["events"]
        assert [e["code"] for e in events if e["kind"] == "refused"] == ["refused-user-max-kernels"] * 2
        assert tracebacks(caplog) == []
        assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


class TestTooManyInLine:
    @pytest.fixture
    def gpushare_config(self, gpushare_config):
        return {**gpushare_config, "default_quota": "4GiB", "queue_max_per_user": 1}

    async def test_a_notebook_past_the_users_cap_in_line_is_a_400_with_the_rule(self, gpushare, jp_fetch, caplog):
        await gpushare.start_kernel(), await gpushare.start_kernel()  # the card is full
        _, waiting = await gpushare.open_notebook("a.ipynb")
        assert await gpushare.state_of(waiting) == "queued"
        code, body = await refused(jp_fetch, "sessions", session_body("b.ipynb"))
        assert code == 400 and body["code"] == "user-max-waiting" and body["params"] == {"waiting": 1}
        assert tracebacks(caplog) == []
        sessions = json.loads((await jp_fetch("api", "sessions")).body)
        assert [s["path"] for s in sessions] == ["a.ipynb"]  # nothing is left of the refused one


class TestNoRoom:
    @pytest.fixture
    def gpushare_config(self, gpushare_config):
        return {**gpushare_config, "default_quota": "4GiB", "on_full": "reject"}

    async def test_no_room_is_a_503_on_sessions_too_not_a_500(self, gpushare, jp_fetch, caplog):
        await gpushare.start_kernel(), await gpushare.start_kernel()
        code, body = await refused(jp_fetch, "sessions", session_body("third.ipynb"))
        assert code == 503 and body["message"].startswith("No GPU has room for this kernel: it needs 4.5 GiB")
        assert "code" not in body  # no rule refused it: there was no room
        assert tracebacks(caplog) == []
