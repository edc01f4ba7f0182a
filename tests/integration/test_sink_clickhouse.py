"""The ClickHouse sink and migrations on the real embedded engine (in this test process)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from bench.workload import events_for
from infra.clickhouse.client import Client
from infra.clickhouse.migrate import MigrationError, load_migrations, migrate
from schemas import TopicNames, encode_event
from streams.records import RAW_COLUMNS, Accepted, DeadLetter, SourceRef, classify, raw_row
from streams.sink_clickhouse import ClickHouseSink
from tests.support.events import queued

pytestmark = pytest.mark.integration
TOPICS = TopicNames("sinktest")


def _accepted(i: int, offset: int | None = None) -> Accepted:
    item = classify(encode_event(queued(i)), b"k", SourceRef(TOPICS.sandbox, 0, offset if offset is not None else i),
                    TOPICS)
    assert isinstance(item, Accepted)
    return item


def test_rewriting_a_batch_adds_no_rows(engine: Client, database: str) -> None:
    sink = ClickHouseSink(client=engine, database=database)
    batch = [_accepted(i) for i in range(1000)]
    first = sink.write(batch, [])
    assert (first.stored, first.duplicates) == (1000, 0)
    # Re-delivery after a crash, cut into other batches and mixed with new events.
    again = sink.write(batch[500:] + [_accepted(i) for i in range(1000, 1100)], [])
    assert (again.stored, again.duplicates) == (100, 500)
    rows = engine.query(f"SELECT count(), uniqExact(event_id) FROM {database}.events_raw").result_rows
    assert rows == [(1100, 1100)]


def test_the_engine_derives_every_raw_column_as_the_event_says(engine: Client, database: str) -> None:
    # Every event type of the scenario: sandbox, verifier, policy and trainer events, with and without
    # trajectory and domain. The sink sends payload and position; the view of migration 0007 writes the row.
    ingested = datetime(2026, 5, 1, 12, 0, 0, 123000, tzinfo=UTC)
    sink = ClickHouseSink(client=engine, database=database, clock=lambda: ingested)
    events = events_for(3000, run_id="derived-columns", faults=False)
    batch = []
    for offset, event in enumerate(events):
        item = classify(encode_event(event), b"k", SourceRef(TOPICS.for_event_type(event.event_type), offset % 3,
                                                                 offset), TOPICS, now=datetime(2100, 1, 1, tzinfo=UTC))
        assert isinstance(item, Accepted)
        batch.append(item)
    assert len({type(item.event) for item in batch}) >= 8
    assert sink.write(batch, []).stored == len(batch)
    stored = engine.query(f"SELECT {', '.join(RAW_COLUMNS)} FROM {database}.events_raw").result_rows
    assert len(stored) == len(batch)
    assert sorted(map(_comparable, stored)) == sorted(_comparable(raw_row(item, ingested)) for item in batch)


def _comparable(row: Sequence[Any]) -> tuple[Any, ...]:
    """A row with its times as naive UTC (the client reads DateTime64 columns without their zone)."""
    return tuple(v.astimezone(UTC).replace(tzinfo=None) if isinstance(v, datetime) and v.tzinfo else v
                 for v in (str(row[0]), *row[1:]))


def test_duplicates_inside_one_batch_are_stored_once(engine: Client, database: str) -> None:
    sink = ClickHouseSink(client=engine, database=database)
    result = sink.write([_accepted(1), _accepted(1, offset=7), _accepted(2)], [])
    assert (result.stored, result.duplicates) == (2, 1)


def test_dead_letters_are_stored_once_per_source_position(engine: Client, database: str) -> None:
    sink = ClickHouseSink(client=engine, database=database)
    letter = classify(b"{oops", b"k", SourceRef(TOPICS.sandbox, 2, 41), TOPICS)
    assert isinstance(letter, DeadLetter)
    assert sink.write([], [letter, letter]).dead_lettered == 1
    assert sink.write([], [letter]).dead_lettered == 0
    rows = engine.query(f"SELECT reason, source_partition, source_offset, raw_bytes FROM {database}.dead_letters"
                        ).result_rows
    assert rows == [("invalid_json", 2, 41, 5)]


def test_migrations_are_recorded_and_applied_once(engine: Client, database: str) -> None:
    assert migrate(engine, database) == []
    recorded = engine.query(f"SELECT version FROM {database}.schema_migrations ORDER BY version").result_rows
    assert [v for (v,) in recorded] == [m.version for m in load_migrations()]


def test_an_edited_applied_migration_is_refused(engine: Client, database: str) -> None:
    engine.command(f"ALTER TABLE {database}.schema_migrations UPDATE checksum = 'x' WHERE version = 1 "
                   "SETTINGS mutations_sync = 1")
    with pytest.raises(MigrationError, match="changed after it was applied"):
        migrate(engine, database)


def test_upgrading_to_one_parse_per_event_keeps_rows_and_writes_each_once(
    engine: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A database as the worker left it before migration 0007 (0005's view: one JSONExtract per column).
    database = f"t_upgrade_{uuid.uuid4().hex[:8]}"
    everything = load_migrations()
    monkeypatch.setattr("infra.clickhouse.migrate.load_migrations", lambda: [m for m in everything if m.version < 7])
    migrate(engine, database)
    sink = ClickHouseSink(client=engine, database=database)
    before = [_accepted(i) for i in range(300)]
    assert sink.write(before, []).stored == 300
    monkeypatch.setattr("infra.clickhouse.migrate.load_migrations", lambda: everything)

    assert [m.version for m in migrate(engine, database)] == [m.version for m in everything if m.version >= 7]

    views = engine.query("SELECT name FROM system.tables WHERE database = {db:String} AND engine = 'MaterializedView' "
                         "AND position(create_table_query, '.events_raw_in') > 0", parameters={"db": database}
                         ).result_rows
    assert [v for (v,) in views] == ["events_raw_from_payload"]
    after = [_accepted(i) for i in range(300, 500)]
    assert sink.write(after, []).stored == 200
    stored = engine.query(f"SELECT {', '.join(RAW_COLUMNS)} FROM {database}.events_raw").result_rows
    ingested = {str(row[0]): row[-1] for row in stored}
    expected = [raw_row(item, ingested[str(item.event.event_id)]) for item in before + after]
    assert sorted(map(_comparable, stored)) == sorted(map(_comparable, expected))  # 500 rows: none twice
