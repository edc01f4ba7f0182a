"""The owner's cached events share repeated values without changing what any event is or encodes to."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from producers.scenario import load_scenario
from producers.simulator import generate
from schemas import decode_event, encode_event
from streams.state import EventCompactor

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "default.yaml"


def _decoded(n: int) -> list[tuple[bytes, object]]:
    scenario = load_scenario(SCENARIO).model_copy(update={"trajectories": 60})
    wire = [encode_event(e) for e in list(generate(scenario))[:n]]
    return [(raw, decode_event(raw)) for raw in wire]


def test_compacted_events_equal_and_encode_like_the_originals() -> None:
    compact = EventCompactor()
    pairs = _decoded(300)
    for raw, event in pairs:
        same = compact(event)  # type: ignore[arg-type]
        assert same is event
        assert encode_event(same) == raw
        assert same == decode_event(raw)
        assert same.model_fields_set == decode_event(raw).model_fields_set


def test_repeated_values_are_one_object() -> None:
    compact = EventCompactor()
    events = [compact(e) for _, e in _decoded(300)]  # type: ignore[arg-type]
    by_producer: dict[tuple[str, str, str], object] = {}
    for e in events:
        key = (e.producer.kind.value, e.producer.id, e.producer.version)
        assert by_producer.setdefault(key, e.producer) is e.producer
    assert len(by_producer) < len(events) / 10
    runs = {id(e.run_id) for e in events}
    assert len(runs) == 1
    same_type = [e for e in events if type(e) is type(events[-1])]
    assert len({id(e.__pydantic_fields_set__) for e in same_type}) == 1


def test_a_shared_set_of_given_fields_is_never_changed_through_one_event() -> None:
    compact = EventCompactor()
    first = compact(_decoded(1)[0][1])  # type: ignore[arg-type]
    second = compact(decode_event(encode_event(first)))  # shares first's set of given fields
    before = set(first.model_fields_set)
    copied = first.model_copy(update={"run_id": "other"})
    assert copied.run_id == "other" and first.run_id != "other"
    assert second.__pydantic_fields_set__ is first.__pydantic_fields_set__
    assert first.model_fields_set == before == second.model_fields_set
    with pytest.raises(ValidationError):
        first.run_id = "changed"
    assert first.model_fields_set == before
