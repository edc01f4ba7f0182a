"""Encoding and decoding events on the wire (UTF-8 JSON), with precise reasons for rejects."""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import TypeAdapter, ValidationError

from schemas.base import Envelope
from schemas.events import EVENT_TYPES, Event
from schemas.exceptions import InvalidEvent
from schemas.upcast import upcast

MAX_EVENT_BYTES = 1_000_000
"""Payloads above this size are rejected (``oversized``) before parsing."""

_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)


def encode_event(event: Envelope) -> bytes:
    """Serialise an event to its wire form (compact UTF-8 JSON)."""
    return event.model_dump_json(exclude_none=False).encode()


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
        data: Any = raw
    else:
        if isinstance(raw, str):
            raw = raw.encode("utf-8", errors="surrogatepass")
        if len(raw) > MAX_EVENT_BYTES:
            raise InvalidEvent("oversized", f"{len(raw)} bytes > {MAX_EVENT_BYTES}")
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidEvent("invalid_utf8", str(exc)) from exc
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise InvalidEvent("invalid_json", str(exc)) from exc
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
