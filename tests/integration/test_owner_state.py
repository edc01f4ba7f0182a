"""The owner's caches change no number: derivation with them equals derivation that reads everything.

Real embedded engine in this process; the pipeline is the worker's (classify, sink, derive)
without Kafka. The reference reads every fact from ClickHouse on every batch (caches off, as
with a ClickHouse server); the others keep state between batches, with tiny limits (constant
eviction), forgotten state, failed writes and a crash between writes.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from infra.clickhouse.client import Client
from infra.clickhouse.migrate import migrate
from producers.scenario import load_scenario
from producers.simulator import generate
from schemas import PolicyVersionPublished, RunConfigured, TopicNames
from streams import state as state_module
from streams.derive import DeriveConfig, Deriver, store_and_derive
from streams.exceptions import SinkWriteError
from streams.records import Accepted
from streams.sink_clickhouse import ClickHouseSink, InsertGate
from streams.state import CacheLimits, Lru, OwnerState
from tests.support.events import accept_all

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
TOPICS = TopicNames("statetest")
VIEWS = ("v_effective_throughput", "v_env_failures", "v_domain_quality", "v_policy_lag", "v_timing",
         "v_interruptions", "v_budget", "v_snapshots", "v_verifier_integrity", "v_undecidable",
         "v_environment_versions", "v_trajectories", "v_alerts")
WHEN_COMPUTED = {"version", "first_fired_at", "updated_at"}


@cache
def _events() -> tuple[Accepted, ...]:
    """The demo scenario (duplicates, late deliveries, a regression, training batches) as accepted events."""
    return tuple(accept_all(generate(load_scenario(ROOT / "scenarios" / "default.yaml")), TOPICS))


@cache
def _trajectory_ids() -> frozenset[str]:
    return frozenset(str(i.event.trajectory_id) for i in _events() if getattr(i.event, "trajectory_id", None))


class _Pipeline:
    """The worker's: the raw events' insert runs beside the derivation, which calls ClickHouse through the gate."""

    def __init__(self, client: Any, database: str, limits: CacheLimits, *, sink_client: Any = None) -> None:
        config = DeriveConfig()
        self.gate = InsertGate(client)
        self.state = OwnerState(client=self.gate, database=database, window_s=config.window_s,
                                default_staleness_bound=config.default_staleness_bound, limits=limits)
        self.sink = ClickHouseSink(client=sink_client or client, database=database, state=self.state)
        self.deriver = Deriver(client=self.gate, database=database, config=config, state=self.state)

    def persist(self, batch: list[Accepted]) -> None:
        store_and_derive(self.sink, self.deriver, self.gate, batch, [])


def _batches(size: int) -> Iterator[list[Accepted]]:
    events = list(_events())
    for i in range(0, len(events), size):
        yield events[i:i + size]


def _fingerprint(engine: Client, database: str) -> dict[str, tuple[int, str]]:
    """Every view's rows (without the columns that say when a row was computed), as count and digest."""
    out = {}
    for view in VIEWS:
        result = engine.query(f"SELECT * FROM {database}.{view}")
        keep = [i for i, name in enumerate(result.column_names) if name not in WHEN_COMPUTED]
        rows = sorted(repr([round(v, 9) if isinstance(v, float) else v for v in (row[i] for i in keep)])
                      for row in result.result_rows)
        out[view] = (len(rows), hashlib.sha256("\n".join(rows).encode()).hexdigest())
    return out


@pytest.fixture(scope="module")
def reference(engine: Client) -> dict[str, tuple[int, str]]:
    """The views after the scenario went through a pipeline that keeps nothing between batches."""
    database = "t_state_reference"
    engine.command(f"DROP DATABASE IF EXISTS {database}")
    migrate(engine, database)
    pipeline = _Pipeline(engine, database, CacheLimits.disabled())
    for batch in _batches(1000):
        pipeline.persist(batch)
    assert pipeline.state.loads["events"] > 0  # it really read the stored events back
    found = _fingerprint(engine, database)
    assert found["v_alerts"][0] == 1 and found["v_trajectories"][0] > 5000
    return found


def test_cached_derivation_equals_reading_everything(engine: Client, database: str,
                                                     reference: dict[str, tuple[int, str]]) -> None:
    pipeline = _Pipeline(engine, database, CacheLimits())
    for batch in _batches(1000):
        pipeline.persist(batch)
    assert _fingerprint(engine, database) == reference
    # The run began under this owner: no trajectory's stored events were looked up on its first sight.
    assert pipeline.state.lookups_skipped == len(_trajectory_ids()) > 5000


def test_policy_events_join_the_cached_run_facts_without_reading_them_again(
        engine: Client, database: str, reference: dict[str, tuple[int, str]]) -> None:
    """The scenario publishes policy versions and configurations all along; a cached run reads its facts once."""
    policy = [i.event for i in _events() if isinstance(i.event, (PolicyVersionPublished, RunConfigured))]
    assert len({e.version for e in policy if isinstance(e, PolicyVersionPublished)}) > 3
    pipeline = _Pipeline(engine, database, CacheLimits())
    for batch in _batches(500):
        pipeline.persist(batch)
    assert pipeline.state.loads["run_facts"] == len({e.run_id for e in policy})
    assert _fingerprint(engine, database) == reference


def test_constant_eviction_and_forgetting_change_nothing(engine: Client, database: str,
                                                         reference: dict[str, tuple[int, str]]) -> None:
    pipeline = _Pipeline(engine, database, CacheLimits(trajectories=40, windows=3, runs=1))
    for n, batch in enumerate(_batches(700)):
        pipeline.persist(batch)
        if n % 4 == 3:
            pipeline.state.clear()
    assert _fingerprint(engine, database) == reference
    # Trajectories let go or forgotten are read again (their duplicates found there), new ones are not.
    assert pipeline.state.lookups_skipped == len(_trajectory_ids()) and pipeline.state.loads["events"] > 0


def test_a_restarted_owner_reads_the_stored_trajectory_ids_once_and_no_new_trajectory(
        engine: Client, database: str, reference: dict[str, tuple[int, str]]) -> None:
    """A worker restarted mid-run: its owner begins the run with the ids of the trajectories already stored
    (one streamed read of events_raw), reads the stored events of those it meets again, and looks up none
    of the trajectories first seen after the restart; the numbers are the reference's."""
    batches = list(_batches(1000))
    half = len(batches) // 2
    first = _Pipeline(engine, database, CacheLimits())
    for batch in batches[:half]:
        first.persist(batch)
    stored_rows = engine.query(f"SELECT count() FROM {database}.events_raw WHERE trajectory_id != ''").result_rows
    before = {str(i.event.trajectory_id) for b in batches[:half] for i in b if getattr(i.event, "trajectory_id", None)}
    later = {str(i.event.trajectory_id) for b in batches[half:] for i in b if getattr(i.event, "trajectory_id", None)}
    restarted = _Pipeline(engine, database, CacheLimits())
    for batch in batches[half:]:
        restarted.persist(batch)
    assert _fingerprint(engine, database) == reference
    assert restarted.state.loads["stored_trajectory_ids"] == stored_rows[0][0] > 0
    assert restarted.state.lookups_skipped == len(later - before) > 1000
    assert restarted.state.loads["events"] > 0  # trajectories that went on across the restart were read


def test_a_filter_that_starts_over_changes_nothing(engine: Client, database: str,
                                                    reference: dict[str, tuple[int, str]]) -> None:
    """A filter of 2,000 trajectories (the scenario has 6,000) with a 400-trajectory cache: it starts over
    between batches, where the run is begun again from its stored trajectories; they are more than half the
    filter, so from then on the run's trajectories are all read, as they must be."""
    pipeline = _Pipeline(engine, database, CacheLimits(trajectories=400, windows=3, runs=1))
    looked = pipeline.state.looked_up = state_module.LookedUp(capacity=2000)
    skipped_at_start_over = None
    for batch in _batches(700):
        pipeline.persist(batch)
        if looked.rotations and skipped_at_start_over is None:
            skipped_at_start_over = pipeline.state.lookups_skipped
    assert _fingerprint(engine, database) == reference
    assert looked.rotations == 1 and pipeline.state.loads["stored_trajectory_ids"] > 1000
    assert pipeline.state.lookups_skipped == skipped_at_start_over


def test_records_kept_from_trajectories_let_go_change_nothing_and_spare_reads(
        engine: Client, database: str, reference: dict[str, tuple[int, str]]) -> None:
    """A 400-trajectory cache (a batch names ~150) lets trajectories go all the time; the records kept
    from them are not read back, and the numbers are the reference's."""
    without = f"{database}_without"
    migrate(engine, without)
    reads = {}
    for db, records in ((database, 100_000), (without, 0)):
        pipeline = _Pipeline(engine, db, CacheLimits(trajectories=400, windows=3, runs=1, records=records))
        for batch in _batches(700):
            pipeline.persist(batch)
        assert _fingerprint(engine, db) == reference, db
        reads[records] = pipeline.state.loads["records"]
    assert reads[100_000] < reads[0] / 2, reads


def test_lookups_split_into_chunks_change_nothing(engine: Client, database: str, monkeypatch: pytest.MonkeyPatch,
                                                 reference: dict[str, tuple[int, str]]) -> None:
    """Each batch names ~1000 trajectories; with 300 ids per query every lookup is split."""
    monkeypatch.setattr(state_module, "IN_LIST_MAX", 300)
    queries: list[int] = []

    class Counting:
        def __getattr__(self, name: str) -> Any:
            return getattr(engine, name)

        def query(self, sql: str, *args: Any, **kwargs: Any) -> Any:
            ids = (kwargs.get("parameters") or {}).get("ids")
            if "trajectory_id IN {ids:Array(String)}" in sql and ids is not None:
                queries.append(len(ids))
            return engine.query(sql, *args, **kwargs)

    pipeline = _Pipeline(Counting(), database, CacheLimits.disabled())
    for batch in _batches(1000):
        pipeline.persist(batch)
    assert queries and max(queries) == 300
    assert _fingerprint(engine, database) == reference


class _SlowRawInserts:
    """A client whose inserts of raw events take 0.3 s longer, so the derivation runs while they go in."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def insert(self, table: str, *args: Any, **kwargs: Any) -> Any:
        if table == "events_raw_in":
            time.sleep(0.3)
        return self._client.insert(table, *args, **kwargs)


def test_a_slow_raw_insert_beside_the_derivation_changes_nothing(engine: Client, database: str,
                                                                reference: dict[str, tuple[int, str]]) -> None:
    """The derivation reads the run's policy facts from the stored raw events (on first use, and after a
    new version): it must wait for the batch's own raw events, however long their insert takes."""
    pipeline = _Pipeline(engine, database, CacheLimits(), sink_client=_SlowRawInserts(engine))
    for n, batch in enumerate(_batches(1000)):
        pipeline.persist(batch)
        if n % 3 == 2:
            pipeline.state.clear()  # facts forgotten: read again, while the next batch's insert is slow
    assert _fingerprint(engine, database) == reference


class _FailOnce:
    """A client whose ``insert`` into ``table`` fails once, after (``landed``) or before the rows are stored."""

    def __init__(self, client: Any, table: str, *, landed: bool) -> None:
        self._client = client
        self.table = table
        self.landed = landed
        self.armed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def insert(self, table: str, *args: Any, **kwargs: Any) -> Any:
        if self.armed and table == self.table:
            self.armed = False
            if self.landed:
                self._client.insert(table, *args, **kwargs)
            raise ConnectionError(f"lost the connection inserting into {table}")
        return self._client.insert(table, *args, **kwargs)


@pytest.mark.parametrize("table", ["events_raw_in", "m_window_metrics", "consumptions", "trajectories", "alerts"])
@pytest.mark.parametrize("landed", [False, True], ids=["failed", "landed-then-failed"])
def test_a_failed_write_retried_or_a_crash_replayed_changes_nothing(
        engine: Client, database: str, reference: dict[str, tuple[int, str]], table: str, landed: bool) -> None:
    failing = _FailOnce(engine, table, landed=landed)
    pipeline = _Pipeline(failing, database, CacheLimits())
    failures = 0
    for n, batch in enumerate(_batches(1000)):
        if n % 5 == 2:
            failing.armed = True  # until an insert into the table fails
        try:
            pipeline.persist(batch)
        except (ConnectionError, SinkWriteError):
            failures += 1
            if failures % 2:
                pipeline = _Pipeline(failing, database, CacheLimits())  # a crash: the next process starts empty
            pipeline.persist(batch)  # the retry, or the re-delivery after the crash
    assert failures > 0
    assert _fingerprint(engine, database) == reference


def test_lru_keeps_the_most_recently_used() -> None:
    lru: Lru[str, int] = Lru(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1  # a is now the most recent
    lru.put("c", 3)
    assert (lru.get("a"), lru.get("b"), lru.get("c")) == (1, None, 3)
    gone: list[tuple[str, int]] = []
    told: Lru[str, int] = Lru(1, lambda k, v: gone.append((k, v)))
    told.put("a", 1)
    told.put("b", 2)
    assert gone == [("a", 1)] and "b" in told and told.pop("b") == 2 and "b" not in told
    nothing: Lru[str, int] = Lru(0)
    nothing.put("a", 1)
    assert nothing.get("a") is None and len(nothing) == 0

