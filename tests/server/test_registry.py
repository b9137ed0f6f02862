"""The kernels' registry (server/registry.py) is the one place a kernel's record changes: a record is frozen to every
other part, a change of its state is held against the kernel's life (life.py), and each change a person would
notice is said once, after all of a change's fields are set."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from jupyter_gpushare.core.policy import Size
from jupyter_gpushare.core.words import render
from jupyter_gpushare.host.procs import SessionRef
from jupyter_gpushare.ledger.leases import Lease, Waiting
from jupyter_gpushare.server.life import IllegalMove
from jupyter_gpushare.server.records import InLine
from jupyter_gpushare.server.registry import KernelRegistry


@pytest.fixture
def registry_and_said():
    said: list = []
    registry = KernelRegistry(
        "alice", [], lambda kid, what: said.append((kid, what)), logging.getLogger(), lambda: True
    )
    return registry, said


def test_a_record_is_changed_by_its_registry_alone(registry_and_said):
    registry, _ = registry_and_said
    rec = registry.record("k1", "python3", "python")
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.line = InLine(1.0)  # type: ignore[misc]
    with pytest.raises(ValueError, match="changes by KernelRegistry.move"):
        registry.update(rec, state="running")
    with pytest.raises(TypeError, match="no field lien"):
        registry.update(rec, lien=InLine(1.0))
    assert rec.line is None and rec.state == "starting"


def test_a_change_is_said_once_all_its_fields_are_set_and_only_what_a_person_would_notice(registry_and_said):
    registry, said = registry_and_said
    rec = registry.record("k1", "python3", "python")
    version = registry.version.n
    seen: list = []
    said_then = said.append
    said.clear()

    def hear(kid, what):  # what a listener reads when it hears: the whole change, not a part of it
        seen.append((rec.state, rec.line))
        said_then((kid, what))

    registry._on_change = hear
    place = InLine(1.0, Waiting("k1", 2, 4608, 1024, 1))
    registry.move(rec, "queued", line=place)
    assert said == [("k1", "position"), ("k1", "state")]
    assert seen == [("queued", place)] * 2
    registry.update(rec, line=InLine(1.0, Waiting("k1", 2, 512, 0, 1)))  # its place is the same: nothing said
    assert said == [("k1", "position"), ("k1", "state")]
    registry.update(rec, quota=Size(mib=1024))
    assert said[-1] == ("k1", "quota") and registry.version.n == version + 3


def test_a_move_the_kernels_life_does_not_allow_raises_under_the_tests(registry_and_said):
    registry, _ = registry_and_said
    rec = registry.record("k1", "python3", "python")
    with pytest.raises(IllegalMove, match="running without a lease"):
        registry.move(rec, "running")
    with pytest.raises(IllegalMove, match="queued without its wait"):
        registry.move(rec, "queued")
    registry.move(rec, "queued", line=InLine(1.0))
    with pytest.raises(IllegalMove, match="standby with a wait in line"):
        registry.move(rec, "standby")
    registry.move(rec, "cpu", line=None, wait_ended="refused-timeout")
    with pytest.raises(IllegalMove, match="starting with a wait that ended"):
        registry.move(rec, "starting")
    assert rec.state == "cpu"


def test_a_change_of_fields_is_held_against_what_the_state_carries(registry_and_said):
    """``update`` changes a record's fields, not its state; it cannot write what its state does not allow: a running
    kernel's lease taken away, or a wait in line given to a kernel that is not queued, without a move."""
    registry, _ = registry_and_said
    rec = registry.record("k1", "python3", "python")
    lease = Lease("k1", "GPU-sim-0", 0, 4096, 512, "alice", "python3", SessionRef("s1"), None, 0.0)
    registry.move(rec, "running", lease=lease)
    with pytest.raises(IllegalMove, match="running without a lease"):
        registry.update(rec, lease=None)
    with pytest.raises(IllegalMove, match="running with a wait in line"):
        registry.update(rec, line=InLine(1.0))
    registry.update(rec, lease=dataclasses.replace(lease, quota_mib=8192))  # a lease that grew: allowed
    assert rec.state == "running" and rec.lease is not None and rec.lease.quota_mib == 8192 and rec.line is None


def test_an_events_english_is_the_catalogues_written_once(registry_and_said, caplog):
    """An event is a code and its figures; its English, in the log, the API and the sidebar alike, is rendered from
    the catalogue (core/words.py), never written at the call site. A code without words is a bug: it raises under
    the tests, and in a server it is logged and said by its code."""
    registry, said = registry_and_said
    registry.update(registry.record("k1", "python3", "python"), path="week1/a.ipynb")
    with caplog.at_level(logging.INFO):
        registry.event("released", "k1", reserved_mib=3584, why="shut down")
        registry.event("no-gpu", "k1", code="no-gpu-full", need_mib=4096, free_mib=1024)
    released, no_gpu = registry.events
    assert released["message"] == "Released 3.5 GiB (shut down)." and released["path"] == "week1/a.ipynb"
    assert (
        no_gpu["message"]
        == render("event.no-gpu-full", no_gpu)
        == ("Started without a GPU: it needs 4 GiB, and the most unreserved on any card is 1 GiB.")
    )
    assert "gpushare released k1: Released 3.5 GiB (shut down)." in caplog.text
    assert said[-1] == ("k1", "event")
    with pytest.raises(KeyError, match="event.not-a-code is not in"):
        registry.event("not-a-code", "k1")
