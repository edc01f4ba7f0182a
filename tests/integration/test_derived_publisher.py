"""The derived-message publisher on the real broker: everything delivered, failures retried, never dropped.

librdkafka reports only failed deliveries to the publisher, so these tests make deliveries fail for
real: a topic whose ``max.message.bytes`` is below a message's size refuses it at the broker (the limit
applies to a compressed record batch, so the refused message is incompressible and the others small).
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from streams.publish import DerivedPublisher

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
BIG = os.urandom(200_000)  # incompressible: lz4 cannot bring it under the topic's limit


@pytest.fixture
def small_topic(kafka_bootstrap: str) -> Iterator[tuple[AdminClient, str]]:
    """A one-partition topic that refuses record batches over 100,000 bytes."""
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    name = f"derived-{uuid.uuid4().hex[:10]}"
    admin.create_topics([NewTopic(name, 1, 1, config={"max.message.bytes": "100000"})])[name].result(30)
    yield admin, name
    admin.delete_topics([name])[name].result(30)


def _read_all(bootstrap: str, topic: str, expected: int) -> list[tuple[bytes, bytes]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    got: list[tuple[bytes, bytes]] = []
    try:
        for _ in range(40):
            for msg in consumer.consume(100, timeout=0.5):
                if msg.error() is None:
                    got.append((msg.key() or b"", msg.value() or b""))
            if len(got) >= expected:
                break
        # One more read: anything past the expected count (a duplicate) shows up too.
        for msg in consumer.consume(100, timeout=1.0):
            if msg.error() is None:
                got.append((msg.key() or b"", msg.value() or b""))
    finally:
        consumer.close()
    return got


def _publisher(bootstrap: str) -> DerivedPublisher:
    return DerivedPublisher({"bootstrap.servers": bootstrap, "message.timeout.ms": 5000}, max_request_size=1 << 20)


def test_every_message_is_delivered_once_in_order(kafka_bootstrap: str, small_topic: tuple[AdminClient, str]) -> None:
    _admin, topic = small_topic
    messages = [(topic, f"k{i}".encode(), f"v{i}".encode()) for i in range(3000)]

    assert _publisher(kafka_bootstrap).publish(messages, should_stop=lambda: False)

    assert _read_all(kafka_bootstrap, topic, len(messages)) == [(k, v) for _t, k, v in messages]


def test_a_refused_message_is_kept_and_retried_until_delivered(
    kafka_bootstrap: str, small_topic: tuple[AdminClient, str]
) -> None:
    admin, topic = small_topic
    big = (topic, b"big", BIG)
    small = [(topic, f"k{i}".encode(), b"v") for i in range(5)]
    asked: list[int] = []

    def should_stop() -> bool:
        # Asked after the first round failed: let the topic take the message, then go on retrying.
        if not asked:
            entry = ConfigEntry("max.message.bytes", "1000000",
                                incremental_operation=AlterConfigOpType.SET)
            resource = ConfigResource("topic", topic, incremental_configs=[entry])
            admin.incremental_alter_configs([resource])[resource].result(30)
        asked.append(1)
        return False

    # Read once, as it is sent: the refused message is sent again from its failure report.
    assert _publisher(kafka_bootstrap).publish(iter([*small, big]), should_stop=should_stop, backoff=0.5)

    assert asked, "the oversized message was never refused: the test did not exercise a failure"
    assert sorted(_read_all(kafka_bootstrap, topic, len(small) + 1)) == sorted((k, v) for _t, k, v in [*small, big])


def test_a_refused_message_is_reported_when_asked_to_stop(
    kafka_bootstrap: str, small_topic: tuple[AdminClient, str], caplog: pytest.LogCaptureFixture
) -> None:
    _admin, topic = small_topic
    publisher = _publisher(kafka_bootstrap)

    with caplog.at_level(logging.WARNING, logger="streams.publish"):
        delivered = publisher.publish([(topic, b"big", BIG)], should_stop=lambda: True)

    assert delivered is False  # the caller leaves its batch unacknowledged
    assert "1 derived message(s) not delivered (KafkaError{code=MSG_SIZE_TOO_LARGE" in caplog.text
    assert "stopping with 1 derived message(s) undelivered" in caplog.text
    assert _read_all(kafka_bootstrap, topic, 0) == []
