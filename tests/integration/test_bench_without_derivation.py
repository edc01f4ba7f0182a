"""The bench's worker without derivation (``bench.without_derivation``) on the real embedded engine: the same
batch as the worker stores it, raw rows and all, with nothing derived; the worker's own derivation beside it."""

from __future__ import annotations

import pytest

from bench.without_derivation import derive_nothing
from bench.workload import events_for
from infra.clickhouse.client import Client
from schemas import TopicNames
from streams.derive import DeriveConfig, Deriver, store_and_derive
from streams.records import Accepted
from streams.sink_clickhouse import ClickHouseSink, InsertGate
from streams.state import OwnerState
from tests.support.events import accept_all

pytestmark = pytest.mark.integration
TOPICS = TopicNames("baretest")
DERIVED = ("trajectories", "m_window_metrics", "consumptions", "alerts")


def _batch() -> list[Accepted]:
    return accept_all(events_for(3_000, run_id="bare"), TOPICS)


def _store(engine: Client, database: str, batch: list[Accepted]) -> dict[str, int]:
    """One batch the worker's way (sink beside the derivation, through the gate); rows per table afterwards."""
    config = DeriveConfig()
    gate = InsertGate(engine)
    state = OwnerState(client=gate, database=database, window_s=config.window_s,
                       default_staleness_bound=config.default_staleness_bound)
    sink = ClickHouseSink(client=engine, database=database, state=state)
    deriver = Deriver(client=gate, database=database, config=config, state=state)
    written, derived = store_and_derive(sink, deriver, gate, batch, [])
    assert written.stored == len({i.event.event_id for i in batch})
    counts = {table: int(engine.query(f"SELECT count() FROM {database}.{table}").result_rows[0][0])
              for table in ("events_raw", *DERIVED)}
    counts["records sent"] = len(derived.records)
    return counts


def test_the_variant_stores_the_raw_rows_and_derives_nothing(engine: Client, database: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    batch = _batch()
    monkeypatch.setattr(Deriver, "derive", derive_nothing)  # what `python -m bench.without_derivation` does
    bare = _store(engine, database, batch)
    assert bare["events_raw"] == len({i.event.event_id for i in batch}) > 0
    assert {table: bare[table] for table in (*DERIVED, "records sent")} == dict.fromkeys((*DERIVED, "records sent"), 0)


def test_the_worker_derives_from_the_same_batch(engine: Client, database: str) -> None:
    # The other side of the comparison: the same batch through the worker's derivation writes every family.
    full = _store(engine, database, _batch())
    assert full["trajectories"] > 0 and full["m_window_metrics"] > 0 and full["records sent"] > 0
