"""Names and bodies a student controls (issue: hardening, round two, item 4): a kernelspec name with a lone
surrogate or terminal escapes, a JSON body nested past Python's parser, and error texts with a '%'."""

from __future__ import annotations

import json

import pytest
from tornado.httpclient import HTTPClientError

from jupyter_gpushare.broker.protocol import BrokerRefused
from jupyter_gpushare.cli.status import format_status


@pytest.mark.parametrize("name", ["\ud800", "evil\x1b[2J", "nul\x00", "rtl\u202etxt.exe", "x" * 201])
def test_the_broker_refuses_a_kernel_name_it_could_not_store_or_print(inproc, name):
    broker, who = inproc
    with pytest.raises(BrokerRefused, match="'kernel_name' must be text matching"):
        broker.handle(who["alice"], "reserve", {"kernel_id": "k1", "mib": 1024, "kernel_name": name})
    with pytest.raises(BrokerRefused, match="'kernel_name' must be text matching"):
        broker.handle(who["alice"], "learned_peak", {"kernel_name": name, "path": "a.ipynb"})
    assert broker._ledger.leases() == []
    ok = broker.handle(
        who["alice"], "reserve", {"kernel_id": "k1", "mib": 1024, "kernel_name": "Python 3 (ipykernel) é"}
    )
    assert "lease" in ok


def test_status_prints_what_others_named_as_escapes_not_as_terminal_codes():
    kernel = {"user": "mallory\x1b]0;owned\x07", "kernel_id": "k1", "kernel_name": "a\x1b[2J\x00b\u202e",
              "card_label": "GPU 0", "quota_mib": 1024, "reserved_mib": 1536, "used_mib": None, "kernel_pid": 1, "age_s": 3}  # fmt: skip
    view = {"source": "test", "user": "root", "admin": True, "cards": [], "users": [], "kernels": [kernel],
            "queue": [], "outside": [{"card_label": "GPU 0", "pid": 2, "user": "eve", "used_mib": 1,
                                       "command": "python -c '\x1b[31mred'"}]}  # fmt: skip
    text = format_status(view)
    assert "\x1b" not in text and "\x00" not in text and "\u202e" not in text
    assert "a\\x1b[2J\\x00b\\u202e" in text and "mallory\\x1b]0;owned\\x07" in text and "\\x1b[31mred" in text


async def test_a_body_nested_past_the_parser_is_a_400_that_says_so(gpushare, jp_fetch):
    kid = await gpushare.start_kernel()
    body = "[" * 100_000 + "]" * 100_000
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("api", "gpushare", "kernels", kid, method="PATCH", body=body)
    assert e.value.code == 400
    assert "nested too deeply" in json.loads(e.value.response.body)["message"]
    await gpushare.stop_kernel(kid)


async def test_an_error_text_with_a_percent_is_sent_as_written(gpushare, jp_fetch):
    kid = await gpushare.start_kernel()
    with pytest.raises(HTTPClientError) as e:
        await jp_fetch("api", "gpushare", "kernels", kid, method="PATCH", body=json.dumps({"quota": "0%"}))
    message = json.loads(e.value.response.body)["message"]
    assert e.value.code == 400 and "%" in message and "%%" not in message, message
    await gpushare.stop_kernel(kid)
