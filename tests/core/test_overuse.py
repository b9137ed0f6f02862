"""The over-use rules (overuse.py) that the server's enforcer and the broker's watchdog both apply: what counts as
theft, which processes hold an excess, and over-time counted across short dips."""

from __future__ import annotations

import pytest

from jupyter_gpushare.core.overuse import (
    SETTLE_S,
    CardRoom,
    Excess,
    OverUseJudge,
    card_room,
    excess_holders,
    over_use,
)

GIB = 1024
CARD = "GPU-0"


def excess(over: int, stolen: int = 0, processes=None, kernel_pid: int | None = 100, shared: bool = True) -> Excess:
    reserved = 4 * GIB
    processes = processes if processes is not None else ((100, CARD, reserved + over),)
    return Excess("k1", CARD, reserved, {CARD: over}, stolen, tuple(processes), kernel_pid, shared)


# -- theft --------------------------------------------------------------------------------------------------------


def test_over_use_the_unreserved_room_covers_is_no_theft():
    # 24 GiB card; k1 reserves 4 GiB and uses 6; k2 reserves 4 GiB and uses 1: 13 GiB free, k2 may take 3 more
    room = card_room(
        free_mib=24 * GIB - 7 * GIB, used_mib=7 * GIB, seen=[("k1", 4 * GIB, 6 * GIB), ("k2", 4 * GIB, GIB)]
    )
    assert room.stolen("k1", 2 * GIB) == 0


def test_over_use_that_leaves_less_free_than_neighbours_may_still_take_is_theft():
    # the H100 case: three neighbours of 23 GiB, idle (their context only), fill the reservations; k1 (4 GiB) takes 24
    seen = [("k1", 4 * GIB, 24 * GIB)] + [(f"n{i}", 23 * GIB, 512) for i in range(3)]
    used = 24 * GIB + 3 * 512
    room = card_room(free_mib=80 * GIB - used, used_mib=used, seen=seen)
    # the neighbours may still take 3 * (23 GiB - 512 MiB) = 67.5 GiB; 54.5 GiB is free: 13 GiB of k1's 20 are theirs
    assert room.stolen("k1", 20 * GIB) == 13 * GIB
    assert room.stolen("k1", 5 * GIB) == 5 * GIB  # never more than the over-use itself


def test_leases_whose_use_is_not_seen_count_at_their_smallest():
    # another server's lease of 10 GiB (its use unseen) and 9 GiB used on the card by processes no seen lease has:
    # it may take at most 1 GiB more, so k1's 3 GiB over in a card with 4 GiB free takes nothing of it
    room = card_room(free_mib=4 * GIB, used_mib=16 * GIB, seen=[("k1", 4 * GIB, 7 * GIB)], unseen_reserved_mib=10 * GIB)
    assert room.unseen_unused_mib == GIB
    assert room.stolen("k1", 3 * GIB) == 0
    room = card_room(
        free_mib=GIB // 2, used_mib=16 * GIB, seen=[("k1", 4 * GIB, 7 * GIB)], unseen_reserved_mib=10 * GIB
    )
    assert room.stolen("k1", 3 * GIB) == GIB // 2


def test_a_card_whose_free_memory_is_not_known_sees_no_theft():
    assert CardRoom(free_mib=None, unused_mib={"k2": 10 * GIB}).stolen("k1", GIB) == 0


def test_over_use_is_past_the_reservation_on_its_card_and_all_of_it_elsewhere():
    assert over_use(4 * GIB, CARD, {CARD: 5 * GIB, "GPU-1": 300}) == {CARD: GIB, "GPU-1": 300}
    assert over_use(4 * GIB, CARD, {CARD: 3 * GIB}) == {}


# -- who holds the excess ------------------------------------------------------------------------------------------


def test_children_that_hold_the_excess_are_chosen_largest_first_and_no_more():
    procs = ((100, CARD, 3 * GIB), (201, CARD, 5 * GIB), (202, CARD, 512))
    assert excess_holders(excess(4 * GIB + 512, processes=procs)) == (201,)  # 8.5 GiB -> 3.5: within its 4
    procs = ((100, CARD, 3 * GIB), (201, CARD, 2 * GIB), (202, CARD, 2 * GIB))
    assert excess_holders(excess(3 * GIB, processes=procs)) == (201, 202)


def test_use_on_another_card_by_a_child_is_all_excess():
    procs = ((100, CARD, GIB), (201, "GPU-1", 20 * GIB))
    e = Excess("k1", CARD, 4 * GIB, {"GPU-1": 20 * GIB}, 0, procs, 100)
    assert excess_holders(e) == (201,)


def test_an_excess_in_the_kernels_own_process_has_no_child_to_stop():
    assert excess_holders(excess(20 * GIB)) is None  # the kernel itself holds 24 GiB
    procs = ((100, "GPU-1", GIB), (201, CARD, 5 * GIB))
    assert excess_holders(Excess("k1", CARD, 4 * GIB, {CARD: GIB, "GPU-1": GIB}, 0, procs, 100)) is None
    assert excess_holders(excess(GIB, processes=((201, CARD, 5 * GIB),), kernel_pid=None)) is None


# -- the judge ------------------------------------------------------------------------------------------------------


def test_theft_is_acted_on_at_the_reading_that_sees_it():
    judge = OverUseJudge("protect", grace_s=30)
    (v,) = judge.judge(0.0, [excess(20 * GIB, stolen=13 * GIB)])
    assert (v.action, v.why) == ("restart", "theft")
    child = excess(20 * GIB, stolen=13 * GIB, processes=((100, CARD, GIB), (201, CARD, 23 * GIB)))
    judge = OverUseJudge("protect", grace_s=30)
    (v,) = judge.judge(0.0, [child])
    assert (v.action, v.why, v.pids) == ("stop", "theft", (201,))


def test_over_use_within_the_unreserved_room_keeps_its_grace():
    judge = OverUseJudge("protect", grace_s=30)
    for t in range(30):
        assert judge.judge(float(t), [excess(GIB)]) == []
    (v,) = judge.judge(30.0, [excess(GIB)])
    assert (v.action, v.why) == ("interrupt", "grace")


def test_an_interrupt_that_frees_nothing_escalates_at_the_next_reading_after_it_settles():
    judge = OverUseJudge("protect", grace_s=5)
    t = 0.0
    while not judge.judge(t, [excess(GIB)]):
        t += 1
    assert judge.judge(t + SETTLE_S / 2, [excess(GIB)]) == []
    (v,) = judge.judge(t + SETTLE_S, [excess(GIB)])
    assert (v.action, v.why) == ("restart", "escalate")


def test_an_interrupt_that_freed_some_starts_a_new_grace():
    judge = OverUseJudge("protect", grace_s=5)
    t = 0.0
    while not judge.judge(t, [excess(2 * GIB)]):
        t += 1
    for dt in range(1, 5):
        assert judge.judge(t + SETTLE_S + dt, [excess(GIB)]) == []


def test_over_time_is_kept_across_short_dips():
    """9 s over, 2 s under, again and again (82% of the time over): acted on within one window (twice the grace).
    A judge that forgot an episode at the first reading under would never act."""
    grace = 30.0
    judge = OverUseJudge("protect", grace_s=grace)
    acted_at = None
    for t in range(0, 200):
        over = t % 11 < 9
        verdicts = judge.judge(float(t), [excess(GIB)] if over else [], present=["k1"])
        if verdicts:
            acted_at = t
            break
    assert acted_at is not None and acted_at <= 2 * grace


def test_over_use_too_rare_for_the_window_is_not_acted_on():
    judge = OverUseJudge("protect", grace_s=10)
    for t in range(0, 300):
        over = t % 10 < 4  # 40% of the time: never the grace within 20 s
        assert judge.judge(float(t), [excess(GIB)] if over else [], present=["k1"]) == []


def test_alone_on_its_card_protect_only_notifies_and_once():
    judge = OverUseJudge("protect", grace_s=2)
    said = [v.action for t in range(20) for v in judge.judge(float(t), [excess(GIB, shared=False)])]
    assert said == ["notify"]


@pytest.mark.parametrize("action", ["notify", "interrupt", "restart", "shutdown"])
def test_other_actions_apply_as_configured_and_theft_skips_the_grace(action):
    judge = OverUseJudge(action, grace_s=30)
    (v,) = judge.judge(0.0, [excess(20 * GIB, stolen=GIB)])
    assert (v.action, v.why) == (action, "theft")


def test_a_kernel_gone_or_restarted_starts_afresh():
    judge = OverUseJudge("protect", grace_s=3)
    for t in range(3):
        judge.judge(float(t), [excess(GIB)])
    judge.forget("k1")
    assert judge.judge(3.0, [excess(GIB)]) == []
    judge.judge(4.0, [])  # neither over nor present: forgotten
    assert "k1" not in judge.episodes()


def test_an_unknown_action_is_refused():
    with pytest.raises(ValueError, match="over_quota_action 'kill'"):
        OverUseJudge("kill", 30)
