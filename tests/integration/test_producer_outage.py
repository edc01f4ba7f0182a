"""Kafka outages at the producer, on a real broker this module starts, stops and restarts itself.

The broker is this module's own (its own folder and free ports), never the shared test broker:
stopping that would break every other test running against it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec  # type: ignore[attr-defined]

from infra.kafka.broker import NativeKafka
from producers import DeliveryError, EventProducer, Spool
from rollout.errors import ConfigurationError
from rollout.settings import Settings
from schemas import TopicNames, decode_event
from tests.support.events import queued

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 3
log = logging.getLogger(__name__)


def _avoided_ports() -> set[int]:
    """Ports other brokers may use: the defaults and the shared test broker's (ROLLOUT_TEST_KAFKA_PORT)."""
    shared = int(os.environ.get("ROLLOUT_TEST_KAFKA_PORT", "29092"))
    return {19092, 19093, 29092, 29093, shared, shared + 1}


def _free_ports(count: int) -> list[int]:
    sockets: list[socket.socket] = []
    avoid = _avoided_ports()
    try:
        while len(sockets) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            if sock.getsockname()[1] in avoid:
                sock.close()
                continue
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NativeKafka]:
    """A broker of this module's own, not started: each test brings it up or down as it needs."""
    settings = Settings()
    port, controller_port = _free_ports(2)
    kafka = NativeKafka(
        version=settings.kafka_version,
        cache_dir=settings.cache_dir,
        data_dir=tmp_path_factory.mktemp("outage-kafka"),
        port=port,
        controller_port=controller_port,
        heap=settings.kafka_heap,
    )
    try:
        kafka.fetch()
    except ConfigurationError as exc:  # Maven missing: the jars cannot be fetched
        pytest.skip(f"the native Kafka broker cannot run on this machine: {exc}")
    try:
        yield kafka
    finally:
        kafka.down(timeout=30)


def _up(broker: NativeKafka) -> float:
    started = time.monotonic()
    broker.up(timeout=120)
    return time.monotonic() - started


def _producer(broker: NativeKafka, spool_dir: Path, topics: TopicNames, **spool_args: int) -> EventProducer:
    spool = Spool(spool_dir, scope=broker.bootstrap_servers, **spool_args)
    return EventProducer(config={"bootstrap.servers": broker.bootstrap_servers}, topics=topics, spool=spool)


def _topics(tag: str) -> TopicNames:
    return TopicNames(f"outage-{tag}-{uuid.uuid4().hex[:10]}")


def _create_topic(bootstrap: str, topic: str) -> None:
    """Create the topic, unless the producer's resending got there first (the broker auto-creates)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])[topic].result(60)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise


def _wait_for(condition: Callable[[], bool], timeout: float, what: str) -> float:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(0.05)
    return time.monotonic() - started


def _partitions(bootstrap: str, topic: str) -> list[TopicPartition]:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=30)
    return [TopicPartition(topic, p) for p in metadata.topics[topic].partitions]


def _event_ids(bootstrap: str, topic: str, expected: int, timeout_s: float = 60.0) -> list[str]:
    """The event ids of the messages on the topic, from the beginning until ``expected`` distinct ones arrived."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"outage-{uuid.uuid4().hex}", "enable.auto.commit": False}
    )
    try:
        consumer.assign(
            [TopicPartition(tp.topic, tp.partition, OFFSET_BEGINNING) for tp in _partitions(bootstrap, topic)]
        )
        ids: list[str] = []
        distinct: set[str] = set()
        deadline = time.monotonic() + timeout_s
        while len(distinct) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            ids.append(str(decode_event(msg.value() or b"").event_id))
            distinct.add(ids[-1])
        return ids
    finally:
        consumer.close()


def _log_size(bootstrap: str, topic: str) -> int:
    """How many records the topic holds (latest minus earliest offsets): duplicates included."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = _partitions(bootstrap, topic)
    ends = [
        sum(f.result().offset for f in admin.list_offsets(dict.fromkeys(partitions, spec), request_timeout=30).values())
        for spec in (OffsetSpec.latest(), OffsetSpec.earliest())  # type: ignore[no-untyped-call]
    ]
    return int(ends[0] - ends[1])


def _expected_ids(count: int, start: int = 0) -> set[str]:
    return {str(queued(i).event_id) for i in range(start, start + count)}


# -- (a) Kafka down from the start --------------------------------------------------------------------


def test_events_sent_while_kafka_is_down_arrive_exactly_once_when_it_is_up(
    broker: NativeKafka, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    broker.down(timeout=30)
    topics = _topics("a")
    producer = _producer(broker, tmp_path / "spool", topics)
    count = 10_000
    events = [queued(i, run_id="run-outage-a") for i in range(count)]

    started = time.perf_counter()
    for event in events:
        producer.send(event)  # never raises, never waits for the broker
    send_s = time.perf_counter() - started
    producer.flush(timeout=30)  # returns at once: Kafka is known to be away, everything is on disk
    flush_s = time.perf_counter() - started - send_s

    stats = producer.stats
    assert (stats.sent, stats.delivered, stats.failed, stats.pending) == (count, 0, 0, count)
    assert stats.spooled == stats.spool_pending == count
    record_property("send_10k_while_down_s", round(send_s, 3))
    log.warning("outage (a): %d sends while Kafka was down took %.3f s, flush %.3f s", count, send_s, flush_s)

    up_s = _up(broker)
    _create_topic(broker.bootstrap_servers, topics.sandbox)
    drain_s = _wait_for(lambda: producer.stats.pending == 0, 90, "spooled events delivered")
    producer.close()

    stats = producer.stats
    assert (stats.sent, stats.delivered, stats.failed, stats.pending, stats.spool_pending) == (count, count, 0, 0, 0)
    ids = _event_ids(broker.bootstrap_servers, topics.sandbox, count)
    assert set(ids) == _expected_ids(count)
    assert len(ids) == count
    assert _log_size(broker.bootstrap_servers, topics.sandbox) == count  # no duplicate
    assert not any((tmp_path / "spool").glob("lane-*"))  # a drained spool leaves nothing on disk
    record_property("drain_after_up_s", round(drain_s, 3))
    log.warning("outage (a): broker up in %.1f s, then all %d delivered in %.2f s", up_s, count, drain_s)


# -- (b) Kafka restarted while a producer publishes ----------------------------------------------------


def test_a_broker_restart_while_publishing_loses_nothing_and_reports_nothing_undelivered(
    broker: NativeKafka, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    _up(broker)
    topics = _topics("b")
    _create_topic(broker.bootstrap_servers, topics.sandbox)
    producer = _producer(broker, tmp_path / "spool", topics)
    stop = threading.Event()
    published: list[int] = [0]
    slowest: list[float] = [0.0]
    errors: list[BaseException] = []

    def publish() -> None:
        try:
            i = 0
            while not stop.is_set():
                started = time.perf_counter()
                producer.send(queued(i, run_id="run-outage-b"))
                slowest[0] = max(slowest[0], time.perf_counter() - started)
                i += 1
                published[0] = i
                time.sleep(0.0005)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    thread = threading.Thread(target=publish, name="outage-publisher")
    thread.start()
    try:
        _wait_for(lambda: producer.stats.delivered >= 1000, 30, "publishing before the restart")
        broker.down(timeout=30)
        _wait_for(lambda: producer.stats.spooled > 0, 30, "events spooled while the broker is down")
        up_s = _up(broker)
        recovered_at = producer.stats.delivered
        _wait_for(lambda: producer.stats.delivered > recovered_at + 1000, 60, "publishing after the restart")
    finally:
        stop.set()
        thread.join(30)
    assert errors == []
    drain_s = _wait_for(lambda: producer.stats.pending == 0, 90, "every event delivered")
    producer.close()  # raises DeliveryError if anything was not delivered

    sent = published[0]
    stats = producer.stats
    assert (stats.sent, stats.delivered, stats.failed, stats.pending, stats.spool_pending) == (sent, sent, 0, 0, 0)
    assert stats.spooled > 0
    ids = _event_ids(broker.bootstrap_servers, topics.sandbox, sent)
    missing = _expected_ids(sent) - set(ids)
    assert not missing, f"{len(missing)} of {sent} events never arrived ({len(ids)} read, {len(set(ids))} distinct)"
    assert set(ids) == _expected_ids(sent)
    # A message in flight when the broker stopped may have been written without its
    # acknowledgement arriving; if it then timed out it was resent (at-least-once, the sink
    # dedupes by event_id). Count such duplicates rather than forbid them.
    duplicates = _log_size(broker.bootstrap_servers, topics.sandbox) - sent
    assert duplicates >= 0
    record_property("restart_published", sent)
    record_property("restart_duplicates", duplicates)
    record_property("restart_slowest_send_s", round(slowest[0], 4))
    log.warning(
        "outage (b): %d published across a broker restart (up in %.1f s), %d spooled, %d duplicate(s), "
        "slowest send %.1f ms, drained %.2f s after the publisher stopped",
        sent,
        up_s,
        stats.spooled,
        duplicates,
        slowest[0] * 1000,
        drain_s,
    )


# -- (c) the producing process restarts ---------------------------------------------------------------

_CHILD = """
import json, os, signal, sys
from pathlib import Path
from producers import EventProducer, Spool
from schemas import TopicNames
from tests.support.events import queued

bootstrap, spool_dir, prefix, count, ending = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
spool = Spool(Path(spool_dir), scope=bootstrap)
producer = EventProducer(config={"bootstrap.servers": bootstrap}, topics=TopicNames(prefix), spool=spool)
for i in range(count):
    producer.send(queued(i, run_id="run-outage-c"))
if ending == "kill":
    producer.flush(timeout=10)  # everything on disk (Kafka is away: returns at once)
    print(json.dumps({"spooled": producer.stats.spooled, "failed": producer.stats.failed}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # no close, no exit handlers
producer.close(timeout=10)
print(json.dumps({"spooled": producer.stats.spooled, "failed": producer.stats.failed}), flush=True)
"""


def test_events_spooled_by_a_process_that_exits_or_is_killed_are_delivered_by_the_next_one(
    broker: NativeKafka, tmp_path: Path
) -> None:
    broker.down(timeout=30)
    count = 2000
    runs = {ending: (_topics(f"c-{ending}"), tmp_path / f"spool-{ending}") for ending in ("close", "kill")}
    for ending, (topics, spool_dir) in runs.items():
        child = subprocess.run(
            [sys.executable, "-c", _CHILD, broker.bootstrap_servers, str(spool_dir), topics.prefix, str(count), ending],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        report = json.loads(child.stdout.strip().splitlines()[-1])
        assert report == {"spooled": count, "failed": 0}, child.stderr[-2000:]
        assert child.returncode == (-9 if ending == "kill" else 0), child.stderr[-2000:]
        assert any(spool_dir.glob("lane-*/*.seg"))

    _up(broker)
    for ending, (topics, spool_dir) in runs.items():
        _create_topic(broker.bootstrap_servers, topics.sandbox)
        producer = _producer(broker, spool_dir, topics)  # adopts the lane the child left
        assert producer.stats.spool_pending == count
        _wait_for(lambda p=producer: p.stats.spool_pending == 0, 90, f"events of the {ending} child delivered")
        producer.close()

        stats = producer.stats
        assert (stats.sent, stats.recovered, stats.failed) == (0, count, 0)
        ids = _event_ids(broker.bootstrap_servers, topics.sandbox, count)
        assert set(ids) == _expected_ids(count)
        assert _log_size(broker.bootstrap_servers, topics.sandbox) == count  # no duplicate
        assert not any(spool_dir.glob("lane-*"))


# -- (d) the bound ----------------------------------------------------------------------------------------


def test_a_full_spool_refuses_counts_logs_and_delivers_everything_it_accepted(
    broker: NativeKafka, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broker.down(timeout=30)
    caplog.set_level(logging.WARNING, logger="producers")
    topics = _topics("d")
    producer = _producer(broker, tmp_path / "spool", topics, max_bytes=64 * 1024)
    count = 2000
    for i in range(count):
        producer.send(queued(i, run_id="run-outage-d"))  # never raises, even with the spool full
    # The lost events are accounted for by flush (or close), as every undelivered event is; after
    # it, every event is either on disk or refused.
    with pytest.raises(DeliveryError) as info:
        producer.flush(timeout=5)

    stats = producer.stats
    assert stats.spool_refused > 0
    assert stats.spooled + stats.spool_refused == count
    assert stats.failed == stats.spool_refused
    refusals = [r for r in caplog.records if r.levelno == logging.ERROR and r.name == "producers.spool"]
    assert refusals, "the full spool logged no ERROR"
    assert "refused" in refusals[0].getMessage() and "ROLLOUT_SPOOL_MAX_BYTES" in refusals[0].getMessage()
    assert info.value.failed == stats.spool_refused
    assert info.value.errors[0].code == "SPOOL_REFUSED"
    assert "spool" in str(info.value)

    _up(broker)
    _create_topic(broker.bootstrap_servers, topics.sandbox)
    accepted = stats.spooled
    _wait_for(lambda: producer.stats.delivered == accepted, 90, "accepted events delivered")
    producer.close()  # nothing more was lost

    ids = _event_ids(broker.bootstrap_servers, topics.sandbox, accepted)
    assert len(set(ids)) == len(ids) == accepted
    assert set(ids) <= _expected_ids(count)
    assert _log_size(broker.bootstrap_servers, topics.sandbox) == accepted
    assert producer.stats.spool_pending == 0
