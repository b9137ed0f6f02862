"""GET /api/gpushare/state: one versioned state, judged by the server, announced on the event bus.

A real jupyter-server (pytest-jupyter) on a simulated 10 GiB card; kernels say what they "use" of it
(gpushare_simulate), as a student can on a machine without a GPU.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from apispec import conforms
from tornado.httpclient import HTTPClientError

from jupyter_gpushare.core.words import event_words
from jupyter_gpushare.ledger.view import card_segments
from jupyter_gpushare.server.state import STATE_SCHEMA, event_view, kernel_status


@pytest.fixture
def gpushare_config(gpushare_config):
    # 1 GiB quotas + 512 MiB context reserve: a kernel is over its reservation past 1.5 GiB
    return {**gpushare_config, "default_quota": "1GiB", "over_quota_grace": 60, "near_quota_threshold": 0.9}


async def state(jp_fetch, etag: str | None = None):
    headers = {"If-None-Match": etag} if etag else {}
    r = await jp_fetch("api", "gpushare", "state", method="GET", headers=headers, raise_error=False)
    return r


async def run_code(jp_serverapp, kernel_id: str, code: str) -> None:
    client = jp_serverapp.kernel_manager.get_kernel(kernel_id).client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=60)
        reply = await client.execute_interactive(code, timeout=60)
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        client.stop_channels()


async def test_one_state_with_a_version_an_unchanged_one_is_a_304(gpushare, jp_fetch):
    kid = await gpushare.start_kernel()
    r = await state(jp_fetch)
    assert r.code == 200
    body = json.loads(r.body)
    assert r.headers["ETag"] == f'"{body["version"]}"'
    conforms(body, "State")  # api/openapi.yaml
    (k,) = body["kernels"]
    assert k["kernel_id"] == kid and k["status"]["label"] == "running" and k["status"]["severity"] == "ok"
    r2 = await state(jp_fetch, r.headers["ETag"])
    assert r2.code == 304 and not r2.body
    await gpushare.stop_kernel(kid)
    r3 = await state(jp_fetch, r.headers["ETag"])
    assert r3.code == 200 and json.loads(r3.body)["kernels"] == []


async def test_a_card_adds_up_and_a_restarting_kernel_is_still_yours(gpushare, jp_fetch, jp_serverapp):
    kids = [await gpushare.start_kernel() for _ in range(2)]
    card = json.loads((await state(jp_fetch)).body)["cards"][0]
    segs = {s["key"]: s["mib"] for s in card["segments"]}
    assert sum(segs.values()) == card["total_mib"] == 10240
    assert segs["mine"] == 2 * 1536 and segs["others"] == 0 and segs["free"] == 10240 - 2 * 1536
    # a quota change restarts the kernel: between its old and new reservation it stays "yours"
    await jp_fetch("api", "gpushare", "kernels", kids[0], method="PATCH", body=json.dumps({"quota": "2GiB"}))
    await jp_fetch("api", "kernels", kids[0], "restart", method="POST", body="{}")
    card = json.loads((await state(jp_fetch)).body)["cards"][0]
    segs = {s["key"]: s["mib"] for s in card["segments"]}
    assert segs["mine"] == 1536 + 2560 and segs["others"] == 0
    for kid in kids:
        await gpushare.stop_kernel(kid)


async def test_over_quota_is_judged_once_and_said_the_same_way_everywhere(gpushare, jp_fetch, jp_serverapp):
    kid = await gpushare.start_kernel()
    await run_code(jp_serverapp, kid, "import gpushare_simulate; gpushare_simulate.use('1.4GiB')")

    async def judged(expected: str):
        k = json.loads((await state(jp_fetch)).body)["kernels"][0]
        return k if k["state"] == expected else None

    near = await gpushare.wait_for(lambda: judged("near_quota"), what="near quota at 1.4 of 1.5 GiB")
    assert near["status"]["label"] == "near quota" and "1.4 GiB of its 1.5 GiB reservation" in near["status"]["detail"]
    await run_code(jp_serverapp, kid, "gpushare_simulate.use('1.7GiB')")
    over = await gpushare.wait_for(lambda: judged("over_quota"), what="over quota at 1.7 of 1.5 GiB")
    assert over["status"]["severity"] == "error" and "more than its 1.5 GiB reservation" in over["status"]["detail"]
    events = json.loads((await state(jp_fetch)).body)["events"]
    over_events = [e for e in events if e["kind"] == "over-quota"]
    assert len(over_events) == 1 and over_events[0]["path"] is None  # (a bare kernel: no notebook)
    await gpushare.stop_kernel(kid)


async def test_changes_are_announced_on_the_event_bus(gpushare, jp_serverapp):
    seen: list[tuple[float, dict]] = []

    async def listener(logger, schema_id, data):
        seen.append((time.monotonic(), data))

    jp_serverapp.event_logger.add_listener(schema_id=STATE_SCHEMA, listener=listener)
    t0 = time.monotonic()
    kid = await gpushare.start_kernel()
    await gpushare.wait_for(lambda: _announced(seen, kid, "listed"), what="the new kernel announced")
    assert seen[-1][0] - t0 < 30
    # each change typed: listed, then its state as it was granted
    changes = [c for _, data in seen for c in data["changes"] if c["kernel_id"] == kid]
    assert {"kernel_id": kid, "what": "listed"} in changes and {"kernel_id": kid, "what": "state"} in changes
    await gpushare.stop_kernel(kid)
    await gpushare.wait_for(lambda: _announced(seen, kid, "gone"), what="its shutdown announced")


async def _announced(seen, kid, what) -> bool:
    await asyncio.sleep(0)
    return any(kid in data["kernel_ids"] and {"kernel_id": kid, "what": what} in data["changes"] for _, data in seen)


async def test_a_renamed_notebook_is_followed_by_its_kernel_id(gpushare, jp_fetch):
    body = {"path": "week3.ipynb", "type": "notebook", "name": "week3.ipynb", "kernel": {"name": "python3"}}
    session = json.loads((await jp_fetch("api", "sessions", method="POST", body=json.dumps(body))).body)
    kid = session["kernel"]["id"]
    await jp_fetch("api", "sessions", session["id"], method="PATCH", body=json.dumps({"path": "week3-final.ipynb"}))
    (k,) = json.loads((await state(jp_fetch)).body)["kernels"]
    assert k["kernel_id"] == kid and k["path"] == "week3-final.ipynb"
    await jp_fetch("api", "sessions", session["id"], method="DELETE")


def test_the_words_and_the_split_have_one_definition():
    over = {"state": "over_quota", "used_mib": 1740, "reserved_mib": 1536, "quota_mib": 1024, "reserve_mib": 512}
    assert kernel_status(over)["label"] == "over quota"
    gives_up = time.mktime((2026, 11, 26, 14, 32, 0, 0, 0, -1))
    queued = {"state": "queued", "position": 2, "need_mib": 2560, "free_mib": 1024, "gives_up_at": gives_up}
    text = kernel_status(queued)["detail"]
    assert "#2 in line, needs 2.5 GiB; 1 GiB unreserved now; gives up at 14:32" in text  # the timeout, said so
    assert "Likely" not in text  # no estimate known: none said
    likely = kernel_status({**queued, "likely_at": gives_up - 600})["detail"]
    assert "gives up at 14:32. Likely granted by 14:22, from how long kernels here held the GPU before." in likely
    ended = {"state": "cpu", "wait_ended": "refused-timeout", "reason": "No GPU memory came in 10 min."}
    assert kernel_status(ended)["code"] == "wait_ended" and "Join again" in kernel_status(ended)["detail"]
    assert "GpuShareApp" not in text
    assert kernel_status(queued)["code"] == "queued" and kernel_status(queued)["params"]["need_mib"] == 2560
    card = {"total_mib": 10240, "usable_mib": 9216, "reserved_mib": 9000, "outside_mib": 4000}
    segs = card_segments(card, 3000)
    assert sum(s["mib"] for s in segs) == 10240  # clamped: the parts never pass the card
    assert [s["key"] for s in segs] == ["mine", "others", "over", "outside", "headroom", "free"]
    # A student's own use past their reservation is said as over-use, the rest of the use without one as no one's
    card = {"total_mib": 10240, "usable_mib": 10240, "reserved_mib": 4096, "outside_mib": 1408}
    segs = {s["key"]: s for s in card_segments(card, 4096, over_mib=384)}
    assert (segs["over"]["mib"], segs["outside"]["mib"]) == (384, 1024)
    assert segs["over"]["label"] == "over-use" and segs["over"]["title"].startswith("Over-use: 384 MiB used by your")
    assert card_segments(card, 4096, over_mib=5000)[2]["mib"] == 1408  # never more than the use without one
    refused = event_view({"time": 1, "kind": "refused", "message": "A quota of 0 MiB is too small.", "need_mib": 0})
    assert refused["code"] == "refused" and refused["severity"] == "error"
    assert refused["params"] == {"message": "A quota of 0 MiB is too small.", "need_mib": 0}
    full = event_view({"time": 1, "kind": "refused", "code": "refused-no-room", "message": "No GPU has room ... " * 20,
                       "need_mib": 4608, "free_mib": 1024})  # fmt: skip
    assert full["code"] == "refused-no-room" and full["severity"] == "error" and "code" not in full["params"]
    assert event_words(full["code"], full["params"]) == (
        "Not started: it needs 4.5 GiB, and the most unreserved on any card is 1 GiB."
    )
    timeout = event_view({"time": 1, "kind": "refused", "code": "refused-timeout", "message": "...", "need_mib": 4608,
                          "free_mib": 0, "waited_s": None})  # fmt: skip
    assert timeout["severity"] == "error" and "waited_s" not in timeout["params"]  # not known: not sent
    assert event_words(timeout["code"], timeout["params"]) == (
        "Stopped waiting: it needs 4.5 GiB, and the most unreserved on any card is 0 MiB."
    )


async def test_a_bad_request_for_the_state_is_refused_without_a_500(jp_fetch):
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("api", "gpushare", "state", method="POST", body="{}")
    assert e.value.code in (404, 405)
