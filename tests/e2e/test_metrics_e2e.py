"""Simulator -> Kafka -> worker -> ClickHouse: the stored metrics are exactly what the scenario implies."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from producers.simulator import expected_counts
from rollout.settings import Settings
from tests.support.play import play, scenario, snapshot
from tests.support.worker import WorkerProcess, free_port

pytestmark = pytest.mark.e2e


def _wait_derived(worker: WorkerProcess, published: int, timeout: float = 180.0) -> None:
    worker.wait_consumed(published, timeout=timeout)


def _totals(worker: WorkerProcess, run_id: str) -> dict[str, dict[str, int]]:
    result = worker.query(
        "SELECT domain, sum(finished), sum(env_valid), sum(decided), sum(passed), sum(model_errors) "
        "FROM v_effective_throughput WHERE run_id = {run:String} GROUP BY domain",
        {"run": run_id},
    )
    names = ("finished", "env_valid", "decided", "passed", "model_errors")
    return {str(row[0]): dict(zip(names, map(int, row[1:]), strict=True)) for row in result.rows}


# Both ways of reading the raw topics (ROLLOUT_INGEST): direct is the default, the Faust agent the alternative.
@pytest.mark.parametrize("stack_settings", ["direct", "faust"], indirect=True)
def test_golden_scenario_counts_follow_from_the_scenario(stack_settings: Settings, worker: WorkerProcess) -> None:
    golden = scenario("golden")
    report = play(stack_settings, golden)
    _wait_derived(worker, report.published)
    expected = expected_counts(golden)["domains"]

    totals = _totals(worker, golden.run_id)
    assert set(totals) == set(expected)
    for domain, want in expected.items():
        got = totals[domain]
        assert got["finished"] == want["finished"], domain
        assert got["env_valid"] == want["env_valid"], domain
        assert got["decided"] == want["decided"], domain
        assert got["passed"] == want["passed"], domain
        assert got["model_errors"] == want["model_errors"], domain

    # Rates over the whole run, to 1e-9, from the same arithmetic.
    rates = worker.query(
        "SELECT domain, sum(env_valid) / sum(finished), sum(decided) / sum(env_valid) FROM v_effective_throughput "
        "WHERE run_id = {run:String} GROUP BY domain", {"run": golden.run_id}).rows
    for domain, validity, decidable in rates:
        want = expected[domain]
        assert validity == pytest.approx(want["env_valid"] / want["finished"], abs=1e-9)
        assert decidable == pytest.approx(want["decided"] / want["env_valid"], abs=1e-9)

    failures = worker.query(
        "SELECT domain, failure_class, sum(failures) FROM v_env_failures "
        "WHERE run_id = {run:String} AND origin = 'environment' GROUP BY domain, failure_class",
        {"run": golden.run_id}).rows
    by_class = {(d, c): int(n) for d, c, n in failures}
    assert by_class == {(d, c): n for d, want in expected.items() for c, n in want["env_failures"].items() if n}

    quality = worker.query(
        "SELECT domain, policy_version, sum(decided), sum(passed) FROM v_domain_quality "
        "WHERE run_id = {run:String} GROUP BY domain, policy_version", {"run": golden.run_id}).rows
    got_versions = {(d, int(v)): (int(n), int(p)) for d, v, n, p in quality}
    want_versions = {(d, int(v)): (c["decided"], c["passed"])
                     for d, want in expected.items() for v, c in want["by_version"].items() if c["decided"]}
    assert got_versions == want_versions


def test_replaying_the_same_scenario_leaves_every_count_unchanged(stack_settings: Settings,
                                                                  worker: WorkerProcess) -> None:
    golden = scenario("golden")
    first = play(stack_settings, golden)
    _wait_derived(worker, first.published)
    before = snapshot(worker, golden.run_id)
    stored = worker.scalar("SELECT count() FROM events_raw")

    second = play(stack_settings, golden)
    _wait_derived(worker, first.published + second.published)
    assert worker.scalar("SELECT count() FROM events_raw") == stored
    assert snapshot(worker, golden.run_id) == before


def test_regression_scenario_raises_exactly_its_alert(stack_settings: Settings, worker: WorkerProcess) -> None:
    regression = scenario("regression")
    report = play(stack_settings, regression)
    _wait_derived(worker, report.published)
    alerts = worker.query(
        "SELECT domain, policy_version, state, overall_rose, p_value FROM v_alerts WHERE run_id = {run:String}",
        {"run": regression.run_id}).rows
    firing = [(d, int(v)) for d, v, state, _, _ in alerts if state == "firing"]
    assert len(firing) == 1, alerts
    assert all(p < stack_settings.regression_alpha for *_, p in alerts)
    assert bool(alerts[0][3]) is True, "the run's overall pass rate rose while this domain dropped"


def test_healthy_scenario_raises_no_alert(stack_settings: Settings, worker: WorkerProcess) -> None:
    healthy = scenario("healthy")
    report = play(stack_settings, healthy)
    _wait_derived(worker, report.published)
    assert worker.scalar("SELECT count() FROM v_trajectories WHERE run_id = {run:String}",
                         {"run": healthy.run_id}) > 0
    assert worker.query("SELECT * FROM v_alerts WHERE run_id = {run:String}", {"run": healthy.run_id}).rows == []


def test_results_do_not_depend_on_batching(stack_settings: Settings, worker: WorkerProcess, tmp_path: Path) -> None:
    default = scenario("default")
    report = play(stack_settings, default)
    _wait_derived(worker, report.published, timeout=300)
    big_batches = snapshot(worker, default.run_id)
    worker.stop()

    # The same Kafka log consumed again by a second, independent stack with tiny batches.
    other = Settings(**{
        **stack_settings.model_dump(),
        "data_dir": tmp_path / "other",
        "consumer_group": f"other-{stack_settings.consumer_group}",
        "worker_web_port": free_port(),
        "sink_batch_size": 250,
        "sink_batch_seconds": 0.05,
    })
    second = WorkerProcess(other, tmp_path / "other-worker.log").start()
    try:
        second.wait_consumed(report.published, timeout=600)
        deadline = time.monotonic() + 30
        while snapshot(second, default.run_id) != big_batches and time.monotonic() < deadline:
            time.sleep(1)
        small_batches = snapshot(second, default.run_id)
    finally:
        second.stop()
    for view, rows in big_batches.items():
        assert small_batches[view] == rows, view
