"""Direct ingestion's backlog figure on a real broker: a partition far behind its end is catching up."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition

from infra.kafka.topics import ensure_topics
from streams.direct import backlogged


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
