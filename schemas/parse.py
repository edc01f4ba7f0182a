"""Encoding and decoding events on the wire (UTF-8 JSON), with precise reasons for rejects."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
from pydantic import BaseModel, TypeAdapter, ValidationError

from schemas.base import Envelope
from schemas.events import EVENT_CLASSES, EVENT_TYPES, Event
from schemas.exceptions import InvalidEvent
from schemas.upcast import upcast

MAX_EVENT_BYTES = 1_000_000
"""Payloads above this size are rejected (``oversized``) before parsing."""

_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)


# Encoding. pydantic's serializer defines the wire form. For models whose schema leaves nothing to
# it but plain values (no aliases, custom serializers, computed or excluded fields, serialization
# settings), orjson writes the same bytes from the instance's __dict__ about three times faster:
# fields in declaration order, UUIDs and enum values as strings, datetimes in ISO 8601 with "Z"
# for UTC, floats shortest round-trip, non-ASCII as is. tests/unit/test_encoding.py holds the two
# to the same output; anything orjson refuses (an integer beyond 64 bits, say) goes to pydantic.

_PLAIN_NODES = frozenset(
    {"model", "model-fields", "model-field", "str", "int", "float", "bool", "uuid", "datetime", "enum",
     "literal", "default", "nullable", "tuple", "list", "dict", "function-after", "function-before"}
)
"""Core-schema node types whose JSON pydantic writes the way orjson does (``function-after`` and
``function-before`` only validate)."""
_PLAIN_CONFIG = frozenset({"extra_fields_behavior", "str_strip_whitespace", "title"})
"""Model settings that do not touch serialisation."""
_MODEL_KEYS = frozenset({"type", "cls", "schema", "custom_init", "root_model", "config", "ref", "metadata",
                         "post_init", "generic_origin"})
_FIELD_KEYS = frozenset({"type", "schema", "metadata", "validation_alias", "frozen"})
_FIELDS_KEYS = frozenset({"type", "fields", "model_name", "computed_fields", "strict", "extras_schema",
                          "extra_behavior"})


def _plain_models(schema: Any) -> Iterator[type[BaseModel]]:
    """The model classes in a core schema; ``ValueError`` if anything in it is not plainly serialised."""
    if isinstance(schema, list | tuple):
        for item in schema:
            yield from _plain_models(item)
        return
    if not isinstance(schema, dict):
        return
    kind = schema.get("type")
    if kind not in _PLAIN_NODES or "serialization" in schema:
        raise ValueError(f"{kind} node")
    if kind == "model":
        config = schema.get("config", {})
        if (
            set(schema) - _MODEL_KEYS
            or schema.get("root_model")
            or set(config) - _PLAIN_CONFIG
            or config.get("extra_fields_behavior") == "allow"  # extras are written, but are not in __dict__
        ):
            raise ValueError(f"model {schema.get('cls')}")
        yield schema["cls"]
    elif kind == "model-fields":
        if (
            set(schema) - _FIELDS_KEYS
            or schema.get("computed_fields")
            or schema.get("extras_schema") is not None
            or schema.get("extra_behavior") == "allow"
        ):
            raise ValueError("model fields")
        yield from _plain_models(list(schema["fields"].values()))
        return
    elif kind == "model-field" and set(schema) - _FIELD_KEYS:
        raise ValueError("model field")
    elif kind == "enum" and schema.get("sub_type") not in ("str", "int"):
        raise ValueError("enum")
    elif kind == "literal" and any(type(v) not in (str, int, bool, type(None)) for v in schema["expected"]):
        raise ValueError("literal")
    for key, value in schema.items():
        if key not in ("type", "cls", "metadata", "config", "ref", "members", "expected", "default", "function"):
            yield from _plain_models(value)


def plainly_serialised(cls: type[BaseModel]) -> frozenset[type[BaseModel]]:
    """``cls`` and the models inside it when orjson writes their JSON exactly as pydantic does, else empty."""
    try:
        return frozenset(_plain_models(cls.__pydantic_core_schema__))
    except (ValueError, KeyError, TypeError):
        return frozenset()


_PLAIN_FIELDS: dict[type, int] = {
    model: len(model.model_fields)
    for event_class in EVENT_CLASSES
    for model in plainly_serialised(event_class)
}
"""Models encoded by orjson, with their number of fields (an instance with another count goes to pydantic)."""
_UTC_Z = orjson.OPT_UTC_Z


def _nested(value: Any) -> Any:
    fields = _PLAIN_FIELDS.get(type(value))
    if fields is not None:
        state: dict[str, Any] = value.__dict__
        if len(state) == fields:
            return state
    raise TypeError(f"{type(value).__name__} is not plainly serialised")


def encode_event(event: Envelope) -> bytes:
    """Serialise an event to its wire form (compact UTF-8 JSON, as ``model_dump_json`` writes it)."""
    state: dict[str, Any] = event.__dict__
    if _PLAIN_FIELDS.get(type(event)) == len(state):
        try:
            return orjson.dumps(state, default=_nested, option=_UTC_Z)
        except orjson.JSONEncodeError:
            pass
    return event.__pydantic_serializer__.to_json(event)


def event_key(event: Envelope) -> str:
    """The Kafka key of an event: trajectory_id for sandbox/verifier events, else run_id."""
    trajectory_id = getattr(event, "trajectory_id", None)
    return str(trajectory_id) if trajectory_id is not None else event.run_id


def decode_event(raw: bytes | str | dict[str, Any]) -> Envelope:
    """Parse and validate one event; raise ``InvalidEvent`` with a reason code on any problem.

    Reasons: ``oversized``, ``invalid_utf8``, ``invalid_json``, ``not_an_object``,
    ``unknown_event_type``, ``unsupported_schema_version``, ``validation``.
    """
    if isinstance(raw, dict):
        return _decode_data(raw)
    if isinstance(raw, str):
        raw = raw.encode("utf-8", errors="surrogatepass")
    if len(raw) > MAX_EVENT_BYTES:
        raise InvalidEvent("oversized", f"{len(raw)} bytes > {MAX_EVENT_BYTES}")
    event = _decode_fast(raw)
    return event if event is not None else _decode_bytes(raw)


def _decode_fast(raw: bytes) -> Envelope | None:
    """The common case: a current-version event, parsed and validated by pydantic-core in one step.

    None for anything else: every event class pins its schema_version as a literal, so an older or
    newer version is refused here, as is anything wrong; ``_decode_bytes`` then upcasts or names the
    reason. Whatever this accepts, ``_decode_bytes`` accepts with an equal result
    (tests/unit/test_parse_fast_path.py); it only saves the time of orjson plus ``validate_python``.
    """
    try:
        event = _ADAPTER.validate_json(raw)
    except ValidationError:
        return None
    # The literal's default stands in for a missing version; the step-by-step path refuses that.
    return event if "schema_version" in event.__pydantic_fields_set__ else None


def _decode_bytes(raw: bytes) -> Envelope:
    """Parse and validate step by step, naming the first problem (``decode_event`` without its fast path)."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidEvent("invalid_utf8", str(exc)) from exc
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidEvent("invalid_json", str(exc)) from exc
    return _decode_data(data)


def _decode_data(data: Any) -> Envelope:
    """Validate parsed JSON: catalog type, schema version (upcast when older), then the model."""
    if not isinstance(data, dict):
        raise InvalidEvent("not_an_object", f"expected a JSON object, got {type(data).__name__}")
    event_type = data.get("event_type")
    cls = EVENT_TYPES.get(event_type) if isinstance(event_type, str) else None
    if cls is None:
        raise InvalidEvent("unknown_event_type", f"event_type {event_type!r} is not in the catalog")
    version = data.get("schema_version")
    current = cls.CURRENT_VERSION  # type: ignore[attr-defined]
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise InvalidEvent("validation", f"schema_version must be a positive integer, got {version!r}")
    if version > current:
        raise InvalidEvent(
            "unsupported_schema_version", f"{event_type} v{version} is newer than v{current} known here"
        )
    if version < current:
        data = upcast(data, current)
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[:3]
        detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in first)
        raise InvalidEvent("validation", detail) from exc
