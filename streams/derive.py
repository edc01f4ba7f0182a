"""Derive trajectories, metric windows and alerts from what ClickHouse holds, after each raw batch.

The sink writes raw events first; this module then re-assembles every trajectory the batch
touched from *all* of its stored events, rewrites those trajectory records, recomputes every
metric window they fall in from the stored records (pure functions in ``streams.trajectory``,
``streams.metrics`` and ``streams.regression``) and re-evaluates regressions of the runs
involved. Because every step recomputes from stored truth, replaying a batch (after a crash,
a re-delivery, or in other batch sizes) gives the same rows.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from clickhouse_connect.driver.client import Client

from infra.clickhouse.inserts import Inserter
from schemas import BatchConsumed, Envelope, PolicyVersionPublished, RunConfigured
from streams import window_store
from streams.metrics import Consumption, Row, WindowKey, breakdown_rows, version_counts, window_rows
from streams.records import Accepted, DeadLetter
from streams.regression import RegressionAlert, RegressionConfig, VersionCounts, detect_regressions
from streams.sink_clickhouse import ClickHouseSink, InsertGate, WriteResult
from streams.state import RECORD_FIELDS, ConsumptionRef, OwnerState, RunState, WindowRef
from streams.trajectory import EPOCH, AssemblyConfig, TrajectoryRecord, assemble, window_start

log = logging.getLogger(__name__)
LARGE_REDERIVATION = 10_000
"""A policy version that re-derives more trajectories than this is logged (it arrived after them)."""

TRAJECTORY_COLUMNS = (*RECORD_FIELDS, "finish_window", "version")
ALERT_COLUMNS = (
    "alert_id", "run_id", "domain", "policy_version", "state", "baseline_versions", "baseline_decided",
    "baseline_passed", "baseline_pass_rate", "candidate_decided", "candidate_passed", "candidate_pass_rate",
    "drop", "z", "p_value", "overall_baseline_pass_rate", "overall_candidate_pass_rate", "overall_rose",
    "first_fired_at", "updated_at", "version",
)


@dataclass(frozen=True, slots=True)
class DeriveConfig:
    """Knobs of the derived metrics."""

    window_s: int = 60
    assembly: AssemblyConfig = field(default_factory=AssemblyConfig)
    regression: RegressionConfig = field(default_factory=RegressionConfig)
    default_staleness_bound: int = 2


@dataclass(frozen=True, slots=True)
class DeriveResult:
    """What one derivation changed: records to publish, windows rewritten, alerts that fired now."""

    records: list[TrajectoryRecord]
    windows: int
    fired: list[RegressionAlert]
    resolved: list[RegressionAlert]


class _Versions:
    """Strictly increasing row versions (nanoseconds, bumped when the clock stands still)."""

    def __init__(self) -> None:
        self._last = 0

    def next(self) -> int:
        self._last = max(self._last + 1, time.time_ns())
        return self._last


class Deriver:
    """Runs the derivation for one batch (call from the ClickHouse owner thread).

    Reads go through ``state`` (streams.state.OwnerState): what this owner wrote or read before is
    served from memory, the rest is read from ClickHouse. Writes go out in an order that keeps
    ClickHouse consistent at every point a crash can hit: window metrics first, then consumptions,
    then the trajectory records, then alerts. A batch re-delivered after a crash finds the
    trajectory records as they were before it (or, if that write landed, metrics that already
    match them), so the windows it recomputes are the right ones either way.
    """

    def __init__(self, *, client: Any, database: str, config: DeriveConfig, state: OwnerState) -> None:
        # ``state`` must be the one the sink writes through: it holds the stored events the sink adds.
        self._client: Client = client
        self._db = database
        self._config = config
        self._versions = _Versions()
        self._inserter = Inserter(client, database)
        self.state = state

    # -- entry point -------------------------------------------------------------------------

    def derive(self, batch: Sequence[Accepted]) -> DeriveResult:
        """Re-derive everything the batch's events touch; on failure forget every cache and raise."""
        try:
            return self._derive(batch)
        except BaseException:
            self.state.clear()
            raise

    def _derive(self, batch: Sequence[Accepted]) -> DeriveResult:
        keys: dict[str, set[str]] = defaultdict(set)
        new_versions: dict[str, datetime] = {}
        reconfigured: set[str] = set()
        policy_events: dict[str, list[Envelope]] = defaultdict(list)
        consumed: dict[str, dict[ConsumptionRef, Consumption]] = defaultdict(dict)
        for item in batch:
            event = item.event
            trajectory_id = getattr(event, "trajectory_id", None)
            if trajectory_id:
                keys[event.run_id].add(str(trajectory_id))
            elif isinstance(event, PolicyVersionPublished):
                at = new_versions.get(event.run_id)
                new_versions[event.run_id] = min(at, event.occurred_at) if at else event.occurred_at
                policy_events[event.run_id].append(event)
            elif isinstance(event, RunConfigured):
                reconfigured.add(event.run_id)
                policy_events[event.run_id].append(event)
            elif isinstance(event, BatchConsumed):
                for tid in event.trajectory_ids:
                    consumed[event.run_id][(tid, event.batch_id)] = Consumption(
                        event.run_id, event.batch_id, tid, event.trainer_version, event.occurred_at)
        for run_id, events in policy_events.items():  # stored by the sink before the derivation runs
            self.state.run_facts_stored(run_id, events)
        for run_id, since in new_versions.items():
            finished = self._finished_since(run_id, since)
            if len(finished) > LARGE_REDERIVATION:
                latest = max((i.event.occurred_at for i in batch), default=since)
                log.warning("run %s: a policy version published at %s arrived with events up to %s; it re-derives "
                            "the %d trajectories finished since", run_id, since.isoformat(), latest.isoformat(),
                            len(finished))
            keys[run_id].update(finished)
        results = [
            self._derive_run(run_id, sorted(keys.get(run_id, ())), list(consumed.get(run_id, {}).values()),
                             run_id in reconfigured)
            for run_id in sorted(set(keys) | set(new_versions) | reconfigured | set(consumed))
        ]
        return DeriveResult([r for res in results for r in res.records], sum(res.windows for res in results),
                            [a for res in results for a in res.fired], [a for res in results for a in res.resolved])

    def _derive_run(self, run_id: str, trajectory_ids: list[str], consumed: list[Consumption],
                    reconfigured: bool) -> DeriveResult:
        state = self.state
        run = state.run(run_id)
        window_s = self._config.window_s
        trajectories = state.trajectories(run_id, trajectory_ids, events=True, record=True, consumed=True)
        consumer_ids = sorted({c.trajectory_id for c in consumed} - set(trajectories))
        trajectories.update(state.trajectories(run_id, consumer_ids, record=True, consumed=True))

        # What changed: records (stored -> new) and consumptions not stored yet.
        changed: dict[str, tuple[TrajectoryRecord | None, TrajectoryRecord]] = {}
        for tid in trajectory_ids:
            known = trajectories[tid]
            assert known.events is not None
            record = assemble(list(known.events.values()), run.timeline, self._config.assembly)
            if record is not None and record != known.record:
                changed[tid] = (known.record, record)
        fresh: list[Consumption] = []
        for c in consumed:
            stored = trajectories[c.trajectory_id].consumed
            assert stored is not None
            if c.batch_id not in stored:
                fresh.append(c)

        def current(tid: str) -> TrajectoryRecord | None:
            return changed[tid][1] if tid in changed else trajectories[tid].record

        # The windows to recompute: where a changed record was and is, with its consumptions, and
        # where new consumptions fall.
        dirty: set[WindowRef] = set()
        for tid, (old, new) in changed.items():
            stored_consumed = trajectories[tid].consumed
            assert stored_consumed is not None
            for record in (old, new):
                if record is not None and record.finished:
                    dirty.add((record.domain, _finish_window(record, window_s)))
                    dirty.update((record.domain, window_start(c.consumed_at, window_s))
                                 for c in stored_consumed.values())
        for c in fresh:
            record = current(c.trajectory_id)
            if record is not None and record.finished:
                dirty.add((record.domain, window_start(c.consumed_at, window_s)))
        if reconfigured:
            dirty |= self._all_windows(run_id)

        # Bring the cached windows up to date with this batch (a failure clears them all).
        members = state.window_members(run_id, run, dirty)
        for tid, (old, new) in changed.items():
            if old is not None and old.finished:
                members.get((old.domain, _finish_window(old, window_s)), {}).pop(tid, None)
            if new.finished:
                members[(new.domain, _finish_window(new, window_s))][tid] = new
        for c in fresh:
            stored = trajectories[c.trajectory_id].consumed
            assert stored is not None
            stored[c.batch_id] = c
        state.add_consumptions(fresh)
        by_start = state.consumption_windows(run_id, run, {start for _, start in dirty})
        for c in fresh:
            bucket = by_start.get(window_start(c.consumed_at, window_s))
            if bucket is not None:
                bucket[(c.trajectory_id, c.batch_id)] = c
        unknown = sorted({c.trajectory_id for found in by_start.values() for c in found.values()} - set(trajectories))
        if unknown:
            trajectories.update(state.trajectories(run_id, unknown, record=True))

        quality = state.window_quality(run_id, run, dirty) if dirty else {}
        totals = state.quality_totals(run_id, run)
        computed: list[tuple[WindowKey, int, dict[str, list[Row]]]] = []
        for domain, start in sorted(dirty):
            pairs = []
            for c in by_start.get(start, {}).values():
                record = current(c.trajectory_id)
                if record is not None and record.finished and record.domain == domain:
                    pairs.append((c, record))
            key = WindowKey(run_id, domain, start)
            window_records = list(members[(domain, start)].values())
            rows = window_rows(key, window_s, window_records, pairs, run.config, run.timeline)
            rows.update(breakdown_rows(key, window_s, window_records))
            computed.append((key, self._versions.next(), rows))

        # Writes, in crash-safe order (see the class docstring).
        self._write_windows(computed)
        state.stored_windows(run, (key.window_start for key, _, _ in computed))
        for key, _version, rows in computed:
            counts = version_counts(rows["m_domain_quality"])
            for version, (decided, passed) in quality.get((key.domain, key.window_start), {}).items():
                total = totals.setdefault((key.domain, version), [0, 0])
                total[0] -= decided
                total[1] -= passed
            for version, (decided, passed) in counts.items():
                total = totals.setdefault((key.domain, version), [0, 0])
                total[0] += decided
                total[1] += passed
            state.remember_window_quality(run, (key.domain, key.window_start), counts)
        if fresh:
            self._insert_consumptions(fresh)
            # A consumption of a trajectory without a record yet: its events may all come later.
            state.stored_consumptions(run, fresh, {c.trajectory_id for c in fresh if current(c.trajectory_id) is None})
        records = self._write_records(changed)
        for tid, (_old, new) in changed.items():
            state.record_written(run_id, tid, trajectories[tid], new)
        # Every batch re-checks its runs, changed or not: an alert whose write failed is written now.
        fired, resolved = self._regressions(run_id, run, totals)
        return DeriveResult(records, len(computed), fired, resolved)

    # -- trajectories --------------------------------------------------------------------------

    def _write_records(self, changed: dict[str, tuple[TrajectoryRecord | None, TrajectoryRecord]]
                       ) -> list[TrajectoryRecord]:
        window = self._config.window_s
        rows: list[tuple[Any, ...]] = []
        records: list[TrajectoryRecord] = []
        for tid in sorted(changed):
            old, new = changed[tid]
            tombstone_version = self._versions.next()
            version = self._versions.next()
            new_window = _finish_window(new, window)
            if old is not None and old.finished_at is not None:
                old_window = _finish_window(old, window)
                if (old.domain, old_window) != (new.domain, new_window):
                    moved = dataclasses.replace(old, status="superseded")
                    rows.append(_record_row(moved, old_window, tombstone_version))
            rows.append(_record_row(new, new_window, version))
            records.append(new)
        if rows:
            self._inserter.insert("trajectories", rows, TRAJECTORY_COLUMNS)
        return records

    def _finished_since(self, run_id: str, since: datetime) -> list[str]:
        result = self._client.query(
            f"SELECT DISTINCT trajectory_id FROM {self._db}.trajectories "
            "WHERE run_id = {run:String} AND finished_at >= {since:DateTime64(6, 'UTC')}",
            parameters={"run": run_id, "since": since},
        )
        return [str(r[0]) for r in result.result_rows]

    # -- consumptions --------------------------------------------------------------------------

    def _insert_consumptions(self, consumed: list[Consumption]) -> None:
        rows = [[c.run_id, c.trajectory_id, c.batch_id, c.trainer_version, c.consumed_at] for c in consumed]
        self._inserter.insert("consumptions", rows,
                              ("run_id", "trajectory_id", "batch_id", "trainer_version", "consumed_at"))

    def _all_windows(self, run_id: str) -> set[WindowRef]:
        return {(k.domain, k.window_start) for k in window_store.stored_windows(self._client, self._db, run_id)}

    # -- windows -------------------------------------------------------------------------------

    def _write_windows(self, computed: list[tuple[WindowKey, int, dict[str, list[Row]]]]) -> None:
        """Write the recomputed windows, one row each (every family of the window), with one INSERT."""
        if not computed:
            return
        window = timedelta(seconds=self._config.window_s)
        rows = [window_store.window_row(key, key.window_start + window, version, families)
                for key, version, families in computed]
        # One row per window holds all of its families: a crash leaves each window on a complete version.
        self._inserter.insert(window_store.TABLE, rows, window_store.COLUMNS)

    # -- regressions ---------------------------------------------------------------------------

    def _regressions(self, run_id: str, run: RunState, totals: dict[tuple[str, int], list[int]]
                     ) -> tuple[list[RegressionAlert], list[RegressionAlert]]:
        by_domain: dict[str, list[VersionCounts]] = defaultdict(list)
        overall: dict[int, list[int]] = defaultdict(lambda: [0, 0])
        for (domain, version), (decided, passed) in sorted(totals.items()):
            if decided == 0 and passed == 0:
                continue
            by_domain[domain].append(VersionCounts(version, decided, passed))
            overall[version][0] += decided
            overall[version][1] += passed
        alerts = detect_regressions(
            run_id, by_domain, [VersionCounts(v, d, p) for v, (d, p) in sorted(overall.items())],
            self._config.regression,
        )
        known = self.state.alerts(run_id, run, ALERT_COLUMNS[5:18])
        now = datetime.now(UTC)
        rows: list[list[Any]] = []
        fired: list[RegressionAlert] = []
        for alert in alerts:
            previous = known.get(alert.alert_id)
            evidence = _alert_evidence(alert)
            if previous is not None and previous[0] == "firing" and _same_evidence(list(previous[4:]), evidence):
                continue  # unchanged: no new row
            first = _utc(previous[1]) if previous is not None else now
            if previous is None or previous[0] != "firing":
                fired.append(alert)
            rows.append(alert_row(alert, "firing", first, now, self._versions.next()))
        current = {a.alert_id for a in alerts}
        resolved: list[RegressionAlert] = []
        for alert_key, row in known.items():
            if alert_key not in current and row[0] == "firing":
                stale = _alert_from_row(run_id, alert_key, row)
                resolved.append(stale)
                rows.append(alert_row(stale, "resolved", _utc(row[1]), now, self._versions.next()))
        if rows:
            self._inserter.insert("alerts", rows, ALERT_COLUMNS)
            for written in rows:
                known[str(written[0])] = (written[4], written[-3], written[2], written[3], *written[5:-3])
        return fired, resolved


def store_and_derive(sink: ClickHouseSink, deriver: Deriver, gate: InsertGate, accepted: Sequence[Accepted],
                     dead: Sequence[DeadLetter]) -> tuple[WriteResult, DeriveResult]:
    """Store one batch and derive from it, the engine inserting its raw events beside the derivation's Python.

    ``deriver`` and the owner's cache (``deriver.state``) must call ClickHouse through ``gate``: their
    first call waits for the raw events to be stored (and raises SinkWriteError if they were not), so
    nothing derived is written, and nothing is read, before them. Raises, with the caches cleared and
    the insert over, when any part failed: the caller retries the whole batch.
    """
    pending = sink.start(accepted, dead)
    gate.arm(pending.result)
    try:
        derived = deriver.derive(accepted)
    except BaseException:
        pending.settle()  # the next attempt starts only when this one's insert is over
        raise
    finally:
        gate.disarm()
    return pending.result(), derived


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _finish_window(record: TrajectoryRecord, window_s: int) -> datetime:
    if record.finished_at is None:
        return EPOCH
    return window_start(record.finished_at, window_s)


_record_values = operator.attrgetter(*RECORD_FIELDS)


def _record_row(record: TrajectoryRecord, finish_window: datetime, version: int) -> tuple[Any, ...]:
    # attrgetter reads every field in one C call; the one tuple field (interruption_reasons) goes in
    # as a tuple, which the Array column's encoder takes like a list.
    return (*_record_values(record), finish_window, version)


def _alert_evidence(alert: RegressionAlert) -> list[Any]:
    return [list(alert.baseline_versions), alert.baseline_decided, alert.baseline_passed, alert.baseline_pass_rate,
            alert.candidate_decided, alert.candidate_passed, alert.candidate_pass_rate, alert.drop, alert.z,
            alert.p_value, alert.overall_baseline_pass_rate, alert.overall_candidate_pass_rate, alert.overall_rose]


def alert_row(alert: RegressionAlert, state: str, first: datetime, now: datetime, version: int) -> list[Any]:
    """The ``alerts`` row of an alert in ``state``, values in ALERT_COLUMNS order."""
    return [alert.alert_id, alert.run_id, alert.domain, alert.policy_version, state, *_alert_evidence(alert),
            first, now, version]


def _same_evidence(stored: list[Any], fresh: list[Any]) -> bool:
    return [list(stored[0]), *stored[1:]] == fresh


def _alert_from_row(run_id: str, alert_key: str, row: Sequence[Any]) -> RegressionAlert:
    """An alert from its cached row: (state, first_fired_at, domain, policy_version, *evidence)."""
    evidence = list(row[4:])
    return RegressionAlert(alert_key, run_id, str(row[2]), int(row[3]), tuple(int(v) for v in evidence[0]),
                           *evidence[1:])


def record_message(record: TrajectoryRecord) -> bytes:
    """The derived topic's JSON form of a trajectory record (fields in declaration order, times in RFC 3339)."""
    return orjson.dumps(record)


def alert_message(alert: RegressionAlert, state: str) -> bytes:
    """The alerts topic's JSON form of an alert (with its evidence)."""
    return orjson.dumps({**dataclasses.asdict(alert), "state": state}, option=orjson.OPT_SORT_KEYS)

