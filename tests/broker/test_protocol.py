"""The broker's request decoder and sizes, tried with every input a hostile student could send.

What must hold: any line either becomes a valid, typed request or a refusal that says what was wrong;
no input becomes a lease that breaks ``sum(reservations) <= card``, a negative or empty reservation, or
an unhandled exception. The crafted inputs of the attacks that once got through are tried by name.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jupyter_gpushare.broker.protocol import REQUESTS, BrokerRefused, ReserveArgs, decode_request, policy_error_from
from jupyter_gpushare.core.policy import MAX_MIB, PolicyError, Size, parse_size
from jupyter_gpushare.ledger.ledger import LedgerError

CARD_MIB = 10240  # the inproc broker's simulated card (no headroom)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
reserve_args = st.fixed_dictionaries(
    {},
    optional={
        "kernel_id": st.sampled_from(["k1", "k2", "k3", "", "../x", "k" * 200]) | json_values,
        "mib": st.integers(-(2**40), 2**40) | json_values,
        "percent": st.floats(allow_nan=True, allow_infinity=True) | json_values,
        "wait": json_values,
        "kernel_name": json_values,
        "cards": st.lists(st.text(max_size=12), max_size=3) | json_values,
    },
)


@given(st.one_of(json_values, st.fixed_dictionaries({"op": st.sampled_from(sorted(REQUESTS)), "args": json_values})))
@settings(max_examples=400)
def test_any_message_is_a_typed_request_or_a_refusal(message):
    for line in (json.dumps(message, allow_nan=True).encode(), message if isinstance(message, dict) else None):
        if line is None:
            continue
        try:
            op, args = decode_request(line)
        except BrokerRefused as e:
            assert str(e)
            continue
        assert op in REQUESTS
        if isinstance(args, ReserveArgs):
            assert isinstance(args.quota, Size) and args.kernel_id and len(args.kernel_name) <= 200


@given(st.binary(max_size=200))
def test_any_bytes_are_decoded_or_refused(line):
    try:
        decode_request(line)
    except BrokerRefused:
        pass


@given(st.lists(reserve_args, min_size=1, max_size=12))
@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
def test_no_reserve_request_overbooks_the_card_or_makes_an_empty_lease(inproc, requests):
    broker, who = inproc
    for args in requests:
        try:
            broker.handle(who["alice"], "reserve", args)
        except (BrokerRefused, PolicyError, LedgerError) as e:
            assert str(e)
    leases = broker._ledger.leases()
    assert sum(lease.reserved_mib for lease in leases) <= CARD_MIB
    assert all(256 <= lease.quota_mib <= CARD_MIB for lease in leases)
    for lease in leases:
        broker.handle(who["admin"], "release", {"kernel_id": lease.kernel_id})


@pytest.mark.parametrize(
    "line, why",
    [
        (b'{"op": "reserve", "args": {"kernel_id": "k1", "percent": -5}}', "-5% is not a size"),
        (b'{"op": "reserve", "args": {"kernel_id": "k1", "mib": true}}', "'mib' must be a whole number; got True"),
        (b'{"op": "reserve", "args": {"kernel_id": "k1", "mib": 1e999}}', "'mib' must be a whole number; got inf"),
        (b'{"op": "reserve", "args": {"kernel_id": "k1", "percent": NaN}}', "nan% is not a size"),
        (b'{"op": "reserve", "args": {"kernel_id": "k1", "percent": 1e999}}', "inf% is not a size"),
        (b'{"op": "reserve", "args": {"kernel_id": "k1", "mib": 1' + b"0" * 5000 + b"}}", "not JSON"),
        (b'{"op": "reserve", "args": {"kernel_id": "k1", "mib": -2048}}', "-2048 MiB is not a size"),
        (b'{"op": "reserve", "args": {"kernel_id": "k1", "mib": 1024, "percent": 10}}', "exactly one"),
        (b'{"op": "reserve", "args": {"kernel_id": "k1", "mib": "\xd9\xa1\xd9\xa0"}}', "'mib' must be a whole number"),
        (b'{"op": "reserve", "args": {"kernel_id": "k1", "mib": 1024, "wait": 1}}', "'wait' must be true or false"),
        (b'{"op": "reserve", "args": {"kernel_id": ["k1"], "mib": 1024}}', "'kernel_id' must be text"),
        (b'{"op": "attach", "args": {"kernel_id": "k1", "pid": -1}}', "'pid' must be a process id"),
        (b'{"op": "adopt", "args": {"kernel_id": "k1"}}', "Unknown request 'adopt'"),
        (b'{"op": "watch", "args": {"since": -1, "wait_s": 5}}', "'since' must be a whole number from 0"),
        (b'{"op": "watch", "args": {"since": 1.5, "wait_s": 5}}', "'since' must be a whole number"),
        (b'{"op": "watch", "args": {"since": 0}}', "'wait_s' must be seconds, more than 0 and at most 60"),
        (b'{"op": "watch", "args": {"since": 0, "wait_s": 0}}', "'wait_s' must be seconds"),
        (b'{"op": "watch", "args": {"since": 0, "wait_s": 61}}', "'wait_s' must be seconds"),
        (b'{"op": "watch", "args": {"since": 0, "wait_s": NaN}}', "'wait_s' must be seconds"),
        (b'{"op": "watch", "args": {"since": 0, "wait_s": true}}', "'wait_s' must be a number"),
        (b"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]", "JSON object"),
        (b"[" * 100_000, "not JSON"),
    ],
)
def test_the_crafted_requests_that_once_got_through_are_refused_with_why(inproc, line, why):
    broker, who = inproc
    with pytest.raises(BrokerRefused, match=None) as e:
        op, args = decode_request(line)
        broker.handle(who["alice"], op, args)
    assert why in str(e.value)
    assert broker._ledger.leases() == []


def test_a_quota_below_the_minimum_is_refused_by_the_broker(inproc):
    broker, who = inproc
    with pytest.raises(PolicyError, match=r"less than the smallest a kernel may have here \(256 MiB\)"):
        broker.handle(who["alice"], "reserve", {"kernel_id": "k1", "mib": 1})
    with pytest.raises(PolicyError, match="at least 256 MiB"):
        broker.handle(who["alice"], "reserve", {"kernel_id": "k1", "percent": 0.0001})
    assert broker._ledger.leases() == []


# -- sizes -------------------------------------------------------------------------------------------------


@given(st.text(max_size=40))
@settings(max_examples=500)
def test_any_text_is_a_bounded_size_or_a_clear_error(text):
    try:
        size = parse_size(text, "quota")
    except PolicyError as e:
        assert str(e).startswith("quota: ")
        return
    assert (size.mib is not None and 0 <= size.mib <= MAX_MIB) or (
        size.percent is not None and 0 <= size.percent <= 100
    )
    assert text.strip()[0].isascii() and text.strip()[0].isdigit()


@given(st.from_type(object) | json_values)
def test_anything_but_text_is_not_a_size(value):
    if isinstance(value, (str, Size)):
        return
    with pytest.raises(PolicyError, match="is not a size"):
        parse_size(value, "quota")


@pytest.mark.parametrize(
    "text, why",
    [
        ("١٢GiB", "is not a size"),  # Arabic-Indic digits
        ("1٢GiB", "is not a size"),  # ASCII and Arabic-Indic mixed: once parsed as another number
        ("４GiB", "is not a size"),  # full-width
        ("1" * 5000 + "MiB", "is not a size"),
        ("2000000000GiB", "more than 1 PiB"),
        ("-1GiB", "is negative"),
        ("nan GiB", "is not a size"),
        ("inf%", "is not a size"),
    ],
)
def test_sizes_that_once_got_through_are_refused(text, why):
    with pytest.raises(PolicyError, match=why):
        parse_size(text, "quota")


def test_a_rules_refusal_crosses_the_wire_with_its_code_and_figures(inproc):
    broker, who = inproc
    line = json.dumps({"op": "reserve", "args": {"kernel_id": "k1", "mib": 1}}).encode()
    reply = broker._answer(who["alice"], line)
    assert reply["ok"] is False and reply["error"] == "PolicyError"
    assert (reply["code"], reply["params"]) == ("quota-below-min", {"quota_mib": 1, "least_mib": 256})
    error = policy_error_from(json.loads(json.dumps(reply)))
    assert (error.code, error.params, str(error)) == ("quota-below-min", reply["params"], reply["message"])


@pytest.mark.parametrize(
    "reply",
    [
        {"code": "Quota; DROP", "params": {"least_mib": 1}},  # not a code
        {"code": "quota-below-min", "params": ["least_mib", 1]},  # not figures
        {"code": "x" * 100, "params": {}},  # too long
        {"code": None, "params": {}},
    ],
)
def test_a_refusal_whose_code_is_not_well_formed_keeps_only_its_message(reply):
    error = policy_error_from({"ok": False, "error": "PolicyError", "message": "As said.", **reply})
    assert (error.code, error.params, str(error)) == (None, {}, "As said.")


def test_figures_that_are_not_plain_numbers_or_short_text_are_dropped():
    params = {"least_mib": 256, "ok_text": "4GiB", "big": "x" * 41, "flag": True, "nested": {"a": 1}, "Bad Key": 1,
              "nan_mib": float("nan"), "inf_mib": float("inf"), "line-noise": 1}  # fmt: skip
    error = policy_error_from({"message": "m", "code": "quota-below-min", "params": params})
    assert error.params == {"least_mib": 256, "ok_text": "4GiB"}


def test_only_a_change_that_may_move_the_line_wakes_the_servers_watching_it(inproc):
    """broker/room.py: a release, a wait stopped, a teacher's action count; a request that changed nothing does not
    (a caller cannot wake every server of the host with it), nor does a reserve."""
    broker, who = inproc
    counted = broker.room.version
    broker.handle(who["alice"], "release", {"kernel_id": "nothing-here"})
    broker.handle(who["alice"], "cancel_wait", {"kernel_id": "nothing-here"})
    assert broker.room.version == counted
    broker.handle(who["alice"], "reserve", {"kernel_id": "k1", "mib": 1024})
    assert broker.room.version == counted
    broker.handle(who["alice"], "release", {"kernel_id": "k1"})
    assert broker.room.version == counted + 1
