"""The native Kafka broker's files and command lines, checked without starting a broker."""

from __future__ import annotations

import base64
import json
import os
import socket
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from infra.kafka.broker import (
    NativeKafka,
    broker_command,
    cache_stamp,
    is_broker_command,
    is_valid_cluster_id,
    log4j_config_text,
    new_cluster_id,
    pom_text,
    render_server_properties,
    slf4j_bindings,
    storage_format_command,
)
from infra.kafka.exceptions import PortInUse, ToolMissing
from rollout.commands.infra import register
from rollout.errors import ConfigurationError
from rollout.settings import Settings

POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


def _properties(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return {key: value for key, value in pairs}


def _broker(tmp_path: Path, **overrides: object) -> NativeKafka:
    args: dict[str, object] = {
        "version": "4.0.2",
        "cache_dir": tmp_path / "cache",
        "data_dir": tmp_path / "data",
        "port": 29092,
        "controller_port": 29093,
    }
    args.update(overrides)
    return NativeKafka(**args)  # type: ignore[arg-type]


@pytest.fixture
def listening_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_server_properties_describe_a_single_node_kraft_broker_on_loopback(tmp_path: Path) -> None:
    props = _properties(
        render_server_properties(
            host="127.0.0.1", port=29092, controller_port=29093, storage_dir=tmp_path / "d"
        )
    )

    assert props["process.roles"] == "broker,controller"
    assert props["node.id"] == "1"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:29093"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:29092,CONTROLLER://127.0.0.1:29093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:29092"
    assert props["controller.listener.names"] == "CONTROLLER"
    assert props["inter.broker.listener.name"] == "PLAINTEXT"
    assert props["listener.security.protocol.map"] == "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
    assert Path(props["log.dirs"]).is_absolute()
    assert Path(props["log.dirs"]) == (tmp_path / "d").resolve()
    assert props["group.initial.rebalance.delay.ms"] == "0"
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "share.coordinator.state.topic.replication.factor",
        "share.coordinator.state.topic.min.isr",
    ):
        assert props[key] == "1", key
    assert "0.0.0.0" not in json.dumps(props)


def test_broker_renders_its_own_ports_and_folders(tmp_path: Path) -> None:
    broker = _broker(tmp_path, port=31001, controller_port=31002)

    props = _properties(broker.render_server_properties())

    assert props["listeners"] == "PLAINTEXT://127.0.0.1:31001,CONTROLLER://127.0.0.1:31002"
    assert Path(props["log.dirs"]) == (tmp_path / "data" / "kafka" / "data").resolve()
    assert broker.bootstrap_servers == "127.0.0.1:31001"
    assert broker.libs_dir == (tmp_path / "cache" / "kafka" / "4.0.2" / "libs").resolve()
    assert broker.home == (tmp_path / "data" / "kafka").resolve()


def test_from_settings_takes_ports_version_heap_and_folders(tmp_path: Path) -> None:
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        data_dir=tmp_path / "d",
        cache_dir=tmp_path / "c",
        kafka_port=31011,
        kafka_controller_port=31012,
        kafka_version="4.0.2",
        kafka_heap="512m",
    )

    broker = NativeKafka.from_settings(settings)

    assert (broker.port, broker.controller_port, broker.version, broker.heap) == (
        31011,
        31012,
        "4.0.2",
        "512m",
    )
    assert broker.home == (tmp_path / "d" / "kafka").resolve()
    assert broker.libs_dir.is_relative_to((tmp_path / "c").resolve())
    assert broker.bootstrap_servers == settings.kafka_bootstrap_servers


def test_cluster_id_is_22_chars_of_base64url_encoding_16_bytes() -> None:
    ids = {new_cluster_id() for _ in range(2000)}  # about 30 would start with "-" if drawn naively

    assert len(ids) == 2000
    for cluster_id in ids:
        assert len(cluster_id) == 22
        assert set(cluster_id) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16
        assert not cluster_id.startswith("-"), "the storage tool would read it as an option"
        assert is_valid_cluster_id(cluster_id)


@pytest.mark.parametrize("bad", ["", "short", "A" * 23, "A" * 21 + "=", "A" * 21 + "+", "A" * 21 + "/"])
def test_malformed_cluster_ids_are_rejected(bad: str) -> None:
    assert not is_valid_cluster_id(bad)


def test_pom_pins_the_kafka_version_the_settings_default_to() -> None:
    root = ET.fromstring(pom_text())

    assert root.findtext("m:packaging", namespaces=POM_NS) == "pom"
    default_version = Settings.model_fields["kafka_version"].default
    assert root.findtext("m:properties/m:kafka.version", namespaces=POM_NS) == default_version
    deps = {
        d.findtext("m:artifactId", namespaces=POM_NS): d.findtext("m:version", namespaces=POM_NS)
        for d in root.iterfind("m:dependencies/m:dependency", POM_NS)
    }
    assert deps["kafka_2.13"] == "${kafka.version}"
    assert set(deps) == {"kafka_2.13", "log4j-core", "log4j-slf4j-impl"}
    plugin = root.find("m:build/m:plugins/m:plugin", POM_NS)
    assert plugin is not None
    assert plugin.findtext("m:artifactId", namespaces=POM_NS) == "maven-dependency-plugin"
    assert plugin.findtext("m:version", namespaces=POM_NS) == "3.8.1"
    assert "${libs.dir}" in pom_text()


def test_pom_declares_exactly_one_slf4j_binding() -> None:
    root = ET.fromstring(pom_text())
    declared = [
        f"{d.findtext('m:artifactId', namespaces=POM_NS)}-x.jar"
        for d in root.iterfind("m:dependencies/m:dependency", POM_NS)
    ]

    assert slf4j_bindings(declared) == ["log4j-slf4j-impl-x.jar"]


def test_slf4j_bindings_are_recognised_by_jar_name() -> None:
    jars = [
        "slf4j-api-1.7.36.jar",
        "log4j-slf4j-impl-2.24.3.jar",
        "slf4j-reload4j-1.7.36.jar",
        "kafka_2.13-4.0.2.jar",
    ]

    assert slf4j_bindings(jars) == ["log4j-slf4j-impl-2.24.3.jar", "slf4j-reload4j-1.7.36.jar"]


def test_log4j_config_writes_a_size_capped_file_under_the_logs_dir() -> None:
    text = log4j_config_text()

    assert "${sys:kafka.logs.dir}/server.log" in text
    assert "RollingFile" in text
    assert "SizeBasedTriggeringPolicy" in text
    assert "rootLogger.level = info" in text


def test_broker_command_uses_a_small_heap_serial_gc_and_our_properties(tmp_path: Path) -> None:
    props = tmp_path / "server.properties"
    command = broker_command(
        java="java",
        libs_dir=tmp_path / "libs",
        heap="768m",
        log4j_config=tmp_path / "log4j2.properties",
        logs_dir=tmp_path / "logs",
        properties=props,
    )

    assert command[0] == "java"
    assert "-Xmx768m" in command
    assert "-XX:+UseSerialGC" in command
    assert f"-Dlog4j2.configurationFile={tmp_path / 'log4j2.properties'}" in command
    assert f"-Dkafka.logs.dir={tmp_path / 'logs'}" in command
    assert command[command.index("-cp") + 1] == f"{tmp_path / 'libs'}/*"
    assert command[-2:] == ["kafka.Kafka", str(props)]
    assert is_broker_command(command, props)


def test_storage_format_command_ignores_already_formatted_storage(tmp_path: Path) -> None:
    command = storage_format_command(
        java="java",
        libs_dir=tmp_path / "libs",
        cluster_id="AAAAAAAAAAAAAAAAAAAAAA",
        log4j_config=tmp_path / "l.properties",
        logs_dir=tmp_path / "logs",
        properties=tmp_path / "server.properties",
    )

    tool = command.index("kafka.tools.StorageTool")
    assert command[tool:] == [
        "kafka.tools.StorageTool",
        "format",
        "-t",
        "AAAAAAAAAAAAAAAAAAAAAA",
        "-c",
        str(tmp_path / "server.properties"),
        "--ignore-formatted",
    ]


def test_only_a_broker_with_our_properties_file_counts_as_ours(tmp_path: Path) -> None:
    ours = tmp_path / "a" / "server.properties"
    theirs = tmp_path / "b" / "server.properties"

    assert is_broker_command(["java", "-cp", "x/*", "kafka.Kafka", str(ours)], ours)
    assert not is_broker_command(["java", "-cp", "x/*", "kafka.Kafka", str(theirs)], ours)
    assert not is_broker_command(["python", "-m", "http.server", str(ours)], ours)
    assert not is_broker_command([], ours)


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"heap": "lots"}, "heap"),
        ({"heap": "-1g"}, "heap"),
        ({"version": "../../etc"}, "version"),
        ({"port": 29092, "controller_port": 29092}, "ROLLOUT_KAFKA_CONTROLLER_PORT"),
        ({"port": 70000}, "port"),
    ],
)
def test_bad_arguments_are_refused_with_a_hint(
    tmp_path: Path, overrides: dict[str, object], words: str
) -> None:
    with pytest.raises(ConfigurationError, match=words):
        _broker(tmp_path, **overrides)


def test_fetch_without_maven_says_how_to_install_it(tmp_path: Path) -> None:
    broker = _broker(tmp_path, mvn=str(tmp_path / "no-such-mvn"))

    with pytest.raises(ToolMissing, match="apt-get install maven"):
        broker.fetch()

    assert not broker.libs_dir.exists()


def test_a_complete_cache_is_reused_without_maven(tmp_path: Path) -> None:
    broker = _broker(tmp_path, mvn=str(tmp_path / "no-such-mvn"))
    broker.libs_dir.mkdir(parents=True)
    (broker.libs_dir / "kafka_2.13-4.0.2.jar").write_bytes(b"jar")
    marker = {"version": "4.0.2", "stamp": cache_stamp("4.0.2"), "jars": ["kafka_2.13-4.0.2.jar"]}
    (broker.libs_dir / ".complete.json").write_text(json.dumps(marker))

    assert broker.is_fetched()
    assert broker.fetch() == broker.libs_dir


def test_a_cache_without_its_marker_or_missing_a_jar_is_not_trusted(tmp_path: Path) -> None:
    broker = _broker(tmp_path, mvn=str(tmp_path / "no-such-mvn"))
    broker.libs_dir.mkdir(parents=True)
    (broker.libs_dir / "kafka_2.13-4.0.2.jar").write_bytes(b"jar")
    assert not broker.is_fetched()

    marker = {"version": "4.0.2", "stamp": cache_stamp("4.0.2"), "jars": ["kafka_2.13-4.0.2.jar", "gone.jar"]}
    (broker.libs_dir / ".complete.json").write_text(json.dumps(marker))
    assert not broker.is_fetched()
    with pytest.raises(ToolMissing):
        broker.fetch()


def test_cache_stamp_changes_with_the_version() -> None:
    assert cache_stamp("4.0.2") == cache_stamp("4.0.2")
    assert cache_stamp("4.0.2") != cache_stamp("3.9.1")


def test_up_refuses_a_port_held_by_another_process_and_names_the_settings(
    tmp_path: Path, listening_port: int
) -> None:
    broker = _broker(
        tmp_path, port=listening_port, controller_port=_free_port(), mvn=str(tmp_path / "no-mvn")
    )

    with pytest.raises(PortInUse) as caught:
        broker.up(timeout=5)

    message = str(caught.value)
    assert f"{listening_port}" in message
    assert f"pid {os.getpid()}" in message
    assert "ROLLOUT_KAFKA_PORT=" in message
    assert "ROLLOUT_KAFKA_CONTROLLER_PORT=" in message
    assert not broker.pid_path.exists()


def test_a_pid_file_naming_another_process_is_never_trusted_or_signalled(tmp_path: Path) -> None:
    broker = _broker(tmp_path, port=_free_port(), controller_port=_free_port())
    broker.home.mkdir(parents=True)
    # This very test process: alive, but not a Kafka broker with our properties file.
    broker.pid_path.write_text(f"{os.getpid()}\n")

    status = broker.status(timeout=0.5)
    assert (status.running, status.ready, status.pid) == (False, False, None)
    assert "stale" in status.reason

    stopped = broker.down(timeout=1)
    assert not stopped.running
    assert "nothing to stop" in stopped.reason
    assert not broker.pid_path.exists()


def test_down_when_nothing_ever_ran_is_harmless(tmp_path: Path) -> None:
    broker = _broker(tmp_path, port=_free_port(), controller_port=_free_port())

    first = broker.down()
    second = broker.down()

    assert not first.running and not second.running
    assert "nothing to stop" in second.reason


def test_cli_lists_the_infra_commands() -> None:
    result = CliRunner().invoke(_cli(), ["infra", "--help"])

    assert result.exit_code == 0
    for command in ("fetch", "up", "down", "status"):
        assert command in result.output


def test_cli_status_of_a_stopped_broker_exits_3_and_says_how_to_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setenv("ROLLOUT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("ROLLOUT_KAFKA_PORT", str(_free_port()))
    monkeypatch.setenv("ROLLOUT_KAFKA_CONTROLLER_PORT", str(_free_port()))

    result = CliRunner().invoke(_cli(), ["infra", "status", "--timeout", "0.5"])

    assert result.exit_code == 3
    assert "not running" in result.output
    assert "rollout infra up" in result.output
    assert str(tmp_path / "data" / "kafka" / "logs" / "server.log") in result.output.replace("\n", "")


def test_cli_down_with_an_external_cluster_has_nothing_to_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "kafka.example.invalid:9092")

    result = CliRunner().invoke(_cli(), ["infra", "down"])

    assert result.exit_code == 0
    assert "external Kafka cluster" in result.output
    assert "nothing to stop" in result.output


def _cli() -> typer.Typer:
    app = typer.Typer(add_completion=False)

    @app.callback()
    def _root() -> None:
        """Root of the command tree under test."""

    register(app)
    return app


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port
