"""JSON Schema files of the event catalog, for producers written in other languages.

One file per event type and version (``<event_type>.v<version>.json``) and an ``index.json``
saying, for each event type, its file, its Kafka topic and the field its messages are keyed by.
The output is deterministic so the committed copy (``schemas/jsonschema/``) can be checked for drift.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from schemas.base import Envelope
from schemas.events import EVENT_CLASSES, PREVIOUS_VERSIONS
from schemas.topics import TopicNames

DEFAULT_DIR = Path(__file__).resolve().parent / "jsonschema"
"""Where the committed copy lives."""

INDEX_FILE = "index.json"
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

_PREFIX_PLACEHOLDER = "{prefix}"
# Names this module writes; only files of this shape are ever deleted as stale.
_GENERATED = re.compile(r"^[a-z][a-z0-9_]*\.[a-z][a-z0-9_]*\.v[0-9]+\.json$")


def _event_type(cls: type[Envelope]) -> str:
    return str(cls.model_fields["event_type"].default)


def _version(cls: type[Envelope]) -> int:
    return int(cls.CURRENT_VERSION)  # type: ignore[attr-defined]


def schema_file_name(cls: type[Envelope]) -> str:
    """``<event_type>.v<version>.json`` of an event class."""
    return f"{_event_type(cls)}.v{_version(cls)}.json"


def key_field(cls: type[Envelope]) -> str:
    """The field whose value is the Kafka key (mirrors ``schemas.parse.event_key``)."""
    return "trajectory_id" if "trajectory_id" in cls.model_fields else "run_id"


def _topic_family(event_type: str) -> str:
    topics = TopicNames(_PREFIX_PLACEHOLDER)
    topic = topics.for_event_type(event_type)
    for family in ("sandbox", "verifier", "policy"):
        if getattr(topics, family) == topic:
            return family
    raise ValueError(f"no topic family for {event_type!r}")  # pragma: no cover - catalog invariant


def event_json_schema(cls: type[Envelope]) -> dict[str, Any]:
    """The JSON Schema of one event class's wire form."""
    schema = cls.model_json_schema(mode="validation")
    # Defaults make these optional to pydantic, but a consumer routes on them, so a message
    # from another language must carry them.
    required = list(schema.get("required", []))
    for name in ("event_type", "schema_version"):
        if name not in required:
            required.append(name)
    schema["required"] = required
    schema["$schema"] = JSON_SCHEMA_DIALECT
    schema["$id"] = schema_file_name(cls)
    return schema


def _index() -> dict[str, Any]:
    topics = TopicNames(_PREFIX_PLACEHOLDER)
    event_types: dict[str, Any] = {}
    for cls in EVENT_CLASSES:
        event_type = _event_type(cls)
        family = _topic_family(event_type)
        event_types[event_type] = {
            "file": schema_file_name(cls),
            "schema_version": _version(cls),
            "title": cls.__name__,
            "topic_family": family,
            "accepted_versions": sorted(
                {_version(cls)} | {_version(old) for old in PREVIOUS_VERSIONS if _event_type(old) == event_type}
            ),
            "topic": topics.for_event_type(event_type),
            "key_field": key_field(cls),
        }
    return {
        "description": (
            "Event catalog of the rollout telemetry platform. Messages are UTF-8 JSON objects, one "
            "event per message, on the topic shown ({prefix} is the deployment's topic prefix, "
            "'rollout' by default), with the value of key_field as the Kafka key (UTF-8). "
            "Partition keys with murmur2 like the Java client. occurred_at is RFC 3339 with a time zone."
        ),
        "default_prefix": TopicNames().prefix,
        "topics": {
            "sandbox": topics.sandbox,
            "verifier": topics.verifier,
            "policy": topics.policy,
            "deadletter": topics.deadletter,
        },
        "event_types": event_types,
    }


def _dump(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def render_json_schemas() -> dict[str, str]:
    """File name -> file content of the whole export (pure: nothing is written)."""
    files = {schema_file_name(cls): _dump(event_json_schema(cls)) for cls in (*EVENT_CLASSES, *PREVIOUS_VERSIONS)}
    files[INDEX_FILE] = _dump(_index())
    return dict(sorted(files.items()))


def export_json_schemas(out_dir: Path) -> list[Path]:
    """Write the schema files and ``index.json`` into ``out_dir``, removing generated files now stale."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = render_json_schemas()
    written: list[Path] = []
    for name, text in files.items():
        path = out_dir / name
        # Rewriting only what changed keeps file times (and make-style rebuilds) quiet.
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8", newline="\n")
        written.append(path)
    for path in out_dir.iterdir():
        if path.is_file() and _GENERATED.match(path.name) and path.name not in files:
            path.unlink()
    return written


def check_json_schemas(out_dir: Path) -> list[str]:
    """Names of files in ``out_dir`` that are missing, differ from a fresh export, or are left over."""
    files = render_json_schemas()
    stale: list[str] = []
    for name, text in files.items():
        path = out_dir / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            stale.append(name)
    if out_dir.is_dir():
        stale.extend(
            sorted(p.name for p in out_dir.iterdir() if _GENERATED.match(p.name) and p.name not in files)
        )
    return stale
