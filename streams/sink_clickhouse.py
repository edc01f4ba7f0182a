"""The ClickHouse sink: writes a batch of raw events and dead letters exactly once, or raises to retry."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from clickhouse_connect.driver.client import Client

from infra.clickhouse.inserts import Inserter
from streams.exceptions import SinkWriteError
from streams.records import (
    DEAD_LETTER_COLUMNS,
    RAW_INPUT_COLUMNS,
    Accepted,
    DeadLetter,
    dead_letter_row,
    dedupe,
    ingestion_ms,
    raw_input_row,
)
from streams.state import OwnerState

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What one batch did: rows stored, duplicates dropped, dead letters stored."""

    stored: int
    duplicates: int
    dead_lettered: int


class ClickHouseSink:
    """Idempotent writer of raw events and dead letters.

    A re-delivered event (same event_id) is found by a primary-key lookup on
    (run_id, trajectory_id, occurred_at, event_id) and skipped, so a batch that is written, then
    re-delivered after a crash before its offsets were committed, adds no row.
    One sink owns a partition at a time, so check-then-insert does not race with itself.

    With an ``OwnerState`` the check for events of a trajectory is answered by the owner's cache
    of that trajectory's stored events (loaded from ClickHouse once, then kept up to date by this
    sink); the derivation reads the same cache. Any failure clears the cache, because an insert
    that reported an error may still have landed.
    """

    def __init__(self, *, client: Client, database: str, clock: Callable[[], datetime] | None = None,
                 state: OwnerState | None = None) -> None:
        self._client = client
        self._db = database
        self._clock = clock or (lambda: datetime.now(UTC))
        self._state = state
        self._inserter = Inserter(client, database)
        self._executor: ThreadPoolExecutor | None = None

    @property
    def client(self) -> Client:
        """The ClickHouse client this sink writes with."""
        return self._client

    def write(self, accepted: Sequence[Accepted], dead: Sequence[DeadLetter]) -> WriteResult:
        """Write one batch on the caller's thread; raise SinkWriteError (retry, commit nothing) on any failure."""
        return self.start(accepted, dead, beside=False).result()

    def start(self, accepted: Sequence[Accepted], dead: Sequence[DeadLetter], *, beside: bool = True
              ) -> PendingWrite:
        """Begin writing one batch: its raw events go in on the sink's own thread while the caller goes on.

        The duplicate check runs here, and the batch's new events are added to the owner's cache at
        once, so a derivation can assemble from them while the engine stores them. Nothing may read or
        write ClickHouse for the batch before ``result()`` returned (``InsertGate`` sees to it for the
        derivation): it returns when the raw events (and the dead letters) are stored, or clears the
        cache and raises SinkWriteError. With ``beside=False`` the insert runs on the caller's thread.
        """
        inserting: Future[None] | None = None
        try:
            unique = dedupe(list(accepted))
            fresh = self._drop_stored(unique)
            now = self._clock()
            if fresh:
                # The engine derives the events_raw row from the payload (migrations 0005 and 0007).
                ingested = ingestion_ms(now)
                rows = [raw_input_row(item, ingested) for item in fresh]
                if beside:
                    inserting = self._insert_thread().submit(self._inserter.insert, "events_raw_in", rows,
                                                             RAW_INPUT_COLUMNS)
                else:
                    self._inserter.insert("events_raw_in", rows, RAW_INPUT_COLUMNS)
                self._remember(fresh)
        except Exception as exc:  # every ClickHouse or transport failure means: not written
            if inserting is not None:  # the next attempt must not start while this insert runs
                with contextlib.suppress(Exception):
                    inserting.result()
            raise self._failed(exc) from exc
        return PendingWrite(self, inserting, list(dead), now, stored=len(fresh), duplicates=len(accepted) - len(fresh))

    def _insert_thread(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sink-insert")
        return self._executor

    def _failed(self, exc: BaseException) -> SinkWriteError:
        """Forget the cache (an insert that reported an error may still have landed) and say what failed."""
        if self._state is not None:
            self._state.clear()
        return SinkWriteError(f"ClickHouse write failed: {str(exc).splitlines()[0] if str(exc) else exc!r}")

    def _finish(self, inserting: Future[None] | None, dead: list[DeadLetter], now: datetime) -> int:
        """Wait for the raw events' insert, then store the dead letters; the number of dead letters stored."""
        try:
            if inserting is not None:
                inserting.result()
            dead_fresh = self._drop_stored_dead(dead)
            if dead_fresh:
                drows = [dead_letter_row(item, now) for item in dead_fresh]
                self._inserter.insert("dead_letters", drows, DEAD_LETTER_COLUMNS)
        except Exception as exc:  # every ClickHouse or transport failure means: not written
            raise self._failed(exc) from exc
        return len(dead_fresh)

    def _drop_stored(self, items: list[Accepted]) -> list[Accepted]:
        if not items or self._state is None:
            return self._drop_stored_by_query(items)
        by_trajectory: dict[str, set[str]] = {}
        others: list[Accepted] = []
        for item in items:
            tid = getattr(item.event, "trajectory_id", "")
            if tid:
                by_trajectory.setdefault(item.event.run_id, set()).add(str(tid))
            else:
                others.append(item)
        stored: set[int] = set()  # event ids' 128-bit values, as the cache keys them
        self._state.before_lookups(sum(map(len, by_trajectory.values())))  # the batches before are stored
        for run_id, tids in by_trajectory.items():
            for known in self._state.trajectories(run_id, tids, events=True).values():
                assert known.events is not None
                stored.update(known.events)
        kept_others = {id(i) for i in self._drop_stored_by_query(others)}
        return [i for i in items if (i.event.event_id.int not in stored if getattr(i.event, "trajectory_id", "")
                                     else id(i) in kept_others)]

    def _remember(self, fresh: list[Accepted]) -> None:
        """Add stored events to the cached trajectories (those not cached load them when needed)."""
        if self._state is None:
            return
        for item in fresh:
            tid = getattr(item.event, "trajectory_id", "")
            if tid:
                self._state.remember_event(item.event.run_id, str(tid), item.event)

    def _drop_stored_by_query(self, items: list[Accepted]) -> list[Accepted]:
        if not items:
            return items
        runs = sorted({i.event.run_id for i in items})
        trajectories = sorted({str(getattr(i.event, "trajectory_id", "")) for i in items})
        times = sorted({i.event.occurred_at for i in items})
        ids = [str(i.event.event_id) for i in items]
        result = self._client.query(
            f"SELECT DISTINCT event_id FROM `{self._db}`.events_raw "
            "WHERE run_id IN {runs:Array(String)} AND trajectory_id IN {trajectories:Array(String)} "
            "AND occurred_at IN {times:Array(DateTime64(6, 'UTC'))} AND event_id IN {ids:Array(UUID)}",
            parameters={"runs": runs, "trajectories": trajectories, "times": times, "ids": ids},
        )
        stored = {str(row[0]) for row in result.result_rows}
        if not stored:
            return items
        return [i for i in items if str(i.event.event_id) not in stored]

    def _drop_stored_dead(self, items: list[DeadLetter]) -> list[DeadLetter]:
        if not items:
            return items
        seen: set[tuple[str, int, int]] = set()
        unique: list[DeadLetter] = []
        for item in items:
            ref = (item.source.topic, item.source.partition, item.source.offset)
            if ref not in seen:
                seen.add(ref)
                unique.append(item)
        topics = sorted({i.source.topic for i in unique})
        offsets = sorted({i.source.offset for i in unique})
        result = self._client.query(
            f"SELECT source_topic, source_partition, source_offset FROM `{self._db}`.dead_letters "
            "WHERE source_topic IN {topics:Array(String)} AND source_offset IN {offsets:Array(UInt64)}",
            parameters={"topics": topics, "offsets": offsets},
        )
        stored = {(str(t), int(p), int(o)) for t, p, o in result.result_rows}
        return [i for i in unique if (i.source.topic, i.source.partition, i.source.offset) not in stored]


class PendingWrite:
    """A batch whose raw events are being inserted (``ClickHouseSink.start``)."""

    def __init__(self, sink: ClickHouseSink, inserting: Future[None] | None, dead: list[DeadLetter], now: datetime,
                 *, stored: int, duplicates: int) -> None:
        self._sink = sink
        self._inserting = inserting
        self._dead = dead
        self._now = now
        self._stored = stored
        self._duplicates = duplicates
        self._result: WriteResult | None = None

    def result(self) -> WriteResult:
        """Wait until the batch is stored and say what it did; SinkWriteError (cache cleared) if it was not.

        Once it has returned, later calls return the same without writing again.
        """
        if self._result is None:
            dead_lettered = self._sink._finish(self._inserting, self._dead, self._now)
            self._result = WriteResult(self._stored, self._duplicates, dead_lettered)
        return self._result

    def settle(self) -> None:
        """Wait for the insert in flight, whatever its outcome (before the batch is tried again)."""
        if self._inserting is not None:
            # The caller is already failing the batch; its next attempt finds whatever landed.
            with contextlib.suppress(Exception):
                self._inserting.result()


class InsertGate:
    """Proxy of a ClickHouse client whose next call first waits for the raw events' insert in flight.

    The owner's cache and the derivation read and write through it. While ``ClickHouseSink.start``
    has a batch's raw events going in on the sink's thread, the derivation computes from the cache;
    its first ClickHouse call, a read (the run's policy facts come from ``events_raw``) or a write,
    waits for the insert (``arm``), so it sees ClickHouse as it is once the raw events are stored, and
    the client is never called from two threads at once. In steady state the derivation reads
    nothing before its first write, and the engine's insert runs beside its Python.
    """

    def __init__(self, client: Any) -> None:
        self._client = client
        self._wait: Callable[[], object] | None = None

    def arm(self, wait: Callable[[], object]) -> None:
        """The next call (from any user of this proxy) runs ``wait()`` first, which may raise to stop it."""
        self._wait = wait

    def disarm(self) -> None:
        """Calls go straight through again."""
        self._wait = None

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if not callable(attribute):
            return attribute

        def gated(*args: Any, **kwargs: Any) -> Any:
            wait, self._wait = self._wait, None
            if wait is not None:
                wait()
            return attribute(*args, **kwargs)

        return gated


def retry_until_done(
    action: Callable[[], T],
    *,
    should_stop: Callable[[], bool],
    initial_backoff: float = 0.2,
    max_backoff: float = 10.0,
    sleep: Callable[[float], Any] = time.sleep,
) -> T | None:
    """Run ``action`` until it succeeds (backoff doubling up to max_backoff); None when asked to stop first.

    Any exception means "not written": the caller keeps the batch uncommitted and nothing is skipped.
    """
    backoff = initial_backoff
    attempt = 0
    while True:
        try:
            return action()
        except Exception as exc:
            attempt += 1
            log.warning("write failed (attempt %d, retry in %.1fs): %s", attempt, backoff,
                        str(exc).splitlines()[0] if str(exc) else repr(exc), exc_info=attempt == 1)
        if should_stop():
            return None
        sleep(backoff)
        backoff = min(backoff * 2, max_backoff)
