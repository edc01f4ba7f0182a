"""The audit end to end: the golden scenario through a real worker audits clean, and corrupted output is caught."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from infra.clickhouse.client import connect
from infra.clickhouse.reader import QueryResult, query
from producers.kafka import EventProducer
from producers.scenario import load_scenario
from producers.simulator import generate, publish
from rollout.commands import audit as audit_command
from rollout.settings import Settings
from streams.audit import AuditReport, QueryFn, audit_run
from streams.regression import RegressionConfig
from tests.support.worker import WorkerProcess, settings_env

pytestmark = pytest.mark.e2e

GOLDEN = Path(__file__).resolve().parents[2] / "scenarios" / "golden.yaml"


def _play_golden(settings: Settings, worker: WorkerProcess) -> None:
    events = list(generate(load_scenario(GOLDEN)))
    with EventProducer.from_settings(settings) as producer:
        report = publish(events, producer)
    worker.wait_consumed(report.published)


def _audit(query_fn: QueryFn, settings: Settings) -> AuditReport:
    return audit_run(
        query_fn, "golden",
        window_s=settings.metrics_window_seconds,
        verdict_timeout_s=settings.verdict_timeout_seconds,
        default_staleness_bound=settings.default_staleness_bound,
        regression=RegressionConfig(min_decided=settings.regression_min_decided,
                                    min_drop=settings.regression_min_drop, alpha=settings.regression_alpha),
    )


def _newest_window(client: Any, domain: str, condition: str = "1") -> dict[str, Any]:
    """The current row of the run's first window of ``domain`` (that meets ``condition``), by column."""
    result = client.query(
        f"SELECT * FROM m_window_metrics FINAL WHERE run_id = 'golden' AND domain = {{domain:String}} AND {condition} "
        "ORDER BY window_start LIMIT 1", parameters={"domain": domain})
    return dict(zip(result.column_names, result.result_rows[0], strict=True))


def _insert_window(client: Any, row: dict[str, Any]) -> None:
    client.insert("m_window_metrics", [list(row.values())], column_names=list(row))


def _epoch(value: datetime) -> int:
    return int((value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp())


def _cli(settings: Settings, *args: str) -> Any:
    app = typer.Typer(add_completion=False)
    audit_command.register(app)

    @app.callback()
    def _root() -> None:
        """Test root."""

    return CliRunner().invoke(app, ["audit", *args], env=settings_env(settings))


def test_golden_run_audits_without_differences(stack_settings: Settings, worker: WorkerProcess) -> None:
    _play_golden(stack_settings, worker)
    report = _audit(worker.query, stack_settings)
    assert report.raw_events == 4045
    assert [d.as_dict() for d in report.differences[:20]] == []
    counts = {f.family: (f.audit_rows, f.stream_rows, f.compared) for f in report.families}
    assert counts["trajectories"] == (1000, 1000, 1000)
    assert counts["alerts"] == (1, 1, 1)  # code regresses on policy version 5
    assert all(f.compared == f.audit_rows == f.stream_rows for f in report.families)

    result = _cli(stack_settings, "--run", "golden")
    assert result.exit_code == 0, result.output
    assert result.output.rstrip().endswith("audit: 0 differences")
    unknown = _cli(stack_settings, "--run", "no-such-run")
    assert unknown.exit_code == 2
    assert "unknown run 'no-such-run'" in unknown.output and "golden" in unknown.output


def test_audit_catches_corrupted_stream_output(stack_settings: Settings, worker: WorkerProcess) -> None:
    _play_golden(stack_settings, worker)
    assert worker.stop() == 0

    client = connect(stack_settings.clickhouse_url, database=stack_settings.clickhouse_database)
    try:
        run = {"run": "golden"}
        # 1. A bogus newer version of one window: its row copied whole, throughput's finished bumped.
        code = _newest_window(client, "code")
        start, finished = code["window_start"], code["finished"]
        _insert_window(client, {**code, "finished": finished + 1, "version": code["version"] + 1})
        # 2. One policy version's quality row of a math window gone from a newer version of the window.
        math_window = _newest_window(client, "math", "notEmpty(quality.policy_version)")
        math_start, policy_version = math_window["window_start"], math_window["quality.policy_version"][0]
        dropped = {c: v[1:] for c, v in math_window.items() if c.startswith("quality.")}
        _insert_window(client, {**math_window, **dropped, "version": math_window["version"] + 1})
        # 3. The firing alert marked resolved by a newer row.
        result = client.query("SELECT * FROM alerts WHERE run_id = {run:String} ORDER BY version DESC LIMIT 1",
                              parameters=run)
        alert = dict(zip(result.column_names, result.result_rows[0], strict=True))
        alert.update(state="resolved", version=alert["version"] + 1)
        client.insert("alerts", [list(alert.values())], column_names=list(alert))
    finally:
        client.close()

    def read(sql: str, parameters: dict[str, Any]) -> QueryResult:
        return query(stack_settings, sql, parameters)

    report = _audit(read, stack_settings)
    start_s, math_s = _epoch(start), _epoch(math_start)
    found = {(d.family, d.key, d.kind, d.column, d.stream, d.audit) for d in report.differences}
    assert found == {
        ("throughput", (("domain", "code"), ("window_start", start_s)), "value", "finished", finished + 1,
         finished),
        ("domain_quality", (("domain", "math"), ("window_start", math_s), ("policy_version", policy_version)),
         "missing_in_stream", "", None, None),
        ("alerts", (("domain", "code"), ("policy_version", 5)), "missing_in_stream", "", None, None),
    }
    assert report.total == 3

    result = _cli(stack_settings, "--run", "golden")
    assert result.exit_code == 1, result.output
    assert "finished: stream" in result.output
    assert result.output.rstrip().endswith("audit: 3 differences")
