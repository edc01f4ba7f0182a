"""The simulator's scenario file: a frozen, validated model of the YAML that describes a run's traffic.

A scenario says how many trajectories finish in which event-time span, how they split over
domains, how often environments fail, verifiers cannot decide and trajectories pass, how the
policy advances, and which delivery faults (duplicates, late events) to inject. Every key is
documented on the model classes below and, with examples, in ``scenarios/default.yaml``.

Durations are numbers of seconds or strings with a unit suffix: ``500ms``, ``30s``, ``5m``,
``1h``, ``2d`` (parts may be combined: ``1h30m``). Ranges are ``[min, max]`` (a single value
means ``[value, value]``) and are drawn uniformly. Rates are shares between 0 and 1.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from rollout.errors import ConfigurationError
from schemas.base import Name, Slug
from schemas.events import InterruptReason
from schemas.taxonomy import failure_classes

__all__ = [
    "DeliverySpec",
    "DomainSpec",
    "PolicySpec",
    "Scenario",
    "ScenarioError",
    "TrainingSpec",
    "load_scenario",
    "parse_duration",
    "parse_scenario",
]


class ScenarioError(ConfigurationError):
    """A scenario file is missing, not YAML, or not a valid scenario; the message says ``file:key: why``."""


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_PART = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)\s*")


def parse_duration(value: object) -> float:
    """Seconds from a duration: a number of seconds, a ``timedelta`` or a string like ``30s`` or ``1h30m``."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 30s, 5m or 1h, got a boolean")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, str):
        text = value.strip().lower()
        try:
            return float(text)
        except ValueError:
            pass
        position, seconds = 0, 0.0
        while position < len(text):
            match = _DURATION_PART.match(text, position)
            if match is None:
                break
            seconds += float(match.group(1)) * _UNITS[match.group(2)]
            position = match.end()
        if text and position == len(text):
            return seconds
    raise ValueError(f"expected a duration such as 500ms, 30s, 5m, 1h or 2d, got {value!r}")


def _pair(value: object) -> object:
    """Let a single value stand for the range ``[value, value]``."""
    if isinstance(value, list | tuple):
        return value
    return (value, value)


def _ordered(value: tuple[Any, Any]) -> tuple[Any, Any]:
    if value[0] > value[1]:
        raise ValueError(f"range [{value[0]}, {value[1]}] has its minimum above its maximum")
    return value


Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0, allow_inf_nan=False)]
"""Seconds, written as a number or with a unit suffix (ms, s, m, h, d)."""

DurationRange = Annotated[tuple[Duration, Duration], BeforeValidator(_pair), AfterValidator(_ordered)]
"""``[min, max]`` seconds, drawn uniformly."""

Rate = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
"""A share between 0 and 1."""

Weight = Annotated[float, Field(gt=0, allow_inf_nan=False)]
"""A relative weight (normalised over its siblings)."""

CountRange = Annotated[
    tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]],
    BeforeValidator(_pair),
    AfterValidator(_ordered),
]
"""``[min, max]`` positive integers, drawn uniformly."""

LagRange = Annotated[
    tuple[Annotated[int, Field(ge=0)], Annotated[int, Field(ge=0)]],
    BeforeValidator(_pair),
    AfterValidator(_ordered),
]
"""``[min, max]`` policy versions."""


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PolicySpec(_Spec):
    """How the policy advances: ``versions`` published evenly over the span, and the policy lag.

    - ``versions``: policy versions 1..V; version *i* is published at ``start + (i-1) * duration / V``.
    - ``async_lag``: ``[min, max]`` versions between the newest version published when a
      trajectory finishes and the version it ran on (floored at version 1). This is the policy lag
      the platform measures; a trajectory also never starts before its version was published.
    """

    versions: int = Field(ge=1, le=10_000)
    async_lag: LagRange = (0, 0)


class TrainingSpec(_Spec):
    """The trainer: consumes finished, decided trajectories in batches.

    - ``batch_size``: trajectories per batch (the last batch of the run may be smaller).
    - ``delay``: time from the moment a batch is complete (its last verdict) to its consumption.
      The batch's ``trainer_version`` is the newest policy version published at consumption time.
    """

    batch_size: int = Field(ge=1, le=100_000)
    delay: Duration = 30.0


class DeliverySpec(_Spec):
    """Delivery faults on sandbox and verifier events (run, policy and trainer events are never touched).

    - ``duplicate_rate``: share of events sent a second time, identical (same ``event_id``),
      up to ``late_by`` later in the stream.
    - ``late_rate``: share of events published late: after events up to ``late_by`` newer than them.
    - ``late_by``: the largest displacement, in event time.
    """

    duplicate_rate: Rate = 0.0
    late_rate: Rate = 0.0
    late_by: Duration = 300.0


class DomainSpec(_Spec):
    """One task domain and the quality of each step its trajectories pass through.

    Required: ``name``, ``weight``, ``run_time``, ``wait_time``, ``pass_rate``. Everything else
    is off (or a neutral default) unless given.

    - ``weight``: share of the scenario's trajectories (normalised over domains); also the domain
      weight announced in the run configuration.
    - ``run_time`` / ``wait_time``: ``[min, max]`` durations (started − queued, finished − started).
    - ``env_failure_rate``: share of finished trajectories whose environment failed (no verdict).
    - ``env_failure_classes``: ``{class: weight}`` how those failures split (default ``{other: 1}``);
      model-origin classes such as ``invalid_tool_call`` belong to ``model_error_rate`` instead.
    - ``undecidable_rate``: share of environment-valid trajectories the verifier cannot decide.
    - ``digest_mismatch_rate``: share of environment-valid trajectories whose (passed or failed)
      verdict was given on a different artifact digest than the sandbox's final one; they do not
      count as decided. ``undecidable_rate + digest_mismatch_rate`` must not exceed 1.
    - ``pass_rate``: share of decided trajectories that pass; ``pass_rate_by_version`` overrides
      it for given policy versions (``{version: rate}``).
    - ``model_error_rate``: share of the failed (decided) trajectories that failed through the
      model's own error (``invalid_tool_call``, origin ``model``): they stay environment-valid,
      finish with termination ``agent_error`` and the verifier fails them.
    - ``snapshot_rate``: share of trajectories taking ``snapshots_per_trajectory`` ``[min, max]``
      snapshots (default ``[1, 3]``).
    - ``interrupt_rate``: share of trajectories interrupted once, for a reason drawn from
      ``interrupt_reasons`` ``{reason: weight}`` (default ``{preempted: 1}``; reasons: preempted,
      stale_policy, budget, cancelled, sandbox_lost). An interrupted trajectory takes at least one
      snapshot, resumes from its last one and finishes as planned; ``resume_failure_rate`` is the
      share of resumes that fail (the trajectory then restarts from step 0). After a
      ``stale_policy`` interruption it continues on the newest published version.
    - ``steps`` / ``tokens_per_step``: ``[min, max]`` size of a trajectory (defaults [10, 60] and
      [200, 1500]).
    - ``verify_time``: ``[min, max]`` delay from finish to verdict (default [1s, 10s]).
    - ``environment_version`` / ``verifier_version``: recorded on the events (defaults env-1, v1).
    """

    name: Name
    weight: Weight
    run_time: DurationRange
    wait_time: DurationRange
    pass_rate: Rate
    pass_rate_by_version: dict[Annotated[int, Field(ge=1)], Rate] = Field(default_factory=dict)
    env_failure_rate: Rate = 0.0
    env_failure_classes: dict[Slug, Weight] = Field(default_factory=lambda: {"other": 1.0})
    undecidable_rate: Rate = 0.0
    digest_mismatch_rate: Rate = 0.0
    model_error_rate: Rate = 0.0
    snapshot_rate: Rate = 0.0
    snapshots_per_trajectory: CountRange = (1, 3)
    interrupt_rate: Rate = 0.0
    interrupt_reasons: dict[InterruptReason, Weight] = Field(default_factory=lambda: {InterruptReason.PREEMPTED: 1.0})
    resume_failure_rate: Rate = 0.0
    steps: CountRange = (10, 60)
    tokens_per_step: CountRange = (200, 1500)
    verify_time: DurationRange = (1.0, 10.0)
    environment_version: Name = "env-1"
    verifier_version: Name = "v1"

    @field_validator("env_failure_classes")
    @classmethod
    def _environment_classes(cls, value: dict[str, float]) -> dict[str, float]:
        if not value:
            raise ValueError("needs at least one failure class, e.g. {other: 1}")
        known = failure_classes()
        for name in value:
            origin = known.get(name, {}).get("origin", "environment")
            if origin != "environment":
                raise ValueError(
                    f"{name!r} is a {origin}-origin class, not an environment failure"
                    + ("; use model_error_rate" if origin == "model" else "")
                )
        return value

    @field_validator("interrupt_reasons")
    @classmethod
    def _some_reason(cls, value: dict[InterruptReason, float]) -> dict[InterruptReason, float]:
        if not value:
            raise ValueError("needs at least one reason, e.g. {preempted: 1}")
        return value

    @model_validator(mode="after")
    def _shares_fit(self) -> DomainSpec:
        if self.undecidable_rate + self.digest_mismatch_rate > 1:
            raise ValueError("undecidable_rate + digest_mismatch_rate must not exceed 1")
        return self

    def pass_rate_for(self, version: int) -> float:
        """The pass rate of decided trajectories that ran on a policy version."""
        return self.pass_rate_by_version.get(version, self.pass_rate)


class Scenario(_Spec):
    """A simulated run: who produces how many trajectories when, and with what outcomes.

    - ``run_id``: the RL run every event carries.
    - ``seed``: seeds every random draw; the same scenario and seed give identical events.
    - ``start``: event time of the run's start (an ISO time with zone, e.g. 2026-01-01T00:00:00Z).
    - ``duration``: the event-time span in which the trajectories finish.
    - ``trajectories``: how many finish in that span, over all domains.
    - ``allocation``: ``exact`` (default) splits trajectories over domains, versions and outcomes
      by the largest-remainder method so counts follow the rates exactly and finish times are
      evenly spread; ``sample`` draws domain, outcome and finish time at random from the seed.
    - ``policy``: see ``PolicySpec`` (``versions``, ``async_lag``).
    - ``staleness_bound``: largest acceptable policy lag in versions, announced in the run
      configuration (default 2).
    - ``domains``: see ``DomainSpec``; names must be unique.
    - ``training``: optional, see ``TrainingSpec`` (off when absent).
    - ``delivery``: optional, see ``DeliverySpec`` (no duplicates and no late events when absent).
    - ``description``: free text shown by the CLI.
    """

    run_id: Name
    seed: int = 0
    start: datetime
    duration: Annotated[Duration, Field(gt=0)]
    trajectories: int = Field(ge=1, le=100_000_000)
    allocation: Literal["exact", "sample"] = "exact"
    policy: PolicySpec
    staleness_bound: int = Field(default=2, ge=0)
    domains: tuple[DomainSpec, ...] = Field(min_length=1)
    training: TrainingSpec | None = None
    delivery: DeliverySpec = Field(default_factory=DeliverySpec)
    description: str = ""

    @field_validator("start")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError("needs a time zone, e.g. 2026-01-01T00:00:00Z")
        return value.astimezone(UTC)

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        names = [domain.name for domain in self.domains]
        duplicated = sorted({name for name in names if names.count(name) > 1})
        if duplicated:
            raise ValueError(f"domain names must be unique: {', '.join(duplicated)} repeated")
        for domain in self.domains:
            beyond = sorted(v for v in domain.pass_rate_by_version if v > self.policy.versions)
            if beyond:
                raise ValueError(
                    f"domain {domain.name}: pass_rate_by_version names version {beyond[0]}, "
                    f"but policy.versions is {self.policy.versions}"
                )
        return self

    @property
    def end(self) -> datetime:
        """End of the span in which trajectories finish."""
        return self.start + timedelta(seconds=self.duration)

    def with_overrides(self, *, seed: int | None = None, run_id: str | None = None) -> Scenario:
        """A copy with another seed and/or run id, validated like the file."""
        updates: dict[str, Any] = {}
        if seed is not None:
            updates["seed"] = seed
        if run_id is not None:
            updates["run_id"] = run_id
        if not updates:
            return self
        return parse_scenario({**self.model_dump(), **updates}, source="override")


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file; every problem is a ``ScenarioError`` saying ``file:key: why``."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError(f"{source}: no such scenario file") from None
    except IsADirectoryError:
        raise ScenarioError(f"{source}: is a directory, not a scenario file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{source}: cannot read: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ScenarioError(f"{where}: invalid YAML: {problem}") from exc
    return parse_scenario(data, source=source)


def parse_scenario(data: object, *, source: str = "<scenario>") -> Scenario:
    """Validate already-parsed YAML (a mapping) as a scenario; ``source`` names it in error messages."""
    if not isinstance(data, Mapping):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise ScenarioError(f"{source}: a scenario is a mapping of keys (run_id, start, ...), this is {kind}")
    try:
        return Scenario.model_validate(dict(data))
    except ValidationError as exc:
        raise ScenarioError(_describe(exc, source, data)) from None


def _known_keys() -> list[str]:
    keys: set[str] = set()
    for model in (Scenario, PolicySpec, TrainingSpec, DeliverySpec, DomainSpec):
        keys.update(model.model_fields)
    return sorted(keys)


def _describe(exc: ValidationError, source: str, data: Mapping[Any, Any]) -> str:
    """One line for the first problem (``file:key: message``), with a count of the others."""
    errors = exc.errors(include_url=False)
    # A bad item also makes its container "too short"; only the item's own problem helps the reader.
    locs = [tuple(e["loc"]) for e in errors]

    def has_deeper(loc: tuple[int | str, ...]) -> bool:
        return any(len(other) > len(loc) and other[: len(loc)] == loc for other in locs)

    errors = [e for e in errors if not has_deeper(tuple(e["loc"]))] or errors
    first = errors[0]
    loc = tuple(first["loc"])
    message = str(first["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            message = message[len(prefix) :]
    if first["type"] == "extra_forbidden" and loc:
        unknown = str(loc[-1])
        guess = difflib.get_close_matches(unknown, _known_keys(), n=1)
        message = f"unknown key {unknown!r}" + (f" (did you mean {guess[0]!r}?)" if guess else "")
    elif first["type"] == "missing":
        message = "required key is missing"
    where = _path(loc, data)
    more = len(errors) - 1
    suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return f"{source}:{where}: {message}{suffix}" if where else f"{source}: {message}{suffix}"


def _path(loc: tuple[int | str, ...], data: Mapping[Any, Any]) -> str:
    """``domains[code].pass_rate`` from pydantic's location, naming list items by their ``name``."""
    parts: list[str] = []
    node: Any = data
    for item in loc:
        if isinstance(item, int):
            label = str(item)
            if isinstance(node, list | tuple) and 0 <= item < len(node):
                node = node[item]
                if isinstance(node, Mapping) and isinstance(node.get("name"), str):
                    label = node["name"]
            else:
                node = None
            parts.append(f"[{label}]")
        elif item == "[key]":
            parts.append(" (key)")
        else:
            node = node.get(item) if isinstance(node, Mapping) else None
            parts.append(f".{item}" if parts else str(item))
    return "".join(parts)
