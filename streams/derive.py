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
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from clickhouse_connect.driver.client import Client

from schemas import BatchConsumed, Envelope, PolicyVersionPublished, RunConfigured, decode_event
from streams import window_store
from streams.metrics import Consumption, RunConfig, WindowKey, breakdown_rows, window_rows
from streams.records import Accepted
from streams.regression import RegressionAlert, RegressionConfig, VersionCounts, detect_regressions
from streams.trajectory import EPOCH, AssemblyConfig, TrajectoryRecord, VersionTimeline, assemble, window_start

RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(TrajectoryRecord))
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
    """Runs the derivation for one batch on a ClickHouse client (call from the client's owner thread)."""

    def __init__(self, *, client: Any, database: str, config: DeriveConfig) -> None:
        self._client: Client = client
        self._db = database
        self._config = config
        self._versions = _Versions()

    # -- entry point -------------------------------------------------------------------------

    def derive(self, batch: Sequence[Accepted]) -> DeriveResult:
        """Re-derive everything the batch's events touch."""
        events = [a.event for a in batch]
        batch_ids = {e.event_id for e in events}
        keys: dict[str, set[str]] = defaultdict(set)
        new_versions: dict[str, datetime] = {}
        reconfigured: set[str] = set()
        consumed: list[Consumption] = []
        for event in events:
            trajectory_id = getattr(event, "trajectory_id", None)
            if trajectory_id:
                keys[event.run_id].add(str(trajectory_id))
            elif isinstance(event, PolicyVersionPublished):
                at = new_versions.get(event.run_id)
                new_versions[event.run_id] = min(at, event.occurred_at) if at else event.occurred_at
            elif isinstance(event, RunConfigured):
                reconfigured.add(event.run_id)
            elif isinstance(event, BatchConsumed):
                consumed.extend(
                    Consumption(event.run_id, event.batch_id, tid, event.trainer_version, event.occurred_at)
                    for tid in event.trajectory_ids
                )
        if consumed:
            self._insert_consumptions(consumed)
        for run_id, since in new_versions.items():
            keys[run_id].update(self._finished_since(run_id, since))

        windows: set[WindowKey] = set()
        changed: list[TrajectoryRecord] = []
        runs = set(keys) | set(new_versions) | reconfigured | {c.run_id for c in consumed}
        facts = {run_id: self._run_facts(run_id) for run_id in sorted(runs)}
        for run_id in sorted(runs):
            timeline = facts[run_id][0]
            run_keys = sorted(keys.get(run_id, ()))
            if run_keys:
                records, touched = self._reassemble(run_id, run_keys, batch_ids, timeline)
                changed.extend(records)
                windows |= touched
                windows |= self._consumption_windows(run_id, run_keys)
            run_consumed = [c for c in consumed if c.run_id == run_id]
            if run_consumed:
                windows |= self._windows_of_consumptions(run_id, run_consumed)
            if run_id in reconfigured:
                windows |= self._all_windows(run_id)
        by_run: dict[str, list[WindowKey]] = defaultdict(list)
        for key in windows:
            by_run[key.run_id].append(key)
        fired: list[RegressionAlert] = []
        resolved: list[RegressionAlert] = []
        for run_id, run_windows in sorted(by_run.items()):
            self._recompute(run_id, run_windows, *facts[run_id])
            now_fired, now_resolved = self._regressions(run_id)
            fired.extend(now_fired)
            resolved.extend(now_resolved)
        return DeriveResult(changed, len(windows), fired, resolved)

    # -- trajectories --------------------------------------------------------------------------

    def _reassemble(
        self, run_id: str, trajectory_ids: list[str], batch_ids: set[Any], timeline: VersionTimeline
    ) -> tuple[list[TrajectoryRecord], set[WindowKey]]:
        grouped: dict[str, list[Envelope]] = defaultdict(list)
        result = self._client.query(
            f"SELECT trajectory_id, payload FROM {self._db}.events_raw "
            "WHERE run_id = {run:String} AND trajectory_id IN {ids:Array(String)}",
            parameters={"run": run_id, "ids": trajectory_ids},
        )
        for trajectory_id, payload in result.result_rows:
            grouped[trajectory_id].append(decode_event(payload.encode() if isinstance(payload, str) else payload))
        window = self._config.window_s
        rows: list[list[Any]] = []
        records: list[TrajectoryRecord] = []
        touched: set[WindowKey] = set()
        for trajectory_id in trajectory_ids:
            events = grouped.get(trajectory_id, [])
            record = assemble(events, timeline, self._config.assembly)
            if record is None:
                continue
            previous = assemble([e for e in events if e.event_id not in batch_ids], timeline, self._config.assembly)
            tombstone_version = self._versions.next()
            version = self._versions.next()
            new_window = _finish_window(record, window)
            if previous is not None and previous.finished_at is not None:
                old_window = _finish_window(previous, window)
                if (previous.domain, old_window) != (record.domain, new_window):
                    moved = dataclasses.replace(previous, status="superseded")
                    rows.append(_record_row(moved, old_window, tombstone_version))
                    touched.add(WindowKey(run_id, previous.domain, old_window))
            rows.append(_record_row(record, new_window, version))
            records.append(record)
            if record.finished_at is not None:
                touched.add(WindowKey(run_id, record.domain, new_window))
        if rows:
            self._client.insert("trajectories", rows, column_names=TRAJECTORY_COLUMNS, database=self._db)
        return records, touched

    def _finished_since(self, run_id: str, since: datetime) -> list[str]:
        result = self._client.query(
            f"SELECT DISTINCT trajectory_id FROM {self._db}.trajectories "
            "WHERE run_id = {run:String} AND finished_at >= {since:DateTime64(6, 'UTC')}",
            parameters={"run": run_id, "since": since},
        )
        return [str(r[0]) for r in result.result_rows]

    def _run_facts(self, run_id: str) -> tuple[VersionTimeline, RunConfig]:
        """The run's policy version timeline and configuration, from its stored policy events."""
        result = self._client.query(
            f"SELECT event_type, payload FROM {self._db}.events_raw WHERE run_id = {{run:String}} "
            "AND trajectory_id = '' AND event_type IN ('policy.version_published', 'policy.run_configured')",
            parameters={"run": run_id},
        )
        published: list[PolicyVersionPublished] = []
        configured: list[RunConfigured] = []
        for _event_type, payload in result.result_rows:
            event = decode_event(payload)
            if isinstance(event, PolicyVersionPublished):
                published.append(event)
            elif isinstance(event, RunConfigured):
                configured.append(event)
        timeline = VersionTimeline.from_events(published)
        if not configured:
            return timeline, RunConfig({}, self._config.default_staleness_bound)
        latest = max(configured, key=lambda e: (e.occurred_at, str(e.event_id)))
        return timeline, RunConfig(dict(latest.domain_weights), latest.staleness_bound)

    # -- consumptions --------------------------------------------------------------------------

    def _insert_consumptions(self, consumed: list[Consumption]) -> None:
        rows = [[c.run_id, c.trajectory_id, c.batch_id, c.trainer_version, c.consumed_at] for c in consumed]
        self._client.insert("consumptions", rows, database=self._db,
                            column_names=["run_id", "trajectory_id", "batch_id", "trainer_version", "consumed_at"])

    def _consumption_windows(self, run_id: str, trajectory_ids: list[str]) -> set[WindowKey]:
        result = self._client.query(
            f"SELECT c.consumed_at, t.domain FROM {self._db}.consumptions AS c "
            f"INNER JOIN (SELECT trajectory_id, domain FROM {self._db}.trajectories "
            "WHERE run_id = {run:String} AND trajectory_id IN {ids:Array(String)} AND status != 'superseded' "
            "ORDER BY version DESC LIMIT 1 BY trajectory_id) AS t ON c.trajectory_id = t.trajectory_id "
            "WHERE c.run_id = {run:String} AND c.trajectory_id IN {ids:Array(String)}",
            parameters={"run": run_id, "ids": trajectory_ids},
        )
        return {WindowKey(run_id, d, window_start(_utc(at), self._config.window_s)) for at, d in result.result_rows}

    def _windows_of_consumptions(self, run_id: str, consumed: list[Consumption]) -> set[WindowKey]:
        domains = self._latest_domains(run_id, sorted({c.trajectory_id for c in consumed}))
        return {
            WindowKey(run_id, domains[c.trajectory_id], window_start(c.consumed_at, self._config.window_s))
            for c in consumed if c.trajectory_id in domains
        }

    def _latest_domains(self, run_id: str, trajectory_ids: list[str]) -> dict[str, str]:
        result = self._client.query(
            f"SELECT trajectory_id, domain FROM {self._db}.trajectories "
            "WHERE run_id = {run:String} AND trajectory_id IN {ids:Array(String)} AND status != 'superseded' "
            "ORDER BY version DESC LIMIT 1 BY trajectory_id",
            parameters={"run": run_id, "ids": trajectory_ids},
        )
        return {str(t): str(d) for t, d in result.result_rows}

    def _all_windows(self, run_id: str) -> set[WindowKey]:
        return window_store.stored_windows(self._client, self._db, run_id)

    # -- windows -------------------------------------------------------------------------------

    def _recompute(self, run_id: str, windows: list[WindowKey], timeline: VersionTimeline,
                   run_config: RunConfig) -> None:
        window_s = self._config.window_s
        records = self._window_records(run_id, windows)
        consumptions = self._window_consumptions(run_id, windows)
        stored: list[list[Any]] = []
        for key in sorted(windows, key=lambda k: (k.domain, k.window_start)):
            version = self._versions.next()
            window_records = records.get((key.domain, key.window_start), [])
            rows = window_rows(key, window_s, window_records, consumptions.get((key.domain, key.window_start), []),
                               run_config, timeline)
            rows.update(breakdown_rows(key, window_s, window_records))
            stored.append(window_store.window_row(key, key.window_start + timedelta(seconds=window_s), version, rows))
        # One row per window holds all of its families: a crash leaves each window on a complete version.
        window_store.write_windows(self._client, self._db, stored)

    def _window_records(
        self, run_id: str, windows: list[WindowKey]
    ) -> dict[tuple[str, datetime], list[TrajectoryRecord]]:
        pairs = sorted({(k.domain, k.window_start) for k in windows})
        result = self._client.query(
            f"SELECT {', '.join(RECORD_FIELDS)}, finish_window FROM {self._db}.trajectories "
            "WHERE run_id = {run:String} AND (domain, finish_window) IN {pairs:Array(Tuple(String, DateTime('UTC')))} "
            "ORDER BY version DESC LIMIT 1 BY trajectory_id",
            parameters={"run": run_id, "pairs": pairs},
        )
        grouped: dict[tuple[str, datetime], list[TrajectoryRecord]] = defaultdict(list)
        for row in result.result_rows:
            record = _record_from_row(row[:-1])
            if record.status == "finished":
                grouped[(record.domain, _utc(row[-1]))].append(record)
        return grouped

    def _window_consumptions(
        self, run_id: str, windows: list[WindowKey]
    ) -> dict[tuple[str, datetime], list[tuple[Consumption, TrajectoryRecord]]]:
        window_s = self._config.window_s
        starts = sorted({k.window_start for k in windows})
        result = self._client.query(
            f"SELECT trajectory_id, batch_id, trainer_version, consumed_at FROM {self._db}.consumptions "
            "WHERE run_id = {run:String} AND toStartOfInterval(consumed_at, toIntervalSecond({w:UInt32})) "
            "IN {starts:Array(DateTime('UTC'))} LIMIT 1 BY trajectory_id, batch_id",
            parameters={"run": run_id, "w": window_s, "starts": starts},
        )
        consumptions = [Consumption(run_id, str(b), str(t), int(v), _utc(at)) for t, b, v, at in result.result_rows]
        if not consumptions:
            return {}
        records = self._latest_records(run_id, sorted({c.trajectory_id for c in consumptions}))
        wanted = {(k.domain, k.window_start) for k in windows}
        grouped: dict[tuple[str, datetime], list[tuple[Consumption, TrajectoryRecord]]] = defaultdict(list)
        for c in consumptions:
            record = records.get(c.trajectory_id)
            if record is None or record.status != "finished":
                continue
            key = (record.domain, window_start(c.consumed_at, window_s))
            if key in wanted:
                grouped[key].append((c, record))
        return grouped

    def _latest_records(self, run_id: str, trajectory_ids: list[str]) -> dict[str, TrajectoryRecord]:
        result = self._client.query(
            f"SELECT {', '.join(RECORD_FIELDS)} FROM {self._db}.trajectories "
            "WHERE run_id = {run:String} AND trajectory_id IN {ids:Array(String)} "
            "ORDER BY version DESC LIMIT 1 BY trajectory_id",
            parameters={"run": run_id, "ids": trajectory_ids},
        )
        records = (_record_from_row(row) for row in result.result_rows)
        return {r.trajectory_id: r for r in records}

    # -- regressions ---------------------------------------------------------------------------

    def _regressions(self, run_id: str) -> tuple[list[RegressionAlert], list[RegressionAlert]]:
        result = self._client.query(
            f"SELECT domain, policy_version, sum(decided), sum(passed) FROM {self._db}.v_domain_quality "
            "WHERE run_id = {run:String} GROUP BY domain, policy_version",
            parameters={"run": run_id},
        )
        by_domain: dict[str, list[VersionCounts]] = defaultdict(list)
        overall: dict[int, list[int]] = defaultdict(lambda: [0, 0])
        for domain, version, decided, passed in result.result_rows:
            by_domain[str(domain)].append(VersionCounts(int(version), int(decided), int(passed)))
            overall[int(version)][0] += int(decided)
            overall[int(version)][1] += int(passed)
        alerts = detect_regressions(
            run_id, by_domain, [VersionCounts(v, d, p) for v, (d, p) in sorted(overall.items())],
            self._config.regression,
        )
        existing = self._client.query(
            f"SELECT alert_id, state, first_fired_at, domain, policy_version, {', '.join(ALERT_COLUMNS[5:18])} "
            f"FROM {self._db}.v_alerts "
            "WHERE run_id = {run:String}",
            parameters={"run": run_id},
        )
        known = {str(row[0]): row for row in existing.result_rows}
        now = datetime.now(UTC)
        rows: list[list[Any]] = []
        fired: list[RegressionAlert] = []
        for alert in alerts:
            previous = known.get(alert.alert_id)
            evidence = _alert_evidence(alert)
            if previous is not None and previous[1] == "firing" and _same_evidence(list(previous[5:]), evidence):
                continue  # unchanged: no new row
            first = _utc(previous[2]) if previous is not None else now
            if previous is None or previous[1] != "firing":
                fired.append(alert)
            rows.append(_alert_row(alert, "firing", first, now, self._versions.next()))
        current = {a.alert_id for a in alerts}
        resolved: list[RegressionAlert] = []
        for alert_key, row in known.items():
            if alert_key not in current and row[1] == "firing":
                stale = _alert_from_row(run_id, alert_key, row)
                resolved.append(stale)
                rows.append(_alert_row(stale, "resolved", _utc(row[2]), now, self._versions.next()))
        if rows:
            self._client.insert("alerts", rows, column_names=ALERT_COLUMNS, database=self._db)
        return fired, resolved


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _finish_window(record: TrajectoryRecord, window_s: int) -> datetime:
    if record.finished_at is None:
        return EPOCH
    return window_start(record.finished_at, window_s)


def _record_row(record: TrajectoryRecord, finish_window: datetime, version: int) -> list[Any]:
    values = [getattr(record, name) for name in RECORD_FIELDS]
    return [*(list(v) if isinstance(v, tuple) else v for v in values), finish_window, version]


_DATETIME_FIELDS = {"queued_at", "started_at", "finished_at", "verdict_at"}


def _record_from_row(row: Sequence[Any]) -> TrajectoryRecord:
    values = dict(zip(RECORD_FIELDS, row, strict=True))
    for name in _DATETIME_FIELDS:
        if values[name] is not None:
            values[name] = _utc(values[name])
    values["interruption_reasons"] = tuple(values["interruption_reasons"])
    for name in ("env_failed", "model_error", "digest_match", "decided", "passed", "claimed_complete"):
        values[name] = bool(values[name])
    return TrajectoryRecord(**values)


def _alert_evidence(alert: RegressionAlert) -> list[Any]:
    return [list(alert.baseline_versions), alert.baseline_decided, alert.baseline_passed, alert.baseline_pass_rate,
            alert.candidate_decided, alert.candidate_passed, alert.candidate_pass_rate, alert.drop, alert.z,
            alert.p_value, alert.overall_baseline_pass_rate, alert.overall_candidate_pass_rate, alert.overall_rose]


def _alert_row(alert: RegressionAlert, state: str, first: datetime, now: datetime, version: int) -> list[Any]:
    return [alert.alert_id, alert.run_id, alert.domain, alert.policy_version, state, *_alert_evidence(alert),
            first, now, version]


def _same_evidence(stored: list[Any], fresh: list[Any]) -> bool:
    return [list(stored[0]), *stored[1:]] == fresh


def _alert_from_row(run_id: str, alert_key: str, row: Sequence[Any]) -> RegressionAlert:
    evidence = list(row[5:])
    return RegressionAlert(alert_key, run_id, str(row[3]), int(row[4]), tuple(int(v) for v in evidence[0]),
                           *evidence[1:])


def record_message(record: TrajectoryRecord) -> bytes:
    """The derived topic's JSON form of a trajectory record."""
    return orjson.dumps(dataclasses.asdict(record), default=str, option=orjson.OPT_SORT_KEYS)


def alert_message(alert: RegressionAlert, state: str) -> bytes:
    """The alerts topic's JSON form of an alert (with its evidence)."""
    return orjson.dumps({**dataclasses.asdict(alert), "state": state}, option=orjson.OPT_SORT_KEYS)

