"""Run ``rollout worker`` as a real subprocess for tests, with readiness by probing its web port."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from infra.clickhouse.reader import QueryResult, live_owner, query
from rollout.commands.status import fetch_stats
from rollout.errors import ServiceUnavailable
from rollout.settings import Settings


def free_port() -> int:
    """A TCP port that was free a moment ago on loopback."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def settings_env(settings: Settings) -> dict[str, str]:
    """Environment variables that make a child process build the same settings."""
    env = {
        "ROLLOUT_DATA_DIR": str(settings.data_dir),
        "ROLLOUT_CACHE_DIR": str(settings.cache_dir),
        "CLICKHOUSE_DATABASE": settings.clickhouse_database,
        "ROLLOUT_TOPIC_PREFIX": settings.topic_prefix,
        "ROLLOUT_TOPIC_PARTITIONS": str(settings.topic_partitions),
        "ROLLOUT_CONSUMER_GROUP": settings.consumer_group,
        "ROLLOUT_WORKER_WEB_PORT": str(settings.worker_web_port),
        "ROLLOUT_WORKER_REPORT_SECONDS": str(settings.worker_report_seconds),
        "ROLLOUT_KAFKA_PORT": str(settings.kafka_port),
        "ROLLOUT_KAFKA_CONTROLLER_PORT": str(settings.kafka_controller_port),
        "ROLLOUT_SINK_BATCH_SIZE": str(settings.sink_batch_size),
        "ROLLOUT_SINK_BATCH_SECONDS": str(settings.sink_batch_seconds),
        "ROLLOUT_INGEST": settings.ingest,
        "ROLLOUT_FAULT_INJECTION": "1" if settings.fault_injection else "0",
    }
    if settings.clickhouse_url_setting:
        env["CLICKHOUSE_URL"] = settings.clickhouse_url_setting
    if settings.kafka_bootstrap_servers_setting:
        env["KAFKA_BOOTSTRAP_SERVERS"] = settings.kafka_bootstrap_servers_setting
    return env


class WorkerProcess:
    """One ``rollout worker`` child process and ways to look at it, stop it or kill it."""

    def __init__(self, settings: Settings, log_path: Path, log_level: str = "warn") -> None:
        self.settings = settings
        self.log_path = log_path
        self.log_level = log_level
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 90.0) -> WorkerProcess:
        """Start the worker and wait until it serves /stats and (embedded) owns ClickHouse."""
        env = {**os.environ, **settings_env(self.settings)}
        env.pop("KAFKA_BOOTSTRAP_SERVERS", None) if not self.settings.kafka_bootstrap_servers_setting else None
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "rollout.cli", "worker", "--log-level", self.log_level],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"worker exited with {self.process.returncode}:\n{self.tail()}")
            if self._ready():
                return self
            time.sleep(0.2)
        raise RuntimeError(f"worker not ready after {timeout}s:\n{self.tail()}")

    def _ready(self) -> bool:
        """Serving /stats, and (embedded engine) some live worker owns ClickHouse: this one or another."""
        try:
            self.stats()
        except ServiceUnavailable:
            return False
        return not self.settings.clickhouse_embedded or live_owner(self.settings) is not None

    def stats(self) -> dict[str, Any]:
        """The sink's running totals."""
        return fetch_stats(self.settings.worker_web_port, timeout=5)

    def query(self, sql: str, parameters: dict[str, Any] | None = None) -> QueryResult:
        """A read through the worker (or directly when no worker owns the engine)."""
        return query(self.settings, sql, parameters)

    def scalar(self, sql: str, parameters: dict[str, Any] | None = None) -> Any:
        """The single value of a one-row, one-column read."""
        return self.query(sql, parameters).rows[0][0]

    def wait_consumed(self, count: int, timeout: float = 120.0) -> dict[str, Any]:
        """Wait until the sink has consumed at least ``count`` messages in total."""
        deadline = time.monotonic() + timeout
        stats: dict[str, Any] = {}
        while time.monotonic() < deadline:
            stats = self.stats()
            if stats["consumed"] >= count:
                return stats
            time.sleep(0.2)
        raise AssertionError(f"worker consumed {stats.get('consumed')} of {count} in {timeout}s:\n{self.tail()}")

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait (SIGKILL after the timeout); returns the exit code."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return self.kill()

    def kill(self) -> int:
        """SIGKILL the whole process group, as a crash would."""
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        return self.process.wait(30)

    def tail(self, lines: int = 40) -> str:
        """The end of the worker's log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def committed_offsets(settings: Settings) -> int:
    """Sum of the worker group's committed offsets over the raw topics' partitions."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient

    from schemas import TopicNames

    admin = AdminClient(settings.kafka_client_config())
    topics = TopicNames(settings.topic_prefix)
    partitions = [TopicPartition(t, p) for t in topics.raw for p in range(settings.topic_partitions)]
    future = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(settings.consumer_group, partitions)])
    result = future[settings.consumer_group].result(timeout=30)
    return sum(max(tp.offset, 0) for tp in result.topic_partitions)
