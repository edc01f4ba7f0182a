"""``decode_event``'s fast path (pydantic-core parses and validates in one step) accepts exactly what the
step-by-step path accepts, with equal events: the fast path may only ever be a shortcut."""

from __future__ import annotations

import json
import random
from datetime import datetime
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from bench.workload import encode_all, events_for
from schemas import InvalidEvent, TopicNames, decode_event
from schemas.parse import _ADAPTER, _decode_bytes, _decode_fast, encode_event
from tests.support.hostile import KINDS, make_case
from tests.unit.test_jsonschema_export import sample_events

ODD_VALUES: tuple[Any, ...] = (
    None, True, False, 0, 1, -1, 1.0, 1.5, 2**70, "", "1", "x" * 300, "\u0000", [], [1], {}, {"a": 1},
    "2026-01-01T00:00:00", "2026-01-01T02:00:00+02:00", 1767225600, "1767225600", "NaN", 1e308,
)
"""Values put in place of each field in turn: types pydantic converts in lax mode, and ones it refuses."""


def _corpus() -> list[bytes]:
    rng = random.Random(20261201)
    samples = list(sample_events().values())
    events = samples + events_for(3000, run_id="fast-path")
    raws = list(encode_all(events, "p").values)
    for event in samples:
        data = json.loads(encode_event(event))
        for name in data:
            for value in ODD_VALUES:
                raws.append(json.dumps({**data, name: value}).encode())
            raws.append(json.dumps({k: v for k, v in data.items() if k != name}).encode())
        raws.append(json.dumps(data, indent=2).encode())  # whitespace
        raws.append(json.dumps(data, ensure_ascii=True).encode().replace(b'"run-7"', b'"run-\\u0037"'))  # escapes
        raws.append(encode_event(event)[:-1] + b',"run_id":"other"}')  # a duplicate key: the last one wins
    topics = TopicNames("p")
    for _ in range(3000):
        case = make_case(rng, rng.choice(KINDS), events, topics)
        if case.value is not None:
            raws.append(case.value)
    return raws


CORPUS = _corpus()


def _shape(value: Any) -> Any:
    """The value with the type of everything in it, so equal-but-differently-typed results differ."""
    if isinstance(value, BaseModel):
        return (type(value), {k: _shape(v) for k, v in value.__dict__.items()})
    if isinstance(value, tuple | list):
        return (type(value), [_shape(v) for v in value])
    if isinstance(value, dict):
        return (type(value), {k: _shape(v) for k, v in value.items()})
    if isinstance(value, datetime):
        return (datetime, value, value.utcoffset())
    return (type(value), value)


def test_whatever_the_fast_path_accepts_the_step_by_step_path_accepts_the_same() -> None:
    fast_accepted = 0
    for raw in CORPUS:
        fast = _decode_fast(raw)
        if fast is None:  # refused here: decode_event goes on to the step-by-step path
            continue
        fast_accepted += 1
        slow = _decode_bytes(raw)
        assert _shape(fast) == _shape(slow), raw
        assert encode_event(fast) == encode_event(slow)
    assert fast_accepted > 3000  # the valid events, at least


def test_decode_event_gives_the_step_by_step_result_for_every_input() -> None:
    outcomes: dict[str, int] = {}
    for raw in CORPUS:
        try:
            expected: Any = _shape(_decode_bytes(raw))
        except InvalidEvent as exc:
            expected = ("rejected", exc.reason, exc.detail)
        try:
            got: Any = _shape(decode_event(raw))
        except InvalidEvent as exc:
            got = ("rejected", exc.reason, exc.detail)
        assert got == expected, raw
        key = expected[1] if expected[0] == "rejected" else "accepted"
        outcomes[key] = outcomes.get(key, 0) + 1
    # The corpus reaches every reason the step-by-step path gives (oversized is checked before either path).
    assert set(outcomes) >= {"accepted", "invalid_utf8", "invalid_json", "not_an_object", "unknown_event_type",
                             "unsupported_schema_version", "validation"}, outcomes


@pytest.mark.parametrize("version", [True, 1.0, "1"])
def test_a_schema_version_that_is_not_an_integer_literal_is_refused_on_both_paths(version: object) -> None:
    data = json.loads(encode_event(next(iter(sample_events().values()))))
    raw = json.dumps({**data, "schema_version": version}).encode()
    with pytest.raises(InvalidEvent) as caught:
        decode_event(raw)
    assert caught.value.reason == "validation"
    assert "schema_version must be a positive integer" in caught.value.detail


def test_an_older_version_is_refused_by_the_fast_path_and_upcast_by_the_other() -> None:
    started = sample_events()["sandbox.rollout_started"]
    data = json.loads(encode_event(started))
    del data["sandbox_pool"]
    v1 = json.dumps({**data, "schema_version": 1}).encode()
    with pytest.raises(ValidationError):
        _ADAPTER.validate_json(v1)
    event = decode_event(v1)
    assert event.schema_version == 2 and event.sandbox_pool == "default"  # type: ignore[attr-defined]
