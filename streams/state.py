"""What the owning worker remembers between batches: bounded read-through caches over ClickHouse.

ClickHouse stays the truth. Every entry is loaded from it on first use and afterwards kept equal
to it because the owner is the only writer: each batch changes the cached entries it touches in
the same step as it writes them. When a write fails, the caller clears everything (``clear``) and
the next attempt reloads what it needs, so a cache can never be ahead of or behind what is stored
for longer than one failed attempt. A worker that starts, or takes over the embedded engine from a
dead owner, starts empty.

Caching is only sound with one writer: it is on for the embedded engine (one owning process by
construction) and off (``enabled=False``: every read goes to ClickHouse, as if each batch started
empty) for a ClickHouse server, which several workers may write to at once.

Entries are bounded by count (least recently used out first), so memory stays flat however long
the run: an evicted trajectory or window is simply read again if a late event touches it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar, cast

import numpy as np

from schemas import Envelope, PolicyVersionPublished, RunConfigured, decode_event
from streams.metrics import Consumption, RunConfig
from streams.trajectory import CachedEvent, TrajectoryRecord, VersionTimeline, cached_copy, window_start

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(TrajectoryRecord))
IN_LIST_MAX = 10_000
"""Most trajectory ids per lookup query. Measured on the embedded engine (350,000 rows): an
``IN {ids:Array(String)}`` of 10,000 or 20,000 ids takes 0.1-0.2 s, of 50,000 ids 75-80 s; a batch
that re-derives every trajectory finished since a late policy version can name more than that."""


def rows_by_ids(client: Any, sql: str, run_id: str, ids: Sequence[str]) -> Iterator[Sequence[Any]]:
    """The rows of ``sql`` (parameters ``run`` and ``ids``) for ``ids`` sorted, in queries of IN_LIST_MAX ids."""
    ordered = sorted(ids)
    for start in range(0, len(ordered), IN_LIST_MAX):
        yield from client.query(sql, parameters={"run": run_id, "ids": ordered[start:start + IN_LIST_MAX]}).result_rows
_DATETIME_FIELDS = ("queued_at", "started_at", "finished_at", "verdict_at")
_BOOL_FIELDS = ("env_failed", "model_error", "digest_match", "decided", "passed", "claimed_complete")

WindowRef = tuple[str, datetime]
"""(domain, window_start) of one metric window of a run."""
ConsumptionRef = tuple[str, str]
"""(trajectory_id, batch_id): one consumption."""
QualityCounts = dict[int, tuple[int, int]]
"""policy_version -> (decided, passed)."""


class Lru(Generic[K, V]):
    """A dict bounded by entry count; the least recently used entry leaves first (capacity 0: keeps nothing)."""

    def __init__(self, capacity: int, evicted: Callable[[K, V], None] | None = None) -> None:
        self.capacity = max(0, capacity)
        self._data: OrderedDict[K, V] = OrderedDict()
        self._evicted = evicted

    def get(self, key: K) -> V | None:
        value = self._data.get(key)
        if value is not None:
            self._data.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        if self.capacity == 0:
            return
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.capacity:
            gone = self._data.popitem(last=False)
            if self._evicted is not None:
                self._evicted(*gone)

    def pop(self, key: K) -> V | None:
        return self._data.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def clear(self) -> None:
        self._data.clear()

    def __len__(self) -> int:
        return len(self._data)


@dataclass(slots=True)
class TrajectoryState:
    """One trajectory as stored: its distinct events, its current record and its consumptions.

    ``events`` and ``consumed`` are None until loaded; ``record_loaded`` tells whether ``record``
    (None: no record stored yet) was read.
    """

    events: dict[int, CachedEvent] | None = None
    """Cached copies, by the event id's 128-bit value (hashed in C; ``UUID.__hash__`` is Python)."""
    record: TrajectoryRecord | None = None
    record_loaded: bool = False
    consumed: dict[str, Consumption] | None = None


@dataclass(slots=True)
class RunFacts:
    """The run's stored policy events that its timeline and configuration are built from.

    Kept so that a batch's new policy events are added to them instead of the run's policy events being
    read again: with a policy version every few minutes, that read was ~5% of a live worker's owner thread.
    """

    published: dict[int, PolicyVersionPublished] = field(default_factory=dict)
    """The stored publications by event id (128-bit value): one per version, but for republications."""
    configured: RunConfigured | None = None
    """The latest stored configuration (by occurred_at, then event id)."""

    def add(self, events: Iterable[Envelope]) -> None:
        """Take stored policy events into account (others are ignored; a known event changes nothing)."""
        for event in events:
            if isinstance(event, PolicyVersionPublished):
                self.published[event.event_id.int] = event
            elif isinstance(event, RunConfigured) and (
                    self.configured is None or _config_order(event) > _config_order(self.configured)):
                self.configured = event

    def timeline(self) -> VersionTimeline:
        """When each version was first published."""
        return VersionTimeline.from_events(self.published.values())

    def config(self, default_staleness_bound: int) -> RunConfig:
        """The latest configuration's weights and staleness bound (none stored: no weights, the default)."""
        if self.configured is None:
            return RunConfig({}, default_staleness_bound)
        return RunConfig(dict(self.configured.domain_weights), self.configured.staleness_bound)


def _config_order(event: RunConfigured) -> tuple[datetime, str]:
    return event.occurred_at, str(event.event_id)


@dataclass(slots=True)
class RunState:
    """Facts of one run: policy version timeline, configuration, regression totals, alerts."""

    timeline: VersionTimeline
    config: RunConfig
    facts: RunFacts
    quality: dict[tuple[str, int], list[int]] | None = None
    """(domain, policy_version) -> [decided, passed] summed over the run's windows."""
    alerts: dict[str, tuple[Any, ...]] | None = None
    """alert_id -> (state, first_fired_at, domain, policy_version, *evidence) of the newest stored row."""
    windows: dict[WindowRef, QualityCounts] = field(default_factory=dict)
    """Domain-quality counts of recently recomputed windows (bounded by the owner)."""
    horizon: datetime | None = None
    """The latest metric window stored for the run (None: none yet). A later window has no metric rows
    and no trajectory finishing in it (metrics are written before trajectory records)."""
    consumed_until: datetime | None = None
    """The latest consumption time stored for the run (None: none yet)."""
    orphans: set[str] = field(default_factory=set)
    """Trajectories consumed by a training batch before any of their events was stored."""


@dataclass(frozen=True, slots=True)
class CacheLimits:
    """How much the owner keeps in memory."""

    trajectories: int = 10_000
    windows: int = 4_096
    runs: int = 64
    records: int = 20_000
    """Records kept from trajectories the trajectory cache let go (their events and consumptions are not
    kept): a live window's consumptions name more trajectories than the trajectory cache holds."""

    @classmethod
    def disabled(cls) -> CacheLimits:
        """Keep nothing between batches (a ClickHouse server with possibly several writers)."""
        return cls(0, 0, 0, 0)


class LookedUp:
    """Trajectories this owner has looked up the stored events of, per run: a Bloom filter over (run, trajectory).

    The sink looks up every trajectory of a batch before storing its events (``OwnerState.trajectories`` with
    ``events=True``: from the cache, else from ``events_raw``), so a trajectory this owner has stored an event
    of is one it looked up before. When the owner first sees a run, it puts the run's trajectories that have
    stored events into the filter (``begin``: none for a run that begins under this worker, all of them for a
    run a worker before this one stored, e.g. after a restart). From then on a trajectory of that run the
    filter never saw has no stored event: the owner is the only writer (the caches' own condition), and
    ``first_lookups`` answers that without a query. The filter can only err the safe way: a trajectory it
    takes for one looked up before is read from ClickHouse as before (and comes back empty).

    Past ``capacity`` trajectories its false positives would grow, so it starts over empty (``rotations``).
    Between batches (``make_room``, when every trajectory looked up is stored) it forgets the runs too, and
    each is begun again at its next lookup from what ClickHouse then holds. Within a batch
    (``first_lookups``), where trajectories looked up are not stored yet, the runs seen so far get no answer
    until the next start-over between batches. A run with more stored trajectories than ``reload_limit()``
    gets no answer until the next start-over. At the bench's 4.66 events per trajectory the capacity is
    ~28,000,000 events, ~1.6 h of a worker at 5,000 events/s.

    Kept when the caches are cleared after a failed write: a trajectory of that batch counts as looked up,
    which is again the safe way.
    """

    def __init__(self, *, bits: int = 1 << 26, hashes: int = 7, capacity: int = 6_000_000) -> None:
        self._bits = np.zeros(bits // 8, dtype=np.uint8)  # 8 MiB for 2**26 bits: fixed, however long the run
        self._size = np.uint64(bits)
        self._steps = np.arange(hashes, dtype=np.uint64)
        self._capacity = capacity
        self._count = 0
        self._born: dict[str, bool] = {}
        self._unanswered = False
        """Runs were left without answers by a start-over within a batch: forget them at the next batch."""
        self.rotations = 0
        """How many times the filter filled up and started over."""

    def knows(self, run_id: str) -> bool:
        """Whether the run was begun (``begin``) since the filter last forgot its runs."""
        return run_id in self._born

    def reload_limit(self) -> int:
        """The most stored trajectories ``begin`` takes for a run: half the capacity, or what is left of it."""
        return max(0, min(self._capacity // 2, self._capacity - self._count))

    def begin(self, run_id: str, stored: Iterable[Sequence[str]]) -> bool:
        """First sight of the run: ``stored`` yields, in blocks, the ids of its trajectories with stored events
        (all of them; repeats allowed). True when the filter answers for the run from now on; False when they
        were more than ``reload_limit()`` (it stops reading them then)."""
        self._born[run_id] = False
        limit = self.reload_limit()
        added = 0
        for block in stored:
            unique = list(dict.fromkeys(block))
            added += sum(self._mark(run_id, unique))
            if added > limit:
                return False
        self._born[run_id] = True
        return True

    def make_room(self, lookups: int) -> None:
        """Between batches, when every trajectory looked up is stored: start over if ``lookups`` more would not
        fit (or a start-over within a batch left runs without answers). The runs are then forgotten, and the
        owner begins each again at its next lookup, from what ClickHouse holds."""
        if self._unanswered or self._count + lookups > self._capacity:
            self._clear()
            self._born.clear()

    def first_lookups(self, run_id: str, trajectory_ids: Sequence[str]) -> list[bool]:
        """For each trajectory, whether it certainly has no stored event (never looked up, in a run begun with
        all of its stored trajectories); every one of them counts as looked up from now on."""
        if not self._born.get(run_id) or not trajectory_ids:
            return [False] * len(trajectory_ids)
        if self._count + len(trajectory_ids) > self._capacity:
            # Trajectories looked up earlier in this batch are not stored yet, so no run can be begun again
            # from ClickHouse now: none gets answers until the next batch starts the filter over again.
            self._clear()
            for known in self._born:
                self._born[known] = False
            self._unanswered = True
            return [False] * len(trajectory_ids)
        return self._mark(run_id, trajectory_ids)

    def _mark(self, run_id: str, trajectory_ids: Sequence[str]) -> list[bool]:
        """Add the trajectories (distinct ids) to the filter; for each, whether the filter lacked it before."""
        if not trajectory_ids:
            return []
        digests = b"".join(hashlib.blake2b(f"{run_id}\x1f{tid}".encode(errors="surrogatepass"), digest_size=16).digest()
                           for tid in trajectory_ids)
        halves = np.frombuffer(digests, dtype="<u8")
        with np.errstate(over="ignore"):  # double hashing modulo 2**64, then modulo the filter's size
            positions = (halves[0::2, None] + self._steps[None, :] * halves[1::2, None]) % self._size
        byte = (positions >> np.uint64(3)).astype(np.intp)
        mask = np.left_shift(np.uint8(1), (positions & np.uint64(7)).astype(np.uint8))
        present = ((self._bits[byte] & mask) != 0).all(axis=1)  # before marking: ids of one call do not meet
        np.bitwise_or.at(self._bits, byte.ravel(), mask.ravel())
        result: list[bool] = (~present).tolist()
        self._count += sum(result)  # what the filter holds (an id looked up again adds nothing)
        return result

    def _clear(self) -> None:
        self._bits[:] = 0
        self._count = 0
        self._unanswered = False
        self.rotations += 1


class OwnerState:
    """Read-through caches for the sink and the derivation; every method runs on the owner thread."""

    def __init__(self, *, client: Any, database: str, window_s: int, default_staleness_bound: int,
                 limits: CacheLimits | None = None) -> None:
        self.client = client
        self.db = database
        self.window_s = window_s
        self.default_staleness_bound = default_staleness_bound
        self.limits = limits or CacheLimits()
        self._trajectories: Lru[tuple[str, str], TrajectoryState] = Lru(self.limits.trajectories, self._let_go)
        self._records: Lru[tuple[str, str], TrajectoryRecord] = Lru(self.limits.records)
        """Records of trajectories the trajectory cache let go; one taken back leaves this cache."""
        self._members: Lru[tuple[str, str, datetime], dict[str, TrajectoryRecord]] = Lru(self.limits.windows)
        self._consumption_windows: Lru[tuple[str, datetime], dict[ConsumptionRef, Consumption]] = \
            Lru(self.limits.windows)
        self._runs: Lru[str, RunState] = Lru(self.limits.runs)
        self.loads: defaultdict[str, int] = defaultdict(int)
        """Rows read per kind (for tests and the benchmark)."""
        self.looked_up = LookedUp()
        """Which trajectories may have stored events, so that new ones are not looked up (``_load_events``)."""
        self.lookups_skipped = 0
        """Trajectories whose stored events were not read because they certainly had none."""

    @property
    def enabled(self) -> bool:
        """Whether anything is kept between batches."""
        return self.limits.trajectories > 0

    def clear(self) -> None:
        """Forget everything (after a failed write: the next attempt reloads from ClickHouse)."""
        self._trajectories.clear()
        self._records.clear()
        self._members.clear()
        self._consumption_windows.clear()
        self._runs.clear()

    # -- trajectories --------------------------------------------------------------------------

    def trajectories(self, run_id: str, trajectory_ids: Iterable[str], *, events: bool = False,
                     record: bool = False, consumed: bool = False) -> dict[str, TrajectoryState]:
        """The states of these trajectories with the asked parts loaded (one query per missing part)."""
        states: dict[str, TrajectoryState] = {}
        for tid in trajectory_ids:
            state = self._trajectories.get((run_id, tid))
            if state is None:
                state = TrajectoryState()
                kept = self._records.pop((run_id, tid))
                if kept is not None:
                    state.record, state.record_loaded = kept, True
                self._trajectories.put((run_id, tid), state)
            states[tid] = state
        if events:
            self._load_events(run_id, [t for t, s in states.items() if s.events is None], states)
            if self.enabled:
                # A trajectory with no stored event has no stored record either, and no consumption
                # unless a training batch named it first (the run's orphans).
                orphans = self.run(run_id).orphans
                for tid, known in states.items():
                    if known.events == {} and not known.record_loaded:
                        known.record_loaded = True
                        if tid not in orphans:
                            known.consumed = {}
        if record:
            self._load_records(run_id, [t for t, s in states.items() if not s.record_loaded], states)
        if consumed:
            self._load_consumed(run_id, [t for t, s in states.items() if s.consumed is None], states)
        return states

    def _let_go(self, key: tuple[str, str], state: TrajectoryState) -> None:
        if state.record is not None:
            self._records.put(key, state.record)

    def record_written(self, run_id: str, trajectory_id: str, state: TrajectoryState, record: TrajectoryRecord
                       ) -> None:
        """``record`` is stored now: the trajectory's state holds it, and so does the record kept from
        that state if the trajectory cache let it go meanwhile (during the same batch)."""
        state.record = record
        key = (run_id, trajectory_id)
        if key in self._records:
            self._records.put(key, record)

    def remember_event(self, run_id: str, trajectory_id: str, event: Envelope) -> None:
        """Add a stored event to its trajectory if that trajectory's events are cached (compacted,
        like every event the cache keeps); otherwise nothing: they load when next needed."""
        known = self._trajectories.get((run_id, trajectory_id))
        if known is not None and known.events is not None:
            known.events[event.event_id.int] = cached_copy(event)

    def _load_events(self, run_id: str, missing: list[str], states: dict[str, TrajectoryState]) -> None:
        if not missing:
            return
        for tid in missing:
            states[tid].events = {}
        if self.enabled:
            if not self.looked_up.knows(run_id):
                self._begin_run(run_id)
            new = self.looked_up.first_lookups(run_id, missing)
            self.lookups_skipped += sum(new)
            missing = [tid for tid, is_new in zip(missing, new, strict=True) if not is_new]
            if not missing:
                return
        sql = (f"SELECT trajectory_id, payload FROM {self.db}.events_raw "
               "WHERE run_id = {run:String} AND trajectory_id IN {ids:Array(String)}")
        for tid, payload in rows_by_ids(self.client, sql, run_id, missing):
            event = cached_copy(decode_event(payload.encode() if isinstance(payload, str) else payload))
            events = states[str(tid)].events
            assert events is not None
            events[event.event_id.int] = event
            self.loads["events"] += 1

    def before_lookups(self, lookups: int) -> None:
        """A batch is about to look up ``lookups`` trajectories, and every trajectory looked up before is stored:
        the filter of looked-up trajectories may start over now (``LookedUp.make_room``)."""
        if self.enabled:
            self.looked_up.make_room(lookups)

    def _begin_run(self, run_id: str) -> None:
        """Put the run's trajectories with stored events into the filter (streamed: memory stays flat), so that
        its new trajectories need no query; with too many of them the run gets no answers (and is read)."""
        started = time.perf_counter()
        rows = 0

        def blocks() -> Iterator[Sequence[str]]:
            nonlocal rows
            sql = (f"SELECT trajectory_id FROM {self.db}.events_raw "
                   "WHERE run_id = {run:String} AND trajectory_id != ''")
            with self.client.query_column_block_stream(sql, parameters={"run": run_id}) as stream:
                for block in stream:
                    rows += len(block[0])
                    yield block[0]

        limit = self.looked_up.reload_limit()
        answers = self.looked_up.begin(run_id, blocks())
        self.loads["stored_trajectory_ids"] += rows
        if rows:
            log.info("run %s: read the trajectory ids of %d stored events in %.1f s; %s", run_id, rows,
                     time.perf_counter() - started,
                     "its new trajectories are not looked up in events_raw" if answers else
                     f"more than {limit} trajectories: each is looked up in events_raw until the filter starts over")

    def _load_records(self, run_id: str, missing: list[str], states: dict[str, TrajectoryState]) -> None:
        if not missing:
            return
        for tid in missing:
            states[tid].record = None
            states[tid].record_loaded = True
        # trajectories_latest keeps the newest record per (run, trajectory) in its sorting key.
        sql = (f"SELECT {', '.join(RECORD_FIELDS)} FROM {self.db}.trajectories_latest FINAL "
               "WHERE run_id = {run:String} AND trajectory_id IN {ids:Array(String)}")
        for row in rows_by_ids(self.client, sql, run_id, missing):
            found = record_from_row(row)
            if found.status != "superseded":
                states[found.trajectory_id].record = found
            self.loads["records"] += 1

    def _load_consumed(self, run_id: str, missing: list[str], states: dict[str, TrajectoryState]) -> None:
        if not missing:
            return
        for tid in missing:
            states[tid].consumed = {}
        sql = (f"SELECT trajectory_id, batch_id, trainer_version, consumed_at FROM {self.db}.consumptions "
               "WHERE run_id = {run:String} AND trajectory_id IN {ids:Array(String)}")
        for tid, batch_id, version, at in rows_by_ids(self.client, sql, run_id, missing):
            consumed = states[str(tid)].consumed
            assert consumed is not None
            consumed[str(batch_id)] = Consumption(run_id, str(batch_id), str(tid), int(version), utc(at))
            self.loads["consumed"] += 1

    # -- windows -------------------------------------------------------------------------------

    def _past(self, latest_stored: datetime | None, start: datetime) -> bool:
        """Whether nothing can be stored at ``start``: it is later than everything stored (caching only)."""
        return self.enabled and (latest_stored is None or start > latest_stored)

    def window_members(self, run_id: str, state: RunState,
                       keys: Iterable[WindowRef]) -> dict[WindowRef, dict[str, TrajectoryRecord]]:
        """Finished current records per window (trajectory_id -> record), as stored."""
        out, missing = _split(keys, lambda key: self._members.get((run_id, *key)),
                              lambda key: self._past(state.horizon, key[1]),
                              lambda key, empty: self._members.put((run_id, *key), empty))
        if missing:
            loaded: dict[WindowRef, dict[str, TrajectoryRecord]] = {key: {} for key in missing}
            result = self.client.query(
                f"SELECT {', '.join(RECORD_FIELDS)}, finish_window FROM {self.db}.trajectories "
                "WHERE run_id = {run:String} "
                "AND (domain, finish_window) IN {pairs:Array(Tuple(String, DateTime('UTC')))} "
                "ORDER BY version DESC LIMIT 1 BY trajectory_id",
                parameters={"run": run_id, "pairs": sorted(missing)},
            )
            for row in result.result_rows:
                found = record_from_row(row[:-1])
                if found.status == "finished":
                    loaded[(found.domain, utc(row[-1]))][found.trajectory_id] = found
            self.loads["members"] += len(result.result_rows)
            for key, members in loaded.items():
                self._members.put((run_id, *key), members)
                out[key] = members
        return out

    def consumption_windows(self, run_id: str, state: RunState,
                            starts: Iterable[datetime]) -> dict[datetime, dict[ConsumptionRef, Consumption]]:
        """Consumptions per window start (all domains), as stored."""
        out, missing = _split(starts, lambda start: self._consumption_windows.get((run_id, start)),
                              lambda start: self._past(state.consumed_until, start),
                              lambda start, empty: self._consumption_windows.put((run_id, start), empty))
        if missing:
            loaded: dict[datetime, dict[ConsumptionRef, Consumption]] = {start: {} for start in missing}
            result = self.client.query(
                f"SELECT trajectory_id, batch_id, trainer_version, consumed_at FROM {self.db}.consumptions "
                "WHERE run_id = {run:String} AND consumed_at >= {lo:DateTime64(6, 'UTC')} "
                "AND consumed_at < {hi:DateTime64(6, 'UTC')} "
                "AND toStartOfInterval(consumed_at, toIntervalSecond({w:UInt32})) IN {starts:Array(DateTime('UTC'))}",
                parameters={"run": run_id, "lo": min(missing), "hi": max(missing) + timedelta(seconds=self.window_s),
                            "w": self.window_s, "starts": sorted(missing)},
            )
            for tid, batch_id, version, at in result.result_rows:
                consumption = Consumption(run_id, str(batch_id), str(tid), int(version), utc(at))
                start = window_start(consumption.consumed_at, self.window_s)
                if start in loaded:
                    loaded[start][(consumption.trajectory_id, consumption.batch_id)] = consumption
            self.loads["consumption_windows"] += len(result.result_rows)
            for start, found in loaded.items():
                self._consumption_windows.put((run_id, start), found)
                out[start] = found
        return out

    def add_consumptions(self, consumptions: Sequence[Consumption]) -> None:
        """Put new consumptions into the cached windows they fall in (others load them when needed)."""
        for c in consumptions:
            found = self._consumption_windows.get((c.run_id, window_start(c.consumed_at, self.window_s)))
            if found is not None:
                found[(c.trajectory_id, c.batch_id)] = c

    # -- runs ----------------------------------------------------------------------------------

    def run(self, run_id: str) -> RunState:
        """The run's facts (loaded from its stored policy events on first use)."""
        state = self._runs.get(run_id)
        if state is None:
            facts = self._run_facts(run_id)
            state = RunState(facts.timeline(), facts.config(self.default_staleness_bound), facts)
            if self.enabled:
                self._load_run_extent(run_id, state)
            self._runs.put(run_id, state)
        return state

    def _load_run_extent(self, run_id: str, state: RunState) -> None:
        """Where the run's stored windows and consumptions end, and its orphan consumptions (once per run)."""
        horizon, consumed_until = self.client.query(
            f"SELECT (SELECT maxOrNull(window_start) FROM {self.db}.m_window_metrics WHERE run_id = {{run:String}}), "
            f"(SELECT maxOrNull(consumed_at) FROM {self.db}.consumptions WHERE run_id = {{run:String}})",
            parameters={"run": run_id},
        ).result_rows[0]
        state.horizon = utc(horizon) if horizon is not None else None
        state.consumed_until = utc(consumed_until) if consumed_until is not None else None
        if consumed_until is not None:
            result = self.client.query(
                f"SELECT DISTINCT trajectory_id FROM {self.db}.consumptions WHERE run_id = {{run:String}} "
                f"AND trajectory_id NOT IN (SELECT DISTINCT trajectory_id FROM {self.db}.events_raw "
                "WHERE run_id = {run:String} AND trajectory_id != '')",
                parameters={"run": run_id},
            )
            state.orphans = {str(r[0]) for r in result.result_rows}

    def stored_windows(self, state: RunState, starts: Iterable[datetime]) -> None:
        """Metric windows up to the latest of ``starts`` are now stored."""
        latest = max(starts, default=None)
        if latest is not None and (state.horizon is None or latest > state.horizon):
            state.horizon = latest

    def stored_consumptions(self, state: RunState, consumptions: Sequence[Consumption],
                            orphans: Iterable[str]) -> None:
        """These consumptions are now stored (``orphans``: their trajectories had no stored event)."""
        latest = max((c.consumed_at for c in consumptions), default=None)
        if latest is not None and (state.consumed_until is None or latest > state.consumed_until):
            state.consumed_until = latest
        state.orphans.update(orphans)

    def run_facts_stored(self, run_id: str, events: Sequence[Envelope]) -> None:
        """Policy events of the run (versions, configuration) were just stored: a cached run takes them in."""
        state = self._runs.get(run_id)
        if state is not None:
            state.facts.add(events)
            state.timeline = state.facts.timeline()
            state.config = state.facts.config(self.default_staleness_bound)

    def _run_facts(self, run_id: str) -> RunFacts:
        result = self.client.query(
            f"SELECT payload FROM {self.db}.events_raw WHERE run_id = {{run:String}} "
            "AND trajectory_id = '' AND event_type IN ('policy.version_published', 'policy.run_configured')",
            parameters={"run": run_id},
        )
        facts = RunFacts()
        facts.add(decode_event(payload) for (payload,) in result.result_rows)
        self.loads["run_facts"] += 1
        return facts

    def quality_totals(self, run_id: str, state: RunState) -> dict[tuple[str, int], list[int]]:
        """(domain, policy_version) -> [decided, passed] over all of the run's stored windows."""
        if state.quality is None:
            result = self.client.query(
                f"SELECT domain, policy_version, sum(decided), sum(passed) FROM {self.db}.v_domain_quality "
                "WHERE run_id = {run:String} GROUP BY domain, policy_version",
                parameters={"run": run_id},
            )
            state.quality = {(str(d), int(v)): [int(n), int(p)] for d, v, n, p in result.result_rows}
        return state.quality

    def window_quality(self, run_id: str, state: RunState,
                       keys: Iterable[WindowRef]) -> dict[WindowRef, QualityCounts]:
        """Stored domain-quality counts of these windows (empty when a window has none)."""
        out, missing = _split(keys, state.windows.get, lambda key: self._past(state.horizon, key[1]))
        if missing:
            loaded: dict[WindowRef, QualityCounts] = {key: {} for key in missing}
            result = self.client.query(
                f"SELECT domain, window_start, policy_version, decided, passed FROM {self.db}.v_domain_quality "
                "WHERE run_id = {run:String} "
                "AND (domain, window_start) IN {pairs:Array(Tuple(String, DateTime('UTC')))}",
                parameters={"run": run_id, "pairs": sorted(missing)},
            )
            for domain, start, version, decided, passed in result.result_rows:
                loaded.setdefault((str(domain), utc(start)), {})[int(version)] = (int(decided), int(passed))
            out.update(loaded)
        return out

    def remember_window_quality(self, state: RunState, key: WindowRef, counts: QualityCounts) -> None:
        """Keep a window's new counts (bounded: the oldest remembered windows are dropped)."""
        windows = state.windows
        windows.pop(key, None)
        windows[key] = counts
        while len(windows) > self.limits.windows:
            del windows[next(iter(windows))]

    def alerts(self, run_id: str, state: RunState, columns: Sequence[str]) -> dict[str, tuple[Any, ...]]:
        """alert_id -> (state, first_fired_at, domain, policy_version, *columns) of the run's current alerts."""
        if state.alerts is None:
            result = self.client.query(
                f"SELECT alert_id, state, first_fired_at, domain, policy_version, {', '.join(columns)} "
                f"FROM {self.db}.v_alerts WHERE run_id = {{run:String}}",
                parameters={"run": run_id},
            )
            state.alerts = {str(row[0]): tuple(row[1:]) for row in result.result_rows}
        return state.alerts


KT = TypeVar("KT", bound=Hashable)
VT = TypeVar("VT", bound=dict[Any, Any])


def _split(keys: Iterable[KT], cached: Callable[[KT], VT | None], known_empty: Callable[[KT], bool],
           remember: Callable[[KT, VT], None] | None = None) -> tuple[dict[KT, VT], list[KT]]:
    """The entries answered from memory (cached, or known to have nothing stored) and the keys to read.

    A known-empty entry is a new empty dict, kept with ``remember`` when given (later writes fill it).
    """
    out: dict[KT, VT] = {}
    missing: list[KT] = []
    for key in keys:
        found = cached(key)
        if found is None and known_empty(key):
            found = cast(VT, {})
            if remember is not None:
                remember(key, found)
        if found is None:
            missing.append(key)
        else:
            out[key] = found
    return out, missing


def utc(value: datetime) -> datetime:
    """The same instant as an aware UTC datetime."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def record_from_row(row: Sequence[Any]) -> TrajectoryRecord:
    """A trajectory record from a ``trajectories`` row in RECORD_FIELDS order."""
    values = dict(zip(RECORD_FIELDS, row, strict=True))
    for name in _DATETIME_FIELDS:
        if values[name] is not None:
            values[name] = utc(values[name])
    values["interruption_reasons"] = tuple(values["interruption_reasons"])
    for name in _BOOL_FIELDS:
        values[name] = bool(values[name])
    return TrajectoryRecord(**values)
