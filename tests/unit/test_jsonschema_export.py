"""The committed JSON Schema files are a current export, and each accepts the events the SDK emits."""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from producers.emitters import PolicyEmitter, SandboxEmitter, VerifierEmitter
from rollout.commands.schemas import register
from schemas import EVENT_TYPES, TopicNames, encode_event, event_key
from schemas.base import Envelope
from schemas.events import PREVIOUS_VERSIONS
from schemas.export import DEFAULT_DIR, INDEX_FILE, check_json_schemas, export_json_schemas
from tests.support.events import Recorder

try:  # the full validator when it is installed; the subset below otherwise
    import jsonschema
except ImportError:  # pragma: no cover - depends on the environment
    jsonschema = None


def sample_events() -> dict[str, Envelope]:
    """One real event of every type, built through the SDK."""
    sink = Recorder()

    def clock() -> datetime:
        return datetime(2026, 1, 1, tzinfo=UTC)

    with SandboxEmitter(
        sink, run_id="run-7", domain="code", task_id="task-42", environment_version="env-3", clock=clock
    ) as rollout:
        rollout.started(policy_version=12, sandbox_id="sb-1")
        rollout.environment_failed("license_prompt", detail="EULA", retryable=True)
        rollout.snapshot(
            snapshot_id="s1",
            step=3,
            filesystem_digest="sha256:f",
            context_digest="sha256:c",
            bytes=10,
            duration_s=0.1,
        )
        rollout.interrupted("stale_policy", step=4)
        rollout.resumed(snapshot_id="s1", steps_restored=3)
        rollout.finished(termination="completed", steps=9, tokens=99, artifact_digest="sha256:ab12")
    VerifierEmitter(sink, run_id="run-7", verifier_id="v", verifier_version="1", clock=clock).verified(
        trajectory_id=rollout.trajectory_id,
        domain="code",
        verdict="passed",
        artifact_digest="sha256:ab12",
        reward=0.5,
        checks={"tests": True},
    )
    policy = PolicyEmitter(sink, run_id="run-7", clock=clock)
    policy.run_configured(domain_weights={"code": 1.0}, staleness_bound=2)
    policy.version_published(version=13, checkpoint_digest="sha256:ck")
    policy.batch_consumed(batch_id="b1", trainer_version=13, trajectory_ids=[rollout.trajectory_id])
    return {str(getattr(e, "event_type")): e for e in sink.events}  # noqa: B009


# -- a validator for the JSON Schema subset pydantic emits, used when jsonschema is absent --------


def _errors(value: Any, schema: dict[str, Any], root: dict[str, Any], path: str = "$") -> list[str]:
    if "$ref" in schema:
        name = schema["$ref"].removeprefix("#/$defs/")
        return _errors(value, root["$defs"][name], root, path)
    if "anyOf" in schema:
        if all(_errors(value, option, root, path) for option in schema["anyOf"]):
            return [f"{path}: matches no anyOf option"]
        return []
    found: list[str] = []
    kind = schema.get("type")
    checks = {
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "null": lambda v: v is None,
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
    }
    if kind is not None and not checks[kind](value):
        return [f"{path}: not of type {kind}"]
    if "const" in schema and value != schema["const"]:
        found.append(f"{path}: is not {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        found.append(f"{path}: not in {schema['enum']}")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", 10**9):
            found.append(f"{path}: length out of bounds")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            found.append(f"{path}: does not match {schema['pattern']}")
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if is_number and not schema.get("minimum", -math.inf) <= value <= schema.get("maximum", math.inf):
        found.append(f"{path}: out of range")
    if isinstance(value, list):
        if len(value) > schema.get("maxItems", 10**9):
            found.append(f"{path}: too many items")
        for i, item in enumerate(value):
            found += _errors(item, schema.get("items", {}), root, f"{path}[{i}]")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        found += [f"{path}: missing {name}" for name in schema.get("required", []) if name not in value]
        for name, item in value.items():
            if name in properties:
                found += _errors(item, properties[name], root, f"{path}.{name}")
                continue
            pattern_match = [s for p, s in schema.get("patternProperties", {}).items() if re.search(p, name)]
            for sub in pattern_match:
                found += _errors(item, sub, root, f"{path}.{name}")
            extra = schema.get("additionalProperties", True)
            if not pattern_match and extra is False:
                found.append(f"{path}: unexpected property {name}")
            elif not pattern_match and isinstance(extra, dict):
                found += _errors(item, extra, root, f"{path}.{name}")
    return found


def validation_errors(value: Any, schema: dict[str, Any]) -> list[str]:
    """Why ``value`` does not satisfy ``schema`` (empty when it does)."""
    if jsonschema is not None:  # pragma: no cover - depends on the environment
        validator = jsonschema.Draft202012Validator(schema)
        return [e.message for e in validator.iter_errors(value)]
    return _errors(value, schema, schema)


# -- tests -------------------------------------------------------------------------------------


def test_committed_schemas_are_a_current_export(tmp_path: Path) -> None:
    fresh = {p.name: p.read_bytes() for p in export_json_schemas(tmp_path)}
    committed = {p.name: p.read_bytes() for p in DEFAULT_DIR.glob("*.json")}
    assert committed == fresh, "run `rollout schemas export` and commit schemas/jsonschema/"
    assert check_json_schemas(DEFAULT_DIR) == []


def test_one_file_per_event_type_version_and_an_index(tmp_path: Path) -> None:
    names = {p.name for p in export_json_schemas(tmp_path)}
    expected = {f"{t}.v{cls.CURRENT_VERSION}.json" for t, cls in EVENT_TYPES.items()}  # type: ignore[attr-defined]
    older = {f"{cls.model_fields['event_type'].default}.v{cls.CURRENT_VERSION}.json"  # type: ignore[attr-defined]
             for cls in PREVIOUS_VERSIONS}
    assert names == expected | older | {INDEX_FILE}


def test_output_is_deterministic_and_canonical(tmp_path: Path) -> None:
    first = {p.name: p.read_text(encoding="utf-8") for p in export_json_schemas(tmp_path / "a")}
    second = {p.name: p.read_text(encoding="utf-8") for p in export_json_schemas(tmp_path / "b")}
    assert first == second
    for text in first.values():
        assert text.endswith("}\n") and "\r" not in text
        assert text == json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def test_index_gives_topic_and_key_of_every_event_type(tmp_path: Path) -> None:
    export_json_schemas(tmp_path)
    index = json.loads((tmp_path / INDEX_FILE).read_text(encoding="utf-8"))
    samples = sample_events()
    assert set(index["event_types"]) == set(EVENT_TYPES) == set(samples)
    topics = TopicNames("{prefix}")
    for event_type, entry in index["event_types"].items():
        assert (tmp_path / entry["file"]).is_file()
        assert entry["topic"] == topics.for_event_type(event_type)
        assert entry["topic"] == getattr(topics, entry["topic_family"])
        event = samples[event_type]
        assert getattr(event, entry["key_field"]) == event_key(event)


@pytest.mark.parametrize("event_type", sorted(EVENT_TYPES))
def test_schema_accepts_the_real_event_and_rejects_broken_ones(tmp_path: Path, event_type: str) -> None:
    export_json_schemas(tmp_path)
    index = json.loads((tmp_path / INDEX_FILE).read_text(encoding="utf-8"))
    schema = json.loads((tmp_path / index["event_types"][event_type]["file"]).read_text(encoding="utf-8"))
    payload = json.loads(encode_event(sample_events()[event_type]))
    assert validation_errors(payload, schema) == []
    for required in ("event_id", "event_type", "schema_version", "occurred_at", "run_id", "producer"):
        broken = {k: v for k, v in payload.items() if k != required}
        assert validation_errors(broken, schema), f"accepted without {required}"
    assert validation_errors({**payload, "event_type": "sandbox.other"}, schema)
    assert validation_errors({**payload, "unexpected": 1}, schema)
    assert validation_errors({**payload, "producer": {**payload["producer"], "kind": "robot"}}, schema)


def test_check_names_missing_stale_and_leftover_files(tmp_path: Path) -> None:
    assert INDEX_FILE in check_json_schemas(tmp_path)
    export_json_schemas(tmp_path)
    assert check_json_schemas(tmp_path) == []
    (tmp_path / "sandbox.rollout_started.v1.json").write_text("{}\n", encoding="utf-8")
    (tmp_path / "policy.version_published.v1.json").unlink()
    (tmp_path / "sandbox.retired_event.v1.json").write_text("{}\n", encoding="utf-8")
    (tmp_path / "notes.json").write_text("{}\n", encoding="utf-8")
    assert check_json_schemas(tmp_path) == [
        "policy.version_published.v1.json",
        "sandbox.rollout_started.v1.json",
        "sandbox.retired_event.v1.json",
    ]
    export_json_schemas(tmp_path)
    assert check_json_schemas(tmp_path) == []
    assert not (tmp_path / "sandbox.retired_event.v1.json").exists()
    assert (tmp_path / "notes.json").exists()  # not ours, left alone


def test_cli_export_and_check(tmp_path: Path) -> None:
    app = typer.Typer()
    register(app)
    runner = CliRunner()
    out = tmp_path / "schemas"
    result = runner.invoke(app, ["schemas", "export", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert runner.invoke(app, ["schemas", "check", "--out", str(out)]).exit_code == 0
    (out / "sandbox.rollout_queued.v1.json").write_text("{}\n", encoding="utf-8")
    result = runner.invoke(app, ["schemas", "check", "--out", str(out)])
    assert result.exit_code == 1
    assert "sandbox.rollout_queued.v1.json" in result.output
