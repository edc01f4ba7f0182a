"""The per-batch SQL probe's medians leave the first batch out; its window rows compare as the stored ones mean."""

from __future__ import annotations

from typing import Any

from bench.batch_sql_probe import (
    TEMP_PREFIX,
    Batch,
    ProbeResult,
    _normalised,
    _same,
    batch_assembly,
    records_insert,
    windows_select,
)
from streams import window_store


def _batch(derive_ms: float) -> Batch:
    return Batch(trajectories=10, derive=(derive_ms, derive_ms), steps={})


def test_median_leaves_the_first_batch_out() -> None:
    result = ProbeResult(events=40, batch_size=10, batches=[_batch(900), _batch(10), _batch(30), _batch(20)])
    assert result.median(lambda b: b.derive[0]) == 20


def test_median_of_one_batch_is_that_batch() -> None:
    result = ProbeResult(events=10, batch_size=10, batches=[_batch(900)])
    assert result.median(lambda b: b.derive[0]) == 900


def _window(**changed: Any) -> tuple[Any, ...]:
    """A window row in ``window_store.COLUMNS`` order (the version left out): zeros, empty families, ``changed``."""
    values: dict[str, Any] = {c: 0 for c in window_store.COLUMNS[:-1]}
    for family in window_store.FAMILIES:
        if isinstance(family, window_store.Multi):
            values.update({c: [] for c in family.columns()})
    values.update({"run_id": "r", "domain": "cad", "window_start": 60, "window_end": 120})
    values.update({k.replace("__", "."): v for k, v in changed.items()})
    return tuple(values[c] for c in window_store.COLUMNS[:-1])


def test_a_multi_row_family_compares_as_its_rows_in_any_order() -> None:
    python = _window(quality__policy_version=[1, 2], quality__decided=[6, 5], quality__passed=[2, 4])
    engine = _window(quality__policy_version=[2, 1], quality__decided=[5, 6], quality__passed=[4, 2])
    assert _same(_normalised(python), _normalised(engine))


def test_rows_paired_otherwise_differ() -> None:
    python = _window(quality__policy_version=[1, 2], quality__decided=[6, 5], quality__passed=[2, 4])
    engine = _window(quality__policy_version=[2, 1], quality__decided=[6, 5], quality__passed=[4, 2])
    assert not _same(_normalised(python), _normalised(engine))


def test_floats_agree_to_the_last_bits_only() -> None:
    assert _same(_normalised(_window(wait_s_p50=0.1 + 0.2)), _normalised(_window(wait_s_p50=0.3)))
    assert not _same(_normalised(_window(wait_s_p50=0.3)), _normalised(_window(wait_s_p50=0.3001)))
    assert not _same(_normalised(_window(wait_s_p50=None)), _normalised(_window(wait_s_p50=0.0)))


def test_a_window_python_did_not_store_differs() -> None:
    assert not _same(None, _normalised(_window()))


def test_window_rows_read_the_materialised_assembly_of_the_batch_windows_only() -> None:
    sql = windows_select(batch_assembly())
    assert "{dirty:Array(Tuple(String, Int64))}" in sql
    assert f"FROM {TEMP_PREFIX}traj" in sql and "FROM traj\n" not in sql


def test_records_go_to_the_scratch_database_from_the_materialised_assembly_for_the_batch_only() -> None:
    sql = records_insert("probe_writes")
    assert "INSERT INTO `probe_writes`.trajectories\n" in sql and "INSERT INTO trajectories" not in sql
    assert f"FROM {TEMP_PREFIX}traj\nWHERE trajectory_id IN (SELECT arrayJoin({{batch:Array(String)}}))" in sql
