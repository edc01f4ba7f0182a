"""Shared fixtures: the service stack for the session, isolated settings and workers per test.

The stack is chosen by ``ROLLOUT_TEST_STACK``:

- ``native`` — this project's own Kafka broker (jars from Maven Central) and the embedded ClickHouse
  engine; the default when no Docker engine answers (``ROLLOUT_TEST_KAFKA_PORT``, default 29092/29093);
- ``containers`` — Kafka and a ClickHouse server in containers (testcontainers); the default when a
  Docker engine answers;
- ``external`` — ``KAFKA_BOOTSTRAP_SERVERS`` (and ``CLICKHOUSE_URL`` for a server, else embedded).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rollout.settings import Settings
from tests.support.worker import WorkerProcess, free_port

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Stack:
    """Where the tests' services are: Kafka bootstrap servers and, for a server, the ClickHouse URL."""

    kind: str
    kafka_bootstrap: str
    clickhouse_url: str | None = None  # None: the embedded engine in each test's data folder


def docker_engine_answers() -> bool:
    """True when a Docker engine answers the docker SDK's ping."""
    try:
        import docker

        docker.from_env(timeout=5).ping()
    except Exception:  # no SDK, no socket, no permission: no engine to use
        return False
    return True


def _stack_kind() -> str:
    kind = os.environ.get("ROLLOUT_TEST_STACK", "auto")
    if kind == "auto":
        if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
            return "external"
        return "containers" if docker_engine_answers() else "native"
    if kind not in ("native", "containers", "external"):
        raise pytest.UsageError(f"ROLLOUT_TEST_STACK must be native, containers, external or auto, not {kind!r}")
    return kind


@pytest.fixture(scope="session")
def services() -> Iterator[Stack]:
    """The session's services (see the module docstring)."""
    kind = _stack_kind()
    if kind == "external":
        bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
        if not bootstrap:
            raise pytest.UsageError("ROLLOUT_TEST_STACK=external needs KAFKA_BOOTSTRAP_SERVERS")
        yield Stack(kind, bootstrap, os.environ.get("CLICKHOUSE_URL") or None)
    elif kind == "containers":
        yield from _containers()
    else:
        yield from _native()


def _native() -> Iterator[Stack]:
    from infra.kafka.broker import NativeKafka
    from infra.kafka.exceptions import PortInUse

    port = int(os.environ.get("ROLLOUT_TEST_KAFKA_PORT", "29092"))
    broker = NativeKafka(
        version=os.environ.get("ROLLOUT_KAFKA_VERSION", "4.0.2"),
        cache_dir=Path(os.environ.get("ROLLOUT_CACHE_DIR", Path.home() / ".cache" / "rollout")),
        data_dir=ROOT / ".data" / f"test-broker-{port}",
        port=port,
        controller_port=port + 1,
    )
    try:
        status = broker.up(timeout=120)
    except PortInUse as exc:
        # The broker's own message names `rollout infra up`'s settings; the test stack reads this one.
        raise pytest.UsageError(f"{exc}\nFor the tests, pick other ports with ROLLOUT_TEST_KAFKA_PORT (e.g. "
                                f"ROLLOUT_TEST_KAFKA_PORT={port + 100}; it uses that port and the next).") from exc
    try:
        yield Stack("native", status.bootstrap_servers)
    finally:
        if not status.reused:
            broker.down()


def _containers() -> Iterator[Stack]:
    """Kafka (apache/kafka) and a ClickHouse server, the images of infra/compose.yaml."""
    import time
    import urllib.request

    import yaml
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import wait_for_logs

    images = yaml.safe_load((ROOT / "infra" / "compose.yaml").read_text())["services"]
    kafka_port = free_port()
    kafka = (
        DockerContainer(images["kafka"]["image"])
        .with_bind_ports(9094, kafka_port)
        .with_envs(
            KAFKA_NODE_ID="1", KAFKA_PROCESS_ROLES="broker,controller",
            KAFKA_LISTENERS="PLAINTEXT://:9092,CONTROLLER://:9093,HOST://:9094",
            KAFKA_ADVERTISED_LISTENERS=f"PLAINTEXT://localhost:9092,HOST://127.0.0.1:{kafka_port}",
            KAFKA_LISTENER_SECURITY_PROTOCOL_MAP="CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,HOST:PLAINTEXT",
            KAFKA_CONTROLLER_LISTENER_NAMES="CONTROLLER", KAFKA_CONTROLLER_QUORUM_VOTERS="1@localhost:9093",
            KAFKA_INTER_BROKER_LISTENER_NAME="PLAINTEXT", KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR="1",
            KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR="1", KAFKA_TRANSACTION_STATE_LOG_MIN_ISR="1",
            KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS="0",
        )
    )
    clickhouse = (
        DockerContainer(images["clickhouse"]["image"])
        .with_exposed_ports(8123)
        .with_envs(CLICKHOUSE_USER="rollout", CLICKHOUSE_PASSWORD="rollout", CLICKHOUSE_DEFAULT_ACCESS_MANAGEMENT="1")
    )
    with kafka, clickhouse:
        wait_for_logs(kafka, "Kafka Server started", timeout=180)
        host, port = clickhouse.get_container_host_ip(), clickhouse.get_exposed_port(8123)
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://{host}:{port}/ping", timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
        yield Stack("containers", f"127.0.0.1:{kafka_port}", f"http://rollout:rollout@{host}:{port}")


@pytest.fixture(scope="session")
def kafka_bootstrap(services: Stack) -> str:
    """Bootstrap servers of the session's real Kafka."""
    return services.kafka_bootstrap


@pytest.fixture
def stack_settings(tmp_path: Path, services: Stack, request: pytest.FixtureRequest) -> Settings:
    """Settings for one test: its own topics, consumer group, data folder, database and worker port."""
    tag = uuid.uuid4().hex[:10]
    return Settings(
        data_dir=tmp_path / "data",
        kafka_bootstrap_servers_setting=services.kafka_bootstrap,
        clickhouse_url_setting=services.clickhouse_url or "",
        clickhouse_database=f"rollout_{tag}" if services.clickhouse_url else "rollout",
        topic_prefix=f"t{tag}",
        consumer_group=f"g{tag}",
        worker_web_port=free_port(),
        topic_partitions=4,
        sink_batch_size=2000,
        sink_batch_seconds=0.2,
        # The worker's own default unless a test asks for a mode (indirect parametrisation) or
        # ROLLOUT_TEST_INGEST=faust runs every worker of the suite with the Faust agent.
        ingest=getattr(request, "param", None)
        or os.environ.get("ROLLOUT_TEST_INGEST", Settings.model_fields["ingest"].default),
    )


@pytest.fixture
def worker(stack_settings: Settings, tmp_path: Path) -> Iterator[WorkerProcess]:
    """A running `rollout worker` subprocess for this test's settings; stopped afterwards."""
    process = WorkerProcess(stack_settings, tmp_path / "worker.log").start()
    try:
        yield process
    finally:
        process.stop()
