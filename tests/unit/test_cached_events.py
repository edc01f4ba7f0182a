"""The owner's cached copies of events assemble exactly like the events, and share what events repeat."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from producers.scenario import load_scenario
from producers.simulator import generate
from schemas import PolicyVersionPublished, decode_event, encode_event
from streams.trajectory import (
    _MODEL_OF,
    NOT_CACHED,
    AssemblyConfig,
    CachedEvent,
    VersionTimeline,
    assemble,
    cached_copy,
)

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "default.yaml"


def _decoded(trajectories: int) -> list[Any]:
    scenario = load_scenario(SCENARIO).model_copy(update={"trajectories": trajectories})
    return [decode_event(encode_event(e)) for e in generate(scenario)]


def test_a_copy_has_its_events_fields_but_those_assembly_never_reads() -> None:
    kinds = set()
    for event in _decoded(60):
        if not getattr(event, "trajectory_id", None):
            continue
        copy = cached_copy(event)
        assert isinstance(copy, CachedEvent) and _MODEL_OF[type(copy)] is type(event)
        kept = [name for name in type(event).model_fields if name not in NOT_CACHED]
        assert list(copy.__slots__) == kept  # type: ignore[attr-defined]
        assert all(getattr(copy, name) == getattr(event, name) for name in kept)
        assert not hasattr(copy, "__dict__") and not hasattr(copy, "producer")
        assert type(cached_copy(event)) is type(copy)  # one class per event class, made once
        kinds.add(type(event))
    assert len(kinds) >= 6  # queued, started, finished, verdicts, failures, snapshots... all met


def test_records_assembled_from_copies_equal_those_from_the_events() -> None:
    events = _decoded(200)
    timeline = VersionTimeline.from_events(e for e in events if isinstance(e, PolicyVersionPublished))
    config = AssemblyConfig()
    by_trajectory: dict[str, list[Any]] = defaultdict(list)
    for e in events:
        if getattr(e, "trajectory_id", None):
            by_trajectory[str(e.trajectory_id)].append(e)
    records = 0
    for trajectory in by_trajectory.values():
        expected = assemble(trajectory, timeline, config)
        copies = [cached_copy(e) for e in trajectory]
        assert assemble(copies, timeline, config) == expected
        assert assemble(copies + copies[:1] + trajectory[-1:], timeline, config) == expected  # duplicates, mixed
        records += expected is not None
    assert records == len(by_trajectory) > 100


def test_repeated_strings_are_one_object() -> None:
    copies = [cached_copy(e) for e in _decoded(60) if getattr(e, "trajectory_id", None)]
    assert len({id(c.run_id) for c in copies}) == 1
    by_trajectory: dict[str, set[int]] = defaultdict(set)
    for c in copies:
        by_trajectory[c.trajectory_id].add(id(c.trajectory_id))  # type: ignore[attr-defined]
    assert all(len(ids) == 1 for ids in by_trajectory.values())
    assert len({id(c.domain) for c in copies}) == len({c.domain for c in copies})  # type: ignore[attr-defined]
