"""The per-batch SQL probe: the audit's assembly on a batch's trajectories gives the records the worker stored, and on
the trajectories of the windows the batch touched, the window rows it stored (written by the engine as the bulk replay
writes them)."""

from __future__ import annotations

from bench.batch_sql_probe import (
    BATCH_FILTER,
    DERIVATION,
    DERIVATION_PARTS,
    PART_FILTER,
    STEPS,
    TEMP_PREFIX,
    batch_assembly,
    report,
    run,
)
from infra.clickhouse.client import Client


def test_batch_assembly_replaces_the_part_filter() -> None:
    sql = batch_assembly()
    assert PART_FILTER not in sql and sql.count(BATCH_FILTER) == 1


def test_sql_records_of_each_batch_equal_the_python_derivation(engine: Client, database: str) -> None:
    previous = engine.database
    engine.database = database
    try:
        result = run(engine, database, 3_000, 1_000, progress=lambda _line: None)
        stored = int(engine.query(f"SELECT uniqExact(trajectory_id) FROM {database}.trajectories_latest FINAL "
                                  "WHERE status != 'superseded'").result_rows[0][0])
        windows = int(engine.query(f"SELECT count() FROM {database}.m_window_metrics FINAL").result_rows[0][0])
        left = engine.query(f"SELECT count() FROM system.tables WHERE database = '{database}' "
                            f"AND startsWith(name, '{TEMP_PREFIX}')").result_rows[0][0]
        scratch = engine.query(f"SELECT count() FROM system.databases WHERE name = '{database}_writes'"
                               ).result_rows[0][0]
    finally:
        engine.database = previous
    assert result.events == 3_000 and len(result.batches) == 3
    for batch in result.batches:
        # One record per trajectory of the batch, not of the run: the filter keeps the others out.
        assert 0 < batch.records == batch.trajectories < stored
        assert batch.differing == 0
        assert batch.derive[0] > 0 and all(batch.steps[step][0] > 0 for step in (*STEPS, DERIVATION, *DERIVATION_PARTS))
        # The windows the batch touched, not the run's; their trajectories include the batch's.
        assert 0 < batch.windows < windows and batch.window_trajectories >= batch.trajectories
        assert batch.windows_differing == 0
        assert batch.records_written == batch.records  # the engine wrote the batch's records, and only those
    assert left == 0 and scratch == 0  # the materialised assembly and the probe's own writes are dropped
    lines = report(result)
    assert lines[-2].startswith(f"records: {sum(b.records for b in result.batches):,} from SQL")
    assert " 0 differing" in lines[-2]
    assert lines[-1].startswith(f"window rows: {sum(b.windows for b in result.batches):,} from SQL")
    assert " 0 differing" in lines[-1]
