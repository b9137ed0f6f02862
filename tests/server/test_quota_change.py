"""A quota change never costs a kernel its GPU: a smaller quota shrinks its reservation in place at the restart (its
card, no line); a larger one is reserved at once from its card's unreserved room, ahead of the line, or refused at
once with the figures, the kernel keeping what it holds. Real jupyter-server, real kernels, a simulated 10 GiB card.

Each kernel reserves its 4 GiB quota + 512 MiB context reserve: two fit, with 1 GiB left, and a third waits.
"""

from __future__ import annotations

import json

import pytest
from kernels import run_in_kernel
from tornado.httpclient import HTTPClientError

from jupyter_gpushare.core.words import render


@pytest.fixture
def gpushare_config(gpushare_config):
    return {**gpushare_config, "default_quota": "4GiB", "queue_timeout": 120}


async def patch_quota(jp_fetch, kernel_id: str, quota: str) -> dict:
    body = json.dumps({"quota": quota})
    return json.loads((await jp_fetch("api", "gpushare", "kernels", kernel_id, method="PATCH", body=body)).body)


async def restart(jp_fetch, kernel_id: str) -> None:
    await jp_fetch("api", "kernels", kernel_id, "restart", method="POST", body="{}")


async def line(gpushare) -> list[str]:
    return [w["kernel_id"] for w in (await gpushare.get("queue"))["queue"]]


async def caps(jp_serverapp, kernel_id: str) -> str:
    code = "import os; print(os.environ.get('GPUSHARE_QUOTA_MIB'))"  # what the frameworks are capped at
    return (await run_in_kernel(jp_serverapp, kernel_id, code)).strip()


async def test_a_smaller_quota_keeps_the_card_and_the_lines_order(gpushare, jp_fetch, jp_serverapp):
    _, k1 = await gpushare.open_notebook("nb01.ipynb")
    _, k2 = await gpushare.open_notebook("nb02.ipynb")
    _, w1 = await gpushare.open_notebook("nb03.ipynb")
    _, w2 = await gpushare.open_notebook("nb04.ipynb")
    assert await line(gpushare) == [w1, w2]
    before = await gpushare.kernel(k1)
    got = await patch_quota(jp_fetch, k1, "3GiB")
    # Said honestly: the reservation is unchanged until the restart, where the caps change too
    assert (got["pending_quota_mib"], got["quota_mib"], got["reserved_mib"]) == (3072, 4096, 4608)
    await restart(jp_fetch, k1)
    after = await gpushare.kernel(k1)
    assert after["state"] == "running" and after["card"]["uuid"] == before["card"]["uuid"]
    assert (after["quota_mib"], after["reserved_mib"], after["pending_quota_mib"]) == (3072, 3584, None)
    assert await caps(jp_serverapp, k1) == "3072"
    # The line was not involved: the same two wait, in the same order (3 GiB free fits neither), and k1 never
    # joined it nor gave its reservation back
    assert await line(gpushare) == [w1, w2]
    events = (await gpushare.get("events"))["events"]
    assert [e["kind"] for e in events if e["kernel_id"] == k1 and e["kind"] in ("queued", "released")] == []
    assert (await gpushare.get("cards"))["cards"][0]["reserved_mib"] == 3584 + 4608
    # The student hears of the change twice, as a toast each time (a severity): asked, then applied
    said = [
        (e["code"], e["severity"], render(f"event.{e['code']}", e["params"])) for e in events if e["kernel_id"] == k1
    ]
    assert said[-2:] == [
        ("quota-requested", "info", "Quota 3 GiB requested; it applies at the next restart."),
        ("quota-applied", "success", "Restarted with its new quota, 3 GiB (3.5 GiB reserved)."),
    ]


async def test_a_larger_quota_is_reserved_at_once_or_refused_at_once_with_why(gpushare, jp_fetch, jp_serverapp):
    _, k1 = await gpushare.open_notebook("nb01.ipynb")
    _, k2 = await gpushare.open_notebook("nb02.ipynb")
    # 6 GiB needs 2 GiB more on k1's card, which has 1 GiB unreserved: refused now, and nothing changes
    with pytest.raises(HTTPClientError) as e:
        await patch_quota(jp_fetch, k1, "6GiB")
    assert e.value.code == 409
    refusal = json.loads(e.value.response.body)
    assert refusal["code"] == "grow-no-room"
    assert refusal["params"] == {"quota_mib": 6144, "extra_mib": 2048, "free_mib": 1024, "card_index": 0}
    assert render("policy.grow-no-room", refusal["params"]) == (
        "6 GiB needs 2 GiB more on GPU 0, which has 1 GiB unreserved now. The kernel keeps its quota and its "
        "GPU; ask again once others have shut down, or ask for less."
    )
    rec = await gpushare.kernel(k1)
    assert (rec["state"], rec["quota_mib"], rec["reserved_mib"], rec["pending_quota_mib"]) == (
        "running",
        4096,
        4608,
        None,
    )
    # Once there is room, the extra is reserved at once, and the caps follow at the restart, on the same card
    await gpushare.stop_kernel(k2)
    got = await patch_quota(jp_fetch, k1, "6GiB")
    assert (got["reserved_mib"], got["pending_quota_mib"]) == (6656, 6144)
    _, late = await gpushare.open_notebook("nb03.ipynb")  # the extra is k1's: a newcomer waits for the rest
    assert await gpushare.state_of(late) == "queued"
    await restart(jp_fetch, k1)
    rec = await gpushare.kernel(k1)
    assert (rec["state"], rec["quota_mib"], rec["reserved_mib"]) == ("running", 6144, 6656)
    assert await caps(jp_serverapp, k1) == "6144"
    assert await line(gpushare) == [late]


@pytest.mark.parametrize(
    "typed, status, said, code",
    [
        ("-1", 400, "quota: '-1' is negative: a size counts memory from zero up, and at least 256 MiB here", None),
        ("1e9 GiB", 400, "is more than the largest a kernel may have here (9.5 GiB). Ask for at most 9.5 GiB.",
         "quota-above-max"),
        ("0", 400, "add a unit, e.g. '4GiB'", None),  # never '0MiB': it is below the 256 MiB minimum
        ("1", 400, "add a unit, e.g. '1GiB'.", None),  # not '1MiB' either
        ("0 GiB", 400, "Ask for at least 256 MiB.", "quota-below-min"),
    ],
)  # fmt: skip
async def test_each_bad_size_gets_its_own_accurate_reason(gpushare, jp_fetch, typed, status, said, code):
    kid = await gpushare.start_kernel()
    with pytest.raises(HTTPClientError) as e:
        await patch_quota(jp_fetch, kid, typed)
    body = json.loads(e.value.response.body)
    assert e.value.code == status and said in body["message"] and body.get("code") == code
    if code:  # the sidebar words it from the figures, typed sizes in MiB
        assert all(isinstance(v, int) for k, v in body["params"].items() if k.endswith("_mib"))
        assert said in render(f"policy.{code}", body["params"])
