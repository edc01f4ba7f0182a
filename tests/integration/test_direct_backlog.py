"""Direct ingestion on a real broker: the backlog figure of a partition catching up, reads of a backlog, and
when a live batch is complete (group commit)."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from infra.kafka.topics import ensure_topics
from rollout.settings import Settings
from streams.direct import DirectIngest, backlogged, consumer_config
from tests.unit.test_direct import _never


def _consume(consumer: Consumer, count: int, timeout: float = 30.0) -> int:
    got = 0
    deadline = time.monotonic() + timeout
    while got < count and time.monotonic() < deadline:
        for message in consumer.consume(num_messages=count - got, timeout=0.5):
            if message.error() is None:
                got += 1
    return got


def test_a_partition_far_behind_its_end_is_backlogged_until_read(kafka_bootstrap: str) -> None:
    topic = f"backlog-{uuid.uuid4().hex[:8]}"
    ensure_topics({"bootstrap.servers": kafka_bootstrap}, [topic], partitions=2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for _ in range(50):
        producer.produce(topic, value=b"x", partition=0)
    for _ in range(3):
        producer.produce(topic, value=b"y", partition=1)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": topic, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
        assert backlogged(consumer, threshold=10) == frozenset()  # nothing fetched: no figures yet
        assert _consume(consumer, 6) == 6
        assert (topic, 0) in backlogged(consumer, threshold=10)
        assert (topic, 1) not in backlogged(consumer, threshold=10)  # 3 messages in all: never 10 behind
        assert _consume(consumer, 47) == 47
        assert backlogged(consumer, threshold=10) == frozenset()
    finally:
        consumer.close()


def test_a_read_of_a_backlog_larger_than_the_prefetch_fills_its_batch(kafka_bootstrap: str, tmp_path: Path) -> None:
    # A batch needs more messages than the prefetch holds; once it is full, librdkafka postpones the
    # next fetch (fetch.queue.backoff.ms, 1 s by default). With that default one read of 3,000 here
    # waits out its second and returns about what a full prefetch held; the worker's setting keeps
    # fetching while the read drains the queue.
    topic = f"prefetch-{uuid.uuid4().hex[:8]}"
    ensure_topics({"bootstrap.servers": kafka_bootstrap}, [topic], partitions=1)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    value = b"e" * 450  # about a bench event's size
    for _ in range(8_000):
        producer.produce(topic, value=value, partition=0)
    assert producer.flush(30) == 0
    settings = Settings(data_dir=tmp_path, kafka_bootstrap_servers_setting=kafka_bootstrap,
                        ingest_prefetch_kbytes=256, consumer_group=topic)
    consumer = Consumer(consumer_config(settings))
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        assert _consume(consumer, 100) == 100  # the prefetch has filled (~570 of these) and been drained a little
        read = [m for m in consumer.consume(num_messages=3_000, timeout=1.0) if m.error() is None]
        assert len(read) == 3_000
    finally:
        consumer.close()


def test_a_live_batch_is_complete_once_the_owner_is_free_and_it_is_old_enough(kafka_bootstrap: str,
                                                                               tmp_path: Path) -> None:
    topic = f"group-{uuid.uuid4().hex[:8]}"
    ensure_topics({"bootstrap.servers": kafka_bootstrap}, [topic], partitions=1)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    settings = Settings(data_dir=tmp_path, kafka_bootstrap_servers_setting=kafka_bootstrap, consumer_group=topic,
                        sink_batch_size=1_000, sink_batch_seconds=4.0, sink_batch_min_seconds=0.3)
    consumer = Consumer(consumer_config(settings))
    ingest = DirectIngest(settings, _never, on_stored=lambda _n, _w: None, stopping=lambda: False)

    def publish(count: int) -> None:
        for _ in range(count):
            producer.produce(topic, value=b"{}", partition=0)
        assert producer.flush(30) == 0

    def fetch(owner_free: threading.Event) -> tuple[int, float]:
        """Messages the batch's read put into the event-time merge (none is released here), and its seconds."""
        began, held = time.monotonic(), ingest._merge.held
        ingest._fetch(consumer, owner_free)
        return ingest._merge.held - held, time.monotonic() - began

    free, busy, never = threading.Event(), threading.Event(), threading.Event()
    free.set()
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        publish(1)
        assert _consume(consumer, 1) == 1  # connected and fetching
        # The owner is free: the batch goes at its minimum age, not after the batch time.
        publish(5)
        count, seconds = fetch(free)
        assert count == 5 and 0.3 <= seconds < 2.0
        # The owner is busy for 1 s: the batch waits for it (and takes what arrived meanwhile).
        publish(5)
        threading.Timer(1.0, busy.set).start()
        count, seconds = fetch(busy)
        assert count == 5 and 1.0 <= seconds < 3.0
        # The owner stays busy: the batch time is the limit, as before group commit.
        publish(3)
        count, seconds = fetch(never)
        assert count == 3 and seconds >= 3.9
        # Full before anything else: it goes at once.
        publish(1_000)
        count, seconds = fetch(never)
        assert count == 1_000 and seconds < 3.9
    finally:
        consumer.close()
        ingest._executor.shutdown(wait=False)


def test_behind_counts_the_backlog_down_to_nothing_as_batches_are_stored(kafka_bootstrap: str,
                                                                          tmp_path: Path) -> None:
    # /stats `behind`: every message of the worker's partitions not stored yet, wherever it is (at the broker,
    # in the consumer's prefetch, held by the event-time merge, in a batch being stored).
    topic = f"behind-{uuid.uuid4().hex[:8]}"
    ensure_topics({"bootstrap.servers": kafka_bootstrap}, [topic], partitions=3)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    total = 6_000
    for i in range(total):
        producer.produce(topic, value=b"{}", partition=i % 3)
    assert producer.flush(30) == 0
    settings = Settings(data_dir=tmp_path, kafka_bootstrap_servers_setting=kafka_bootstrap, consumer_group=topic,
                        sink_batch_size=500, sink_batch_seconds=0.5, ingest_align_seconds=0)
    reads: list[tuple[int | None, int]] = []  # behind, and what was stored by then
    stored: list[int] = []

    async def handle(messages: list[Any], released: Any) -> str:
        await asyncio.sleep(0.02)  # a store that takes a moment, so that batches queue up behind it
        stored.append(len(messages))
        released()
        return "written"

    ingest = DirectIngest(settings, handle, on_stored=lambda _n, _w: None,
                          stopping=lambda: sum(stored) >= total and reads[-1][0] == 0,
                          on_read=lambda _held, _paused, behind: reads.append((behind, sum(stored))))
    ingest._topics = [topic]
    asyncio.run(asyncio.wait_for(ingest.run(), timeout=60))
    known = [(behind, done) for behind, done in reads if behind is not None]
    assert known[0][0] > total // 2  # known from the first reads on (each partition's start asked for)
    for behind, done in known:
        # Every message not stored is counted, wherever it is. A batch stored while the read was being counted
        # can be counted on both sides (two batches in flight), never on neither.
        assert total <= behind + done <= total + 2 * 500, (behind, done)
    assert known[-1] == (0, total)
    assert all(a >= b for (a, _), (b, _) in itertools.pairwise(known))  # nothing arrives: it only shrinks
    assert len({b for b, _ in known}) > 3  # and it went down in steps, batch by batch
