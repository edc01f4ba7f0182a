"""Scenario files: the documented keys parse as written, and mistakes are reported as ``file:key: why``."""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from producers.scenario import ScenarioError, load_scenario, parse_duration, parse_scenario
from rollout.errors import ConfigurationError
from schemas.events import InterruptReason

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"

EXAMPLE = """\
run_id: system-a            # every event carries it
seed: 1
start: 2026-01-01T00:00:00Z # event time of the run's start
duration: 1h                # event-time span in which the trajectories finish
trajectories: 1000          # trajectories finishing in that span, over all domains
allocation: exact
policy: {versions: 5, async_lag: [0, 2]}
domains:
  - name: code
    weight: 1.0
    run_time: [30s, 300s]   # uniform
    wait_time: [1s, 20s]
    env_failure_rate: 0.4
    env_failure_classes: {dependency_unreachable: 2, license_prompt: 1, data_missing: 1}
    undecidable_rate: 0.2
    pass_rate: 0.6
    pass_rate_by_version: {5: 0.3}
"""


def _base() -> dict[str, Any]:
    data = yaml.safe_load(EXAMPLE)
    assert isinstance(data, dict)
    return data


def test_the_documented_example_parses_as_written() -> None:
    scenario = parse_scenario(_base())
    assert scenario.run_id == "system-a"
    assert scenario.seed == 1
    assert scenario.start == datetime(2026, 1, 1, tzinfo=UTC)
    assert scenario.duration == 3600.0
    assert scenario.trajectories == 1000
    assert scenario.allocation == "exact"
    assert scenario.policy.versions == 5
    assert scenario.policy.async_lag == (0, 2)
    (code,) = scenario.domains
    assert code.name == "code"
    assert code.run_time == (30.0, 300.0)
    assert code.wait_time == (1.0, 20.0)
    assert code.env_failure_classes == {"dependency_unreachable": 2, "license_prompt": 1, "data_missing": 1}
    assert list(code.env_failure_classes) == ["dependency_unreachable", "license_prompt", "data_missing"]
    assert code.pass_rate_for(5) == 0.3
    assert code.pass_rate_for(4) == 0.6


def test_optional_keys_default_to_off() -> None:
    scenario = parse_scenario(_base())
    code = scenario.domains[0]
    assert scenario.staleness_bound == 2
    assert scenario.training is None
    assert scenario.delivery.duplicate_rate == scenario.delivery.late_rate == 0.0
    assert code.snapshot_rate == code.interrupt_rate == code.digest_mismatch_rate == 0.0
    assert code.model_error_rate == code.resume_failure_rate == 0.0
    assert code.interrupt_reasons == {InterruptReason.PREEMPTED: 1.0}


def test_optional_keys_parse() -> None:
    data = _base()
    data |= {
        "staleness_bound": 1,
        "training": {"batch_size": 64, "delay": "30s"},
        "delivery": {"duplicate_rate": 0.01, "late_rate": 0.02, "late_by": "5m"},
    }
    data["domains"][0] |= {
        "snapshot_rate": 0.5,
        "snapshots_per_trajectory": [2, 4],
        "interrupt_rate": 0.1,
        "interrupt_reasons": {"preempted": 2, "stale_policy": 1},
        "resume_failure_rate": 0.2,
        "digest_mismatch_rate": 0.05,
        "model_error_rate": 0.1,
        "verify_time": "3s",
    }
    scenario = parse_scenario(data)
    assert scenario.training is not None and scenario.training.delay == 30.0
    assert scenario.delivery.late_by == 300.0
    code = scenario.domains[0]
    assert code.snapshots_per_trajectory == (2, 4)
    assert code.interrupt_reasons == {InterruptReason.PREEMPTED: 2.0, InterruptReason.STALE_POLICY: 1.0}
    assert code.verify_time == (3.0, 3.0)  # one value stands for [value, value]


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_scenarios_load(path: Path) -> None:
    scenario = load_scenario(path)
    assert scenario.domains


def test_shipped_scenarios_are_there() -> None:
    assert {p.name for p in SCENARIOS.glob("*.yaml")} >= {
        "default.yaml",
        "regression.yaml",
        "healthy.yaml",
        "golden.yaml",
    }


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("2d", 172800.0),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        (" 10 s ", 10.0),
        ("90", 90.0),
        (90, 90.0),
        (0.25, 0.25),
    ],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["1x", "", "h", "1 hour", "s1", True, None, [1]])
def test_bad_durations(text: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


Mutation = Callable[[dict[str, Any]], None]


def _set_domain(**values: Any) -> Mutation:
    return lambda data: data["domains"][0].update(values)


def _set(**values: Any) -> Mutation:
    return lambda data: data.update(values)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            _set_domain(pas_rate=0.5),
            "run.yaml:domains[code].pas_rate: unknown key 'pas_rate' (did you mean 'pass_rate'?)",
        ),
        (_set_domain(pass_rate=1.5), "run.yaml:domains[code].pass_rate: Input should be less than or equal to 1"),
        (_set_domain(run_time=["5m", "1s"]), "run.yaml:domains[code].run_time: range [300.0, 1.0] has its minimum"),
        (_set_domain(wait_time="soon"), "run.yaml:domains[code].wait_time[0]: expected a duration"),
        (_set(duration="1x"), "run.yaml:duration: expected a duration such as 500ms"),
        (_set(duration="0s"), "run.yaml:duration: Input should be greater than 0"),
        (_set(start="2026-01-01T00:00:00"), "run.yaml:start: needs a time zone"),
        (lambda d: d.pop("run_id"), "run.yaml:run_id: required key is missing"),
        (_set(allocation="roughly"), "run.yaml:allocation: Input should be 'exact' or 'sample'"),
        (_set(trajectories=0), "run.yaml:trajectories: Input should be greater than or equal to 1"),
        (_set(domains=[]), "run.yaml:domains: Tuple should have at least 1 item"),
        (
            _set_domain(pass_rate_by_version={7: 0.1}),
            "run.yaml: domain code: pass_rate_by_version names version 7, but policy.versions is 5",
        ),
        (
            _set_domain(env_failure_classes={"invalid_tool_call": 1}),
            "'invalid_tool_call' is a model-origin class, not an environment failure; use model_error_rate",
        ),
        (
            _set_domain(env_failure_classes={"Bad Class": 1}),
            "run.yaml:domains[code].env_failure_classes.Bad Class (key)",
        ),
        (
            _set_domain(interrupt_reasons={"nap": 1}),
            "run.yaml:domains[code].interrupt_reasons.nap (key): Input should be",
        ),
        (
            _set_domain(undecidable_rate=0.7, digest_mismatch_rate=0.4),
            "run.yaml:domains[code]: undecidable_rate + digest_mismatch_rate must not exceed 1",
        ),
        (lambda d: d["domains"].append(copy.deepcopy(d["domains"][0])), "run.yaml: domain names must be unique: code"),
        (lambda d: d["policy"].update(async_lag=[2, 0]), "run.yaml:policy.async_lag: range [2, 0]"),
        (
            lambda d: d["policy"].update(versions=0),
            "run.yaml:policy.versions: Input should be greater than or equal to 1",
        ),
        (_set(training={"batch_size": 0}), "run.yaml:training.batch_size"),
        (_set(delivery={"late_rate": 2}), "run.yaml:delivery.late_rate"),
        (_set_domain(weight=0), "run.yaml:domains[code].weight: Input should be greater than 0"),
    ],
)
def test_validation_errors_name_file_and_key(mutate: Mutation, message: str) -> None:
    data = _base()
    mutate(data)
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(data, source="run.yaml")
    text = str(caught.value)
    assert message in text
    assert "\n" not in text


def test_scenario_errors_are_configuration_errors() -> None:
    assert issubclass(ScenarioError, ConfigurationError)


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ScenarioError, match=r"nope\.yaml: no such scenario file"):
        load_scenario(missing)


def test_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("run_id: x\ndomains: [\n  {name: a\n", encoding="utf-8")
    with pytest.raises(ScenarioError, match=r"broken\.yaml:\d+:\d+: invalid YAML"):
        load_scenario(path)


@pytest.mark.parametrize(("text", "kind"), [("", "empty"), ("- a\n- b\n", "a list"), ("just words", "a str")])
def test_a_scenario_is_a_mapping(tmp_path: Path, text: str, kind: str) -> None:
    path = tmp_path / "odd.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ScenarioError, match=f"odd.yaml: a scenario is a mapping.*this is {kind}"):
        load_scenario(path)


def test_file_errors_carry_the_file_name(tmp_path: Path) -> None:
    data = _base()
    data["domains"][0]["pass_rate"] = -1
    path = tmp_path / "neg.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(ScenarioError, match=r"neg\.yaml:domains\[code\]\.pass_rate: "):
        load_scenario(path)


def test_overrides_are_validated() -> None:
    scenario = parse_scenario(_base())
    changed = scenario.with_overrides(seed=9, run_id="system-b")
    assert (changed.seed, changed.run_id) == (9, "system-b")
    assert changed.domains == scenario.domains
    assert scenario.with_overrides() is scenario
    with pytest.raises(ScenarioError, match="run_id"):
        scenario.with_overrides(run_id="")


def test_start_is_normalised_to_utc() -> None:
    data = _base()
    data["start"] = "2026-01-01T02:00:00+02:00"
    assert parse_scenario(data).start == datetime(2026, 1, 1, tzinfo=UTC)


def test_scenarios_are_frozen() -> None:
    scenario = parse_scenario(_base())
    with pytest.raises(ValidationError):
        scenario.seed = 2  # type: ignore[misc]
