"""Play a scenario through the real broker, and read back every contract view for comparisons."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from producers.kafka import EventProducer
from producers.scenario import Scenario, load_scenario
from producers.simulator import PublishReport, generate, publish
from rollout.settings import Settings
from tests.support.worker import WorkerProcess

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios"

# Columns that say *when* something was computed, not *what*: left out of comparisons.
WALL_CLOCK_COLUMNS = {"first_fired_at", "updated_at"}
CONTRACT_VIEWS = (
    "v_effective_throughput", "v_env_failures", "v_domain_quality", "v_policy_lag", "v_timing",
    "v_interruptions", "v_budget", "v_snapshots", "v_verifier_integrity", "v_undecidable", "v_environment_versions",
    "v_alerts", "v_trajectories",
)


def scenario(name: str) -> Scenario:
    """A shipped scenario by file name (without .yaml)."""
    return load_scenario(SCENARIOS / f"{name}.yaml")


def play(settings: Settings, scenario_obj: Scenario) -> PublishReport:
    """Publish every event of the scenario with the SDK producer, as fast as possible."""
    with EventProducer.from_settings(settings) as producer:
        return publish(list(generate(scenario_obj)), producer)


def snapshot(worker: WorkerProcess, run_id: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every contract view's rows for a run, sorted, without wall-clock columns."""
    views: dict[str, list[tuple[Any, ...]]] = {}
    for view in CONTRACT_VIEWS:
        result = worker.query(f"SELECT * FROM {view} WHERE run_id = {{run:String}}", {"run": run_id})
        keep = [i for i, c in enumerate(result.columns) if c not in WALL_CLOCK_COLUMNS]
        rows = [tuple(_normal(row[i]) for i in keep) for row in result.rows]
        views[view] = sorted(rows, key=repr)
    return views


def _normal(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 9)
    if isinstance(value, list):
        return tuple(_normal(v) for v in value)
    return value


def audit_differences(worker: WorkerProcess, settings: Settings, run_id: str) -> list[str]:
    """Recompute every metric family of a run from raw events and list what differs from the stream."""
    from streams.audit import audit_run

    report = audit_run(worker.query, run_id, window_s=settings.metrics_window_seconds,
                       verdict_timeout_s=settings.verdict_timeout_seconds,
                       default_staleness_bound=settings.default_staleness_bound)
    return [d.describe() for d in report.differences]


def domain_totals(worker: WorkerProcess, run_id: str) -> dict[str, tuple[int, int, int, int]]:
    """finished, env_valid, decided, passed per domain of a run, from v_effective_throughput."""
    rows = worker.query(
        "SELECT domain, sum(finished), sum(env_valid), sum(decided), sum(passed) FROM v_effective_throughput "
        "WHERE run_id = {run:String} GROUP BY domain", {"run": run_id}).rows
    return {str(d): (int(f), int(v), int(c), int(p)) for d, f, v, c, p in rows}


def expected_totals(scenario_obj: Scenario) -> dict[str, tuple[int, int, int, int]]:
    """The same totals by arithmetic from an exact-allocation scenario."""
    from producers.simulator import expected_counts

    domains = expected_counts(scenario_obj)["domains"]
    return {d: (int(c["finished"]), int(c["env_valid"]), int(c["decided"]), int(c["passed"]))
            for d, c in domains.items()}
