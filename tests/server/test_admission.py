"""Admission through a real jupyter-server: queue, timeout, reject, cpu fallback, restarts, deaths.

The simulated card has 10 GiB and no headroom; each Python kernel reserves 4 GiB + 512 MiB, so two
fit and a third must wait, fall back or be refused.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from jupyter_gpushare.core.words import event_words, render


@pytest.fixture
def gpushare_config(gpushare_config):
    return {**gpushare_config, "default_quota": "4GiB", "queue_timeout": 60}


async def reserved(gpushare) -> int:
    return (await gpushare.get("cards"))["cards"][0]["reserved_mib"]


async def test_third_kernel_waits_in_line_and_is_admitted_on_release(gpushare):
    """Two 4.5 GiB kernels fill the 10 GiB card; the third and fourth notebooks' kernels are listed at once, in
    line, and admitted in order as room is freed."""
    _, k1 = await gpushare.open_notebook("n1.ipynb")
    _, k2 = await gpushare.open_notebook("n2.ipynb")
    _, k3 = await gpushare.open_notebook("n3.ipynb")
    _, k4 = await gpushare.open_notebook("n4.ipynb")
    queue = (await gpushare.get("queue"))["queue"]
    assert [(q["position"], q["kernel_id"], q["quota_mib"], q["need_mib"]) for q in queue] == [
        (1, k3, 4096, 4608),
        (2, k4, 4096, 4608),
    ]
    waiting = [await gpushare.kernel(k) for k in (k3, k4)]
    assert [(k["state"], k["position"]) for k in waiting] == [("queued", 1), ("queued", 2)]
    assert waiting[0]["need_mib"] == 4608 and waiting[0]["free_mib"] == 10240 - 2 * 4608

    await gpushare.stop_kernel(k1)
    await gpushare.wait_for(lambda: _is(gpushare, k3, "running"), what="the third kernel admitted")
    assert await gpushare.state_of(k4) == "queued"  # the second in line stays in line
    events = [e["kind"] for e in (await gpushare.get("events"))["events"] if e["kernel_id"] == k3]
    assert events[:1] == ["queued"] and "admitted" in events

    await gpushare.stop_kernel(k2)
    await gpushare.wait_for(lambda: _is(gpushare, k4, "running"), what="the fourth kernel admitted")
    assert (await gpushare.get("queue"))["queue"] == []
    assert await reserved(gpushare) == 2 * 4608
    for k in (k3, k4):
        await gpushare.stop_kernel(k)


async def _is(gpushare, kernel_id: str, state: str) -> bool:
    return await gpushare.state_of(kernel_id) == state


async def test_memory_used_outside_any_kernel_holds_the_next_kernel_until_it_is_freed(gpushare, jp_serverapp):
    """A script run outside Jupyter (a process of this host in no kernel) holds 4 GiB: the next kernel fits
    by reservations alone but waits, and is admitted once the script exits."""
    fake = jp_serverapp.web_app.settings["gpushare_manager"].backend.fake
    k1 = await gpushare.start_kernel()
    script = await asyncio.create_subprocess_exec("sleep", "60")
    fake.add_process(script.pid, 4096)

    async def measured():
        card = (await gpushare.get("cards"))["cards"][0]
        return card if card.get("used_by_others_mib") == 4096 else None

    card = await gpushare.wait_for(measured, what="the script's memory measured")
    assert card["reserved_mib"] == 4608 and card["used_by_kernels_mib"] == 0
    assert card["outside_mib"] == 4096  # in no reserved kernel's tree: what the sidebar shows as "no reservation"
    _, k2 = await gpushare.open_notebook("second.ipynb")
    waiting = await gpushare.kernel(k2)
    assert waiting["state"] == "queued" and waiting["free_mib"] == 10240 - 4608 - 4096
    script.kill()
    await script.wait()
    fake.remove_process(script.pid)
    await gpushare.wait_for(lambda: _is(gpushare, k2, "running"), what="the second kernel admitted")
    assert await reserved(gpushare) == 2 * 4608
    for k in (k1, k2):
        await gpushare.stop_kernel(k)


async def _fill_and_try_third(gpushare):
    ks = [await gpushare.start_kernel(), await gpushare.start_kernel()]
    with pytest.raises(HTTPClientError) as e:
        await gpushare.start_kernel()
    return ks, e.value.code, json.loads(e.value.response.body)["message"]


async def _event(gpushare, kernel_id: str, kind: str):
    found = [e for e in (await gpushare.get("events"))["events"] if e["kernel_id"] == kernel_id and e["kind"] == kind]
    return found[-1] if found else None


class TestWhenFull:
    @pytest.fixture
    def gpushare_config(self, gpushare_config, request):
        return {**gpushare_config, **request.param}

    @pytest.mark.parametrize("gpushare_config", [{"queue_timeout": 3.0}], indirect=True)
    async def test_a_wait_past_the_queue_timeout_ends_with_the_reason(self, gpushare, jp_serverapp):
        await gpushare.start_kernel(), await gpushare.start_kernel()
        session, kid = await gpushare.open_notebook("late.ipynb")
        # it joined the line (its state may be past it: on a loaded machine its start took 3.7 s, the whole wait)
        assert await _event(gpushare, kid, "queued")
        ended = await gpushare.wait_for(lambda: _event(gpushare, kid, "no-gpu"), what="the wait to time out")
        rec = await gpushare.kernel(kid)
        message = rec["reason"]  # the whole reason, in the kernel's status; the event says it short
        assert "needs 4.5 GiB (quota 4 GiB + 512 MiB CUDA context reserve)" in message
        assert "most unreserved on any card is 1 GiB" in message
        waited = re.search(
            r"waited (\d+) s in the queue", message
        )  # (the wait as it was: the timeout, or a turn later)
        assert waited and 3 <= int(waited[1]) <= 10, message
        assert "Shut down a kernel you no longer use" in message and ended["path"] == "late.ipynb"
        assert ended["code"] == "refused-timeout"  # the sidebar's words, from the figures
        words = event_words(ended["code"], ended["params"])
        assert (
            words == ended["message"]
            and words.startswith("Stopped waiting after ")
            and words.endswith(": it needs 4.5 GiB, and the most unreserved on any card is 1 GiB.")
        )
        # The kernel runs on without a GPU, with its session and whatever it holds; nothing waits, and it holds
        # no GPU memory.
        assert rec["state"] == "cpu" and rec["reserved_mib"] in (None, 0)
        assert rec["wait_ended"] == "refused-timeout"  # the notebook's banner stays, with Join again
        assert session in [s["id"] for s in await jp_serverapp.session_manager.list_sessions()]
        assert await jp_serverapp.kernel_manager.get_kernel(kid).is_alive()
        assert (await gpushare.get("queue"))["queue"] == []
        assert (await gpushare.get("cards"))["cards"][0]["reserved_mib"] == 2 * 4608

    @pytest.mark.parametrize("gpushare_config", [{"on_full": "reject"}], indirect=True)
    async def test_reject_reaches_the_http_client_at_once(self, gpushare):
        ks, code, message = await _fill_and_try_third(gpushare)
        assert code == 503 and "No GPU has room for this kernel: it needs 4.5 GiB" in message
        assert "waited" not in message
        events = (await gpushare.get("events"))["events"]
        kinds = [e["kind"] for e in events]
        assert kinds.count("reserved") == 2 and kinds.count("refused") == 1
        assert [e["code"] for e in events if e["kind"] == "refused"] == ["refused-no-room"]

    @pytest.mark.parametrize("gpushare_config", [{"on_full": "cpu"}], indirect=True)
    async def test_cpu_fallback_starts_without_a_gpu_and_says_so(self, gpushare, jp_serverapp):
        await gpushare.start_kernel(), await gpushare.start_kernel()
        k3 = await gpushare.start_kernel()
        rec = await gpushare.kernel(k3)
        assert rec["state"] == "cpu" and rec["card"] is None and rec["reserved_mib"] is None
        assert "No GPU has room" in rec["reason"] and "started without a GPU" in rec["reason"]
        said = [e for e in (await gpushare.get("events"))["events"] if e["kind"] == "no-gpu"][-1]
        assert (said["code"], said["severity"]) == ("no-gpu-full", "warning")
        assert event_words(said["code"], said["params"]) == (
            "Started without a GPU: it needs 4.5 GiB, and the most unreserved on any card is 1 GiB."
        )
        env = await kernel_env(jp_serverapp, k3)
        assert env["CUDA_VISIBLE_DEVICES"] == "" and env["GPUSHARE_MODE"] == "cpu"
        assert await reserved(gpushare) == 2 * 4608


async def kernel_env(jp_serverapp, kernel_id: str) -> dict:
    """The environment of a running kernel, read by running code in it."""
    client = jp_serverapp.kernel_manager.get_kernel(kernel_id).client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=60)
        reply = (
            await client.execute_interactive(
                "import os, json; print(json.dumps({k: v for k, v in os.environ.items() if k.startswith(('GPUSHARE', 'CUDA', 'XLA', 'CUPY', 'TF_'))}))",
                output_hook=lambda msg: out.append(msg),
                timeout=60,
            )
            if (out := []) is not None
            else None
        )
        assert reply["content"]["status"] == "ok"
    finally:
        client.stop_channels()
    text = "".join(m["content"].get("text", "") for m in out if m["msg_type"] == "stream")
    return json.loads(text)


async def test_restart_keeps_the_reservation(gpushare, jp_fetch):
    kid = await gpushare.start_kernel()
    before = await gpushare.kernel(kid)
    await jp_fetch("api", "kernels", kid, "restart", method="POST", body="{}")
    after = await gpushare.kernel(kid)
    assert after["state"] == "running" and after["card"] == before["card"]
    assert after["reserved_mib"] == before["reserved_mib"] and after["pid"] != before["pid"]
    assert await reserved(gpushare) == 4608
    kinds = [e["kind"] for e in (await gpushare.get("events"))["events"]]
    assert kinds.count("reserved") == 1 and "released" not in kinds


async def test_kernel_killed_once_is_restarted_with_its_reservation(gpushare, jp_serverapp):
    kid = await gpushare.start_kernel()
    pid = (await gpushare.kernel(kid))["pid"]
    os.kill(pid, signal.SIGKILL)
    rec = await gpushare.wait_for(lambda: _new_pid(gpushare, kid, pid), timeout=30, what="auto-restart")
    assert rec["state"] == "running" and await reserved(gpushare) == 4608
    # Let the restart finish: jupyter_client's shutdown at teardown fails on a kernel still starting
    # (InvalidStateError from its pending ``ready`` future).
    await asyncio.wait_for(jp_serverapp.kernel_manager.get_kernel(kid).ready, 30)


async def _new_pid(gpushare, kid, old):
    rec = await gpushare.kernel(kid)
    return rec if rec and rec["pid"] not in (None, old) else None


class TestDeath:
    @pytest.fixture
    def jp_server_config(self, jp_server_config):
        return {**jp_server_config, "KernelRestarter": {"restart_limit": 0, "time_to_dead": 0.5}}

    async def test_kernel_dead_past_its_restart_limit_is_released(self, gpushare, jp_serverapp):
        kid = await gpushare.start_kernel()
        os.kill((await gpushare.kernel(kid))["pid"], signal.SIGKILL)
        await gpushare.wait_for(lambda: _is_zero(gpushare), timeout=30, what="release after death")
        assert await gpushare.kernel(kid) is None
        assert kid not in jp_serverapp.kernel_manager.list_kernel_ids()
        kinds = [(e["kind"], e["message"]) for e in (await gpushare.get("events"))["events"] if e["kernel_id"] == kid]
        # (released by Jupyter's word that it died, or by the reconcile that found it gone, whichever came first on
        # a loaded machine: CI saw the second once)
        assert {("released", "Released 4.5 GiB (died past its restart limit)."),
                ("released", "Released 4.5 GiB (gone from the server).")} & set(kinds), kinds  # fmt: skip


async def _is_zero(gpushare):
    return await reserved(gpushare) == 0


async def test_quota_change_applies_at_restart(gpushare, jp_fetch):
    kid = await gpushare.start_kernel()
    r = await jp_fetch("api", "gpushare", "kernels", kid, method="PATCH", body=json.dumps({"quota": "1GiB"}))
    assert json.loads(r.body)["pending_quota_mib"] == 1024
    assert (await gpushare.kernel(kid))["quota_mib"] == 4096  # not before the restart
    await jp_fetch("api", "kernels", kid, "restart", method="POST", body="{}")
    rec = await gpushare.kernel(kid)
    assert rec["quota_mib"] == 1024 and rec["pending_quota_mib"] is None and rec["state"] == "running"
    assert await reserved(gpushare) == 1024 + 512


class TestTheServerParsesWhatWasTyped:
    """The quota dialog sends what the student typed; the server's parser and limits are the only ones, and its
    answer (the size it took, or why not) is what the dialog shows."""

    @pytest.fixture
    def gpushare_config(self, gpushare_config):
        return {**gpushare_config, "max_quota": "5000MiB"}

    async def test_its_answer_is_what_the_dialog_says(self, gpushare, jp_fetch):
        kid = await gpushare.start_kernel()

        async def ask(quota):
            body = json.dumps({"quota": quota})
            return json.loads((await jp_fetch("api", "gpushare", "kernels", kid, method="PATCH", body=body)).body)

        # the maximum exactly as the admin wrote it is taken (the sidebar once refused it as "too large")
        got = await ask("5000MiB")
        assert got["pending_quota_mib"] == 5000
        # decimal gigabytes, said back in the server's figures: what the restart will really give
        got = await ask("4.5 gb")
        assert got["pending_quota_mib"] == 4291
        await jp_fetch("api", "kernels", kid, "restart", method="POST", body="{}")
        assert (await gpushare.kernel(kid))["quota_mib"] == 4291  # exactly what was said, not "4.2 GiB" parsed again
        with pytest.raises(HTTPClientError) as e:
            await ask("5001MiB")
        refusal = json.loads(e.value.response.body)
        assert "Ask for at most 4.9 GiB" in refusal["message"]
        # the rule and its figures: the dialog words them through the translator (words.ts's policy.<code>)
        assert (refusal["code"], refusal["params"]) == ("quota-above-max", {"quota_mib": 5001, "most_mib": 5000})
        assert render("policy.quota-above-max", refusal["params"]) == (
            "A quota of 4.9 GiB is more than the largest a kernel may have here (4.9 GiB). Ask for at most 4.9 GiB."
        )
        config = json.loads((await jp_fetch("api", "gpushare", "config")).body)
        assert config["max_quota"] == {"mib": 5000} and config["default_quota"] == {"mib": 4096}


@pytest.mark.parametrize(
    "body, expect",
    [
        ("not json", "not JSON"),
        ('["6GiB"]', "must be a JSON object"),
        ('{"size": "6GiB"}', 'Send {"quota": "<size>"}'),
        ('{"quota": "lots"}', "'lots' is not a size"),
        ('{"quota": "64GiB"}', "does not fit on any card"),
    ],
)
async def test_bad_quota_requests_get_400_with_a_message(gpushare, jp_fetch, body, expect):
    kid = await gpushare.start_kernel()
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("api", "gpushare", "kernels", kid, method="PATCH", body=body)
    assert e.value.code == 400 and expect in json.loads(e.value.response.body)["message"]


async def test_unknown_kernel_is_404(gpushare, jp_fetch):
    for method, body in (("GET", None), ("PATCH", '{"quota": "1GiB"}')):
        with pytest.raises(HTTPClientError) as e:
            await jp_fetch("api", "gpushare", "kernels", "no-such-kernel", method=method, body=body)
        assert e.value.code == 404 and "no-such-kernel" in json.loads(e.value.response.body)["message"]


async def test_every_endpoint_refuses_unauthenticated_requests(gpushare, jp_base_url, jp_http_port):
    client = AsyncHTTPClient()
    for path in ("cards", "kernels", "kernels/x", "host", "queue", "events", "config"):
        url = f"http://localhost:{jp_http_port}{jp_base_url}api/gpushare/{path}"
        with pytest.raises(HTTPClientError) as e:
            await client.fetch(url)
        assert e.value.code == 403, path


async def test_session_kernels_carry_the_notebook_path(gpushare, jp_fetch, jp_root_dir):
    (jp_root_dir / "work").mkdir()
    body = {"path": "work/mnist.ipynb", "type": "notebook", "name": "mnist.ipynb", "kernel": {"name": "python3"}}
    r = await jp_fetch("api", "sessions", method="POST", body=json.dumps(body))
    kid = json.loads(r.body)["kernel"]["id"]
    rec = await gpushare.kernel(kid)
    assert rec["path"] == "work/mnist.ipynb" and rec["state"] == "running"


def _write_kernelspec(data_dir, name: str, language: str = "python", provisioner_config: dict | None = None):
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": name,
        "language": language,
    }
    if provisioner_config is not None:
        spec["metadata"] = {
            "kernel_provisioner": {"provisioner_name": "gpushare-provisioner", "config": provisioner_config}
        }
    path = data_dir / "kernels" / name
    path.mkdir(parents=True)
    (path / "kernel.json").write_text(json.dumps(spec))


class TestKernelspecs:
    @pytest.fixture
    def gpushare_config(self, gpushare_config):
        return {**gpushare_config, "max_quota": "6GiB"}

    @pytest.fixture
    def specs(self, jp_data_dir):
        _write_kernelspec(jp_data_dir, "big", provisioner_config={"quota": "8GiB"})
        _write_kernelspec(jp_data_dir, "small", provisioner_config={"quota": "1GiB"})
        _write_kernelspec(jp_data_dir, "other-language", language="R")

    async def test_kernelspec_quota_within_and_above_the_maximum(self, specs, gpushare):
        small = await gpushare.start_kernel("small")
        assert (await gpushare.kernel(small))["quota_mib"] == 1024
        with pytest.raises(HTTPClientError) as e:
            await gpushare.start_kernel("big")
        message = json.loads(e.value.response.body)["message"]
        assert e.value.code == 400 and "largest a kernel may have here (6 GiB). Ask for at most 6 GiB" in message
        refused = [e for e in (await gpushare.get("events"))["events"] if e["kind"] == "refused"][-1]
        assert refused["code"] == "refused-quota-above-max" and refused["severity"] == "error"
        assert event_words(refused["code"], refused["params"]) == (
            "Not started: its quota 8 GiB is above the maximum here, 6 GiB."
        )

    async def test_other_languages_reserve_nothing(self, specs, gpushare):
        kid = await gpushare.start_kernel("other-language")
        rec = await gpushare.kernel(kid)
        assert rec["state"] == "none" and rec["reserved_mib"] is None and "reserve no GPU memory" in rec["reason"]
        assert await reserved(gpushare) == 0


async def test_a_queued_start_can_be_cancelled_and_a_running_kernel_cannot(gpushare, jp_fetch, jp_serverapp):
    k1 = await gpushare.start_kernel()
    await gpushare.start_kernel()
    _, k3 = await gpushare.open_notebook("third.ipynb")
    r = await jp_fetch("api", "gpushare", "kernels", k3, method="DELETE")
    assert r.code == 202
    cancelled = await gpushare.wait_for(lambda: _event(gpushare, k3, "no-gpu"), what="the cancel event")
    assert "Stopped waiting for a GPU" in cancelled["message"] and cancelled["code"] == "cancelled"
    assert (await gpushare.kernel(k3))["state"] == "cpu"  # it runs on without a GPU, with what it holds
    assert await jp_serverapp.kernel_manager.get_kernel(k3).is_alive()
    assert (await gpushare.get("queue"))["queue"] == []
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("api", "gpushare", "kernels", k1, method="DELETE")
    assert e.value.code == 409 and f"DELETE /api/kernels/{k1}" in json.loads(e.value.response.body)["message"]
    assert (await gpushare.kernel(k1))["state"] == "running"


async def test_host_view_lists_this_users_kernels_on_each_card(gpushare):
    kid = await gpushare.start_kernel()
    view = await gpushare.get("host")
    assert [k["kernel_id"] for k in view["kernels"]] == [kid]
    (card,) = view["cards"]
    assert card["uuid"] == "GPU-simulated-0" and card["reserved_mib"] == 4608


async def test_events_since_filters_and_a_bad_since_is_400(gpushare, jp_fetch):
    kid = await gpushare.start_kernel()
    events = (await gpushare.get("events"))["events"]
    assert [e["kind"] for e in events if e["kernel_id"] == kid] == ["reserved"]
    r = await jp_fetch("api", "gpushare", "events", params={"since": str(events[-1]["time"])}, method="GET")
    assert json.loads(r.body)["events"] == []
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("api", "gpushare", "events", params={"since": "yesterday"}, method="GET")
    assert e.value.code == 400 and "'since' must be a Unix time" in json.loads(e.value.response.body)["message"]


class TestOverUse:
    """Admission counts the card as it is: what a kernel uses beyond its lease is taken on its card, and what it
    uses on another card is taken there, so the next kernel waits instead of being placed on memory in use."""

    @pytest.fixture
    def gpushare_config(self, gpushare_config):
        return {**gpushare_config, "simulated_cards": "10GiB,10GiB", "over_quota_action": "notify"}

    async def test_use_beyond_a_lease_and_on_another_card_holds_the_next_kernel(self, gpushare, jp_serverapp):
        fake = jp_serverapp.web_app.settings["gpushare_manager"].backend.fake
        k1 = await gpushare.start_kernel()
        rec = await gpushare.kernel(k1)
        mine, other = rec["card"]["index"], 1 - rec["card"]["index"]
        fake.add_process(rec["pid"], rec["reserved_mib"] + 6000, card=mine)  # 6,000 MiB past its reservation
        fake.add_process(rec["pid"], 8000, card=other)  # and 8,000 on a card it holds nothing on

        async def measured():
            cards = (await gpushare.get("cards"))["cards"]
            return cards if [cards[mine]["outside_mib"], cards[other]["outside_mib"]] == [6000, 8000] else None

        await gpushare.wait_for(measured, what="the over-use counted on both cards")
        _, k2 = await gpushare.open_notebook("next.ipynb")
        waiting = await gpushare.kernel(k2)  # 10,240 - 4,608 - 6,000 < 0 and 10,240 - 8,000 = 2,240: no room
        assert waiting["state"] == "queued", waiting
        fake.remove_process(rec["pid"], card=other)  # gone from the other card, still over on its own
        await gpushare.wait_for(lambda: _is(gpushare, k2, "running"), what="the next kernel admitted")
        assert (await gpushare.kernel(k2))["card"]["index"] == other  # placed where the memory really is free
        for k in (k1, k2):
            await gpushare.stop_kernel(k)
