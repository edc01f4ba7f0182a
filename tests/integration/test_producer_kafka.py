"""The producer SDK on a real broker: each event once, with its key, on the partition Java would pick."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec  # type: ignore[attr-defined]

from producers import DeliveryError, EventProducer, ProducerStats, Spool, TelemetryClient
from schemas import TopicNames, decode_event, event_key
from schemas.base import Envelope
from tests.support.events import queued

PARTITIONS = 7  # prime, so a wrong hash or modulus shows up as misplaced keys


def java_murmur2(data: bytes) -> int:
    """``org.apache.kafka.common.utils.Utils.murmur2`` as an unsigned 32-bit value."""
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = data[i] | data[i + 1] << 8 | data[i + 2] << 16 | data[i + 3] << 24
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    tail = length & ~3
    rest = length % 4
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def java_partition(key: bytes, partitions: int) -> int:
    """The partition the Java client's default partitioner picks for a keyed record."""
    return (java_murmur2(key) & 0x7FFFFFFF) % partitions


@pytest.mark.parametrize(
    ("key", "signed"),
    [
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
def test_murmur2_matches_the_java_client(key: bytes, signed: int) -> None:
    # Vectors of Kafka's own UtilsTest.testMurmur2.
    assert java_murmur2(key) == signed & 0xFFFFFFFF


@pytest.fixture
def topics(kafka_bootstrap: str) -> Iterator[TopicNames]:
    """The raw topics under a prefix no other test uses, created with PARTITIONS partitions."""
    names = TopicNames(f"it-{uuid.uuid4().hex[:12]}")
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    futures = admin.create_topics(
        [NewTopic(t, num_partitions=PARTITIONS, replication_factor=1) for t in names.raw], request_timeout=30
    )
    for future in futures.values():
        future.result(timeout=60)
    yield names
    admin.delete_topics(list(names.raw), request_timeout=30)


def _consume_all(
    bootstrap: str, topic_names: tuple[str, ...], expected: int, timeout_s: float = 60.0
) -> list[Message]:
    """Every message of the topics from the beginning, once ``expected`` arrived or the time is up."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"it-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.assign(
            [TopicPartition(t, p, OFFSET_BEGINNING) for t in topic_names for p in range(PARTITIONS)]
        )
        messages: list[Message] = []
        deadline = time.monotonic() + timeout_s
        while len(messages) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            messages.append(msg)
        return messages
    finally:
        consumer.close()


def _log_size(bootstrap: str, topic_names: tuple[str, ...], timeout_s: float = 30.0) -> int:
    """How many records the partitions of the topics hold (latest minus earliest offset)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = [TopicPartition(t, p) for t in topic_names for p in range(PARTITIONS)]
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ends = [
                sum(
                    future.result().offset
                    for future in admin.list_offsets(
                        dict.fromkeys(partitions, spec), request_timeout=10
                    ).values()
                )
                for spec in (OffsetSpec.latest(), OffsetSpec.earliest())  # type: ignore[no-untyped-call]
            ]
            return int(ends[0] - ends[1])
        except KafkaException:
            # A partition leader can still be settling right after topic creation.
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.integration
def test_sdk_events_arrive_once_with_their_keys_on_java_partitions(
    kafka_bootstrap: str, topics: TopicNames
) -> None:
    producer = EventProducer(config={"bootstrap.servers": kafka_bootstrap}, topics=topics)
    sent: list[Envelope] = []

    class Tee:
        def send(self, event: Envelope) -> None:
            sent.append(event)
            producer.send(event)

        def flush(self, timeout: float = 30.0) -> None:
            producer.flush(timeout)

        def close(self, timeout: float = 30.0) -> None:
            producer.close(timeout)

    with TelemetryClient(Tee()) as kafka:
        policy = kafka.policy(run_id="run-it")
        policy.run_configured(domain_weights={"code": 0.7, "math": 0.3}, staleness_bound=2)
        policy.version_published(version=1, checkpoint_digest="sha256:c1")
        verifier = kafka.verifier(run_id="run-it", verifier_id="checker", verifier_version="3")
        trajectory_ids = []
        for i in range(40):
            domain = "code" if i % 2 else "math"
            with kafka.sandbox(
                run_id="run-it", domain=domain, task_id=f"task-{i}", environment_version="env-1"
            ) as r:
                r.started(policy_version=1, sandbox_id=f"sb-{i}")
                r.finished(termination="completed", steps=i, tokens=10 * i, artifact_digest=f"sha256:{i:04x}")
            verifier.verified(
                trajectory_id=r.trajectory_id,
                domain=domain,
                verdict="passed",
                artifact_digest=f"sha256:{i:04x}",
            )
            trajectory_ids.append(r.trajectory_id)
        policy.batch_consumed(batch_id="b-1", trainer_version=1, trajectory_ids=trajectory_ids)

    assert producer.stats == ProducerStats(sent=len(sent), delivered=len(sent), failed=0, pending=0)
    messages = _consume_all(kafka_bootstrap, topics.raw, expected=len(sent))
    # The log holds exactly what was sent: no duplicate from a retried produce.
    assert _log_size(kafka_bootstrap, topics.raw) == len(sent)
    by_id = {e.event_id: e for e in sent}
    received = [decode_event(m.value() or b"") for m in messages]
    assert sorted(str(e.event_id) for e in received) == sorted(str(i) for i in by_id)
    for msg, event in zip(messages, received, strict=True):
        assert event == by_id[event.event_id]
        assert msg.topic() == topics.for_event_type(event.event_type)  # type: ignore[attr-defined]
        key = msg.key()
        assert key == event_key(event).encode()
        assert msg.partition() == java_partition(key, PARTITIONS)
    # Keys spread over partitions at all (the check above would be vacuous on one partition).
    assert len({m.partition() for m in messages if m.topic() == topics.sandbox}) > 1


@pytest.mark.integration
def test_a_message_the_broker_refuses_is_reported_and_the_producer_goes_on(kafka_bootstrap: str) -> None:
    topic = f"it-small-{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics(
        [NewTopic(topic, num_partitions=1, replication_factor=1, config={"max.message.bytes": "1024"})]
    )[topic].result(timeout=60)
    try:
        producer = EventProducer(config={"bootstrap.servers": kafka_bootstrap}, topics=TopicNames("unused"))
        producer.send_raw(topic, os.urandom(8192), key="too-big")
        with pytest.raises(DeliveryError) as info:
            producer.flush(timeout=30)
        err = info.value
        assert (err.failed, err.pending) == (1, 0)
        assert err.errors[0].code == "MSG_SIZE_TOO_LARGE" and err.errors[0].key == "too-big"
        producer.send_raw(topic, b"small", key="fine")
        producer.close()
        assert producer.stats == ProducerStats(sent=2, delivered=1, failed=1, pending=0)
    finally:
        admin.delete_topics([topic], request_timeout=30)


@pytest.mark.integration
def test_a_burst_larger_than_the_send_queue_waits_for_room_instead_of_spooling(
    kafka_bootstrap: str, topics: TopicNames, tmp_path: Path
) -> None:
    # librdkafka's queue made small (its default is 100,000 messages), so a burst overflows it many times
    # over against a healthy broker, the first time before anything was confirmed: the sender waits for
    # room while deliveries come in, as a bare producer does, and nothing detours through the disk.
    count, room = 20_000, 500
    spool = Spool(tmp_path / "spool", scope=kafka_bootstrap)
    events = [queued(i, run_id="run-burst") for i in range(count)]
    with EventProducer(config={"bootstrap.servers": kafka_bootstrap}, topics=topics, spool=spool,
                       extra={"queue.buffering.max.messages": room}) as producer:
        for event in events:
            producer.send(event)
        producer.flush(60)
        stats = producer.stats
    assert (stats.sent, stats.delivered, stats.failed, stats.pending) == (count, count, 0, 0)
    assert stats.spooled == 0
    assert _log_size(kafka_bootstrap, (topics.sandbox,)) == count
