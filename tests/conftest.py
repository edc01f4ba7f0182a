"""Shared fixtures: the Kafka broker for the whole session, isolated settings and workers per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout.settings import Settings
from tests.support.worker import WorkerProcess, free_port

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Bootstrap servers of a real Kafka: KAFKA_BOOTSTRAP_SERVERS when set, else this project's native broker.

    The native broker for tests has its own data folder and ports (ROLLOUT_TEST_KAFKA_PORT,
    default 29092/29093) so it never collides with a broker started by `rollout infra up`.
    """
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if external:
        yield external
        return
    from infra.kafka.broker import NativeKafka

    port = int(os.environ.get("ROLLOUT_TEST_KAFKA_PORT", "29092"))
    broker = NativeKafka(
        version=os.environ.get("ROLLOUT_KAFKA_VERSION", "4.0.2"),
        cache_dir=Path(os.environ.get("ROLLOUT_CACHE_DIR", Path.home() / ".cache" / "rollout")),
        data_dir=ROOT / ".data" / f"test-broker-{port}",
        port=port,
        controller_port=port + 1,
    )
    status = broker.up(timeout=120)
    try:
        yield status.bootstrap_servers
    finally:
        if not status.reused:
            broker.down()


@pytest.fixture
def stack_settings(tmp_path: Path, kafka_bootstrap: str) -> Settings:
    """Settings for one test: its own topics, consumer group, data folder and worker port."""
    tag = uuid.uuid4().hex[:10]
    return Settings(
        data_dir=tmp_path / "data",
        kafka_bootstrap_servers_setting=kafka_bootstrap,
        topic_prefix=f"t{tag}",
        consumer_group=f"g{tag}",
        worker_web_port=free_port(),
        topic_partitions=4,
        sink_batch_size=2000,
        sink_batch_seconds=0.2,
    )


@pytest.fixture
def worker(stack_settings: Settings, tmp_path: Path) -> Iterator[WorkerProcess]:
    """A running `rollout worker` subprocess for this test's settings; stopped afterwards."""
    process = WorkerProcess(stack_settings, tmp_path / "worker.log").start()
    try:
        yield process
    finally:
        process.stop()
