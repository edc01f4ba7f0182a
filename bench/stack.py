"""The native stack a benchmark runs on: its own Kafka broker on free ports and worker subprocesses."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.machine import process_cpu_seconds
from infra.clickhouse.reader import QueryResult, live_owner, query
from infra.kafka.broker import NativeKafka
from infra.kafka.topics import ensure_topics
from rollout.commands.status import fetch_stats
from rollout.errors import ServiceUnavailable
from rollout.settings import Settings
from schemas import TopicNames

if TYPE_CHECKING:
    from producers.kafka import EventProducer, ProducerStats


def free_port() -> int:
    """A TCP port that was free a moment ago on loopback."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def exit_on_sigterm() -> None:
    """Make SIGTERM (``kill``, ``timeout``) end this process as Ctrl-C does: through its ``finally`` blocks, which
    stop the broker and workers it started (by default the signal ends Python at once and leaves them running)."""

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, stop)


def deliver_all(producer: EventProducer, timeout: float = 120.0) -> ProducerStats:
    """Wait until the broker confirmed every message ``producer`` sent; its stats then.

    ``flush`` counts a message that went to the producer's spool (Kafka briefly unavailable, e.g. while a new
    broker's coordinator loads) as not lost, and ``close`` leaves it on disk for the next producer: a
    benchmark whose log missed it would measure a different log. The spool's own thread resends it.
    """
    deadline = time.monotonic() + timeout
    producer.flush(timeout)
    while True:
        stats = producer.stats
        if stats.failed:
            raise RuntimeError(f"the broker refused messages of the benchmark's log: {stats}")
        if stats.delivered >= stats.sent and not stats.spool_pending:
            return stats
        if time.monotonic() > deadline:
            raise RuntimeError(f"not every message of the benchmark's log was delivered within {timeout:.0f} s: "
                               f"{stats}")
        producer.poll(0.1)


class Broker:
    """A Kafka broker of the bench's own: native, on free ports, with its data under the work folder."""

    def __init__(self, work_dir: Path) -> None:
        port = free_port()
        controller = free_port()
        while controller == port:
            controller = free_port()
        defaults = Settings()
        self.kafka = NativeKafka(
            version=defaults.kafka_version,
            cache_dir=defaults.cache_dir,
            data_dir=work_dir / "kafka",
            port=port,
            controller_port=controller,
            heap=defaults.kafka_heap,
        )

    @property
    def bootstrap(self) -> str:
        """Bootstrap servers of the running broker."""
        return self.kafka.bootstrap_servers

    def up(self) -> Broker:
        """Start it (fetching the jars on first use) and wait until it answers."""
        self.kafka.up(timeout=180)
        return self

    def down(self) -> None:
        """Stop it."""
        self.kafka.down()


INGEST = {"mode": "direct"}
"""How the suite's workers read the raw topics (``rollout bench --ingest``); the live worker always uses Faust."""


def stack_settings(bootstrap: str, data_dir: Path, tag: str, *, batch_size: int, topic_prefix: str | None = None,
                   partitions: int = 4, ingest: str | None = None) -> Settings:
    """Settings of one worker (or publisher): its data folder, topics, consumer group and web port."""
    return Settings(
        ingest="faust" if (ingest or INGEST["mode"]) == "faust" else "direct",
        data_dir=data_dir,
        kafka_bootstrap_servers_setting=bootstrap,
        topic_prefix=topic_prefix or f"bench-{tag}",
        consumer_group=f"bench-{tag}-{os.getpid()}",
        worker_web_port=free_port(),
        topic_partitions=partitions,
        sink_batch_size=batch_size,
        sink_batch_seconds=Settings().sink_batch_seconds,
    )


def create_topics(settings: Settings) -> None:
    """Create the raw, dead-letter and derived topics of the settings' prefix (idempotent)."""
    ensure_topics(settings.kafka_client_config(), TopicNames(settings.topic_prefix).all,
                  partitions=settings.topic_partitions)


def settings_env(settings: Settings) -> dict[str, str]:
    """Environment variables that make the child ``rollout worker`` build the same settings."""
    return {
        "ROLLOUT_DATA_DIR": str(settings.data_dir),
        "ROLLOUT_CACHE_DIR": str(settings.cache_dir),
        "CLICKHOUSE_DATABASE": settings.clickhouse_database,
        "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap_servers,
        "ROLLOUT_TOPIC_PREFIX": settings.topic_prefix,
        "ROLLOUT_TOPIC_PARTITIONS": str(settings.topic_partitions),
        "ROLLOUT_CONSUMER_GROUP": settings.consumer_group,
        "ROLLOUT_WORKER_WEB_PORT": str(settings.worker_web_port),
        "ROLLOUT_SINK_BATCH_SIZE": str(settings.sink_batch_size),
        "ROLLOUT_SINK_BATCH_SECONDS": str(settings.sink_batch_seconds),
        "ROLLOUT_INGEST": settings.ingest,
        "ROLLOUT_ENGINE_PAGE_OUT_SECONDS": str(settings.engine_page_out_seconds),
        "ROLLOUT_FAULT_INJECTION": "0",
    }


def proc_status_bytes(pid: int, *names: str) -> tuple[int, ...]:
    """The named memory figures of a process's ``/proc/<pid>/status`` (VmRSS, RssAnon, ...) in bytes, in
    the order asked; zeros when it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return tuple(0 for _ in names)
    values = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in names:
            values[name] = int(rest.split()[0]) * 1024
    return tuple(values.get(name, 0) for name in names)


def rss_bytes(pid: int) -> tuple[int, int, int]:
    """Resident set size now, at its peak, and its file-backed part now (VmRSS, VmHWM, RssFile) of a
    process, in bytes; zeros when it is gone."""
    rss, peak, file_rss = proc_status_bytes(pid, "VmRSS", "VmHWM", "RssFile")
    return rss, peak, file_rss


@dataclass
class Progress:
    """Samples of a worker's progress: (seconds since the first sample, consumed, RSS bytes)."""

    samples: list[tuple[float, int, int]] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    """The worker's CPU seconds (all threads, its embedded engine's included) at each sample."""
    peak_rss: int = 0
    peak_file_rss: int = 0
    """Largest file-backed part of RSS sampled (pages mapped from files: mostly the ClickHouse engine's
    library, which the kernel can drop and read again; the rest is the process's own memory)."""


class Worker:
    """One ``rollout worker`` subprocess with its own settings; stats, reads, RSS and a clean stop."""

    def __init__(self, settings: Settings, log_path: Path, *, module: str = "rollout.cli") -> None:
        self.settings = settings
        self.log_path = log_path
        self.module = module
        """What runs ``worker``: the project's command line, or a bench variant of it (``bench.without_derivation``)."""
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        """The worker's process id."""
        assert self.process is not None
        return self.process.pid

    def start(self, timeout: float = 120.0) -> Worker:
        """Start it and wait until it serves /stats and owns its embedded ClickHouse."""
        env = {**os.environ, **settings_env(self.settings)}
        env.pop("CLICKHOUSE_URL", None)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", self.module, "worker", "--log-level", "warn"],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"worker exited with {self.process.returncode}:\n{self.tail()}")
            with contextlib.suppress(ServiceUnavailable):  # fetch_stats turns OSError into it
                self.stats()
                if live_owner(self.settings) is not None:
                    return self
            time.sleep(0.2)
        raise RuntimeError(f"worker not ready after {timeout:.0f}s:\n{self.tail()}")

    def stats(self) -> dict[str, Any]:
        """The sink's running totals (/stats)."""
        return fetch_stats(self.settings.worker_web_port, timeout=10)

    def query(self, sql: str, parameters: dict[str, Any] | None = None) -> QueryResult:
        """A read-only query through the worker's /sql endpoint."""
        return query(self.settings, sql, parameters, timeout=300)

    def watch(self, total: int, *, timeout: float, interval: float = 0.25,
              on_sample: Callable[[float, int], None] | None = None) -> Progress:
        """Sample consumed and RSS until ``consumed >= total``; WatchTimeout (with the samples) after ``timeout``."""
        progress = Progress()
        began = time.monotonic()
        while True:
            now = time.monotonic() - began
            consumed = int(self.stats()["consumed"])
            rss, peak, file_rss = rss_bytes(self.pid)
            progress.samples.append((now, consumed, rss))
            progress.cpu.append(process_cpu_seconds(self.pid))
            progress.peak_rss = max(progress.peak_rss, peak)
            progress.peak_file_rss = max(progress.peak_file_rss, file_rss)
            if on_sample is not None:
                on_sample(now, consumed)
            if consumed >= total:
                return progress
            if now > timeout:
                raise WatchTimeout(progress, f"worker consumed {consumed} of {total} in {timeout:.0f}s")
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"worker exited with {self.process.returncode}:\n{self.tail()}")
            time.sleep(interval)

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM and wait; SIGKILL the process group after ``timeout``."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)

    def tail(self, lines: int = 30) -> str:
        """The end of the worker's log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class WatchTimeout(TimeoutError):
    """A worker did not consume everything in time; ``progress`` holds what was sampled."""

    def __init__(self, progress: Progress, message: str) -> None:
        super().__init__(message)
        self.progress = progress
