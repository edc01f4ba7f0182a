"""The native Apache Kafka broker: KRaft single node, jars from Maven Central, a local process on loopback."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from infra.kafka.exceptions import (
    BrokerConfigChanged,
    BrokerStartFailed,
    BrokerStopFailed,
    FetchFailed,
    PortInUse,
    ToolMissing,
)
from rollout.errors import ConfigurationError

if TYPE_CHECKING:
    from rollout.settings import Settings

Progress = Callable[[str], None]
"""Receives one short human-readable line per step (fetching, formatting, starting, waiting)."""

NODE_ID = 1
MAIN_CLASS = "kafka.Kafka"
STORAGE_TOOL_CLASS = "kafka.tools.StorageTool"

# Jar name prefixes of every slf4j binding a Kafka version might bring; exactly one may be present.
SLF4J_BINDINGS = (
    "log4j-slf4j-impl",
    "log4j-slf4j2-impl",
    "slf4j-reload4j",
    "slf4j-log4j12",
    "slf4j-simple",
    "slf4j-nop",
    "slf4j-jdk14",
    "logback-classic",
)

_MARKER = ".complete.json"
_VERSION_RE = re.compile(r"^[0-9A-Za-z][0-9A-Za-z._-]{0,63}$")
_HEAP_RE = re.compile(r"^[1-9][0-9]*[kKmMgG]?$")
_CLUSTER_ID_RE = re.compile(r"^[A-Za-z0-9_-]{22}$")
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_MAVEN_NOISE = (
    "[ERROR] -> [Help",
    "To see the full stack trace",
    "Re-run Maven using",
    "For more information about",
    "[Help 1] http",
    "[ERROR] After correcting the problems",
)


@dataclass(frozen=True)
class BrokerStatus:
    """What is known about the native broker: its process, whether it answers, and where it keeps things."""

    running: bool
    """The broker process of this data directory is alive."""
    ready: bool
    """An admin client got metadata listing this broker (the right cluster id) within the timeout."""
    pid: int | None
    bootstrap_servers: str
    data_dir: Path
    """The broker's own folder: ``<data_dir>/kafka`` with config, storage, pid file and logs."""
    log_file: Path
    reason: str
    """One human sentence: what state it is in and why."""
    reused: bool = False
    """Set by ``up()`` when it found the broker already running instead of starting it."""


@dataclass(frozen=True)
class ClusterProbe:
    """The outcome of asking a Kafka cluster for its metadata once."""

    reachable: bool
    brokers: int
    cluster_id: str | None
    detail: str


def new_cluster_id() -> str:
    """A fresh KRaft cluster id: base64url of 16 random bytes without padding (22 characters).

    An id starting with ``-`` would be read as an option by the storage tool, so those are drawn again
    (Kafka's own ``Uuid`` does the same).
    """
    while True:
        candidate = base64.urlsafe_b64encode(secrets.token_bytes(16)).decode("ascii").rstrip("=")
        if not candidate.startswith("-"):
            return candidate


def is_valid_cluster_id(value: str) -> bool:
    """True for a 22-character base64url id that decodes to 16 bytes, as StorageTool expects."""
    if not _CLUSTER_ID_RE.match(value):
        return False
    return len(base64.urlsafe_b64decode(value + "==")) == 16


def render_server_properties(*, host: str, port: int, controller_port: int, storage_dir: Path) -> str:
    """The ``server.properties`` of a single-node KRaft broker+controller listening on ``host`` only."""
    lines = [
        "# Written by infra/kafka/broker.py on every start; edits here are overwritten.",
        "process.roles=broker,controller",
        f"node.id={NODE_ID}",
        # A static voter needs no --standalone/--initial-controllers at format time (3.9 and 4.x).
        f"controller.quorum.voters={NODE_ID}@{host}:{controller_port}",
        f"listeners=PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}",
        f"advertised.listeners=PLAINTEXT://{host}:{port}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        f"log.dirs={storage_dir.resolve()}",
        # One broker: every internal topic must accept a replication factor and min ISR of 1.
        "offsets.topic.replication.factor=1",
        # 50 offsets partitions (the default) cost seconds of coordinator loading at each first
        # group join on a 2-core machine; a single-node broker gains nothing from them.
        "offsets.topic.num.partitions=4",
        "transaction.state.log.num.partitions=4",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        # Nobody else will join; waiting 3 s per first rebalance only slows tests and demos.
        "group.initial.rebalance.delay.ms=0",
        # A restarted controller treats the previous broker incarnation as alive for a whole session
        # and refuses to register the new one until it expires (9 s by default), so the session
        # bounds every restart. Heartbeats never leave this JVM: only a stall of the whole process
        # for 4 s could miss them, and then the broker just re-registers.
        "broker.heartbeat.interval.ms=1000",
        "broker.session.timeout.ms=4000",
    ]
    return "\n".join(lines) + "\n"


def log4j_config_text() -> str:
    """The broker's log4j 2 configuration (writes ``${kafka.logs.dir}/server.log``, size-capped)."""
    return resources.files("infra.kafka").joinpath("log4j2.properties").read_text(encoding="utf-8")


def pom_text() -> str:
    """The Maven project that lists the broker's runtime jars (version set by ``-Dkafka.version``)."""
    return resources.files("infra.kafka").joinpath("pom.xml").read_text(encoding="utf-8")


def cache_stamp(version: str) -> str:
    """Identifies a jar cache: changes with the version and with the pom, so an updated pom refetches."""
    return hashlib.sha256(f"{version}\n{pom_text()}".encode()).hexdigest()[:16]


def slf4j_bindings(jar_names: Sequence[str]) -> list[str]:
    """The jars among ``jar_names`` that are slf4j bindings."""
    return [name for name in jar_names if any(name.startswith(f"{b}-") for b in SLF4J_BINDINGS)]


def broker_command(
    *, java: str, libs_dir: Path, heap: str, log4j_config: Path, logs_dir: Path, properties: Path
) -> list[str]:
    """The command line that runs the broker in the foreground."""
    return [
        java,
        f"-Xmx{heap}",
        # Two cores and a shared machine: the serial collector has no GC threads competing with
        # the broker, Faust and ClickHouse, and is plenty for a heap this size.
        "-XX:+UseSerialGC",
        # Die loudly instead of limping on after an OutOfMemoryError.
        "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true",
        # Kafka shuts down in its own hook; log4j's hook would otherwise close the log first and
        # swallow the shutdown messages.
        "-Dlog4j2.shutdownHookEnabled=false",
        f"-Dkafka.logs.dir={logs_dir}",
        f"-Dlog4j2.configurationFile={log4j_config}",
        "-cp",
        f"{libs_dir}/*",
        MAIN_CLASS,
        str(properties),
    ]


def storage_format_command(
    *, java: str, libs_dir: Path, cluster_id: str, log4j_config: Path, logs_dir: Path, properties: Path
) -> list[str]:
    """The command line that formats the broker's storage once (a no-op when already formatted)."""
    return [
        java,
        "-Xmx256m",
        "-XX:+UseSerialGC",
        # A short-lived tool: C1 only starts faster and it never runs long enough to need C2.
        "-XX:TieredStopAtLevel=1",
        f"-Dkafka.logs.dir={logs_dir}",
        f"-Dlog4j2.configurationFile={log4j_config}",
        "-cp",
        f"{libs_dir}/*",
        STORAGE_TOOL_CLASS,
        "format",
        "-t",
        cluster_id,
        "-c",
        str(properties),
        "--ignore-formatted",
    ]


def is_broker_command(args: Sequence[str], properties: Path) -> bool:
    """True when a process's arguments are a Kafka broker run with exactly this properties file."""
    return MAIN_CLASS in args and str(properties) in args


def probe_cluster(client_config: Mapping[str, str], timeout: float) -> ClusterProbe:
    """Ask a Kafka cluster for its metadata once; an open port alone is not an answer."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    conf: dict[str, str | int | float | bool] = dict(client_config)
    # librdkafka would print every refused connection to stderr while the broker is starting.
    conf.setdefault("log_level", 0)
    conf.setdefault("reconnect.backoff.max.ms", 250)
    try:
        metadata = AdminClient(conf).list_topics(timeout=max(timeout, 0.1))
    except KafkaException as exc:
        error = exc.args[0] if exc.args else exc
        detail = error.str() if isinstance(error, KafkaError) else str(error)
        return ClusterProbe(reachable=False, brokers=0, cluster_id=None, detail=detail)
    brokers = len(metadata.brokers)
    return ClusterProbe(
        reachable=brokers > 0,
        brokers=brokers,
        cluster_id=metadata.cluster_id,
        detail=f"{brokers} broker(s), cluster id {metadata.cluster_id}",
    )


class NativeKafka:
    """Fetches, starts, probes and stops this project's own single-node Kafka broker."""

    def __init__(
        self,
        *,
        version: str,
        cache_dir: Path,
        data_dir: Path,
        port: int,
        controller_port: int,
        heap: str = "768m",
        host: str = "127.0.0.1",
        java: str = "java",
        mvn: str = "mvn",
    ) -> None:
        if not _VERSION_RE.match(version):
            raise ConfigurationError(f"Kafka version {version!r} is not a version number (e.g. 4.0.2)")
        if not _HEAP_RE.match(heap):
            raise ConfigurationError(f"Kafka heap {heap!r} is not a JVM size such as 512m or 1g")
        for name, value in (("port", port), ("controller port", controller_port)):
            if not 1 <= value <= 65535:
                raise ConfigurationError(f"Kafka {name} {value} is outside 1-65535")
        if port == controller_port:
            raise ConfigurationError(
                f"the Kafka port and controller port are both {port}; "
                "set ROLLOUT_KAFKA_CONTROLLER_PORT to another free port"
            )
        self.version = version
        self.cache_dir = Path(cache_dir).expanduser().resolve()
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.port = port
        self.controller_port = controller_port
        self.heap = heap
        self.host = host
        self.java = java
        self.mvn = mvn
        self._process: subprocess.Popen[bytes] | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> NativeKafka:
        """The broker described by the platform settings."""
        return cls(
            version=settings.kafka_version,
            cache_dir=settings.cache_dir,
            data_dir=settings.data_dir,
            port=settings.kafka_port,
            controller_port=settings.kafka_controller_port,
            heap=settings.kafka_heap,
        )

    # Where things live -------------------------------------------------------------------------

    @property
    def home(self) -> Path:
        """The broker's folder under the data directory."""
        return self.data_dir / "kafka"

    @property
    def libs_dir(self) -> Path:
        """The cached jars of this Kafka version, shared by every data directory."""
        return self.cache_dir / "kafka" / self.version / "libs"

    @property
    def properties_path(self) -> Path:
        """The broker's ``server.properties``."""
        return self.home / "server.properties"

    @property
    def log4j_path(self) -> Path:
        """The broker's log4j 2 configuration."""
        return self.home / "log4j2.properties"

    @property
    def pid_path(self) -> Path:
        """The pid of the running broker."""
        return self.home / "broker.pid"

    @property
    def cluster_id_path(self) -> Path:
        """The cluster id the storage was formatted with."""
        return self.home / "cluster.id"

    @property
    def storage_dir(self) -> Path:
        """The broker's ``log.dirs``: topic data and the KRaft metadata log."""
        return self.home / "data"

    @property
    def logs_dir(self) -> Path:
        """The broker's log files."""
        return self.home / "logs"

    @property
    def log_file(self) -> Path:
        """The broker's main log."""
        return self.logs_dir / "server.log"

    @property
    def console_log(self) -> Path:
        """The JVM's stdout and stderr: crashes before logging starts end up here."""
        return self.logs_dir / "console.log"

    @property
    def bootstrap_servers(self) -> str:
        """What clients connect to."""
        return f"{self.host}:{self.port}"

    def render_server_properties(self) -> str:
        """This broker's ``server.properties``."""
        return render_server_properties(
            host=self.host, port=self.port, controller_port=self.controller_port, storage_dir=self.storage_dir
        )

    # Jars ----------------------------------------------------------------------------------------

    def is_fetched(self) -> bool:
        """True when the jar cache of this version is complete (``fetch`` would not download)."""
        return self._libs_complete(cache_stamp(self.version))

    def fetch(self, progress: Progress | None = None, *, timeout: float = 900.0) -> Path:
        """Copy the broker's jars from Maven Central into the cache once; return the libs folder."""
        report = progress or _quiet
        stamp = cache_stamp(self.version)
        if self._libs_complete(stamp):
            return self.libs_dir
        version_dir = self.libs_dir.parent
        version_dir.mkdir(parents=True, exist_ok=True)
        with _locked(version_dir / ".fetch.lock"):
            # Another process may have finished the same fetch while this one waited for the lock.
            if self._libs_complete(stamp):
                return self.libs_dir
            mvn = shutil.which(self.mvn)
            if mvn is None:
                raise ToolMissing(
                    "Maven (mvn) is needed to fetch the Kafka jars from Maven Central; "
                    "install Maven: apt-get install maven"
                )
            # Left by fetches that were killed; nobody else can be using them while we hold the lock.
            for leftover in version_dir.glob(".fetch-*"):
                shutil.rmtree(leftover, ignore_errors=True)
            report(f"Fetching Kafka {self.version} jars from Maven Central (about 40 MB, once)")
            with tempfile.TemporaryDirectory(dir=version_dir, prefix=".fetch-") as tmp:
                self._fetch_into(Path(tmp), mvn, stamp, timeout)
        return self.libs_dir

    def _fetch_into(self, work: Path, mvn: str, stamp: str, timeout: float) -> None:
        pom = work / "pom.xml"
        pom.write_text(pom_text(), encoding="utf-8")
        staged = work / "libs"
        command = [
            mvn,
            "-B",
            "-q",
            "-Dstyle.color=never",
            "-f",
            str(pom),
            "package",
            f"-Dkafka.version={self.version}",
            f"-Dlibs.dir={staged}",
        ]
        try:
            done = subprocess.run(
                command,
                cwd=work,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise FetchFailed(
                f"Maven did not finish fetching Kafka {self.version} within {timeout:.0f} s; "
                "is Maven Central reachable?"
            ) from exc
        if done.returncode != 0:
            tail = _tail_lines(_maven_essentials(done.stdout + "\n" + done.stderr), 15)
            raise FetchFailed(
                f"Maven could not fetch Kafka {self.version} (exit code {done.returncode}); "
                f"last lines of its output:\n{tail}"
            )
        jars = sorted(p.name for p in staged.glob("*.jar"))
        if f"kafka_2.13-{self.version}.jar" not in jars:
            raise FetchFailed(
                f"Maven finished but kafka_2.13-{self.version}.jar is not among the {len(jars)} jars copied"
            )
        bindings = slf4j_bindings(jars)
        if len(bindings) != 1:
            raise FetchFailed(
                f"Kafka {self.version} needs exactly one slf4j binding on its classpath, found "
                f"{', '.join(bindings) or 'none'}; adjust the exclusions in infra/kafka/pom.xml"
            )
        # The marker is written last and the folder appears by one rename: a fetch killed at any
        # point leaves either the previous cache or none, never a half one.
        marker = {"version": self.version, "stamp": stamp, "jars": jars}
        (staged / _MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        if self.libs_dir.exists():
            self.libs_dir.rename(work / "stale-libs")
        staged.rename(self.libs_dir)

    def _libs_complete(self, stamp: str) -> bool:
        marker = self.libs_dir / _MARKER
        try:
            recorded = json.loads(marker.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        if not isinstance(recorded, dict) or recorded.get("stamp") != stamp:
            return False
        jars = recorded.get("jars")
        return isinstance(jars, list) and all((self.libs_dir / str(j)).is_file() for j in jars)

    # Lifecycle -----------------------------------------------------------------------------------

    def up(self, timeout: float = 90.0, progress: Progress | None = None) -> BrokerStatus:
        """Start the broker unless it already runs, and return once it answers (idempotent)."""
        report = progress or _quiet
        started_at = time.monotonic()
        deadline = started_at + timeout
        self.home.mkdir(parents=True, exist_ok=True)
        with _locked(self.home / ".lock"):
            pid = self._our_pid()
            if pid is None:
                pid = self._adopt_orphan()
            if pid is not None:
                return self._reuse(pid, deadline, report)
            self._check_ports_free()
            libs = self.fetch(progress)
            java = self._java_executable()
            self._write_config()
            self._format_storage(java, libs, report)
            process, log_marks = self._spawn(java, libs)
            report(f"Waiting for Kafka to answer on {self.bootstrap_servers} (pid {process.pid})")
            try:
                self._wait_ready(process.pid, deadline, log_marks)
            except BaseException:
                # A broker that never became ready is of no use and would hold the ports.
                if self._alive(process.pid):
                    self._terminate(process.pid, grace=10.0)
                self.pid_path.unlink(missing_ok=True)
                raise
        elapsed = time.monotonic() - started_at
        reason = f"started Kafka {self.version} (pid {process.pid}) in {elapsed:.1f} s"
        return self._status(pid=process.pid, ready=True, reason=reason)

    def down(self, timeout: float = 30.0) -> BrokerStatus:
        """Stop the broker: SIGTERM, then SIGKILL after ``timeout`` seconds (idempotent)."""
        self.home.mkdir(parents=True, exist_ok=True)
        with _locked(self.home / ".lock"):
            pid = self._our_pid()
            if pid is None:
                pid = self._adopt_orphan()
            if pid is None:
                stale = self.pid_path.exists()
                self.pid_path.unlink(missing_ok=True)
                reason = "not running; nothing to stop"
                if stale:
                    reason += " (removed a stale pid file)"
                return self._status(pid=None, ready=False, reason=reason)
            began = time.monotonic()
            killed = self._terminate(pid, grace=timeout)
            self.pid_path.unlink(missing_ok=True)
        how = f"killed after {timeout:.0f} s without stopping" if killed else "stopped"
        reason = f"{how} (pid {pid}) in {time.monotonic() - began:.1f} s"
        return self._status(pid=None, ready=False, reason=reason)

    def status(self, timeout: float = 3.0) -> BrokerStatus:
        """Whether the broker process runs and answers; changes nothing."""
        pid = self._our_pid() or self._find_orphan()
        if pid is None:
            reason = "not running"
            if self.pid_path.exists():
                reason += f" (stale pid file: the broker exited without being stopped; see {self.log_file})"
            return self._status(pid=None, ready=False, reason=reason)
        if self._ready(timeout):
            return self._status(pid=pid, ready=True, reason=f"running and ready on {self.bootstrap_servers}")
        return self._status(
            pid=pid,
            ready=False,
            reason=f"running but not answering on {self.bootstrap_servers}: "
            f"still starting, or see {self.log_file}",
        )

    # Internals -----------------------------------------------------------------------------------

    def _status(self, *, pid: int | None, ready: bool, reason: str, reused: bool = False) -> BrokerStatus:
        return BrokerStatus(
            running=pid is not None,
            ready=ready,
            pid=pid,
            bootstrap_servers=self.bootstrap_servers,
            data_dir=self.home,
            log_file=self.log_file,
            reason=reason,
            reused=reused,
        )

    def _reuse(self, pid: int, deadline: float, report: Progress) -> BrokerStatus:
        changed = self._changed_settings(pid)
        if changed:
            raise BrokerConfigChanged(
                f"the Kafka broker of {self.home} (pid {pid}) runs with another {' and '.join(changed)} "
                "than the settings now ask for; stop it first (rollout infra down), then start it again"
            )
        if not self._ready(min(5.0, max(deadline - time.monotonic(), 0.1))):
            report(f"Kafka is running (pid {pid}); waiting for it to answer on {self.bootstrap_servers}")
            self._wait_ready(pid, deadline, log_marks=None)
        return self._status(
            pid=pid, ready=True, reused=True, reason=f"already running (pid {pid}); reused it"
        )

    def _changed_settings(self, pid: int) -> list[str]:
        changed: list[str] = []
        on_disk = _read_text(self.properties_path)
        if on_disk is not None and on_disk != self.render_server_properties():
            changed.append(
                f"address (wanted {self.bootstrap_servers}, controller port {self.controller_port})"
            )
        args = _cmdline(pid) or []
        if f"{self.libs_dir}/*" not in args:
            changed.append(f"Kafka version (wanted {self.version})")
        if f"-Xmx{self.heap}" not in args:
            changed.append(f"heap (wanted {self.heap})")
        return changed

    def _our_pid(self) -> int | None:
        """The pid from the pid file, if that process is alive and really is this broker."""
        text = _read_text(self.pid_path)
        if text is None:
            return None
        try:
            pid = int(text.strip())
        except ValueError:
            return None
        if pid <= 0 or not self._alive(pid):
            return None
        # Pids are reused: only trust one whose command line is a broker with our properties file.
        args = _cmdline(pid)
        if args is None or not is_broker_command(args, self.properties_path):
            return None
        return pid

    def _find_orphan(self) -> int | None:
        """Our broker running without its pid file (deleted by hand), found by the port it holds."""
        for port in (self.port, self.controller_port):
            owner = _port_owner(port)
            if owner is None:
                continue
            args = _cmdline(owner)
            if args is not None and is_broker_command(args, self.properties_path) and self._alive(owner):
                return owner
        return None

    def _adopt_orphan(self) -> int | None:
        owner = self._find_orphan()
        if owner is not None:
            _write_atomic(self.pid_path, f"{owner}\n")
        return owner

    def _check_ports_free(self) -> None:
        for name, port in (("Kafka port", self.port), ("Kafka controller port", self.controller_port)):
            if _port_free(self.host, port):
                continue
            owner = _port_owner(port)
            who = "another process"
            if owner is not None:
                args = _cmdline(owner) or []
                who = f"another process (pid {owner}: {_shorten(' '.join(args))})" if args else f"pid {owner}"
            hint = "ROLLOUT_KAFKA_PORT=... ROLLOUT_KAFKA_CONTROLLER_PORT=..."
            free = _suggest_ports(self.host, self.port, self.controller_port)
            if free is not None:
                hint = f"ROLLOUT_KAFKA_PORT={free[0]} ROLLOUT_KAFKA_CONTROLLER_PORT={free[1]}"
            raise PortInUse(
                f"{name} {port} on {self.host} is already in use by {who}, not by the broker of "
                f"{self.home}; stop that process or pick other ports, e.g. {hint}"
            )

    def _java_executable(self) -> str:
        java = shutil.which(self.java)
        needed = 17 if _major(self.version) >= 4 else 8
        if java is None:
            raise ToolMissing(
                f"Java {needed} or newer is needed to run Kafka; "
                "install it: apt-get install openjdk-17-jre-headless"
            )
        try:
            done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ToolMissing(f"{java} -version did not run: {exc}") from exc
        found = _java_major(done.stderr + done.stdout)
        if found is not None and found < needed:
            raise ToolMissing(
                f"Kafka {self.version} needs Java {needed} or newer but {java} is Java {found}; "
                f"install it: apt-get install openjdk-17-jre-headless"
            )
        return java

    def _write_config(self) -> None:
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.storage_dir.mkdir(parents=True, exist_ok=True)
        _write_atomic(self.properties_path, self.render_server_properties())
        _write_atomic(self.log4j_path, log4j_config_text())

    def _cluster_id(self) -> str:
        """The persisted cluster id; the one in already formatted storage wins, else a new one."""
        formatted = _meta_cluster_id(self.storage_dir / "meta.properties")
        if formatted is not None:
            cluster_id = formatted
        else:
            saved = (_read_text(self.cluster_id_path) or "").strip()
            cluster_id = saved if is_valid_cluster_id(saved) else new_cluster_id()
        if (_read_text(self.cluster_id_path) or "").strip() != cluster_id:
            _write_atomic(self.cluster_id_path, cluster_id + "\n")
        return cluster_id

    def _format_storage(self, java: str, libs: Path, report: Progress) -> None:
        cluster_id = self._cluster_id()
        if (self.storage_dir / "meta.properties").exists():
            return
        report(f"Formatting Kafka storage in {self.storage_dir} (cluster id {cluster_id})")
        command = storage_format_command(
            java=java,
            libs_dir=libs,
            cluster_id=cluster_id,
            log4j_config=self.log4j_path,
            logs_dir=self.logs_dir,
            properties=self.properties_path,
        )
        try:
            done = subprocess.run(
                command,
                cwd=self.home,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=180,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise BrokerStartFailed(f"formatting Kafka storage in {self.storage_dir} took over 180s") from exc
        if done.returncode != 0:
            tail = _tail_lines(done.stdout + "\n" + done.stderr, 12)
            raise BrokerStartFailed(
                f"formatting Kafka storage in {self.storage_dir} failed "
                f"(exit code {done.returncode}):\n{tail}"
            )

    def _spawn(self, java: str, libs: Path) -> tuple[subprocess.Popen[bytes], _LogMarks]:
        command = broker_command(
            java=java,
            libs_dir=libs,
            heap=self.heap,
            log4j_config=self.log4j_path,
            logs_dir=self.logs_dir,
            properties=self.properties_path,
        )
        with self.console_log.open("ab") as console:
            stamp = datetime.now(UTC).isoformat(timespec="seconds")
            console.write(f"=== {stamp} starting: {' '.join(command)}\n".encode())
            console.flush()
            marks = _LogMarks(console=console.tell(), server=_size(self.log_file))
            # A new session: the broker must outlive the command that started it and must not get
            # the terminal's Ctrl-C.
            process = subprocess.Popen(
                command,
                cwd=self.home,
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        self._process = process
        _write_atomic(self.pid_path, f"{process.pid}\n")
        return process, marks

    def _wait_ready(self, pid: int, deadline: float, log_marks: _LogMarks | None) -> None:
        while True:
            if not self._alive(pid):
                code = ""
                own = self._process
                if own is not None and own.pid == pid and own.returncode is not None:
                    code = f" with exit code {own.returncode}"
                self.pid_path.unlink(missing_ok=True)
                raise BrokerStartFailed(
                    f"Kafka exited during startup{code}; logs: {self.log_file}\n" + self._log_tail(log_marks)
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrokerStartFailed(
                    f"Kafka (pid {pid}) did not answer on {self.bootstrap_servers} in time; "
                    f"logs: {self.log_file}\n" + self._log_tail(log_marks)
                )
            if self._ready(min(1.0, remaining)):
                return
            # list_topics returns at once on some errors; keep the loop from spinning.
            time.sleep(min(0.1, max(deadline - time.monotonic(), 0)))

    def _ready(self, timeout: float) -> bool:
        probe = probe_cluster({"bootstrap.servers": self.bootstrap_servers}, timeout)
        if probe.brokers != 1:
            return False
        # Guards against a different cluster answering on our port.
        expected = (_read_text(self.cluster_id_path) or "").strip()
        return not expected or probe.cluster_id == expected

    def _alive(self, pid: int) -> bool:
        if self._process is not None and self._process.pid == pid:
            return self._process.poll() is None
        # Reap it if it is a child of this process; otherwise a zombie would look alive.
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
        stat = _read_text(Path(f"/proc/{pid}/stat"))
        if stat is None:
            return False
        state = stat.rpartition(")")[2].split()
        return bool(state) and state[0] not in ("Z", "X")

    def _terminate(self, pid: int, grace: float) -> bool:
        """SIGTERM, wait ``grace`` seconds, then SIGKILL; True when it had to be killed."""
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return False
        except PermissionError as exc:
            raise BrokerStopFailed(f"not allowed to stop the Kafka broker (pid {pid}): {exc}") from exc
        if self._wait_gone(pid, grace):
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if not self._wait_gone(pid, 10.0):
            raise BrokerStopFailed(f"the Kafka broker (pid {pid}) survived SIGKILL")
        return True

    def _wait_gone(self, pid: int, seconds: float) -> bool:
        end = time.monotonic() + seconds
        while self._alive(pid):
            if time.monotonic() >= end:
                return False
            time.sleep(0.1)
        return True

    def _log_tail(self, marks: _LogMarks | None, lines: int = 12) -> str:
        parts: list[str] = []
        # Only what this start wrote: earlier runs and the storage format step would mislead.
        console = "" if marks is None else _read_bytes_from(self.console_log, marks.console)
        if console.strip():
            parts.append(f"--- {self.console_log}:\n{_tail_lines(console, lines)}")
        if marks is None or _size(self.log_file) < marks.server:
            server = _read_tail(self.log_file, 64 * 1024)
        else:
            server = _read_bytes_from(self.log_file, marks.server)
        if server.strip():
            parts.append(f"--- {self.log_file}:\n{_tail_lines(server, lines)}")
        return "\n".join(parts) or "(the broker wrote no log)"


# Files, processes and ports ---------------------------------------------------------------------


class _LogMarks(NamedTuple):
    """Sizes of the log files when the broker was started, to show only what that start wrote."""

    console: int
    server: int


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _quiet(_: str) -> None:
    return None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive advisory lock: two ``up``s (or fetches) at once wait for each other."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # Opened non-inheritable (Python's default), so the broker never holds the lock.
    with path.open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _read_bytes_from(path: Path, offset: int) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _read_tail(path: Path, size: int) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(handle.tell() - size, 0))
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _tail_lines(text: str, count: int) -> str:
    lines = [_ANSI_RE.sub("", line).rstrip() for line in text.splitlines()]
    kept = [line for line in lines if line.strip()][-count:]
    return "\n".join(f"  {line}" for line in kept)


def _maven_essentials(output: str) -> str:
    """Maven's output without the boilerplate it appends to every failure."""
    kept: list[str] = []
    for line in output.splitlines():
        bare = _ANSI_RE.sub("", line).strip()
        if bare in ("", "[ERROR]") or any(marker in bare for marker in _MAVEN_NOISE):
            continue
        kept.append(bare)
    return "\n".join(kept) or output


def _shorten(text: str, width: int = 160) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode("utf-8", errors="replace") for part in raw.split(b"\0") if part]


def _meta_cluster_id(meta_properties: Path) -> str | None:
    text = _read_text(meta_properties)
    if text is None:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "cluster.id":
            return value.strip()
    return None


def _major(version: str) -> int:
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else 0


def _java_major(version_output: str) -> int | None:
    match = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if match is None:
        return None
    major = int(match.group(1))
    # Java 8 and older call themselves 1.x.
    return int(match.group(2) or 0) if major == 1 else major


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # The broker's server sockets set SO_REUSEADDR too, so a port in TIME_WAIT counts as free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _suggest_ports(host: str, port: int, controller_port: int) -> tuple[int, int] | None:
    for step in range(1, 40):
        candidate = (port + 100 * step, controller_port + 100 * step)
        if candidate[1] > 65535 or candidate[0] > 65535:
            return None
        if all(_port_free(host, p) for p in candidate):
            return candidate
    return None


def _port_owner(port: int) -> int | None:
    """The pid listening on a TCP port, from /proc (best effort: other users' processes may be hidden)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        text = _read_text(Path(table))
        if text is None:
            continue
        for row in text.splitlines()[1:]:
            fields = row.split()
            if len(fields) < 10 or fields[3] != "0A":
                continue
            if int(fields[1].rpartition(":")[2], 16) == port:
                inodes.add(fields[9])
    if not inodes:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in wanted:
                        return int(proc.name)
        except OSError:
            continue
    return None
