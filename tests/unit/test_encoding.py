"""encode_event writes exactly what pydantic's serializer writes, whichever encoder it uses."""

from __future__ import annotations

import itertools
import math
import random
import struct
import uuid
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Annotated, Any

import orjson
import pytest
from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, RootModel, computed_field, field_serializer

from producers.scenario import load_scenario
from producers.simulator import generate
from schemas import (
    BatchConsumed,
    Envelope,
    EnvironmentFailed,
    Producer,
    RolloutFinished,
    RolloutQueued,
    RunConfigured,
    SnapshotTaken,
    VerificationCheck,
    VerificationFinished,
    decode_event,
    encode_event,
)
from schemas.base import Frozen
from schemas.events import COUNT_MAX, EVENT_CLASSES, Termination
from schemas.parse import _PLAIN_FIELDS, _nested, plainly_serialised
from tests.unit.test_jsonschema_export import sample_events

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "default.yaml"
PRODUCER = Producer(kind="verifier", id="v-1", version="1")
WHEN = datetime(2026, 1, 1, tzinfo=UTC)


def pydantic_json(event: BaseModel) -> bytes:
    """The reference: what ``model_dump_json`` has always put on the wire."""
    return event.model_dump_json().encode()


def fast_json(event: BaseModel) -> bytes:
    """The fast encoder alone (``encode_event`` would fall back to pydantic where it fails)."""
    return orjson.dumps(event.__dict__, default=_nested, option=orjson.OPT_UTC_Z)


def same(event: Envelope) -> bool:
    expected = pydantic_json(event)
    return fast_json(event) == expected and encode_event(event) == expected


def verification(i: int, **changes: Any) -> VerificationFinished:
    values: dict[str, Any] = {
        "event_id": uuid.UUID(int=i, version=4),
        "occurred_at": WHEN + timedelta(microseconds=i),
        "run_id": "run",
        "producer": PRODUCER,
        "trajectory_id": f"t-{i}",
        "domain": "code",
        "verifier_id": "v-1",
        "verifier_version": "1",
        "verdict": "passed",
        "artifact_digest": "sha256:ab",
    }
    values.update(changes)
    return VerificationFinished(**values)


def test_every_catalog_event_and_its_parts_take_the_fast_encoder() -> None:
    assert set(EVENT_CLASSES) | {Producer, VerificationCheck} == set(_PLAIN_FIELDS)
    assert _PLAIN_FIELDS[Producer] == 3


def test_sample_of_every_type_is_encoded_as_pydantic_does() -> None:
    for event in sample_events().values():
        assert same(event)
        assert decode_event(encode_event(event)) == event


def test_simulated_run_is_encoded_as_pydantic_does() -> None:
    events = list(itertools.islice(generate(load_scenario(SCENARIO)), 20_000))
    assert {type(e) for e in events} >= {RolloutQueued, RolloutFinished, VerificationFinished, SnapshotTaken}
    for event in events:
        assert same(event)


def test_floats_are_written_as_pydantic_writes_them() -> None:
    rng = random.Random(7)
    values = [0.0, -0.0, 1.0, 0.1, 1 / 3, 2.925, 100.0, 1e15, 1e16, 1e17, 1e21, 1e22, 1.5e-7, 1e-5, 5e-324,
              1.7976931348623157e308, 9007199254740993.0, 123456789012345680.0]
    while len(values) < 3000:
        bits = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
        if math.isfinite(bits):
            values.append(bits)
        values.append(rng.random() * 10 ** rng.randint(-30, 30))
    for i, value in enumerate(values):
        event = verification(i, reward=value, duration_s=min(abs(value), 1e9))
        assert same(event), value
    weights = RunConfigured(event_id=uuid.uuid4(), occurred_at=WHEN, run_id="r", producer=PRODUCER,
                            domain_weights={f"d{i}": abs(v) for i, v in enumerate(values[:200])}, staleness_bound=1)
    assert same(weights)


def test_strings_are_escaped_as_pydantic_escapes_them() -> None:
    specials = [chr(c) for c in range(0x20)] + ['"', "\\", "/", "\x7f", "\u0080", "\u00e9", "\u2028", "\u2029",
                                                  "\ufeff", "\uffff", "\U0001f600", "\U0010ffff", "<>&'"]
    for i, text in enumerate(specials):
        event = EnvironmentFailed(event_id=uuid.UUID(int=i, version=4), occurred_at=WHEN, run_id="r\u00e9",
                                  producer=PRODUCER, trajectory_id="t\u6f22", domain="code", failure_class="oom",
                                  origin="environment", detail=f"a{text}b{text * 3}")
        assert same(event), repr(text)


def test_times_optional_fields_and_collections_are_written_as_pydantic_writes_them() -> None:
    moments = [WHEN, WHEN.replace(microsecond=500_000), WHEN.replace(microsecond=1), datetime(1, 1, 1, tzinfo=UTC),
               datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
               datetime(2026, 6, 1, 12, 30, 15, 120_000, tzinfo=timezone(timedelta(hours=5, minutes=30)))]
    for i, moment in enumerate(moments):
        event = verification(i, occurred_at=moment, reward=None, checks=())
        assert same(event)
    many = verification(1, checks=tuple(VerificationCheck(name=f"c{i}", passed=i % 2 == 0) for i in range(50)))
    assert same(many)
    finished = RolloutFinished(event_id=uuid.uuid4(), occurred_at=WHEN, run_id="r", producer=PRODUCER,
                               trajectory_id="t", domain="d", termination="max_steps", steps=0, tokens=COUNT_MAX,
                               oldest_policy_version=0, newest_policy_version=0)
    assert same(finished)
    batch = BatchConsumed(event_id=uuid.uuid4(), occurred_at=WHEN, run_id="r", producer=PRODUCER, batch_id="b",
                          trainer_version=1, trajectory_ids=tuple(f"t{i}" for i in range(1000)))
    assert same(batch)


def test_what_orjson_cannot_write_goes_to_pydantic() -> None:
    # Validation refuses counts past 2^40 now; built without it, such an event still encodes (through pydantic).
    huge = RolloutFinished.model_construct(
        event_id=uuid.uuid4(), occurred_at=WHEN, run_id="r", producer=PRODUCER, trajectory_id="t", domain="d",
        termination=Termination.COMPLETED, steps=1, tokens=2**70, artifact_digest=None, oldest_policy_version=0,
        newest_policy_version=0)
    with pytest.raises(orjson.JSONEncodeError):
        fast_json(huge)
    assert encode_event(huge) == pydantic_json(huge)
    assert b'"tokens":1180591620717411303424' in encode_event(huge)


def test_subclasses_and_odd_instances_go_to_pydantic() -> None:
    class Extended(RolloutQueued):
        note: str = "x"

    extended = Extended(event_id=uuid.uuid4(), occurred_at=WHEN, run_id="r", producer=PRODUCER, trajectory_id="t",
                        domain="d", task_id="k", environment_version="e")
    assert encode_event(extended) == pydantic_json(extended)
    assert b'"note":"x"' in encode_event(extended)

    class OtherProducer(Producer):
        region: str = "eu"

    nested = verification(1).model_copy(update={"producer": OtherProducer(kind="verifier", id="v", version="1")})
    assert encode_event(nested) == pydantic_json(nested)
    assert b"region" not in encode_event(nested)

    partial = RolloutQueued.model_construct(run_id="r", trajectory_id="t")
    assert encode_event(partial) == pydantic_json(partial)


@pytest.mark.parametrize(
    "model",
    [
        "alias",
        "excluded",
        "plain_serializer",
        "field_serializer",
        "computed",
        "config",
        "root",
        "nested_alias",
        "extra_allowed",
    ],
)
def test_models_whose_json_pydantic_shapes_are_not_plain(model: str) -> None:
    class Alias(Frozen):
        value: str = Field(serialization_alias="v")

    class Excluded(Frozen):
        value: str
        secret: str = Field(default="", exclude=True)

    class Plain(Frozen):
        value: Annotated[str, PlainSerializer(str.upper)]

    class WithFieldSerializer(Frozen):
        value: str

        @field_serializer("value")
        def _upper(self, value: str) -> str:
            return value.upper()

    class Computed(Frozen):
        value: str

        @computed_field  # type: ignore[prop-decorator]
        @property
        def twice(self) -> str:
            return self.value * 2

    class Configured(BaseModel):
        model_config = ConfigDict(ser_json_timedelta="float")
        value: timedelta

    class Root(RootModel[list[int]]):
        pass

    class Outer(Frozen):
        inner: Alias

    class ExtraAllowed(BaseModel):
        model_config = ConfigDict(extra="allow")
        value: str

    models: dict[str, type[BaseModel]] = {
        "alias": Alias,
        "excluded": Excluded,
        "plain_serializer": Plain,
        "field_serializer": WithFieldSerializer,
        "computed": Computed,
        "config": Configured,
        "root": Root,
        "nested_alias": Outer,
        "extra_allowed": ExtraAllowed,
    }
    assert plainly_serialised(models[model]) == frozenset()


def test_plain_models_are_found_with_what_they_contain() -> None:
    assert plainly_serialised(VerificationFinished) == {VerificationFinished, Producer, VerificationCheck}
    assert plainly_serialised(Envelope) == {Envelope, Producer}
