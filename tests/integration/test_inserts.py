"""Inserts through the Inserter: rows land, contexts are reused, an insert's rows are freed without the collector."""

from __future__ import annotations

import gc
import weakref
from datetime import UTC, datetime
from typing import Any

import pytest

from infra.clickhouse.client import Client
from infra.clickhouse.inserts import Inserter

COLUMNS = ("run_id", "trajectory_id", "batch_id", "trainer_version", "consumed_at")


def _rows(batch: str, n: int) -> list[list[Any]]:
    return [["run", f"t{i}", batch, 1, datetime(2026, 1, 1, tzinfo=UTC)] for i in range(n)]


def test_rows_land_and_the_context_is_reused(engine: Client, database: str) -> None:
    inserter = Inserter(engine, database)
    inserter.insert("consumptions", _rows("b1", 3), COLUMNS)
    inserter.insert("consumptions", _rows("b2", 2), COLUMNS)
    inserter.insert("consumptions", [], COLUMNS)  # nothing to do, no error
    count = engine.query(f"SELECT count(), uniqExact(batch_id) FROM {database}.consumptions").result_rows[0]
    assert tuple(count) == (5, 2)


def test_a_failed_insert_leaves_the_context_usable(engine: Client, database: str) -> None:
    inserter = Inserter(engine, database)
    with pytest.raises(Exception):  # noqa: B017 - the client's own error type for a bad value
        inserter.insert("consumptions", [["run", "t", "b", "not a number", None]], COLUMNS)
    inserter.insert("consumptions", _rows("b3", 1), COLUMNS)
    assert engine.query(f"SELECT count() FROM {database}.consumptions").result_rows[0][0] == 1


def test_an_inserts_rows_are_freed_by_reference_counting(engine: Client, database: str) -> None:
    """A new InsertContext per insert is a reference cycle that kept each batch's rows until a full collection."""
    inserter = Inserter(engine, database)

    class Rows(list[list[Any]]):
        """A list that can be weakly referenced."""

    gc.disable()
    try:
        first = Rows(_rows("b1", 100))
        gone = weakref.ref(first)
        inserter.insert("consumptions", first, COLUMNS)
        inserter.insert("consumptions", Rows(_rows("b2", 100)), COLUMNS)
        del first
        assert gone() is None
    finally:
        gc.enable()
