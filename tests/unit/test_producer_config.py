"""EventProducer without a broker: safe defaults, delivery accounting, error wrapping, no leaked secrets."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Message
from pydantic import SecretStr

import producers.kafka as kafka_module
from producers import (
    DeliveryError,
    EventProducer,
    ProduceFailed,
    ProducerClosed,
    ProducerConfigError,
    ProduceRejected,
    ProducerFatalError,
    ProducerQueueFull,
    ProducerStats,
    Spool,
    producer_config,
)
from producers.kafka import DEFAULT_LINGER_MS, Tally
from rollout.errors import ConfigurationError, PermanentError, TransientError
from rollout.settings import Settings
from schemas.topics import TopicNames

PASSWORD = "pa55-w0rd-never-printed"


def _free_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


class FakeClient:
    """Stands in for confluent_kafka.Producer: queues messages and serves their reports on poll."""

    instances: list[FakeClient] = []

    def __init__(self, conf: dict[str, Any]) -> None:
        self.conf = conf
        self.on_delivery = conf["on_delivery"]
        self.error_cb = conf["error_cb"]
        self.queue: list[Message] = []
        self.callbacks: list[Callable[[KafkaError | None, Message], None]] = []  # per queued message
        self.outcomes: list[KafkaError | None] = []  # per message, None = delivered
        self.buffer_errors = 0  # produce() raises BufferError this many times
        self.produce_error: KafkaException | None = None
        self.stuck = False  # flush leaves messages queued
        self.unserved_events = 0  # client events (errors) in librdkafka's queue, counted by flush()
        self.closed = False
        self.purged = False
        FakeClient.instances.append(self)

    def produce(self, topic: str, value: bytes, key: Any = None, headers: Any = None,
                on_delivery: Callable[[KafkaError | None, Message], None] | None = None) -> None:
        if self.produce_error is not None:
            raise self.produce_error
        if self.buffer_errors:
            self.buffer_errors -= 1
            raise BufferError("Local: Queue full")
        raw_key = key.encode() if isinstance(key, str) else key
        self.queue.append(Message(topic=topic, partition=0, key=raw_key, value=value, headers=headers))
        self.callbacks.append(on_delivery or self.on_delivery)  # as librdkafka: the message's own, else the config's

    def poll(self, timeout: float = -1) -> int:
        if self.stuck:
            return 0
        served = 0
        while True:
            try:  # a spool's thread polls too
                msg = self.queue.pop(0)
                callback = self.callbacks.pop(0)
            except IndexError:
                break
            outcome = self.outcomes.pop(0) if self.outcomes else None
            callback(outcome, msg)
            served += 1
        if not served and timeout > 0:
            time.sleep(min(timeout, 0.005))  # as the real client waits for a report
        return served

    def flush(self, timeout: float = -1) -> int:
        self.poll(timeout)
        return len(self.queue) + self.unserved_events

    def purge(self) -> None:
        self.purged = True
        for msg, callback in zip(self.queue, self.callbacks, strict=True):
            callback(KafkaError(KafkaError._PURGE_QUEUE, "purged"), msg)
        self.queue.clear()
        self.callbacks.clear()

    def close(self) -> bool:
        self.closed = True
        return True

    def __len__(self) -> int:
        return len(self.queue)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[FakeClient]]:
    FakeClient.instances = []
    monkeypatch.setattr(kafka_module, "Producer", FakeClient)
    yield FakeClient


def _producer(**kwargs: Any) -> EventProducer:
    return EventProducer(config={"bootstrap.servers": "127.0.0.1:9"}, topics=TopicNames("t"), **kwargs)


# -- configuration --------------------------------------------------------------------------


def test_defaults_are_the_safe_ones() -> None:
    conf = producer_config({"bootstrap.servers": "b:9092"})
    assert conf["enable.idempotence"] is True
    assert conf["acks"] == "all"
    assert conf["partitioner"] == "murmur2_random"
    assert conf["compression.type"] == "lz4"
    assert conf["linger.ms"] == DEFAULT_LINGER_MS == 50
    assert conf["client.id"] == "rollout-producer"
    assert conf["bootstrap.servers"] == "b:9092"


def test_precedence_defaults_config_arguments_extra() -> None:
    conf = producer_config(
        {"bootstrap.servers": "b:9092", "client.id": "sandbox-fleet", "linger.ms": "99"},
        linger_ms=5,
        compression="zstd",
        extra={"compression.type": "gzip", "queue.buffering.max.messages": 5000},
    )
    assert conf["client.id"] == "sandbox-fleet"
    assert conf["linger.ms"] == 5
    assert conf["compression.type"] == "gzip"
    assert conf["queue.buffering.max.messages"] == 5000
    assert conf["partitioner"] == "murmur2_random"


@pytest.mark.parametrize("key", ["on_delivery", "error_cb", "delivery.report.only.error"])
def test_delivery_accounting_cannot_be_configured_away(key: str) -> None:
    with pytest.raises(ProducerConfigError, match=key):
        producer_config({}, extra={key: True})


def test_bad_arguments_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match="compression"):
        producer_config({}, compression="brotli")
    with pytest.raises(ConfigurationError, match="linger_ms"):
        producer_config({}, linger_ms=-1)


def test_librdkafka_refusal_is_a_configuration_error() -> None:
    with pytest.raises(ProducerConfigError, match="acks") as info:
        EventProducer(config={"bootstrap.servers": "127.0.0.1:9"}, topics=TopicNames(), extra={"acks": "1"})
    assert isinstance(info.value.__cause__, KafkaException)


def test_settings_reach_the_client_and_the_password_is_never_shown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = Settings(
        kafka_bootstrap_servers_setting=f"127.0.0.1:{_free_port()}",
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_mechanism="PLAIN",
        kafka_sasl_username="alice",
        kafka_sasl_password=SecretStr(PASSWORD),
        topic_prefix="secret-test",
    )
    caplog.set_level(logging.DEBUG)
    producer = EventProducer.from_settings(settings, spool=False, extra={"message.timeout.ms": 2000})
    assert producer.topics == TopicNames("secret-test")
    assert producer.config["sasl.username"] == "alice"
    assert producer.config["sasl.password"] == "***"
    assert producer.config["partitioner"] == "murmur2_random"
    producer.send_raw(producer.topics.sandbox, b"{}", key="k")
    with pytest.raises(DeliveryError) as info:
        producer.close(timeout=0.5)
    shown = " ".join([repr(producer), str(producer.config), str(info.value), caplog.text])
    assert PASSWORD not in shown
    assert producer.stats == ProducerStats(sent=1, delivered=0, failed=1, pending=0)


def test_unreachable_broker_flush_reports_undelivered() -> None:
    producer = EventProducer(
        config={"bootstrap.servers": f"127.0.0.1:{_free_port()}"}, topics=TopicNames("u")
    )
    producer.send_raw("u.raw.sandbox", b"{}", key="traj-1")
    with pytest.raises(DeliveryError) as info:
        producer.flush(timeout=0.3)
    err = info.value
    assert (err.undelivered, err.pending, err.failed) == (1, 1, 0)
    assert err.retriable
    assert "reachable" in str(err)
    assert producer.stats.pending == 1
    with pytest.raises(DeliveryError):
        producer.close(timeout=0)
    assert producer.stats == ProducerStats(sent=1, delivered=0, failed=1, pending=0)
    with pytest.raises(ProducerClosed):
        producer.send_raw("u.raw.sandbox", b"{}")


# -- delivery accounting (fake client) -----------------------------------------------------------


def test_flush_counts_messages_not_client_events_still_queued(fake: type[FakeClient]) -> None:
    # librdkafka's flush() returns its queue length, which also holds error events ("all brokers
    # down") raised just before the deadline; they are not undelivered messages.
    producer = _producer()
    client = fake.instances[0]
    client.stuck = True
    client.unserved_events = 3
    producer.send_raw("t.raw.sandbox", b"{}", key="a")
    with pytest.raises(DeliveryError) as info:
        producer.flush(timeout=0)
    assert (info.value.undelivered, info.value.pending, info.value.failed) == (1, 1, 0)
    client.stuck = False
    producer.flush(timeout=0)  # the message is delivered; the queued events are no error
    assert producer.stats == ProducerStats(sent=1, delivered=1, failed=0, pending=0)


def test_tally_counts_every_bump_and_reading_does_not_change_it() -> None:
    tally = Tally()
    assert tally.value() == 0
    for _ in range(5):
        tally.bump()
    assert tally.value() == 5
    assert tally.value() == 5
    tally.bump()
    assert tally.value() == 6


def test_tally_loses_no_bump_between_threads() -> None:
    tally = Tally()
    start = threading.Barrier(4)

    def bump() -> None:
        start.wait()
        for _ in range(50_000):
            tally.bump()

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for thread in threads:
        thread.start()
    seen = [tally.value() for _ in range(100)]
    for thread in threads:
        thread.join()
    assert tally.value() == 200_000
    assert seen == sorted(seen)


def test_every_delivery_report_is_counted(fake: type[FakeClient]) -> None:
    producer = _producer()
    client = fake.instances[0]
    client.stuck = True
    for i in range(3):
        producer.send_raw("t.raw.sandbox", b"x", key=f"k{i}", headers={"h": b"1"})
    assert producer.stats == ProducerStats(sent=3, delivered=0, failed=0, pending=3)
    client.stuck = False
    client.outcomes = [None, KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too big"), None]
    with pytest.raises(DeliveryError) as info:
        producer.flush()
    err = info.value
    assert (err.undelivered, err.failed, err.pending) == (1, 1, 0)
    assert err.errors[0].code == "MSG_SIZE_TOO_LARGE"
    assert err.errors[0].key == "k1"
    assert not err.retriable
    assert producer.stats == ProducerStats(sent=3, delivered=2, failed=1, pending=0)
    producer.flush()  # a failure is reported once


def test_buffer_full_is_retried_after_serving_reports(fake: type[FakeClient]) -> None:
    producer = _producer()
    fake.instances[0].buffer_errors = 3
    producer.send_raw("t.raw.sandbox", b"x")
    producer.flush()
    assert producer.stats == ProducerStats(sent=1, delivered=1, failed=0, pending=0)


def test_buffer_that_never_drains_is_a_transient_error(fake: type[FakeClient]) -> None:
    producer = _producer()
    producer.buffer_full_timeout_s = 0.2
    fake.instances[0].buffer_errors = 10**9
    with pytest.raises(ProducerQueueFull) as info:
        producer.send_raw("t.raw.sandbox", b"x")
    assert isinstance(info.value, TransientError)
    assert isinstance(info.value.__cause__, BufferError)
    assert producer.stats.sent == 0


def _answering_spooled_producer(fake: type[FakeClient], tmp_path: Path) -> tuple[EventProducer, FakeClient]:
    """A producer with a spool whose cluster has answered (one message delivered)."""
    producer = _producer(spool=Spool(tmp_path / "spool", scope="127.0.0.1:9"))
    client = fake.instances[0]
    producer.send_raw("t.raw.sandbox", b"first")
    producer.flush(5)
    assert producer.stats.delivered == 1
    return producer, client


def test_with_a_spool_a_full_queue_waits_for_room_while_the_cluster_answers(
    fake: type[FakeClient], tmp_path: Path
) -> None:
    producer, client = _answering_spooled_producer(fake, tmp_path)
    client.buffer_errors = 5  # room comes back after a few reports' time
    producer.send_raw("t.raw.sandbox", b"x")
    producer.flush(5)
    stats = producer.stats
    assert (stats.sent, stats.delivered, stats.spooled) == (2, 2, 0)
    assert client.buffer_errors == 0
    producer.close(5)


def _let_the_spool_thread_look_after_spooling_begins(producer: EventProducer, monkeypatch: pytest.MonkeyPatch
                                                     ) -> None:
    """Make ``_start_spooling`` return only after the spool's thread made a whole loop once spooling began."""
    spool = producer.spool
    assert spool is not None
    looped = threading.Condition()
    loops = [0]
    maintain = spool.maintain

    def counted_maintain() -> None:  # once per loop of the spool's thread
        maintain()
        with looped:
            loops[0] += 1
            looped.notify_all()

    monkeypatch.setattr(spool, "maintain", counted_maintain)
    start_spooling = producer._start_spooling

    def start_then_let_the_thread_look(why: str) -> None:
        start_spooling(why)
        with looped:  # two more loops: a whole one began after spooling did
            began = loops[0]
            assert looped.wait_for(lambda: loops[0] >= began + 2, timeout=5)

    monkeypatch.setattr(producer, "_start_spooling", start_then_let_the_thread_look)


def test_with_a_spool_a_queue_that_stays_full_without_deliveries_spools(
    fake: type[FakeClient], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(kafka_module, "QUEUE_STALL_S", 0.2)
    caplog.set_level(logging.WARNING, logger="producers.kafka")
    producer, client = _answering_spooled_producer(fake, tmp_path)
    # The spool's thread ends spooling once nothing waits to be resent: looking right after spooling began, it
    # must find the message that began it on disk, or the next send would wait for the stall again.
    _let_the_spool_thread_look_after_spooling_begins(producer, monkeypatch)
    client.buffer_errors = 10**9
    started = time.monotonic()
    producer.send_raw("t.raw.sandbox", b"x")
    waited = time.monotonic() - started
    assert 0.2 <= waited < 5
    assert producer.stats.spooled == 1
    assert "stayed full for 0.2 s without a delivery confirmed" in caplog.text
    assert "answers again" not in caplog.text
    producer.send_raw("t.raw.sandbox", b"y")  # spooling now: straight to disk, no second wait
    assert caplog.text.count("is not keeping up") == 1
    assert producer.stats.spooled == 2
    producer.close(0.5)


def test_with_a_spool_a_full_queue_before_the_cluster_answered_waits_until_an_outage_signal(
    fake: type[FakeClient], tmp_path: Path
) -> None:
    # A burst at start-up fills the queue before any delivery: that is a wait (bounded by the stall limit)
    # unless librdkafka says the cluster is away, which sends the message to the spool at once.
    producer = _producer(spool=Spool(tmp_path / "spool", scope="127.0.0.1:9"))
    client = fake.instances[0]
    client.buffer_errors = 10**9
    down = threading.Timer(0.2, client.error_cb, [KafkaError(KafkaError._ALL_BROKERS_DOWN, "all brokers down")])
    down.start()
    started = time.monotonic()
    producer.send_raw("t.raw.sandbox", b"x")
    waited = time.monotonic() - started
    down.join()
    assert 0.2 <= waited < kafka_module.QUEUE_STALL_S
    assert producer.stats.spooled == 1
    producer.close(0.5)


def test_fatal_error_stops_the_producer(fake: type[FakeClient]) -> None:
    producer = _producer()
    fake.instances[0].error_cb(KafkaError(KafkaError._FATAL, "fenced", fatal=True))
    with pytest.raises(ProducerFatalError, match="create a new EventProducer") as info:
        producer.send_raw("t.raw.sandbox", b"x")
    assert isinstance(info.value, PermanentError)
    assert info.value.code == "_FATAL"


def test_transient_client_errors_are_only_logged_once(
    fake: type[FakeClient], caplog: pytest.LogCaptureFixture
) -> None:
    producer = _producer()
    for _ in range(5):
        fake.instances[0].error_cb(KafkaError(KafkaError._TRANSPORT, "broker away"))
    producer.send_raw("t.raw.sandbox", b"x")
    assert caplog.text.count("broker away") == 1


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too big"), ProduceRejected),
        (KafkaError(KafkaError._TRANSPORT, "away", retriable=True), ProduceFailed),
        (KafkaError(KafkaError._FATAL, "dead", fatal=True), ProducerFatalError),
    ],
)
def test_kafka_exceptions_become_project_errors(
    fake: type[FakeClient], error: KafkaError, expected: type[Exception]
) -> None:
    producer = _producer()
    fake.instances[0].produce_error = KafkaException(error)
    with pytest.raises(expected) as info:
        producer.send_raw("t.raw.sandbox", b"x")
    assert isinstance(info.value.__cause__, KafkaException)
    assert producer.stats.sent == 0


def test_event_that_is_not_in_the_catalog_is_rejected(fake: type[FakeClient]) -> None:
    from datetime import UTC, datetime
    from uuid import uuid4

    from schemas.base import Envelope, Producer, ProducerKind

    bare = Envelope(
        event_id=uuid4(),
        schema_version=1,
        occurred_at=datetime.now(UTC),
        run_id="r",
        producer=Producer(kind=ProducerKind.SANDBOX, id="p", version="1"),
    )
    with pytest.raises(ProduceRejected, match="not a catalog event"):
        _producer().send(bare)


def test_context_exit_flushes_and_raises_when_undelivered(fake: type[FakeClient]) -> None:
    with pytest.raises(DeliveryError), _producer() as producer:
        fake.instances[0].stuck = True
        producer.send_raw("t.raw.sandbox", b"x")
    assert fake.instances[0].purged and fake.instances[0].closed


def test_context_exit_never_hides_the_exception_in_flight(fake: type[FakeClient]) -> None:
    with pytest.raises(KeyError), _producer() as producer:
        fake.instances[0].stuck = True
        producer.send_raw("t.raw.sandbox", b"x")
        raise KeyError("the caller's own error")
    assert fake.instances[0].closed


def test_close_is_idempotent_and_send_after_close_fails(fake: type[FakeClient]) -> None:
    producer = _producer()
    producer.send_raw("t.raw.sandbox", b"x")
    producer.close()
    producer.close()
    assert "closed" in repr(producer)
    with pytest.raises(ProducerClosed):
        producer.send_raw("t.raw.sandbox", b"x")
