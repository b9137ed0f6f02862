"""server/admission.py, the rules of a kernel's start without I/O: each step's answer, refusals with their codes,
table by table. (tests/server/test_admission.py runs the same rules through a real server and ledger.)"""

from __future__ import annotations

import pytest

from jupyter_gpushare.core.policy import Policy, PolicyError, Size
from jupyter_gpushare.host.gpu import Card
from jupyter_gpushare.ledger.file import LedgerError
from jupyter_gpushare.ledger.leases import Lease, Waiting
from jupyter_gpushare.server.admission import Cards, Queue, Refusal, Start, StartRequest, answer, check, plan

GIB = 1024
CARD0 = Card(index=0, uuid="GPU-0", name="test", total_mib=10 * GIB, simulated=True)
CARD1 = Card(index=1, uuid="GPU-1", name="test", total_mib=10 * GIB, simulated=True)
CARDS = Cards((CARD0, CARD1), level="caps")
POLICY = Policy(default_quota=Size(mib=2 * GIB), context_reserve_mib=512, max_quota=Size(mib=6 * GIB))
PYTHON = StartRequest("python3", "python")
RESTART = StartRequest("python3", "python", restarting=True)
FULL = Waiting("k1", position=2, need_mib=4608, free_mib=1024, ahead=1)


def lease(card: Card, quota_mib: int = 4 * GIB) -> Lease:
    return Lease("k1", card.uuid, card.index, quota_mib, 512, "alice", "python3", None, None, 0.0)  # type: ignore[arg-type]


def figures(outcome) -> dict:
    return dict(outcome.figures) if outcome is not None else {}


PLANS = [
    # (what is asked, the cards, the policy) -> quota, its source, and the outcome's kind, code or why, and status
    ("the default for a Python kernel", PYTHON, CARDS, POLICY, (Size(mib=2 * GIB), "default", None)),
    ("the kernelspec's quota", StartRequest("big", "python", requested=Size(mib=5 * GIB)), CARDS, POLICY,
     (Size(mib=5 * GIB), "kernelspec", None)),
    ("a quota asked for through the API wins", StartRequest("big", "python", Size(mib=5 * GIB), Size(mib=3 * GIB)),
     CARDS, POLICY, (Size(mib=3 * GIB), "requested", None)),
    ("a language with no quota sees no GPU", StartRequest("ir", "R"), CARDS, POLICY, (None, "default", "none")),
    ("a quota of zero sees no GPU", StartRequest("python3", "python", Size(mib=0)), CARDS, POLICY,
     (None, "kernelspec", "none")),
    ("the server is closing", RESTART, Cards((CARD0,), closing=True), POLICY,
     (Size(mib=2 * GIB), "default", ("refused-closing", 503, False))),
    ("no card: it starts without a GPU", PYTHON, Cards((), no_gpu_reason="NVML could not start"), POLICY,
     (Size(mib=2 * GIB), "default", "no-gpu-none")),
    ("held below the level the admin requires", RESTART, Cards((CARD0,), level="caps", missing="no watchdog"),
     Policy(required_level="cgroup"), (Size(mib=4 * GIB), "default", ("refused-level-below-required", 503, True))),
    ("held at the level required", PYTHON, Cards((CARD0,), level="cgroup"), Policy(required_level="cgroup"),
     (Size(mib=4 * GIB), "default", None)),
]  # fmt: skip


@pytest.mark.parametrize(("case", "request_", "cards", "policy", "expected"), PLANS, ids=[p[0] for p in PLANS])
def test_plan(case, request_, cards, policy, expected):
    quota, source, outcome = expected
    got = plan(request_, cards, policy)
    assert (got.quota, got.source) == (quota, source)
    if outcome is None:
        assert got.outcome is None  # the ledger is asked
    elif isinstance(outcome, tuple):
        code, status, keep = outcome
        assert isinstance(got.outcome, Refusal)
        assert (got.outcome.code, got.outcome.status, got.outcome.keep) == (code, status, keep)
    elif outcome == "none":
        assert isinstance(got.outcome, Start) and got.outcome.grant.mode == "none"
        assert "reserve no GPU memory here" in (got.outcome.grant.reason or "")
    else:
        assert isinstance(got.outcome, Start) and got.outcome.grant.mode == "cpu" and got.outcome.why == outcome


def test_a_level_refusal_says_the_levels_and_what_is_missing():
    got = plan(RESTART, Cards((CARD0,), level="caps", missing="no watchdog"), Policy(required_level="cgroup"))
    assert isinstance(got.outcome, Refusal) and figures(got.outcome) == {"level": "caps", "required": "cgroup"}
    assert "no watchdog" in got.outcome.message


CHECKS = [
    # (quota, the policy, restarting) -> None, or the refusal's code and figures (always status 400)
    ("within the limits", Size(mib=2 * GIB), POLICY, False, None),
    ("a share of the card within the limits", Size(percent=25), POLICY, False, None),
    ("above the largest", Size(mib=8 * GIB), POLICY, True, ("refused-quota-above-max", {"most_mib": 6 * GIB})),
    ("below the smallest", Size(mib=64), Policy(min_quota=Size(mib=256)), False,
     ("refused-quota-below-min", {"least_mib": 256})),
    ("no card could hold it", Size(mib=10 * GIB), Policy(context_reserve_mib=512), False,
     ("refused-quota-unfit", {"most_mib": 10 * GIB - 512})),
]  # fmt: skip


@pytest.mark.parametrize(("case", "quota", "policy", "restarting", "expected"), CHECKS, ids=[c[0] for c in CHECKS])
def test_check(case, quota, policy, restarting, expected):
    got = check(quota, StartRequest("python3", "python", restarting=restarting), CARDS, policy)
    if expected is None:
        assert got is None
        return
    code, shown = expected
    assert got is not None and (got.code, got.status, got.keep) == (code, 400, restarting)
    assert shown.items() <= figures(got).items() and figures(got)["quota_mib"] == quota.mib


ANSWERS = [
    # (the ledger's answer, on_full, restarting) -> what the start gets
    ("a lease: a grant on its card", lease(CARD1), "queue", False, ("gpu", CARD1)),
    ("no room, and kernels queue", FULL, "queue", False, ("queued", FULL)),
    ("no room, and kernels start without a GPU", FULL, "cpu", False, ("cpu", "no-gpu-full")),
    ("no room, and kernels are refused", FULL, "reject", True, ("refused", "refused-no-room", 503, True)),
    ("the ledger cannot be used", LedgerError("the broker is not answering"), "queue", False, ("cpu", "no-gpu-ledger")),
    ("a per-user limit the broker enforces", PolicyError("alice has 2 kernels in line", "user-max-waiting", most=2),
     "queue", True, ("refused", "refused-user-max-waiting", 400, True)),
]  # fmt: skip


@pytest.mark.parametrize(("case", "got", "on_full", "restarting", "expected"), ANSWERS, ids=[a[0] for a in ANSWERS])
def test_answer(case, got, on_full, restarting, expected):
    policy = Policy(context_reserve_mib=512, on_full=on_full)
    request = StartRequest("python3", "python", restarting=restarting)
    outcome = answer(got, Size(mib=4 * GIB), request, CARDS, policy)
    kind = expected[0]
    if kind == "gpu":
        assert isinstance(outcome, Start) and outcome.grant.mode == "gpu"
        assert outcome.grant.lease is got and outcome.grant.card == expected[1]
    elif kind == "queued":
        assert outcome == Queue(expected[1])
    elif kind == "cpu":
        assert isinstance(outcome, Start) and outcome.grant.mode == "cpu" and outcome.why == expected[1]
    else:
        _, code, status, keep = expected
        assert isinstance(outcome, Refusal) and (outcome.code, outcome.status, outcome.keep) == (code, status, keep)


def test_no_room_says_what_was_needed_and_what_was_free():
    for on_full in ("cpu", "reject"):
        outcome = answer(FULL, Size(mib=4 * GIB), PYTHON, CARDS, Policy(context_reserve_mib=512, on_full=on_full))
        assert figures(outcome) == {"need_mib": 4608, "free_mib": 1024}
        said = outcome.grant.reason if isinstance(outcome, Start) else outcome.message
        assert "it needs 4.5 GiB" in said and "the most unreserved on any card is 1 GiB" in said
    started = answer(FULL, Size(mib=4 * GIB), PYTHON, CARDS, Policy(on_full="cpu"))
    assert started.grant.reason.endswith("This kernel was started without a GPU.")


def test_a_ledger_that_grants_nothing_for_now_says_its_own_reason():
    settling = Waiting("k1", 1, 4608, 8192, 0, reason="The ledger is being re-created; starts wait a moment.")
    outcome = answer(settling, Size(mib=4 * GIB), PYTHON, CARDS, Policy(on_full="reject"))
    assert isinstance(outcome, Refusal) and outcome.message == settling.reason


def test_a_ledger_that_cannot_be_used_says_why_in_the_reason():
    outcome = answer(LedgerError("disk full"), Size(mib=4 * GIB), PYTHON, CARDS, POLICY)
    assert isinstance(outcome, Start) and outcome.grant.reason == "No GPU reservation could be made: disk full"
