"""Sizes and placement rules (pure functions)."""

from __future__ import annotations

import pytest

from jupyter_gpushare.core.policy import CardView, Policy, PolicyError, Size, format_mib, parse_size


@pytest.mark.parametrize(
    "text, mib",
    [
        ("4GiB", 4096),
        ("4096MiB", 4096),
        ("4G", 4096),
        ("4 GiB", 4096),
        ("1.5GiB", 1536),
        ("512M", 512),
        ("1TiB", 1048576),
        ("2GB", 1907),
    ],
)
def test_absolute_sizes(text, mib):
    assert parse_size(text).mib == mib


def test_percent_resolves_against_the_card():
    size = parse_size("25%")
    assert size.percent == 25 and size.resolve(81559) == 20389


@pytest.mark.parametrize(
    "bad, hint",
    [
        ("4", "add a unit"),
        ("four GiB", "is not a size"),
        ("4 parsecs", "not known"),
        ("150%", "more than a whole card"),
        ("", "is not a size"),
        ("-1GiB", "is negative"),
        ("-1", "is negative"),
        ("1e9 GiB", "more than 1 PiB"),
        ("0", "add a unit, e.g. '4GiB'"),  # not '0MiB': no size below the least is suggested
    ],
)
def test_bad_sizes_name_the_setting_the_value_and_an_example(bad, hint):
    with pytest.raises(PolicyError) as e:
        parse_size(bad, "GpuShareApp.default_quota")
    msg = str(e.value)
    assert msg.startswith("GpuShareApp.default_quota:") and repr(bad) in msg and hint in msg
    assert "e.g." in msg


def test_percent_refused_where_an_absolute_size_is_needed():
    with pytest.raises(PolicyError, match="absolute size"):
        parse_size("10%", "GpuShareApp.context_reserve", allow_percent=False)


def test_format_mib():
    assert [format_mib(m) for m in (512, 1024, 3584, 0)] == ["512 MiB", "1 GiB", "3.5 GiB", "0 MiB"]


def test_quota_for_python_default_other_languages_none_unless_configured():
    p = Policy(default_quota=Size(mib=4096), kernel_quotas={"ir": Size(mib=1024), "python-cpu": Size(mib=0)})
    assert p.quota_for("python3", "python") == Size(mib=4096)
    assert p.quota_for("julia", "julia") is None
    assert p.quota_for("ir", "R") == Size(mib=1024)
    assert p.quota_for("python-cpu", "python") is None
    assert p.quota_for("python3", "python", Size(mib=8192)) == Size(mib=8192)


def test_best_fit_picks_the_fullest_card_that_still_fits():
    p = Policy(context_reserve_mib=512)
    cards = [CardView("a", 0, 16384, 0), CardView("b", 1, 16384, 10000), CardView("c", 2, 16384, 14000)]
    assert p.place(Size(mib=2048), cards).uuid == "b"  # c has 2384 left, less than 2048 + 512
    assert p.place(Size(mib=1024), cards).uuid == "c"
    assert p.place(Size(mib=4096), cards).uuid == "b"
    assert p.place(Size(mib=16000), cards) is None


def test_headroom_and_allowed_cards():
    p = Policy(context_reserve_mib=0, headroom=Size(mib=1024), cards=("1",))
    cards = [CardView("a", 0, 8192, 0), CardView("b", 1, 8192, 0)]
    assert p.place(Size(mib=7168), cards).uuid == "b"
    assert p.place(Size(mib=7169), cards) is None


def test_check_quota_names_the_maximum_in_a_students_words():
    p = Policy(max_quota=Size(mib=8192), context_reserve_mib=512)
    with pytest.raises(PolicyError, match=r"largest a kernel may have here \(8 GiB\). Ask for at most 8 GiB.$") as e:
        p.check_quota(Size(mib=12288), [CardView("a", 0, 24576)])
    assert "GpuShareApp" not in str(e.value)  # a student cannot change an admin setting
    with pytest.raises(PolicyError, match="does not fit on any card"):
        Policy(context_reserve_mib=512).check_quota(Size(mib=24576), [CardView("a", 0, 24576)])
    p.check_quota(Size(mib=8192), [CardView("a", 0, 24576)])


def test_user_total_limit_message_offers_what_is_left():
    from jupyter_gpushare.core.policy import UserLimits

    limits = UserLimits(max_total=parse_size("16GiB"))
    with pytest.raises(PolicyError, match=r"already hold 12 GiB .* or ask for at most 4 GiB\."):
        limits.check("alice", 8192, 81920, [8192, 4096])
    with pytest.raises(PolicyError) as e:  # nothing left: no "ask for at most 0 MiB"
        limits.check("alice", 8192, 81920, [8192, 8192])
    assert "at most 0" not in str(e.value) and str(e.value).endswith("no longer use.")
