"""Direct ingestion on a real broker: the backlog figure of a partition catching up, and reads of a backlog."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from infra.kafka.topics import ensure_topics
from rollout.settings import Settings
from streams.direct import backlogged, consumer_config


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
