"""The kernels' registry (server/registry.py) is the one place a kernel's record changes: a record is frozen to every
other part, a change of its state is held against the kernel's life (life.py), and each change a person would
notice is said once, after all of a change's fields are set."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from jupyter_gpushare.core.policy import Size
from jupyter_gpushare.server.life import IllegalMove
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
        rec.position = 3  # type: ignore[misc]
    with pytest.raises(ValueError, match="changes by KernelRegistry.move"):
        registry.update(rec, state="running")
    with pytest.raises(TypeError, match="no field positon"):
        registry.update(rec, positon=3)
    assert rec.position is None and rec.state == "starting"


def test_a_change_is_said_once_all_its_fields_are_set_and_only_what_a_person_would_notice(registry_and_said):
    registry, said = registry_and_said
    rec = registry.record("k1", "python3", "python")
    version = registry.version.n
    seen: list = []
    said_then = said.append
    said.clear()

    def hear(kid, what):  # what a listener reads when it hears: the whole change, not a part of it
        seen.append((rec.state, rec.position, rec.queued_since))
        said_then((kid, what))

    registry._on_change = hear
    registry.move(rec, "queued", position=2, queued_since=1.0)
    assert said == [("k1", "position"), ("k1", "state")]
    assert seen == [("queued", 2, 1.0)] * 2
    registry.update(rec, need_mib=512, position=2)  # nothing a person would notice changed: nothing said
    assert said == [("k1", "position"), ("k1", "state")]
    registry.update(rec, quota=Size(mib=1024))
    assert said[-1] == ("k1", "quota") and registry.version.n == version + 3


def test_a_move_the_kernels_life_does_not_allow_raises_under_the_tests(registry_and_said):
    registry, _ = registry_and_said
    rec = registry.record("k1", "python3", "python")
    with pytest.raises(IllegalMove, match="running without a lease"):
        registry.move(rec, "running")
    assert rec.state == "starting"
