"""The audit's comparison logic, its report and its command, without ClickHouse."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from infra.clickhouse.reader import QueryResult
from rollout.commands import audit as audit_command
from streams.audit import (
    ALERTS,
    ALL_FAMILIES,
    FAMILIES,
    RUN_EVENTS_SQL,
    RUNS_SQL,
    SQL_DIR,
    TRAJECTORIES,
    AuditReport,
    Difference,
    FamilyResult,
    InconsistentRead,
    Kind,
    UnknownRun,
    audit_run,
    audit_sql,
    compare_family,
    expected_alerts,
    fill_empty_windows,
    normalise,
    values_equal,
)
from streams.regression import RegressionConfig

FAMILY = {f.name: f for f in ALL_FAMILIES}
W0 = 1_767_225_600  # 2026-01-01T00:00:00Z
W1 = W0 + 60


def throughput(domain: str = "code", start: int = W0, **values: int) -> dict[str, Any]:
    row: dict[str, Any] = {"domain": domain, "window_start": start, "finished": 10, "env_valid": 8, "decided": 6,
                           "passed": 3, "undecidable": 2, "digest_mismatches": 0, "model_errors": 1}
    row.update(values)
    return row


# -- values ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "kind", "expected"),
    [
        (None, Kind.FLOAT, None),
        (float("nan"), Kind.FLOAT, None),
        (3, Kind.FLOAT, 3.0),
        ("42", Kind.INT, 42),
        (W0, Kind.TIME, W0),
        (True, Kind.FLAG, True),
        (0, Kind.FLAG, False),
        ("true", Kind.FLAG, True),
        (("a", "b"), Kind.LIST, ["a", "b"]),
        (7, Kind.TEXT, "7"),
    ],
)
def test_values_are_normalised_to_one_form(value: Any, kind: Kind, expected: Any) -> None:
    assert normalise(value, kind) == expected


def test_null_equals_only_null_and_floats_have_a_tolerance() -> None:
    assert values_equal(None, None, Kind.FLOAT)
    assert not values_equal(None, 0.0, Kind.FLOAT)
    assert not values_equal(0, None, Kind.INT)
    assert values_equal(1.0, 1.0 + 1e-12, Kind.FLOAT)
    assert not values_equal(1.0, 1.0 + 1e-6, Kind.FLOAT)
    assert values_equal(1.0, 1.0005, Kind.FLOAT, tolerance=1e-3)
    assert not values_equal(5, 6, Kind.INT)
    assert values_equal(["a"], ["a"], Kind.LIST)


# -- keyed comparison --------------------------------------------------------------------------


def test_identical_rows_give_no_difference_whatever_the_order() -> None:
    rows = [throughput("code"), throughput("math", W1)]
    result = compare_family(FAMILY["throughput"], rows, list(reversed(rows)))
    assert result.differences == ()
    assert (result.audit_rows, result.stream_rows, result.compared) == (2, 2, 2)


def test_each_differing_value_is_one_difference_with_both_sides() -> None:
    result = compare_family(FAMILY["throughput"], [throughput(finished=10, passed=3)],
                            [throughput(finished=11, passed=4)])
    assert [(d.kind, d.column, d.stream, d.audit) for d in result.differences] == [
        ("value", "finished", 11, 10), ("value", "passed", 4, 3)]
    assert result.differences[0].key == (("domain", "code"), ("window_start", W0))
    assert result.compared == 1


def test_rows_missing_on_either_side_are_reported() -> None:
    result = compare_family(FAMILY["throughput"], [throughput("code"), throughput("math")],
                            [throughput("code"), throughput("documents")])
    kinds = {(d.kind, dict(d.key)["domain"]) for d in result.differences}
    assert kinds == {("missing_in_stream", "math"), ("missing_in_audit", "documents")}
    assert result.compared == 1


def test_repeated_keys_are_reported() -> None:
    result = compare_family(FAMILY["throughput"], [throughput()], [throughput(), throughput()])
    assert [d.kind for d in result.differences] == ["duplicate_in_stream"]


def test_keys_match_across_representations() -> None:
    audit = [{"domain": "code", "window_start": W0, "policy_version": 3, "decided": 5, "passed": 2}]
    stream = [{"domain": "code", "window_start": str(W0), "policy_version": "3", "decided": "5", "passed": 2}]
    assert compare_family(FAMILY["domain_quality"], audit, stream).differences == ()


def test_floats_compare_within_tolerance_and_null_quantiles_match() -> None:
    base = {"domain": "code", "window_start": W0, "finished": 0, "wait_s_p50": None, "wait_s_p95": None,
            "run_s_p50": 1.5, "run_s_p95": 2.0, "interruptions": 0}
    near = {**base, "run_s_p50": 1.5 + 1e-12}
    far = {**base, "run_s_p95": 2.001}
    assert compare_family(FAMILY["timing"], [base], [near]).differences == ()
    assert [d.column for d in compare_family(FAMILY["timing"], [base], [far]).differences] == ["run_s_p95"]


def test_lag_seconds_are_compared_strictly_at_finish_and_at_consumption() -> None:
    row = {"domain": "code", "window_start": W0, "stage": "consumption", "trajectories": 4,
           "lag_versions_p50": 1.0, "lag_versions_p95": 2.0, "lag_versions_max": 2.0, "lag_seconds_p50": 10.123456,
           "lag_seconds_p95": 20.5, "lag_seconds_max": 20.5, "over_bound": 1, "staleness_bound": 2}
    truncated = {**row, "lag_seconds_p50": 10.123, "lag_seconds_max": 20.4999}
    for name, stage in (("policy_lag_consumption", "consumption"), ("policy_lag_finish", "finish")):
        family = FAMILY[name]
        differences = compare_family(family, [{**row, "stage": stage}], [{**truncated, "stage": stage}]).differences
        assert [d.column for d in differences] == ["lag_seconds_p50", "lag_seconds_max"]


def test_trajectory_records_compare_flags_lists_and_nulls() -> None:
    record: dict[str, Any] = {c.name: None for c in TRAJECTORIES.columns}
    record.update(trajectory_id="tr-1", domain="code", status="finished", decided=True, passed=False,
                  interruption_reasons=["preempted"], revision=4)
    stream = {**record, "decided": 1, "passed": 0, "interruption_reasons": ("preempted",)}
    assert compare_family(TRAJECTORIES, [record], [stream]).differences == ()
    stream["lag_versions"] = 0
    assert [d.column for d in compare_family(TRAJECTORIES, [record], [stream]).differences] == ["lag_versions"]


# -- windows without finished trajectories ---------------------------------------------------


def test_empty_windows_get_the_zero_row_of_one_row_families() -> None:
    windows = {("code", W0), ("code", W1), ("cad", W0)}
    weights = {"code": 0.75, "math": 0.25}
    filled = fill_empty_windows(FAMILY["budget"], [{"domain": "code", "window_start": W0, "sandbox_seconds": 5.0,
                                                     "effective": 1, "configured_weight": 0.75}], windows, weights)
    assert sorted((r["domain"], r["window_start"], r["sandbox_seconds"], r["effective"], r["configured_weight"])
                  for r in filled) == [("cad", W0, 0.0, 0, 0.0), ("code", W0, 5.0, 1, 0.75),
                                       ("code", W1, 0.0, 0, 0.75)]
    timing = fill_empty_windows(FAMILY["timing"], [], {("code", W0)}, weights)
    assert timing == [{"domain": "code", "window_start": W0, "finished": 0, "wait_s_p50": None,
                       "wait_s_p95": None, "run_s_p50": None, "run_s_p95": None, "interruptions": 0}]


def test_families_with_one_row_per_key_are_not_filled() -> None:
    assert fill_empty_windows(FAMILY["domain_quality"], [], {("code", W0)}, {}) == []
    assert fill_empty_windows(FAMILY["env_failures"], [], {("code", W0)}, {}) == []


def test_a_stream_window_emptied_by_a_late_event_is_not_a_difference() -> None:
    family = FAMILY["snapshots"]
    stream = [{"domain": "code", "window_start": W1, **{c.name: 0 for c in family.values}}]
    filled = fill_empty_windows(family, [], {("code", W1)}, {})
    assert compare_family(family, filled, stream).differences == ()


# -- alerts ----------------------------------------------------------------------------------


def test_expected_alerts_come_from_the_regression_check() -> None:
    counts = [
        {"domain": "code", "policy_version": 1, "decided": 100, "passed": 60},
        {"domain": "code", "policy_version": 2, "decided": 100, "passed": 30},
        {"domain": "math", "policy_version": 1, "decided": 100, "passed": 60},
        {"domain": "math", "policy_version": 2, "decided": 100, "passed": 62},
    ]
    alerts = expected_alerts("r", counts, RegressionConfig())
    assert [(a["domain"], a["policy_version"], a["baseline_versions"], a["candidate_passed"]) for a in alerts] == [
        ("code", 2, [1], 30)]
    stream = [{**alerts[0], "baseline_versions": (1,)}]
    assert compare_family(ALERTS, alerts, stream).differences == ()
    assert [d.kind for d in compare_family(ALERTS, alerts, []).differences] == ["missing_in_stream"]
    assert expected_alerts("r", counts, RegressionConfig(min_decided=101)) == []


# -- the SQL and the run checks --------------------------------------------------------------


def test_every_family_has_its_sql_file_and_binds_the_run() -> None:
    for family in (*FAMILIES, TRAJECTORIES):
        sql = audit_sql(family.sql_file)
        assert "{run:String}" in sql
        assert "FROM events_raw" in sql
        assert "{run:String}" in family.stream_sql()
        assert family.stream_sql().count("FROM v_") == 1
    used = {f.sql_file for f in (*FAMILIES, TRAJECTORIES)} | {"assembly.sql", "windows.sql", "weights.sql",
                                                              "version_counts.sql"}
    assert {p.name for p in SQL_DIR.glob("*.sql")} == used


def test_no_audit_query_joins_tables() -> None:
    """A JOIN's runtime filter can poison ClickHouse's query condition cache; the audit SQL has none."""
    for path in SQL_DIR.glob("*.sql"):
        code = "\n".join(line.split("--")[0] for line in path.read_text().splitlines()).upper()
        assert " JOIN " not in code.replace("ARRAY JOIN", ""), path.name


class FakeClickHouse:
    """Answers the audit's reads from fixed per-run counts (every other read returns no rows)."""

    def __init__(self, per_run: dict[str, int], filtered: int | None = None) -> None:
        self.per_run = per_run
        self.filtered = filtered
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, sql: str, parameters: dict[str, Any]) -> QueryResult:
        self.calls.append((sql, dict(parameters)))
        if sql == RUNS_SQL:
            return QueryResult(["run_id", "events"], ["String", "UInt64"], [[r, n] for r, n in self.per_run.items()])
        if sql == RUN_EVENTS_SQL:
            count = self.filtered if self.filtered is not None else self.per_run.get(parameters["run"], 0)
            return QueryResult(["events"], ["UInt64"], [[count]])
        return QueryResult([], [], [])


def _audit(fake: FakeClickHouse, run_id: str) -> AuditReport:
    return audit_run(fake, run_id, window_s=60, verdict_timeout_s=600.0, default_staleness_bound=2)


def test_an_unknown_run_is_refused_with_the_known_ones() -> None:
    with pytest.raises(UnknownRun) as caught:
        _audit(FakeClickHouse({"golden": 10, "demo": 5}), "nope")
    assert caught.value.known == ("demo", "golden")
    assert "demo, golden" in str(caught.value)


def test_inconsistent_counts_stop_the_audit() -> None:
    with pytest.raises(InconsistentRead, match="8192"):
        _audit(FakeClickHouse({"demo": 27886}, filtered=8192), "demo")


def test_the_run_id_is_always_bound_never_pasted() -> None:
    run_id = "x' OR '1'='1"
    fake = FakeClickHouse({run_id: 3})
    report = _audit(fake, run_id)
    assert report.total == 0
    assert [f.family for f in report.families] == [f.name for f in ALL_FAMILIES]
    assert all(run_id not in sql for sql, _ in fake.calls)
    assert all(params.get("run") == run_id for sql, params in fake.calls if sql != RUNS_SQL)
    audit_params = next(p for s, p in fake.calls if "folded AS" in s)
    assert audit_params == {"run": run_id, "window_s": 60, "timeout_s": 600.0, "timeout_us": 600_000_000,
                            "default_bound": 2, "tid_from": "", "tid_to": ""}


# -- report and command ----------------------------------------------------------------------


def _report(differences: int) -> AuditReport:
    diffs = tuple(Difference("throughput", (("domain", "code"), ("window_start", W0 + 60 * i)), "value",
                             "finished", 11, 10) for i in range(differences))
    family = FamilyResult("throughput", "v_effective_throughput", 30, 30, 30, diffs)
    return AuditReport("golden", 60, 4045, (family,))


def test_differences_describe_themselves() -> None:
    value = _report(1).differences[0]
    assert value.key_text() == "domain=code, window_start=2026-01-01T00:00:00Z"
    assert value.describe() == "finished: stream 11 != audit 10"
    missing = Difference("alerts", (("domain", "code"), ("policy_version", 5)), "missing_in_stream")
    assert "only in the audit" in missing.describe()
    assert json.loads(json.dumps(_report(2).as_dict()))["differences"] == 2


def _cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, outcome: AuditReport | Exception, *args: str
         ) -> Any:
    def fake_audit_run(*_args: Any, **_kwargs: Any) -> AuditReport:
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(audit_command, "audit_run", fake_audit_run)
    app = typer.Typer(add_completion=False)
    audit_command.register(app)

    @app.callback()
    def _root() -> None:
        """Test root."""

    return CliRunner().invoke(app, list(args), env={"ROLLOUT_DATA_DIR": str(tmp_path), "COLUMNS": "120"})


def test_command_exits_0_when_nothing_differs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    result = _cli(monkeypatch, tmp_path, _report(0), "audit", "--run", "golden")
    assert result.exit_code == 0, result.output
    assert result.output.rstrip().endswith("audit: 0 differences")


def test_command_exits_1_and_shows_at_most_20_examples(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    result = _cli(monkeypatch, tmp_path, _report(25), "audit", "--run", "golden")
    assert result.exit_code == 1
    assert "first 20 of 25 differences" in result.output
    assert "00:19:00Z" in result.output and "00:20:00Z" not in result.output
    assert result.output.rstrip().endswith("audit: 25 differences")


def test_command_prints_json(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    result = _cli(monkeypatch, tmp_path, _report(2), "audit", "--run", "golden", "--format", "json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["differences"] == 2 and len(data["details"]) == 2
    assert data["details"][0]["key"] == {"domain": "code", "window_start": "2026-01-01T00:00:00Z"}


def test_command_exits_2_on_an_unknown_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    result = _cli(monkeypatch, tmp_path, UnknownRun("nope", ["demo", "golden"]), "audit", "--run", "nope")
    assert result.exit_code == 2
    assert "unknown run 'nope'" in result.output and "demo, golden" in result.output


def test_command_exits_2_when_the_run_is_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert _cli(monkeypatch, tmp_path, _report(0), "audit").exit_code == 2
    assert "events_raw" in _cli(monkeypatch, tmp_path, _report(0), "audit", "--help").output
