"""Raw topics read in batches by a confluent-kafka consumer below Faust's stream (``ROLLOUT_INGEST=direct``, default).

Faust's stream costs tens of microseconds of Python per message (conductor, channel queue, stream
iteration, acks) before the worker does anything with it; ``bench/faust_floor.py`` measures that
ceiling. In ``direct`` mode the worker's Faust app still runs everything else (web views, timers,
the producer of dead letters, start-up and shutdown), but the raw topics are read by a librdkafka
consumer in batches of up to ``ROLLOUT_SINK_BATCH_SIZE`` messages or ``ROLLOUT_SINK_BATCH_SECONDS``,
handed to the same ``handle`` as the Faust agent, and their offsets committed synchronously only
after ClickHouse holds the batch. The guarantees are the agent's: a crash re-delivers at most the
uncommitted tail, which the idempotent sink and derivation turn into no new rows; a rebalance
that moves a partition while its batch is being stored makes that commit fail (logged), and the
partition's new reader stores the batch again, to the same effect.

All consumer calls run on one thread of their own (librdkafka consumers are not shared between
threads); the next batch is fetched while the previous one is stored.

**Group commit.** A batch is complete when it holds ``ROLLOUT_SINK_BATCH_SIZE`` messages, when
``ROLLOUT_SINK_BATCH_SECONDS`` have passed, or, sooner, when the previous batch has left the ClickHouse
owner (stored and derived; its derived messages may still be in delivery, and its offsets are committed
after they are delivered) and this one is at least ``ROLLOUT_SINK_BATCH_MIN_SECONDS`` old: a live worker
then takes what arrived while
the owner was busy, so an event waits for about one batch's work instead of the whole batch time,
and under load batches grow by themselves (what arrives during a long batch is the next one), which
spreads each insert's fixed cost over more events. Catching up on a backlog changes nothing: the
prefetch fills a batch before the previous one is stored.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from rollout.settings import Settings
from schemas import TopicNames
from streams.align import EventTimeMerge, event_time
from streams.forward import RawMessage

log = logging.getLogger("rollout.worker.direct")

Handle = Callable[[list[RawMessage], Callable[[], None]], Awaitable[Any]]
"""Stores one batch; returns what was written, or None when stopping before it was stored. Calls its
second argument as soon as the batch no longer holds the ClickHouse owner (its derived messages may
still be in delivery then): the next batch can be handed over from that moment."""


def consumer_config(settings: Settings) -> dict[str, object]:
    """The librdkafka consumer configuration of direct ingestion."""
    return {
        **settings.kafka_client_config(),
        "group.id": settings.consumer_group,
        "client.id": "rollout-worker-direct",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        # Like the Faust worker: a crashed worker's partitions move after 10 s, not 45.
        "session.timeout.ms": 10_000,
        "heartbeat.interval.ms": 3_000,
        # A ClickHouse outage holds a batch (and the next poll) for as long as it lasts.
        "max.poll.interval.ms": 900_000,
        # Small fetches per partition, so a batch interleaves the partitions (the runs' event time moves
        # forward on all of them together) instead of holding a megabyte of one partition: derived
        # metrics and regression checks on a partly consumed log then see every domain's progress.
        "max.partition.fetch.bytes": 64 * 1024,
        # Fetch ahead by at most ROLLOUT_INGEST_PREFETCH_KBYTES (librdkafka's default, 64 MiB, is held in
        # the worker's memory, and so are the messages that keep arriving after the merge pauses a partition).
        "queued.max.messages.kbytes": settings.ingest_prefetch_kbytes,
        # When the prefetch is full, librdkafka postpones the partition's next fetch by this long (its
        # default, 1 s, is longer than a batch). A batch needs more messages than a 4 MiB prefetch holds,
        # so with the default a catching-up worker's read waited out its whole batch time on most
        # batches and the owner thread sat idle (300,000-event replays: 16,568 -> 18,561 events/s).
        "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
        "fetch.min.bytes": FETCH_MIN_BYTES,
        "fetch.wait.max.ms": FETCH_WAIT_MAX_MS,
    }


FETCH_QUEUE_BACKOFF_MS = 20
"""How long a partition's next fetch waits once the consumer's prefetch is full (librdkafka: 1,000 ms)."""

FETCH_MIN_BYTES = 64 * 1024
FETCH_WAIT_MAX_MS = 40
"""The broker answers a fetch once it holds FETCH_MIN_BYTES for it or FETCH_WAIT_MAX_MS have passed
(librdkafka: 1 byte, 500 ms). With 1 byte, every produce request completed the waiting fetch at once, so
a live worker fetched as often as producers appended: ~900 fetches/s at 5,000 events/s, each with the
broker's fixed per-request cost. A batch takes 0.1 s or more anyway; 40 ms cut it to ~100 fetches/s.
A backlog fills 64 KiB at once, so catching up is not slowed."""

FETCH_SLICE_S = 0.02
"""Longest single wait of the consumer once a batch has reached its minimum age: how soon the batch notices
that the owner became free (a wait ends early only when it has every message it asked for)."""

READ_CHUNK = 2_000
"""Most messages one ``consume`` call asks for: between calls the partitions the event-time merge holds too much
of are paused, so a batch's read is not all from the partitions furthest ahead."""

BACKLOG_MESSAGES = 10_000
"""A partition this many messages behind its end is being caught up on (a replay, a restart after
downtime), not read live: the event-time merge waits for it without a time limit (streams.align)."""


def partition_lag(consumer: Consumer, starts: dict[tuple[str, int], int | None] | None = None
                  ) -> dict[tuple[str, int], int]:
    """Messages of each assigned partition not read yet: its end less the worker's position (local figures,
    no request).

    The end is the high watermark of the partition's last fetch response; the position is the next
    offset the worker will take (messages fetched ahead, in librdkafka's queue, count as not read). A
    partition nothing was taken from yet has no position: its start from ``starts`` stands for it (the
    group's committed offset, or None for none committed: the partition's first offset, as the consumer
    resets to the earliest). Partitions without figures (nothing fetched yet, start unknown) are left out.
    """
    assigned = consumer.assignment()
    if not assigned:
        return {}
    starts = starts or {}
    out: dict[tuple[str, int], int] = {}
    for tp in consumer.position(assigned):
        key = (tp.topic, tp.partition)
        try:
            watermarks = consumer.get_watermark_offsets(tp, cached=True)
        except KafkaException:
            continue
        if watermarks is None or watermarks[1] < 0:
            continue
        low, high = watermarks
        position = tp.offset
        if position < 0 and key in starts:
            start = starts[key]
            position = low if start is None else start
        if position >= 0:
            out[key] = max(0, high - position)
    return out


def backlogged(consumer: Consumer, threshold: int = BACKLOG_MESSAGES) -> frozenset[tuple[str, int]]:
    """Assigned partitions at least ``threshold`` messages behind their end (``partition_lag`` of what was
    read). Unknown figures (nothing fetched or taken yet) count as no backlog."""
    return frozenset(key for key, behind in partition_lag(consumer).items() if behind >= threshold)


def commit_offsets(messages: list[RawMessage]) -> list[TopicPartition]:
    """The offsets to commit after ``messages`` are stored: the next offset of each partition they came from."""
    top: dict[tuple[str, int], int] = {}
    for m in messages:
        key = (m.topic, m.partition)
        if m.offset + 1 > top.get(key, -1):
            top[key] = m.offset + 1
    return [TopicPartition(t, p, o) for (t, p), o in sorted(top.items())]


class DirectIngest:
    """The loop that reads, stores (through ``handle``) and commits; run it as a Faust app task."""

    def __init__(self, settings: Settings, handle: Handle, *, on_stored: Callable[[int, Any], None],
                 stopping: Callable[[], bool], on_read: Callable[[int, int, int | None], None] | None = None
                 ) -> None:
        self._settings = settings
        self._handle = handle
        self._on_stored = on_stored
        # After every read: messages held in the merge, partitions paused, messages not stored yet (``behind``).
        self._on_read = on_read
        self._in_flight = 0  # messages handed to ``handle`` and not back yet (changed on the event loop only)
        self._starts: dict[tuple[str, int], int | None] = {}  # where each assigned partition's reading began
        self._unstarted: list[TopicPartition] = []  # assigned, their committed offsets not asked for yet
        self._stopping = stopping
        self._topics = list(TopicNames(settings.topic_prefix).raw)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ingest")
        self._consumer: Consumer | None = None
        self._merge: EventTimeMerge[RawMessage] = EventTimeMerge(slack_s=settings.ingest_align_seconds)
        self._align = settings.ingest_align_seconds > 0  # off: no event time is read from the messages

    async def run(self) -> None:
        """Read and store batches until the worker stops."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._open)
        try:
            pending: asyncio.Future[bool] | None = None
            owner_free = threading.Event()  # the batch being stored left the ClickHouse owner (none yet: free)
            owner_free.set()
            while not self._stopping():
                messages = await loop.run_in_executor(self._executor, self._poll, owner_free)
                current = None
                if messages:
                    self._in_flight += len(messages)
                    owner_free = threading.Event()
                    current = asyncio.ensure_future(self._store(messages, owner_free, pending))
                if pending is not None and not await pending:
                    return  # stopping before that batch was stored: nothing of it (or later) is committed
                pending = current
            if pending is not None:
                await pending
        finally:
            self._executor.submit(self._close).result(timeout=30)
            self._executor.shutdown(wait=False)

    async def _store(self, messages: list[RawMessage], owner_free: threading.Event,
                     previous: asyncio.Future[bool] | None) -> bool:
        """Store a batch, then commit its offsets once the batch before it (``previous``) is committed."""
        try:
            written = await self._handle(messages, owner_free.set)
        finally:
            self._in_flight -= len(messages)
            owner_free.set()  # before the commit: it runs on the consumer's thread, after the next fetch
        # The batch before may still be delivering its derived messages: offsets go in batch order, and none
        # after a batch that was not stored.
        if previous is not None and not await previous:
            return False
        if written is None:
            return False
        await asyncio.get_running_loop().run_in_executor(self._executor, self._commit, commit_offsets(messages))
        self._on_stored(len(messages), written)
        return True

    # -- on the consumer's own thread ----------------------------------------------------------

    def _open(self) -> None:
        self._consumer = Consumer(consumer_config(self._settings))
        self._consumer.subscribe(self._topics, on_assign=self._assigned, on_revoke=self._revoked)

    def _poll(self, owner_free: threading.Event) -> list[RawMessage]:
        """The next batch to store: what arrived, in event-time order across partitions (streams.align)."""
        consumer = self._consumer
        assert consumer is not None
        self._fetch(consumer, owner_free)
        if self._unstarted:
            self._ask_starts(consumer)
        if self._align:
            self._merge.backlogged = backlogged(consumer)
        out = self._merge.release(self._settings.sink_batch_size)
        self._flow(consumer)
        if self._on_read is not None:
            lag = partition_lag(consumer, self._starts)
            self._on_read(self._merge.held, len(self._merge.paused),
                          self.behind(lag, len(consumer.assignment()), len(out)))
        return out

    def behind(self, lag: dict[tuple[str, int], int], partitions: int, releasing: int = 0) -> int | None:
        """Messages of this worker's ``partitions`` not stored yet: not read (``lag``, ``partition_lag`` with the
        starts of reading), held by the merge, being stored, and ``releasing`` (a batch on its way to ``handle``).

        A partition nothing was read from yet counts from where its reading begins (its committed offset, asked
        for once per assignment). None while any partition has no figure (its end is known from its first fetch
        response): a part of the partitions would understate it.
        """
        if not lag or len(lag) < partitions:
            return None
        return sum(lag.values()) + self._merge.held + self._in_flight + releasing

    def _take(self, messages: list[Message]) -> None:
        """Add what ``consume`` returned to the event-time merge (errors logged, or raised when fatal)."""
        merge, align = self._merge, self._align
        for m in messages:
            error = m.error()
            if error is not None:
                if error.fatal():
                    raise KafkaException(error)
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("consumer: %s", error)
                continue
            message = RawMessage(m.topic() or "", m.partition() or 0, m.offset() or 0, m.key(), m.value())
            merge.add((message.topic, message.partition), event_time(message.value) if align else None, message)

    def _flow(self, consumer: Consumer) -> None:
        """Pause the partitions the merge holds too much of, resume those it has drained (``EventTimeMerge.flow``)."""
        pause, resume = self._merge.flow()
        if pause:
            consumer.pause([TopicPartition(t, p) for t, p in pause])
        if resume:
            consumer.resume([TopicPartition(t, p) for t, p in resume])

    def _fetch(self, consumer: Consumer, owner_free: threading.Event) -> None:
        """Read up to a batch of messages into the merge (librdkafka releases the GIL while it waits): until the
        batch is full or its time is up, or, once it is ``sink_batch_min_seconds`` old and holds a message, until
        ``owner_free`` (the previous batch has left the ClickHouse owner; see the module's *group commit*).

        Partitions are paused as soon as the merge holds too much of them, not once the whole batch is read:
        a read of a batch's size otherwise comes mostly from the partitions furthest ahead, which the merge
        then holds (10,000,000-event replay, batches of 10,000: a median of 41,892 messages held, 28,671 with
        reads of READ_CHUNK; docs/performance.md)."""
        settings = self._settings
        size = settings.sink_batch_size
        began = time.monotonic()
        deadline = began + settings.sink_batch_seconds
        early = began + min(settings.sink_batch_min_seconds, settings.sink_batch_seconds)
        read = 0
        while True:
            now = time.monotonic()
            if now >= deadline or (read and now >= early and owner_free.is_set()):
                return
            # consume() returns when it has all it was asked for or its time is up, not at the first message:
            # past the minimum age it waits in short slices, so that the owner becoming free is noticed.
            timeout = early - now if now < early else min(FETCH_SLICE_S, deadline - now)
            messages = consumer.consume(num_messages=min(size - read, READ_CHUNK), timeout=timeout)
            self._take(messages)
            read += len(messages)
            if read >= size:
                return
            if messages:
                self._flow(consumer)

    def _commit(self, offsets: list[TopicPartition]) -> None:
        assert self._consumer is not None
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            log.warning("offsets of a stored batch not committed (%s); whoever reads those partitions next "
                        "stores the batch again, which adds nothing", exc.args[0] if exc.args else exc)

    def _close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()

    def _ask_starts(self, consumer: Consumer) -> None:
        """Where reading the newly assigned partitions began (their committed offsets), for ``behind``: once
        per assignment, a request to the group's coordinator. On failure ``behind`` stays unknown until each of
        them has been read from (its position then stands for its start)."""
        partitions, self._unstarted = self._unstarted, []
        try:
            committed = consumer.committed(partitions, timeout=5.0)
        except KafkaException as exc:
            log.debug("committed offsets not known (%s): how far behind is known once every partition is read", exc)
            return
        for tp in committed:
            if tp.error is None:
                self._starts[(tp.topic, tp.partition)] = tp.offset if tp.offset >= 0 else None

    def _assigned(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info("assigned %d raw partition(s)", len(partitions))
        self._unstarted += partitions
        self._merge.expect((tp.topic, tp.partition) for tp in partitions)

    def _revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info("revoked %d raw partition(s)", len(partitions))
        # librdkafka keeps a partition paused across a rebalance: resumed here, while still assigned,
        # or one given back to this worker would never deliver again (the merge forgets it was paused).
        paused = [tp for tp in partitions if (tp.topic, tp.partition) in self._merge.paused]
        if paused:
            consumer.resume(paused)
        self._merge.revoked((tp.topic, tp.partition) for tp in partitions)
        gone = {(tp.topic, tp.partition) for tp in partitions}
        self._unstarted = [tp for tp in self._unstarted if (tp.topic, tp.partition) not in gone]
        for key in gone:
            self._starts.pop(key, None)
