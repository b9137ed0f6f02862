"""The queue's rules on their own (queue.py): order, backfill, aging, caps, and when a server's wait ends.

No ledger, no server: each test runs in milliseconds. The same rules through the SQLite ledger are in
test_ledger.py, and through a real server in test_waiting.py.
"""

from __future__ import annotations

import asyncio

import pytest
from clocks import SteppedClock

from jupyter_gpushare.core.policy import CardView, Policy, PolicyError, Size
from jupyter_gpushare.core.words import render
from jupyter_gpushare.ledger.leases import Waiting
from jupyter_gpushare.ledger.queue import Entry, Request, check_waiting, choose_card
from jupyter_gpushare.server.line import ServerQueue

GIB = 1024
POLICY = Policy(context_reserve_mib=512, overtake_limit_s=300.0, max_waiting=3)
NOW = 10_000.0


def card(index: int, reserved_gib: float = 0, total_gib: int = 10) -> CardView:
    return CardView(f"GPU-{index}", index, total_gib * GIB, int(reserved_gib * GIB))


def entry(ticket: int, gib: float, waited_s: float = 0.0, cards: tuple[str, ...] = (), user: str = "") -> Entry:
    return Entry(ticket, f"k{ticket}", Size(mib=int(gib * GIB)), user, NOW - waited_s, frozenset(cards))


def test_a_kernel_that_fits_is_placed_when_no_one_waits():
    assert choose_card(entry(9, 4), [], [card(0)], POLICY, NOW) == card(0)
    assert choose_card(entry(9, 10), [], [card(0)], POLICY, NOW) is None  # 10 GiB + 512 MiB context: never fits


def test_kernels_ahead_that_fit_are_served_first():
    # 5 GiB free: the kernel ahead (4 GiB + 0.5) takes it, so the one behind, which would fit alone, waits.
    cards = [card(0, reserved_gib=5)]
    assert choose_card(entry(2, 4), [entry(1, 4)], cards, POLICY, NOW) is None
    assert choose_card(entry(1, 4), [], cards, POLICY, NOW) == cards[0]


def test_a_kernel_that_fits_passes_one_ahead_that_does_not():
    # 5 GiB free: the 8 GiB kernel ahead cannot be placed; the 2 GiB one behind it can, and is (backfill).
    cards = [card(0, reserved_gib=5)]
    assert choose_card(entry(2, 2), [entry(1, 8, waited_s=120)], cards, POLICY, NOW) == cards[0]


def test_a_kernel_that_has_waited_its_turn_out_is_no_longer_passed():
    cards = [card(0, reserved_gib=5)]
    aged = entry(1, 8, waited_s=POLICY.overtake_limit_s)
    assert choose_card(entry(2, 2), [aged], cards, POLICY, NOW) is None  # the card is kept for it
    strict = Policy(context_reserve_mib=512, overtake_limit_s=0.0)  # 0: first come, first served on each card
    assert choose_card(entry(2, 2), [entry(1, 8)], cards, strict, NOW) is None


def test_a_card_kept_for_one_kernel_leaves_the_others_open():
    # Card 0 is kept for the aged 8 GiB kernel; card 1 is too small for it, so the 2 GiB kernel goes there.
    cards = [card(0, reserved_gib=5), card(1, total_gib=4)]
    aged = entry(1, 8, waited_s=1000)
    assert choose_card(entry(2, 2), [aged], cards, POLICY, NOW) == cards[1]


def test_an_aged_kernel_keeps_only_the_room_it_needs_on_one_card():
    # Both cards could hold the aged 8 GiB kernel once they empty; it lacks the least on card 0 (5 GiB free), so
    # the room there is kept for it and card 1 (3 GiB free) stays open to the 2 GiB kernel behind it.
    cards = [card(0, reserved_gib=5), card(1, reserved_gib=7)]
    aged = entry(1, 8, waited_s=1000)
    assert choose_card(entry(2, 2), [aged], cards, POLICY, NOW) == cards[1]
    assert choose_card(entry(2, 2, cards=("GPU-0",)), [aged], cards, POLICY, NOW) is None


def test_kept_room_holds_a_fitting_kernel_back_for_at_most_the_overtake_limit():
    cards = [card(0, reserved_gib=5)]
    aged = entry(1, 8, waited_s=1000)
    almost = entry(2, 2, waited_s=POLICY.overtake_limit_s - 1)
    assert choose_card(almost, [aged], cards, POLICY, NOW) is None
    waited = entry(2, 2, waited_s=POLICY.overtake_limit_s)
    assert choose_card(waited, [aged], cards, POLICY, NOW) == cards[0]  # it has waited its own turn out: it goes
    # A re-joined kernel (aging later than it joined) keeps nothing before its aging clock has run.
    rejoined = Entry(1, "k1", Size(mib=8 * GIB), "a", NOW - 1000, frozenset(), ages_from=NOW - 10)
    assert choose_card(entry(3, 2), [rejoined], cards, POLICY, NOW) == cards[0]


def test_a_kernel_pinned_to_a_full_card_holds_no_one_back_on_another():
    cards = [card(0, reserved_gib=9), card(1)]
    pinned = entry(1, 4, waited_s=1000, cards=("GPU-0",))  # a container that sees only card 0, waiting long
    assert choose_card(entry(2, 4), [pinned], cards, POLICY, NOW) == cards[1]
    assert choose_card(entry(2, 4, cards=("GPU-0",)), [pinned], cards, POLICY, NOW) is None


def test_room_taken_by_kernels_ahead_adds_up():
    # 10 GiB free: three 2 GiB kernels ahead take 7.5 GiB; a 2 GiB one still fits, a 3 GiB one does not.
    ahead = [entry(i, 2) for i in (1, 2, 3)]
    assert choose_card(entry(4, 2), ahead, [card(0)], POLICY, NOW) is not None
    assert choose_card(entry(4, 3), ahead, [card(0)], POLICY, NOW) is None


def test_the_admins_card_list_and_headroom_apply_to_everyone():
    policy = Policy(context_reserve_mib=512, headroom=Size(mib=GIB), cards=("1",))
    cards = [card(0), card(1, reserved_gib=5)]
    assert choose_card(entry(1, 4), [], cards, policy, NOW) is None  # card 0 not allowed; card 1: 4 GiB left
    assert choose_card(entry(1, 3), [], cards, policy, NOW) == cards[1]


def test_a_user_may_have_only_so_many_kernels_in_line():
    check_waiting("alice", 2, POLICY)
    with pytest.raises(PolicyError, match="3 kernels waiting for a GPU already.*Stop waiting on one") as refused:
        check_waiting("alice", 3, POLICY)
    assert (refused.value.code, refused.value.params) == ("user-max-waiting", {"waiting": 3})
    assert render("event.refused-user-max-waiting", refused.value.params) == (
        "Not started: you already have 3 kernels waiting for a GPU, the most allowed."
    )
    with pytest.raises(PolicyError, match="has 1 kernel waiting") as one:
        check_waiting("alice", 1, Policy(max_waiting=1))
    assert render("policy.user-max-waiting", one.value.params).startswith("You have 1 kernel waiting for a GPU")
    check_waiting("alice", 500, Policy(max_waiting=0))  # 0: no cap


def request(kid: str, gib: float = 4) -> Request:
    return Request(kid, Size(mib=int(gib * GIB)), "alice", "python3")


async def test_a_wait_ends_at_its_timeout_by_the_monotonic_clock():
    clock = SteppedClock()
    line = ServerQueue(clock=clock)
    line.answered(line.join(request("a")), Waiting("a", 1, 4096, 0, 0, gives_up_at=clock.wall() + 60))
    clock.elapsed = 59.9
    assert [w.kernel_id for w in line.due()[0]] == ["a"]
    clock.elapsed = 60
    ask, ending = line.due()
    assert ask == [] and [(w.kernel_id, w.ending) for w in ending] == [("a", "timeout")]


async def test_a_wait_ends_at_the_ledgers_deadline_not_at_a_second_one():
    """The host's line (a broker's policy, say) may give up sooner than this server's own setting: the wait ends
    at the ledger's deadline, read from its answer; without one it has no end of its own."""
    clock = SteppedClock()
    line = ServerQueue(clock=clock)
    wait = line.join(request("a"))
    line.answered(wait, Waiting("a", 1, 4096, 0, 0, gives_up_at=clock.wall() + 30))
    clock.elapsed = 29
    assert [w.kernel_id for w in line.due()[0]] == ["a"]
    clock.elapsed = 30.5
    assert [(w.kernel_id, w.ending) for w in line.due()[1]] == [("a", "timeout")]
    other = line.join(request("b"))
    line.answered(other, Waiting("b", 1, 4096, 0, 0, gives_up_at=None))
    clock.elapsed = 1e9
    assert [w.kernel_id for w in line.due()[0]] == ["b"]


async def test_joining_again_keeps_the_place_unless_the_quota_changed():
    line = ServerQueue(clock=SteppedClock())
    first = line.join(request("a"))
    assert line.join(request("a")) is first  # a restart or a reload while it waits
    other = line.join(request("a", gib=6))
    assert other is not first and first.ending == "cancelled" and "another quota" in first.why
    assert line.waits["a"] is other


async def test_a_cancelled_wait_ends_at_the_next_tick_and_says_why():
    line = ServerQueue(clock=SteppedClock())
    line.join(request("a"))
    line.join(request("b"))
    assert line.end("a", "cancelled", "its owner stopped it").why == "its owner stopped it"
    assert line.end("nobody", "cancelled") is None
    ask, ending = line.due()
    assert [w.kernel_id for w in ask] == ["b"] and [w.ending for w in ending] == ["cancelled"]


async def test_a_wait_no_client_watches_ends_after_the_unwatched_timeout():
    clock = SteppedClock()
    line = ServerQueue(unwatched_s=30, clock=clock)
    line.join(request("a"))
    watchers = {"a": 0}
    line.due(watchers.get)  # unwatched from now
    clock.elapsed = 20
    watchers["a"] = 1  # a page reloaded: it watches again
    line.due(watchers.get)
    watchers["a"] = 0
    clock.elapsed = 45  # unwatched again from here: the count starts anew
    assert line.due(watchers.get)[1] == []
    clock.elapsed = 76
    ask, ending = line.due(watchers.get)
    assert [(w.kernel_id, w.ending) for w in ending] == [("a", "unwatched")]
    # Kernels whose clients are not known here (nbclient's) are never unwatched.
    line.join(request("b"))
    clock.elapsed = 600  # within b's timeout, long past the unwatched one
    assert [w.kernel_id for w in line.due(lambda kid: None)[0]] == ["b"]


async def test_closing_ends_every_wait():
    line = ServerQueue(clock=SteppedClock())
    for kid in "abc":
        line.join(request(kid))
    line.closing = True
    ask, ending = line.due()
    assert ask == [] and {w.ending for w in ending} == {"closing"} and len(ending) == 3
    assert line.leave("a").kernel_id == "a" and line.leave("a") is None


def test_waits_carry_a_future_of_the_running_loop():
    async def main():
        line = ServerQueue(clock=SteppedClock())
        wait = line.join(request("a"))
        assert not wait.result.done()
        return wait.result.get_loop() is asyncio.get_running_loop()

    assert asyncio.run(main())
