"""Bulk replay: rebuild a database from the raw topics, raw rows first, then every derived table in SQL.

The live worker derives batch by batch in Python (``streams.derive``), about 17,000 events/s on one
core. Rebuilding from a whole log does not need that: once every raw event is stored, each run's
trajectories, consumptions, metric windows and alerts are a function of its raw events, and
``streams/audit_sql`` already computes them in SQL. A replay therefore

1. reads every raw topic from its first offset to the end it had when the replay started,
   validates each message as the worker does (``streams.records.classify``; part of each batch in a
   helper process), drops events already stored or read before (by event id), and inserts the rest
   into ``events_raw_in`` in large batches, on a thread beside the validation; malformed messages go
   to ``dead_letters``;
2. for every run the log holds, materialises the audit's assembly once (the parsed events, their fold
   per trajectory, the run's configuration, its trajectories, its consumptions) into tables of the
   engine (in memory, or on disk for runs of more than ``IN_MEMORY_MAX_EVENTS`` events or when told), and
   from them writes
   ``trajectories``, ``consumptions`` and the metric windows (``m_window_metrics``, one row per window,
   every audit family joined to it: ``window_metrics_select``) with ``INSERT ... SELECT``, and the firing
   regression alerts (``streams.regression`` on the run's per-version counts).

The result equals what a worker that read the same log gives (``bench.pipeline`` compares every
``v_*`` view of the two, ``tests/integration/test_replay.py`` too). What it does not do: publish the
derived topics (trajectory records, alerts) or dead letters to Kafka again, or write an alert that
fired and resolved while a live worker was still reading (only the end state). A run that already
has derived rows in the database is refused: replay into another database.

With ``hand_off`` (``rollout replay --hand-off``) the replay ends by committing the worker's consumer
group at the offsets it read to, so a worker started on the rebuilt database goes on from there
instead of reading the whole log again: a backlog caught up at the replay's rate, then the live
path (``tests/integration/test_replay_hand_off.py`` holds the result to a replay of the whole log).
"""

from __future__ import annotations

import gc
import logging
import math
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from infra.clickhouse.client import join_settings
from infra.clickhouse.inserts import Inserter
from infra.clickhouse.reader import run_read
from rollout.errors import ConfigurationError, PermanentError, ServiceUnavailable
from rollout.settings import Settings
from schemas import TopicNames
from streams import window_store
from streams.audit import FAMILIES, audit_file, audit_params, audit_sql, regression_alerts
from streams.derive import ALERT_COLUMNS, DeriveConfig, alert_row
from streams.event_ids import EventIdSet, packed_from_row_binary
from streams.records import RAW_INPUT_COLUMNS, Accepted, DeadLetter, SourceRef, classify, ingestion_ms
from streams.sink_clickhouse import ClickHouseSink

REPLAY_SQL = Path(__file__).with_name("replay_sql")
_librdkafka_log = logging.getLogger(f"{__name__}.librdkafka")
"""librdkafka's own log lines (connection failures, say) go through logging, not straight to stderr."""
READ_BATCH = 50_000
"""Messages validated and inserted at a time (the live worker's batches are 10,000)."""
ASSEMBLY_STEPS = {"raw": "parsed the raw events", "folded": "folded them per trajectory",
                  "config": "read the run's configuration", "traj": "assembled the trajectory records",
                  "consumed": "read the consumptions", "consumption": "matched consumptions to trajectories"}
"""Each expression of ASSEMBLED, and how the progress names its step."""
ASSEMBLED = tuple(ASSEMBLY_STEPS)
"""The assembly's expressions (``streams/audit_sql/assembly.sql``) materialised once per run, in this order (each
reads the ones before): without them every family would assemble the run's trajectories again. The raw events
parsed, then folded per trajectory, as tables of their own: 1,000,000 events 1.3 + 1.6 s, against 5.6-7.2 s for
the trajectories straight from ``events_raw`` (the parse and the fold in one query)."""
MATERIALISED = {"raw": "SELECT * REPLACE (if(tid = '', payload, '') AS payload) FROM raw"}
"""What a materialised expression holds when not all of it (``SELECT * FROM <name>``): of the raw events, only
those without a trajectory keep their payload (policy and trainer events: the versions, the configuration,
the consumed trajectories); the trajectory events' fields are in the parsed tuple."""
IN_MEMORY = "Memory"
ON_DISK = "MergeTree ORDER BY tuple()"
"""Engines of the materialised assembly. A 1,000,000-event run's tables take ~730 MB in memory (the process's
RSS rose by ~1.3 GB while they were built), ~250 MB compressed on disk; the assembly 2.9-3.2 against 4.5 s."""
IN_MEMORY_MAX_EVENTS = 2_000_000
"""The largest run (stored raw events) assembled in memory when the replay chooses (``choose_engine``); a larger
one is assembled on disk, where its tables do not take memory (in memory, a 10,000,000-event run's tables alone
would take ~7 GB). A 3,000,000-event run on disk, folded in parts (PARTED), peaked at 2.2 GB of RSS."""
PARTED = ("raw", "folded")
"""The expressions materialised part by part on a large run (``trajectory_parts``): parsing the raw events and folding
them per trajectory hold every trajectory's aggregation state at once. A 3,000,000-event run folded in one query
took 12.2 s and raised the RSS by 2.1 GB; in three parts by trajectory id 2.9 + 2.7 + 2.7 s without raising it
(the filter on the grouping key reaches the GROUP BY); the same rows."""
PART_EVENTS = 1_000_000
"""Raw events per part of ``trajectory_parts`` (the replay target's log is one part)."""
WHOLE_RUN: tuple[tuple[str, str], ...] = (("", ""),)
"""One part: every trajectory of the run."""
TEMP_PREFIX = "replay_tmp_"
"""Name prefix of the tables a run's rebuild creates (and drops) in the target database."""

WINDOW_FAMILIES: dict[str, str] = {
    "throughput": "m_throughput", "timing": "m_timing", "budget": "m_budget", "snapshots": "m_snapshots",
    "env_failures": "m_env_failures", "domain_quality": "m_domain_quality",
    "policy_lag_finish": "m_policy_lag", "policy_lag_consumption": "m_policy_lag",
    "interruptions": "m_interruptions", "verifier_integrity": "m_verifier_integrity",
    "undecidable": "m_undecidable", "environment_versions": "m_environment_versions",
}
"""Which family of ``m_window_metrics`` (``streams.window_store.FAMILIES``) each audit family fills."""

Progress = Callable[[str], None]


@contextmanager
def no_insert_merge(client: Any) -> Iterator[None]:
    """The client's inserts without ``optimize_on_insert`` while inside (the previous value restored after).

    The replay writes each sorting key once per table (raw events deduplicated by id, one record per
    trajectory, one row per window or consumption), so merging an inserted block by its ReplacingMergeTree
    key finds nothing to merge, but costs the sort and merge: 214,075 trajectory records into
    ``trajectories`` (and its materialized view) 2.6-2.9 s with it, 0.7-0.9 s without.
    """
    previous = client.get_client_setting("optimize_on_insert")
    client.set_client_setting("optimize_on_insert", 0)
    try:
        yield
    finally:
        client.set_client_setting("optimize_on_insert", previous if previous is not None else 1)


def on_assembled(sql: str, prefix: str = TEMP_PREFIX) -> str:
    """``sql`` reading the materialised assembly (``<prefix><name>``) instead of recomputing it."""
    for name in ASSEMBLED:
        sql = re.sub(rf"\bFROM {name}\b", f"FROM {prefix}{name}", sql)
    return sql


@cache
def replay_sql(name: str) -> str:
    """The text of one of the replay's SQL files (``streams/replay_sql/<name>``)."""
    return (REPLAY_SQL / name).read_text()


# -- phase 1: raw rows ----------------------------------------------------------------------------


@dataclass
class LoadResult:
    """What reading the raw topics stored."""

    messages: int = 0
    stored: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    runs: set[str] = field(default_factory=set)
    seconds: float = 0.0


Valid = tuple[bytes, str, str, str, int, int]
"""A validated event as the load keeps it: (event id's 16 bytes, run id, canonical payload, topic, partition,
offset). Plain values, so a helper process hands them back cheaply (pickling the event objects costs more
than validating them)."""

Raw = tuple[bytes | None, bytes | None, str, int, int]
"""A message as the load validates it: (value, key, topic, partition, offset)."""


def validate(messages: Sequence[Raw], prefix: str, now: datetime) -> tuple[list[Valid], list[DeadLetter]]:
    """Validate messages as the worker does (``streams.records.classify``): the valid events and the dead letters."""
    topics = TopicNames(prefix)
    valid: list[Valid] = []
    dead: list[DeadLetter] = []
    for value, key, topic, partition, offset in messages:
        item = classify(value, key, SourceRef(topic, partition, offset), topics, now=now)
        if isinstance(item, Accepted):
            valid.append((item.event.event_id.bytes, item.event.run_id, item.payload, topic, partition, offset))
        else:
            dead.append(item)
    return valid, dead


STORED_IDS_CHUNK = 16 << 20
"""Bytes of stored event ids read at a time when a replay loads a run's ids (1,048,576 ids)."""


class StoredIds:
    """Event ids already stored or read in this replay, loaded per run on first sight (``EventIdSet``: ~16 bytes
    per id, where a Python set of them took ~75)."""

    def __init__(self, client: Any, database: str) -> None:
        self._client = client
        self._db = database
        self._seen = EventIdSet()
        self._runs: set[str] = set()

    def fresh(self, items: list[Valid]) -> list[Valid]:
        """The items whose event was neither stored before nor read earlier in this replay (first one kept).

        Raises DerivedRowsExist on the first sight of a run that has derived rows (before any of its events
        is stored)."""
        for run_id in sorted({item[1] for item in items} - self._runs):
            check_no_derived(self._client, self._db, run_id)
            self._load(run_id)
            self._runs.add(run_id)
        new = self._seen.add_new([item[0] for item in items])
        return [item for item, is_new in zip(items, new, strict=True) if is_new]

    def _load(self, run_id: str) -> None:
        """The run's stored ids into the set, read as RowBinary in chunks of STORED_IDS_CHUNK bytes: no Python
        object per id (10,000,000 ids: 5.7 s and +118 MiB of peak RSS; as UUID rows 36.5 s and +2,939 MiB)."""
        with self._client.raw_stream(f"SELECT event_id FROM `{self._db}`.events_raw WHERE run_id = {{run:String}} "
                                     "FORMAT RowBinary", parameters={"run": run_id}) as stream:
            rest = b""
            while chunk := stream.read(STORED_IDS_CHUNK):
                data = rest + chunk
                whole = len(data) // 16 * 16  # a read may end inside an id
                self._seen.add_packed(packed_from_row_binary(data[:whole]))
                rest = data[whole:]
            if rest:
                raise PermanentError(f"run {run_id}: the stored event ids read back ended inside an id "
                                     f"({len(rest)} bytes left)")


def log_end(consumer: Consumer, topics: Sequence[str], timeout: float = 10.0) -> list[TopicPartition]:
    """Every partition of ``topics`` that holds messages, at its first offset; ``.offset`` is set to its end."""
    try:
        metadata = consumer.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise ServiceUnavailable(f"Kafka did not answer ({exc}); start it (rollout infra up) or check "
                                 "KAFKA_BOOTSTRAP_SERVERS") from exc
    ends: list[TopicPartition] = []
    for topic in topics:
        described = metadata.topics.get(topic)
        if described is None or described.error is not None:
            continue  # a topic nobody wrote to yet: nothing to replay from it
        for partition in sorted(described.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout)
            if high > low:
                ends.append(TopicPartition(topic, partition, high))
    return ends


def read_log(consumer: Consumer, ends: Sequence[TopicPartition], batch: int) -> Iterator[list[Raw]]:
    """Batches of up to ``batch`` messages (as Raw tuples) from the first offset of each partition up to its end
    in ``ends``."""
    remaining = {(tp.topic, tp.partition): tp.offset for tp in ends}
    consumer.assign([TopicPartition(tp.topic, tp.partition, OFFSET_BEGINNING) for tp in ends])
    pending: list[Raw] = []
    idle_since = time.monotonic()
    while remaining:
        messages = consumer.consume(num_messages=min(batch, 10_000), timeout=0.5)
        if not messages and time.monotonic() - idle_since > 60:
            raise ServiceUnavailable(f"Kafka returned nothing for 60 s with {len(remaining)} partitions not read to "
                                     "their end; check the broker (rollout infra status)")
        append = pending.append
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise ServiceUnavailable(f"reading {message.topic()}[{message.partition()}] failed: {error}")
            # One pass over the message's accessors (each is a C call, but a million of them add up on the
            # thread that also validates).
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            end = remaining.get((topic, partition))  # type: ignore[arg-type]
            if end is None or offset >= end:  # type: ignore[operator]
                continue  # written after the replay started: the next replay or the live worker takes it
            append((message.value(), message.key(), topic, partition, offset))  # type: ignore[arg-type]
        # A partition is read once the consumer's position reaches its end (a message at end - 1 need not exist:
        # a transaction marker, say, takes an offset of its own).
        for tp in consumer.position([TopicPartition(t, p) for t, p in remaining]):
            if tp.offset >= remaining[(tp.topic, tp.partition)]:
                del remaining[(tp.topic, tp.partition)]
        if messages:
            idle_since = time.monotonic()
        if len(pending) >= batch or (pending and not remaining):
            yield pending
            pending = []
    if pending:
        yield pending


HELPER_SHARE = 0.42
"""Share of each batch validated by the helper process (the rest on the reading thread, at the same time).

Measured, not derived (the reading thread also pickles the helper's share, and the helper shares the second
core with the engine's inserts): 1,000,000-event replays from Kafka, alternated (``bench.bulk_replay``): 0.6
against 0.5 19.8 / 20.3 / 20.0 s against 18.7 / 19.1 / 19.9 s; 0.42 against 0.5 20.1 / 19.7 / 20.1 s against
20.7 / 19.8 / 21.0 s. Since the next batch's share is queued before the current one is validated (the helper no
longer waits while this thread reads and stores), 0.5 and 0.42 measure the same: 16.8 / 16.9 / 17.0 against
16.8 / 16.6 / 17.1 s."""


def _helper_init() -> None:
    # A helper keeps nothing between batches: collections of its young objects only (nothing is frozen).
    gc.set_threshold(50_000, 1_000, 1_000)


def load(client: Any, database: str, batches: Iterator[list[Raw]], topics: TopicNames, *,
         progress: Progress = lambda _: None, total: int = 0, helper: bool = True) -> LoadResult:
    """Phase 1: validate, deduplicate and store each batch of messages.

    With ``helper``, a process of its own validates part of each batch while this thread validates the
    rest (validation is Python, and the interpreter lock gives one thread one core); each batch's insert
    runs on a thread of its own while the next batch is validated (the engine's part runs without the lock).
    """
    inserter = Inserter(client, database)
    sink = ClickHouseSink(client=client, database=database)
    stored = StoredIds(client, database)
    result = LoadResult()
    began = time.perf_counter()
    step = max(total // 10, 1)
    next_report = step
    pending: Future[None] | None = None
    with ExitStack() as stack:
        stack.enter_context(no_insert_merge(client))
        executor = stack.enter_context(ThreadPoolExecutor(max_workers=1, thread_name_prefix="replay-insert"))
        helpers = (stack.enter_context(ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn"),
                                                           initializer=_helper_init)) if helper else None)
        def take() -> tuple[list[Raw], int, Future[tuple[list[Valid], list[DeadLetter]]] | None, datetime] | None:
            """The next batch, its helper's share already handed over: (messages, split, helper's result, now)."""
            raw = next(batches, None)
            if raw is None:
                return None
            now = datetime.now(UTC)
            split = len(raw) - int(len(raw) * HELPER_SHARE) if helpers is not None else len(raw)
            theirs = helpers.submit(validate, raw[split:], topics.prefix, now) if helpers is not None else None
            return raw, split, theirs, now

        current = take()
        while current is not None:
            # The next batch is read, and its share queued for the helper, before this one is validated: the helper
            # goes from one share to the next instead of waiting while this thread reads and stores.
            following = take()
            raw, split, theirs, now = current
            current = following
            valid, dead = validate(raw[:split], topics.prefix, now)
            if theirs is not None:
                more_valid, more_dead = theirs.result()
                valid += more_valid
                dead += more_dead
            fresh = stored.fresh(valid)
            # RAW_INPUT_COLUMNS: payload, source topic, partition, offset, ingestion time.
            ingested = ingestion_ms(now)
            rows = [[payload, topic, partition, offset, ingested] for _, _, payload, topic, partition, offset in fresh]
            if pending is not None:
                pending.result()
            pending = executor.submit(inserter.insert, "events_raw_in", rows, RAW_INPUT_COLUMNS)
            if dead:
                # The sink's own path: deduplicated by source position against what is stored, then inserted.
                result.dead_lettered += sink.write([], dead).dead_lettered
            result.messages += len(raw)
            result.stored += len(fresh)
            result.duplicates += len(valid) - len(fresh)
            result.runs.update(item[1] for item in valid)
            if result.messages >= next_report:
                progress(f"read {result.messages:,}{f' / {total:,}' if total else ''} messages "
                         f"({result.messages / (time.perf_counter() - began):,.0f}/s)")
                while next_report <= result.messages:
                    next_report += step
        if pending is not None:
            pending.result()
    result.seconds = time.perf_counter() - began
    return result


# -- phase 2: derived tables ----------------------------------------------------------------------


@dataclass
class RunResult:
    """What rebuilding one run wrote, and the seconds each step took."""

    run_id: str
    engine: str = IN_MEMORY
    """Where its assembly was materialised (IN_MEMORY or ON_DISK)."""
    parts: int = 1
    """In how many parts its raw events were parsed and folded (``trajectory_parts``)."""
    trajectories: int = 0
    consumptions: int = 0
    windows: int = 0
    alerts: int = 0
    seconds: dict[str, float] = field(default_factory=dict)


class DerivedRowsExist(ConfigurationError):
    """The run already has derived rows: a bulk rebuild would lay its rows beside them."""


def check_no_derived(client: Any, database: str, run_id: str) -> None:
    """Raise DerivedRowsExist when ``run_id`` has trajectories or metric windows in ``database``."""
    counts = {table: _run_rows(client, database, table, run_id) for table in ("trajectories", window_store.TABLE)}
    if any(counts.values()):
        raise DerivedRowsExist(
            f"run {run_id!r} already has derived rows in database {database!r} ({counts['trajectories']:,} "
            f"trajectory rows, {counts[window_store.TABLE]:,} window rows): a replay rebuilds runs into a database "
            "without them; replay into another database (--database NAME)")


def rebuild_run(client: Any, database: str, run_id: str, config: DeriveConfig, version: int, *,
                engine: str = IN_MEMORY, parts: Sequence[tuple[str, str]] = WHOLE_RUN,
                progress: Progress = lambda _: None) -> RunResult:
    """Phase 2 for one run: every derived table from its stored raw events, every row at ``version``; the
    assembly in ``engine`` tables, parsed and folded part by part (``parts``: ``trajectory_parts``).

    ``client``'s current database must be ``database`` (the audit SQL names its tables unqualified).
    """
    params = audit_params(run_id, window_s=config.window_s, verdict_timeout_s=config.assembly.verdict_timeout_s,
                          default_staleness_bound=config.default_staleness_bound)
    result = RunResult(run_id, engine, len(parts))
    clock = _Clock(result.seconds)
    try:
        with clock("assembly"):
            materialise(client, database, params, engine=engine, parts=parts,
                        on_each=lambda name, took: progress(f"run {run_id}: {ASSEMBLY_STEPS[name]} in {took:.1f} s"))
        progress(f"run {run_id}: writing trajectories, consumptions, windows and alerts")
        # The records' and the windows' INSERT ... SELECTs are the engine's work: one beside the other.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="replay-records") as beside:
            records = beside.submit(_write_records, client, database, params, version, result)
            with clock("windows"):
                # A JOIN: on a server too without the query condition cache (see infra.clickhouse.client.connect).
                client.command(window_metrics_insert(), parameters={**params, "version": version},
                               settings=join_settings(client))
                result.windows = _run_rows(client, database, window_store.TABLE, run_id)
            with clock("alerts"):
                counts = run_read(client, on_assembled(audit_sql("version_counts.sql")), params)
                alerts = regression_alerts(run_id, [dict(zip(counts.columns, r, strict=True)) for r in counts.rows],
                                           config.regression)
                now = datetime.now(UTC)
                alert_rows = [alert_row(a, "firing", now, now, version) for a in alerts]
                if alert_rows:
                    client.insert("alerts", alert_rows, column_names=list(ALERT_COLUMNS), database=database)
                result.alerts = len(alert_rows)
            records.result()
    finally:
        drop_materialised(client, database)
    return result


def _write_records(client: Any, database: str, params: dict[str, Any], version: int, result: RunResult) -> None:
    """The run's trajectory records and consumptions, from the materialised assembly."""
    clock = _Clock(result.seconds)
    with clock("trajectories"):
        client.command(on_assembled(replay_sql("trajectories.sql")), parameters={**params, "version": version})
        result.trajectories = _count(client, database, "traj")
    with clock("consumptions"):
        client.command(on_assembled(replay_sql("consumptions.sql")), parameters=params)
        result.consumptions = _count(client, database, "consumed")


def materialise(client: Any, database: str, params: Mapping[str, Any], prefix: str = TEMP_PREFIX,
                on_each: Callable[[str, float], None] = lambda _name, _seconds: None, *,
                engine: str = IN_MEMORY, parts: Sequence[tuple[str, str]] = WHOLE_RUN, assembly: str | None = None
                ) -> None:
    """Each expression of ASSEMBLED into a table ``<prefix><name>`` of ``database`` (IN_MEMORY or ON_DISK), in order;
    the PARTED ones one part of ``parts`` (``trajectory_parts``) at a time. ``assembly``: the assembly's text, by
    default the audit's (``assembly.sql``; ``bench.batch_sql_probe`` limits it to a batch's trajectories)."""
    assembly = on_assembled(audit_file("assembly.sql") if assembly is None else assembly, prefix)
    for name in ASSEMBLED:
        began = time.perf_counter()
        table = f"`{database}`.{prefix}{name}"
        client.command(f"DROP TABLE IF EXISTS {table}")
        select = MATERIALISED.get(name, f"SELECT * FROM {name}")
        for i, (low, high) in enumerate(parts if name in PARTED else WHOLE_RUN):
            statement = f"CREATE TABLE {table} ENGINE = {engine} AS" if i == 0 else f"INSERT INTO {table}"
            client.command(f"{statement} {assembly}\n{select}", parameters={**params, "tid_from": low, "tid_to": high})
        on_each(name, time.perf_counter() - began)


def drop_materialised(client: Any, database: str, prefix: str = TEMP_PREFIX) -> None:
    """Drop the tables ``materialise`` made with ``prefix`` in ``database`` (those that exist)."""
    for name in ASSEMBLED:
        client.command(f"DROP TABLE IF EXISTS `{database}`.{prefix}{name}")


def trajectory_parts(client: Any, database: str, run_id: str, events: int, per_part: int = PART_EVENTS
                     ) -> list[tuple[str, str]]:
    """Ranges ``[from, to)`` of trajectory ids (``to`` '': no upper bound) that split the run's ``events`` stored raw
    events into parts of about ``per_part`` each, in id order; one range, ``('', '')``, for a run that small."""
    count = max(1, math.ceil(events / per_part))
    bounds = [""]
    for k in range(1, count):
        found = client.query(f"SELECT trajectory_id FROM `{database}`.events_raw WHERE run_id = {{run:String}} "
                             f"ORDER BY trajectory_id LIMIT 1 OFFSET {events * k // count}",
                             parameters={"run": run_id}).result_rows
        if found and str(found[0][0]) > bounds[-1]:  # no empty range, none twice
            bounds.append(str(found[0][0]))
    bounds.append("")
    return list(zip(bounds, bounds[1:], strict=False))


def window_metrics_select(source: Callable[[str], str] = audit_file) -> str:
    """A SELECT of a run's ``m_window_metrics`` rows, in ``window_store.COLUMNS`` order, from the audit families.

    ``source`` gives the SELECT of an audit SQL file by name (``windows.sql``, ``weights.sql`` and each family's).
    One row per window of ``windows.sql`` (every window with a finished trajectory or a consumption), each
    family LEFT JOINed to it by domain and window: a one-row family's columns from its row, or where the window
    has none the zero row the worker writes (``Column.empty``; budget's configured weight from ``weights.sql``);
    a family with several rows per window as the Nested column's arrays (one element per row, empty where none).
    Parameters: ``{run:String}``, ``{window_s:UInt32}``, ``{version:UInt64}``.
    """
    joins: list[str] = []
    values: list[str] = []
    for i, target in enumerate(window_store.FAMILIES):
        sources = [f for f in FAMILIES if WINDOW_FAMILIES[f.name] == target.family]
        alias = f"f{i}"
        if isinstance(target, window_store.Single):
            (family,) = sources
            empty = {c.name: c.empty for c in family.values}
            fields = ", ".join(f"{name} AS {alias}_{name}" for name in target.fields)
            joins.append(f"LEFT JOIN (SELECT domain, window_start, 1 AS {alias}_present, {fields}\n"
                         f"FROM (\n{source(family.sql_file)}\n)) AS {alias} USING (domain, window_start)")
            for name in target.fields:
                zero = "weights_configured_weight" if name == "configured_weight" else sql_literal(empty[name])
                values.append(f"if({alias}_present, {alias}_{name}, {zero})")
        else:
            fields = ", ".join(target.fields)
            union = "\nUNION ALL\n".join(f"SELECT domain, window_start, {fields} FROM (\n{source(f.sql_file)}\n)"
                                          for f in sources)
            # Tuples, so that a NULL field keeps its place (groupArray skips NULL values).
            joins.append(f"LEFT JOIN (SELECT domain, window_start, groupArray(tuple({fields})) AS {alias}_rows\n"
                         f"FROM (\n{union}\n) GROUP BY domain, window_start) AS {alias} USING (domain, window_start)")
            values.extend(f"tupleElement({alias}_rows, {k})" for k in range(1, len(target.fields) + 1))
    joins.append(f"LEFT JOIN (SELECT domain, configured_weight AS weights_configured_weight FROM (\n"
                 f"{source('weights.sql')}\n)) AS weights USING (domain)")
    body = ",\n    ".join(values)
    return (f"SELECT\n    {{run:String}}, domain, toDateTime(window_start, 'UTC'),\n"
            f"    toDateTime(window_start + {{window_s:UInt32}}, 'UTC'),\n    {body},\n    {{version:UInt64}}\n"
            f"FROM (\n{source('windows.sql')}\n) AS windows\n" + "\n".join(joins))


def sql_literal(value: Any) -> str:
    """A family column's empty value (``Column.empty``: a number or None) as an SQL literal."""
    if value is None:
        return "NULL"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"no SQL literal for the empty value {value!r}")
    return repr(value)


def window_metrics_insert() -> str:
    """The INSERT of a run's ``m_window_metrics`` rows from the materialised assembly (``window_metrics_select``)."""
    columns = ", ".join(f"`{c}`" for c in window_store.COLUMNS)
    return on_assembled(f"INSERT INTO {window_store.TABLE} ({columns})\n{audit_file('assembly.sql')}\n"
                        f"{window_metrics_select()}")


def choose_engine(events: int) -> str:
    """Where a run of ``events`` stored raw events is assembled: in memory up to IN_MEMORY_MAX_EVENTS, else on disk."""
    return IN_MEMORY if events <= IN_MEMORY_MAX_EVENTS else ON_DISK


def _run_rows(client: Any, database: str, table: str, run_id: str) -> int:
    """Rows of ``run_id`` in ``database.table``."""
    return int(client.query(f"SELECT count() FROM `{database}`.{table} WHERE run_id = {{run:String}}",
                            parameters={"run": run_id}).result_rows[0][0])


def _count(client: Any, database: str, name: str) -> int:
    return int(client.query(f"SELECT count() FROM `{database}`.{TEMP_PREFIX}{name}").result_rows[0][0])


class _Clock:
    def __init__(self, into: dict[str, float]) -> None:
        self._into = into

    def __call__(self, name: str) -> _Clock:
        self._name = name
        return self

    def __enter__(self) -> None:
        self._began = time.perf_counter()

    def __exit__(self, *_: object) -> None:
        self._into[self._name] = time.perf_counter() - self._began


# -- the whole replay -----------------------------------------------------------------------------


@dataclass
class ReplayResult:
    """A whole replay: the load, each run's rebuild, the seconds in total."""

    load: LoadResult
    runs: list[RunResult]
    seconds: float
    handed_off: list[TopicPartition] = field(default_factory=list)
    """With ``hand_off``: the partitions at which the worker's consumer group now starts (the ends read)."""

    @property
    def per_second(self) -> float:
        """Messages read per second over the whole replay."""
        return self.load.messages / self.seconds if self.seconds > 0 else 0.0


def consumer_config(settings: Settings) -> dict[str, object]:
    """A consumer that reads by assignment and commits nothing (the group id only names it to the broker)."""
    return {
        **_kafka_config(settings),
        "group.id": f"{settings.consumer_group}-replay",
        "client.id": "rollout-replay",
        "enable.auto.commit": False,
        "enable.partition.eof": False,
        "fetch.min.bytes": 1024 * 1024,
        "fetch.wait.max.ms": 100,
    }


def replay(settings: Settings, client: Any, database: str, config: DeriveConfig, *, batch: int = READ_BATCH,
           progress: Progress = lambda _: None, engine: str | None = None, hand_off: bool = False) -> ReplayResult:
    """Read the raw topics of ``settings`` into ``database`` and rebuild every run they hold (see the module).

    ``engine``: where each run's assembly is materialised (IN_MEMORY or ON_DISK); None chooses by the run's size
    (``choose_engine``). ``hand_off``: once every run is rebuilt, commit the worker's consumer group at the ends
    the replay read (``commit_hand_off``), so a worker on ``database`` goes on from there; refused at once while
    the group has members (``require_idle_group``)."""
    began = time.perf_counter()
    if hand_off:
        require_idle_group(settings)
    topics = TopicNames(settings.topic_prefix)
    consumer = Consumer(consumer_config(settings))
    try:
        ends = log_end(consumer, topics.raw)
        total = sum(tp.offset for tp in ends)  # an upper bound: offsets before a partition's low mark are gone
        if not ends:
            progress(f"no messages on {', '.join(topics.raw)}: nothing to replay (the topics come from "
                     "ROLLOUT_TOPIC_PREFIX, the broker from KAFKA_BOOTSTRAP_SERVERS)")
        else:
            progress(f"reading {len(ends)} partitions of {', '.join(topics.raw)} (up to {total:,} messages)")
        loaded = load(client, database, read_log(consumer, ends, batch), topics, progress=progress, total=total)
    finally:
        consumer.close()
    progress(f"stored {loaded.stored:,} raw events ({loaded.duplicates:,} duplicates, {loaded.dead_lettered:,} "
             f"dead letters) in {loaded.seconds:.1f} s; rebuilding {len(loaded.runs)} run(s)")
    runs = rebuild(client, database, sorted(loaded.runs), config, progress=progress, engine=engine)
    handed: list[TopicPartition] = []
    if hand_off:  # a worker that joined the group meanwhile makes the broker refuse the commit
        handed = commit_hand_off(settings, ends)
    return ReplayResult(loaded, runs, time.perf_counter() - began, handed)


_COORDINATOR_MOVING = frozenset({KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                                  KafkaError.COORDINATOR_NOT_AVAILABLE})
_NO_ANSWER = frozenset({KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN})
"""Client-side errors that mean no broker answered (which of them, or the future's own timeout, depends on timing)."""


def _unanswered(exc: BaseException, code: int | None, timeout: float) -> str:
    """Why a request to the broker failed, for a message: no answer in ``timeout`` s, or the broker's error."""
    if isinstance(exc, TimeoutError) or code in _NO_ANSWER:
        return f"no answer in {timeout:g} s"
    return str(exc)


def require_idle_group(settings: Settings, timeout: float = 10.0) -> None:
    """Refuse a hand-off while the worker's consumer group (``ROLLOUT_CONSUMER_GROUP``) has members: a running
    worker reads, stores and commits on its own, and the broker rejects another client's commit for its group."""
    from confluent_kafka.admin import AdminClient

    group = settings.consumer_group
    admin = AdminClient(_kafka_config(settings))
    deadline = time.monotonic() + timeout
    while True:
        try:
            described = admin.describe_consumer_groups([group], request_timeout=timeout)[group].result(timeout=timeout)
            break
        except (KafkaException, TimeoutError) as exc:  # TimeoutError: no broker answered in time
            error = exc.args[0] if exc.args else None
            code = error.code() if isinstance(error, KafkaError) else None
            if code == KafkaError.GROUP_ID_NOT_FOUND:
                return  # no worker ever joined it: nothing to wait for
            if code in _COORDINATOR_MOVING and time.monotonic() < deadline:
                time.sleep(0.5)  # a broker just started is still loading its group coordinator
                continue
            why = _unanswered(exc, code, timeout)
            raise ServiceUnavailable(f"could not describe the worker's consumer group {group!r} ({why}); start "
                                     "Kafka (rollout infra up) or check KAFKA_BOOTSTRAP_SERVERS") from exc
    members = list(described.members or [])
    if members:
        where = ", ".join(sorted({f"{m.client_id}@{m.host}" for m in members}))
        raise ServiceUnavailable(
            f"the worker's consumer group {group!r} has {len(members)} active member(s) ({where}): stop the "
            "worker first; --hand-off moves that group's offsets to where the replay ends")


def commit_hand_off(settings: Settings, ends: Sequence[TopicPartition], timeout: float = 30.0) -> list[TopicPartition]:
    """Commit the worker's consumer group at ``ends`` (each partition's offset: the end the replay read to) and
    return what the broker confirmed. Partitions the replay found empty keep what they had: the worker reads them
    from their first offset (``auto.offset.reset=earliest``), which holds nothing the replay stored.

    If the commit fails, the database is still complete up to ``ends``: a worker started on it reads from the
    group's old offsets and skips every event stored already (its duplicate check), slower but counting nothing
    twice."""
    if not ends:
        return []
    group = settings.consumer_group
    consumer = Consumer({**_kafka_config(settings), "group.id": group, "client.id": "rollout-replay-hand-off",
                         "enable.auto.commit": False, "socket.timeout.ms": int(timeout * 1000)})
    try:
        confirmed = list(consumer.commit(offsets=[TopicPartition(tp.topic, tp.partition, tp.offset) for tp in ends],
                                         asynchronous=False) or [])
    except KafkaException as exc:
        raise _not_handed_off(group, str(exc)) from exc
    finally:
        consumer.close()
    failed = [tp for tp in confirmed if tp.error is not None]
    if failed:
        first = failed[0]
        raise _not_handed_off(group, f"refused for {len(failed)} partition(s), {first.topic}[{first.partition}]: "
                                     f"{first.error}")
    return confirmed


def _not_handed_off(group: str, why: str) -> ServiceUnavailable:
    return ServiceUnavailable(
        f"the replay is stored, but committing the worker's consumer group {group!r} failed ({why}); a worker "
        "started on this database reads from the group's old offsets and skips what is stored (nothing counted "
        "twice, only slower)")


def _kafka_config(settings: Settings) -> dict[str, Any]:
    """The replay's Kafka clients: the settings' connection, librdkafka's log lines through ``logging``."""
    return {**settings.kafka_client_config(), "logger": _librdkafka_log}


def rebuild(client: Any, database: str, run_ids: Sequence[str], config: DeriveConfig, *,
            progress: Progress = lambda _: None, engine: str | None = None) -> list[RunResult]:
    """Phase 2 for each run (``engine`` as in ``replay``). The caller has refused runs with derived rows already
    (``load`` does, on each run's first sight)."""
    previous = client.database
    client.database = database
    try:
        out = []
        for run_id in run_ids:
            events = _run_rows(client, database, "events_raw", run_id)
            chosen = engine or choose_engine(events)
            parts = trajectory_parts(client, database, run_id, events)
            with no_insert_merge(client):
                result = rebuild_run(client, database, run_id, config, time.time_ns(), engine=chosen, parts=parts,
                                     progress=progress)
            where = ("in memory" if result.engine == IN_MEMORY else "on disk") + (
                f", {result.parts} parts" if result.parts > 1 else "")
            progress(f"run {run_id}: {result.trajectories:,} trajectories, {result.consumptions:,} consumptions, "
                     f"{result.windows:,} windows, {result.alerts} alerts in {sum(result.seconds.values()):.1f} s "
                     f"(assembled {where})")
            out.append(result)
        return out
    finally:
        client.database = previous
