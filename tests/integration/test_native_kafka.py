"""The native Kafka broker for real: fetched jars, a JVM on loopback, topics, messages, stop and restart."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from infra.kafka.broker import BrokerStatus, NativeKafka
from infra.kafka.exceptions import BrokerConfigChanged, BrokerStartFailed, ToolMissing
from rollout.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

# Never the default ports: a developer's own broker may be running there.
_AVOID = {19092, 19093}


def _free_ports(count: int) -> list[int]:
    sockets: list[socket.socket] = []
    try:
        while len(sockets) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            if sock.getsockname()[1] in _AVOID:
                sock.close()
                continue
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _make_broker(data_dir: Path, **overrides: str) -> NativeKafka:
    """A broker in its own data folder on free ports, sharing the real jar cache (fetched once)."""
    settings = Settings()
    port, controller_port = _free_ports(2)
    return NativeKafka(
        version=settings.kafka_version,
        cache_dir=settings.cache_dir,
        data_dir=data_dir,
        port=port,
        controller_port=controller_port,
        heap=overrides.get("heap", settings.kafka_heap),
    )


def _fetch_or_skip(broker: NativeKafka) -> None:
    try:
        broker.fetch()
    except ToolMissing as exc:
        pytest.skip(f"the native Kafka broker cannot run on this machine: {exc}")


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NativeKafka, BrokerStatus]]:
    broker = _make_broker(tmp_path_factory.mktemp("kafka-native"))
    _fetch_or_skip(broker)
    try:
        yield broker, broker.up(timeout=120)
    finally:
        broker.down(timeout=30)


def _client(broker: NativeKafka) -> dict[str, str | int | float | bool]:
    return {"bootstrap.servers": broker.bootstrap_servers}


def _create_topic(broker: NativeKafka, name: str) -> None:
    # The client must outlive the future: destroying it cancels the request.
    admin = AdminClient(_client(broker))
    futures = admin.create_topics([NewTopic(name, num_partitions=2, replication_factor=1)])
    futures[name].result(timeout=30)


def _produce(broker: NativeKafka, topic: str, key: bytes, value: bytes) -> None:
    producer = Producer({**_client(broker), "enable.idempotence": True})
    errors: list[KafkaError] = []
    producer.produce(
        topic, key=key, value=value, on_delivery=lambda err, _msg: errors.append(err) if err else None
    )
    assert producer.flush(30) == 0
    assert errors == []


def _consume_one(broker: NativeKafka, topic: str) -> tuple[bytes | None, bytes | None]:
    consumer = Consumer(
        {**_client(broker), "group.id": f"test-{uuid.uuid4().hex}", "auto.offset.reset": "earliest"}
    )
    try:
        consumer.subscribe([topic])
        for _ in range(60):
            message = consumer.poll(1.0)
            if message is None:
                continue
            assert message.error() is None, message.error()
            return message.key(), message.value()
    finally:
        consumer.close()
    raise AssertionError(f"no message arrived on {topic} within 60 s")


def test_up_from_cold_reaches_a_ready_broker(started: tuple[NativeKafka, BrokerStatus]) -> None:
    broker, status = started

    assert status.ready and status.running
    assert not status.reused
    assert status.pid is not None
    assert status.bootstrap_servers == broker.bootstrap_servers
    assert broker.pid_path.read_text().strip() == str(status.pid)
    assert status.log_file.is_file()
    cmdline = Path(f"/proc/{status.pid}/cmdline").read_bytes().split(b"\0")
    assert b"kafka.Kafka" in cmdline
    assert str(broker.properties_path).encode() in cmdline


def test_second_up_reuses_the_running_broker(started: tuple[NativeKafka, BrokerStatus]) -> None:
    broker, first = started
    again = NativeKafka(
        version=broker.version,
        cache_dir=broker.cache_dir,
        data_dir=broker.data_dir,
        port=broker.port,
        controller_port=broker.controller_port,
        heap=broker.heap,
    )

    second = again.up(timeout=30)

    assert second.reused
    assert second.pid == first.pid
    assert second.ready
    assert "already running" in second.reason


def test_status_says_running_and_ready(started: tuple[NativeKafka, BrokerStatus]) -> None:
    broker, first = started

    status = broker.status()

    assert (status.running, status.ready, status.pid) == (True, True, first.pid)
    assert status.data_dir == broker.home
    assert "ready" in status.reason


def test_a_topic_can_be_created_written_and_read(started: tuple[NativeKafka, BrokerStatus]) -> None:
    broker, _ = started
    topic = f"test-native-{uuid.uuid4().hex[:12]}"

    _create_topic(broker, topic)
    _produce(broker, topic, b"trajectory-1", b'{"event_type": "rollout.finished"}')

    assert _consume_one(broker, topic) == (b"trajectory-1", b'{"event_type": "rollout.finished"}')


def test_up_with_other_ports_while_running_asks_to_stop_first(
    started: tuple[NativeKafka, BrokerStatus],
) -> None:
    broker, _ = started
    port, controller_port = _free_ports(2)
    moved = NativeKafka(
        version=broker.version,
        cache_dir=broker.cache_dir,
        data_dir=broker.data_dir,
        port=port,
        controller_port=controller_port,
    )

    with pytest.raises(BrokerConfigChanged, match="stop it first") as caught:
        moved.up(timeout=10)

    assert "address" in str(caught.value)
    assert broker.status().ready


def test_up_with_another_heap_while_running_asks_to_stop_first(
    started: tuple[NativeKafka, BrokerStatus],
) -> None:
    broker, _ = started
    bigger = NativeKafka(
        version=broker.version,
        cache_dir=broker.cache_dir,
        data_dir=broker.data_dir,
        port=broker.port,
        controller_port=broker.controller_port,
        heap="1g",
    )

    with pytest.raises(BrokerConfigChanged, match="heap"):
        bigger.up(timeout=10)


def test_down_stops_it_keeps_its_data_for_the_next_up_and_is_harmless_twice(tmp_path: Path) -> None:
    broker = _make_broker(tmp_path)
    _fetch_or_skip(broker)
    try:
        first = broker.up(timeout=120)
        assert first.ready and first.pid is not None
        cluster_id = broker.cluster_id_path.read_text().strip()
        topic = f"test-restart-{uuid.uuid4().hex[:12]}"
        _create_topic(broker, topic)
        _produce(broker, topic, b"k", b"kept across restarts")

        stopped = broker.down(timeout=30)

        assert not stopped.running
        assert "stopped" in stopped.reason
        assert not Path(f"/proc/{first.pid}").exists()
        assert not broker.pid_path.exists()
        after = broker.status(timeout=1)
        assert (after.running, after.ready, after.pid) == (False, False, None)
        assert "not running" in after.reason
        again = broker.down(timeout=30)
        assert not again.running
        assert "nothing to stop" in again.reason

        restarted = broker.up(timeout=120)

        assert restarted.ready and restarted.pid != first.pid
        assert broker.cluster_id_path.read_text().strip() == cluster_id
        assert _consume_one(broker, topic) == (b"k", b"kept across restarts")
    finally:
        broker.down(timeout=30)


def test_a_broker_that_dies_during_startup_is_reported_with_its_log(tmp_path: Path) -> None:
    broker = _make_broker(tmp_path, heap="1k")
    _fetch_or_skip(broker)

    with pytest.raises(BrokerStartFailed) as caught:
        broker.up(timeout=60)

    message = str(caught.value)
    assert "exited during startup" in message
    assert "Too small maximum heap" in message
    assert not broker.pid_path.exists()
    assert not broker.status(timeout=0.5).running
