"""``rollout infra``: fetch, start, stop and inspect the native Kafka broker, or check an external cluster."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.markup import escape

from infra.kafka.broker import BrokerStatus, NativeKafka, probe_cluster
from rollout.cli_support import console, fail, load_settings
from rollout.errors import RolloutError
from rollout.settings import Settings

NOT_RUNNING_EXIT = 3
"""Exit code of ``status`` when Kafka does not answer (the LSB code for "not running")."""

UpTimeout = Annotated[
    float, typer.Option("--timeout", "-t", min=1.0, help="Seconds to wait for the broker to answer.")
]
DownTimeout = Annotated[
    float,
    typer.Option("--timeout", "-t", min=0.0, help="Seconds to wait after SIGTERM before sending SIGKILL."),
]
ProbeTimeout = Annotated[
    float, typer.Option("--timeout", "-t", min=0.1, help="Seconds to wait for Kafka's answer.")
]

FETCH_HELP = (
    "Download the Kafka broker's jars from Maven Central into the cache, once (needs Maven).\n\n"
    "The version is ROLLOUT_KAFKA_VERSION (default 4.0.2); the cache is ROLLOUT_CACHE_DIR "
    "(default ~/.cache/rollout). `up` fetches by itself when needed; run this ahead to prepare offline use."
)
UP_HELP = (
    "Start the local Kafka broker and wait until it answers; reuse it when it already runs.\n\n"
    "Fetches the jars first if needed. The broker keeps running after this command exits; stop it with "
    "`rollout infra down`. Ports: ROLLOUT_KAFKA_PORT (default 19092) and ROLLOUT_KAFKA_CONTROLLER_PORT "
    "(default 19093); heap: ROLLOUT_KAFKA_HEAP; state and logs live under ROLLOUT_DATA_DIR/kafka.\n\n"
    "With KAFKA_BOOTSTRAP_SERVERS set, only checks that the external cluster answers."
)
DOWN_HELP = (
    "Stop the local Kafka broker: SIGTERM, then SIGKILL after --timeout. Harmless when it is not running.\n\n"
    "Topics and committed offsets stay on disk under ROLLOUT_DATA_DIR/kafka for the next `rollout infra up`."
)
STATUS_HELP = (
    "Show whether Kafka runs and answers, its pid, address, data folder and log file.\n\n"
    "Exits 0 when Kafka answers and 3 when it does not, so scripts can test it. With "
    "KAFKA_BOOTSTRAP_SERVERS set, checks the external cluster instead."
)

CLICKHOUSE_USERS_HELP = (
    "Create the read-only role and user (Grafana, people) and the writer (worker) on a ClickHouse server.\n\n"
    "Idempotent. The reader gets SELECT on the platform's database with readonly=1 (it may only lower "
    "max_execution_time); the writer may insert and run migrations there. Then point the worker's CLICKHOUSE_URL "
    "at the writer and Grafana's data source at the reader. The embedded engine has no users: its read path is "
    "loopback-only and read-only already."
)


def register(app: typer.Typer) -> None:
    """Add the ``infra`` sub-commands."""
    sub = typer.Typer(
        name="infra",
        help=(
            "The local Apache Kafka broker (KRaft, one node on 127.0.0.1, jars from Maven Central). "
            "With KAFKA_BOOTSTRAP_SERVERS set, an external cluster is used instead and these "
            "commands only check that it answers."
        ),
        no_args_is_help=True,
    )
    sub.command("fetch", help=FETCH_HELP)(fetch)
    sub.command("up", help=UP_HELP)(up)
    sub.command("down", help=DOWN_HELP)(down)
    sub.command("status", help=STATUS_HELP)(status)
    sub.command("clickhouse-users", help=CLICKHOUSE_USERS_HELP)(clickhouse_users)
    app.add_typer(sub, name="infra")


def clickhouse_users(
    admin_url: str = typer.Option(..., "--admin-url", envvar="CLICKHOUSE_ADMIN_URL",
                                  help="http(s)://admin:password@host:8123 of a user allowed to create users."),
    reader_user: str = typer.Option("grafana", "--reader-user", help="Read-only user for Grafana and people."),
    writer_user: str = typer.Option("rollout_worker", "--writer-user", help="User the worker writes with."),
    reader_password: str = typer.Option(..., "--reader-password", envvar="CLICKHOUSE_READER_PASSWORD",
                                        prompt=True, hide_input=True, show_default=False),
    writer_password: str = typer.Option(..., "--writer-password", envvar="CLICKHOUSE_WRITER_PASSWORD",
                                        prompt=True, hide_input=True, show_default=False),
) -> None:
    """Create the ClickHouse server's reader and writer users (the command's help: ``CLICKHOUSE_USERS_HELP``)."""
    from infra.clickhouse.access import AccessPlan, access_statements
    from infra.clickhouse.client import connect

    if not admin_url.startswith(("http://", "https://")):
        fail("--admin-url must be a ClickHouse server URL (http(s)://…); the embedded engine has no users")
    settings = _settings()
    plan = AccessPlan(settings.clickhouse_database, reader_user, reader_password, writer_user, writer_password)
    client = connect(admin_url, database=settings.clickhouse_database)
    try:
        for statement in access_statements(plan):
            client.command(statement)
    finally:
        client.close()
    _say(f"users {reader_user} (read-only) and {writer_user} (writer) are ready on {settings.clickhouse_database}")


def fetch() -> None:
    """Download the Kafka broker's jars from Maven Central into the cache (once; needs Maven)."""
    settings = _settings()
    broker = _broker(settings)
    cached = broker.is_fetched()
    began = time.monotonic()
    try:
        with console.status(f"Checking the Kafka {broker.version} jars in {broker.libs_dir}") as spinner:
            libs = broker.fetch(progress=lambda line: spinner.update(escape(line)))
    except RolloutError as exc:
        fail(escape(str(exc)))
    jars = sum(1 for _ in libs.glob("*.jar"))
    how = "already cached" if cached else f"fetched in {time.monotonic() - began:.1f} s"
    _say(f"Kafka {broker.version} jars {how}: {jars} jars in {libs}")
    if not settings.kafka_native:
        _say("note: KAFKA_BOOTSTRAP_SERVERS is set, so the platform uses that cluster, not this broker")


def up(timeout: UpTimeout = 90.0) -> None:
    """Start the local Kafka broker and wait until it answers; reuse it when it already runs."""
    settings = _settings()
    if not settings.kafka_native:
        if not _check_external(settings, timeout=min(timeout, 15.0)):
            fail(
                escape(
                    f"the external Kafka cluster at {settings.kafka_bootstrap_servers} does not answer; "
                    "check KAFKA_BOOTSTRAP_SERVERS and the KAFKA_SECURITY_PROTOCOL/SASL settings"
                )
            )
        return
    broker = _broker(settings)
    try:
        with console.status(f"Starting Kafka {broker.version} on {broker.bootstrap_servers}") as spinner:
            result = broker.up(timeout=timeout, progress=lambda line: spinner.update(escape(line)))
    except RolloutError as exc:
        fail(escape(str(exc)))
    _say(f"Kafka is ready on {result.bootstrap_servers}: {result.reason}")
    _print_places(result)


def down(timeout: DownTimeout = 30.0) -> None:
    """Stop the local Kafka broker; harmless when it is not running."""
    settings = _settings()
    if not settings.kafka_native:
        _say(
            f"An external Kafka cluster is configured (KAFKA_BOOTSTRAP_SERVERS="
            f"{settings.kafka_bootstrap_servers}); nothing to stop here."
        )
        return
    broker = _broker(settings)
    try:
        with console.status(f"Stopping Kafka on {broker.bootstrap_servers}"):
            result = broker.down(timeout=timeout)
    except RolloutError as exc:
        fail(escape(str(exc)))
    _say(f"Kafka: {result.reason}")


def status(timeout: ProbeTimeout = 3.0) -> None:
    """Show whether Kafka runs and answers, its pid, address, data and log files."""
    settings = _settings()
    if not settings.kafka_native:
        if not _check_external(settings, timeout=timeout):
            raise typer.Exit(NOT_RUNNING_EXIT)
        return
    broker = _broker(settings)
    try:
        result = broker.status(timeout=timeout)
    except RolloutError as exc:
        fail(escape(str(exc)))
    pid = f" (pid {result.pid})" if result.pid is not None else ""
    _say(f"Kafka {broker.version}{pid}: {result.reason}")
    _say(f"  running: {'yes' if result.running else 'no'}, ready: {'yes' if result.ready else 'no'}")
    _say(f"  bootstrap servers: {result.bootstrap_servers}")
    _print_places(result)
    if not result.ready:
        if not result.running:
            _say("  start it with: rollout infra up")
        raise typer.Exit(NOT_RUNNING_EXIT)


def _settings() -> Settings:
    try:
        return load_settings()
    except RolloutError as exc:
        fail(escape(str(exc)))


def _broker(settings: Settings) -> NativeKafka:
    try:
        return NativeKafka.from_settings(settings)
    except RolloutError as exc:
        fail(escape(str(exc)))


def _check_external(settings: Settings, *, timeout: float) -> bool:
    """Probe the configured external cluster and say what was found; True when it answers."""
    servers = settings.kafka_bootstrap_servers
    with console.status(f"Asking the external Kafka cluster at {servers} for metadata"):
        probe = probe_cluster(settings.kafka_client_config(), timeout)
    _say(f"An external Kafka cluster is configured (KAFKA_BOOTSTRAP_SERVERS={servers}); none runs here.")
    if probe.reachable:
        _say(f"  reachable: {probe.detail}")
    else:
        _say(f"  not reachable: {probe.detail}")
    return probe.reachable


def _print_places(result: BrokerStatus) -> None:
    _say(f"  data: {result.data_dir}")
    _say(f"  logs: {result.log_file}")


def _say(text: str) -> None:
    console.print(escape(text), highlight=False, soft_wrap=True)
