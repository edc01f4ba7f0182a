"""``rollout demo``: Kafka up, worker on, the default scenario played, progress live, a summary at the end."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer
from rich.console import Group
from rich.live import Live
from rich.table import Table

from infra.clickhouse.reader import live_owner, owner_file, query
from infra.kafka.topics import ensure_topics
from rollout.cli_support import console, fail, load_settings
from rollout.commands.status import fetch_stats
from rollout.errors import RolloutError, ServiceUnavailable
from rollout.settings import Settings
from schemas import TopicNames

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SCENARIO = ROOT / "scenarios" / "default.yaml"


_HELP_PARAGRAPHS = (
    "Play a scenario through the whole platform and watch it arrive in ClickHouse.",
    "Starts the native Kafka broker (or uses KAFKA_BOOTSTRAP_SERVERS), starts `rollout worker`, publishes the"
    " scenario's events with the SDK, shows what was published, consumed and stored per domain while it runs,"
    " then prints a summary and the commands to explore the data. Playing the same scenario again stores"
    " nothing new: every event is stored exactly once.",
)
HELP = "\n\n".join(_HELP_PARAGRAPHS)


def register(app: typer.Typer) -> None:
    """Add the demo command."""
    app.command("demo", help=HELP)(demo)


def demo(
    scenario: Path = typer.Option(DEFAULT_SCENARIO, "--scenario", "-s", help="Scenario YAML to play."),
    speed: str = typer.Option("max", "--speed", help="'max' (as fast as possible) or an event-time factor, e.g. 600."),
    timeout: float = typer.Option(150.0, "--timeout", help="Give up when the worker has not caught up by then (s)."),
    keep_running: bool = typer.Option(False, "--keep-running", help="Leave the broker and worker running."),
) -> None:
    """The ``rollout demo`` command (its help: ``HELP``)."""
    speed_factor = _parse_speed(speed)
    if not scenario.is_file():
        fail(f"scenario file {scenario} not found")
    settings = load_settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    stack = _Stack(settings)
    try:
        stack.start_kafka()
        topics = TopicNames(settings.topic_prefix)
        ensure_topics(settings.kafka_client_config(), topics.all,
                      partitions=settings.topic_partitions, configs=topics.configs())
        stack.start_worker()
        _play(settings, stack, scenario, speed_factor, timeout)
    finally:
        if not keep_running:
            stack.stop()
    _explore_hint(settings, keep_running)


def _parse_speed(speed: str) -> float | None:
    if speed == "max":
        return None
    try:
        value = float(speed)
    except ValueError:
        fail(f"--speed takes 'max' or a positive number, got {speed!r}")
    if value <= 0:
        fail(f"--speed takes 'max' or a positive number, got {speed!r}")
    return value


@dataclass
class _Stack:
    """The services the demo brought up (and so takes down again)."""

    settings: Settings
    started_broker: bool = False
    worker: subprocess.Popen[bytes] | None = None
    notes: list[str] = field(default_factory=list)

    def start_kafka(self) -> None:
        if not self.settings.kafka_native:
            console.print(f"Kafka: external cluster at {self.settings.kafka_bootstrap_servers}")
            return
        from infra.kafka.broker import NativeKafka

        broker = NativeKafka.from_settings(self.settings)
        with console.status("Starting the native Kafka broker (first run fetches its jars from Maven Central)…"):
            status = broker.up()
        self.started_broker = not status.reused
        console.print(f"Kafka: {status.reason}")

    def start_worker(self) -> None:
        if live_owner(self.settings) is not None:
            console.print("Worker: reusing the running worker that owns the embedded ClickHouse")
            return
        logs = self.settings.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log_path = logs / "worker.log"
        env = {**os.environ, "ROLLOUT_DATA_DIR": str(self.settings.data_dir)}
        with log_path.open("ab") as log:
            self.worker = subprocess.Popen([sys.executable, "-m", "rollout.cli", "worker", "--log-level", "warn"],
                                           stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 120
        with console.status("Starting the worker (Faust + ClickHouse sink)…"):
            while time.monotonic() < deadline:
                if self.worker.poll() is not None:
                    tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
                    raise ServiceUnavailable(
                        f"the worker exited with {self.worker.returncode}; log {log_path}:\n{tail}"
                    )
                if _worker_stats(self.settings) is not None and (
                    not self.settings.clickhouse_embedded or live_owner(self.settings) is not None
                ):
                    console.print(f"Worker: running (pid {self.worker.pid}, log {log_path})")
                    return
                time.sleep(0.3)
        raise ServiceUnavailable(f"the worker did not become ready in 120 s; see {log_path}")

    def stop(self) -> None:
        if self.worker is not None and self.worker.poll() is None:
            self.worker.terminate()
            try:
                self.worker.wait(30)
            except subprocess.TimeoutExpired:
                self.worker.kill()
            console.print("Worker: stopped")
        if self.started_broker:
            from infra.kafka.broker import NativeKafka

            NativeKafka.from_settings(self.settings).down()
            console.print("Kafka: stopped (the demo started it)")


def _worker_stats(settings: Settings) -> dict[str, Any] | None:
    try:
        return fetch_stats(settings.worker_web_port, timeout=2)
    except ServiceUnavailable:
        return None


@dataclass
class _Publishing:
    total: int
    published: int = 0
    done: bool = False
    error: BaseException | None = None


def _play(settings: Settings, stack: _Stack, scenario_path: Path, speed: float | None, timeout: float) -> None:
    from producers.kafka import EventProducer
    from producers.scenario import load_scenario
    from producers.simulator import generate, publish

    scenario = load_scenario(scenario_path)
    with console.status(f"Generating {scenario_path.name}…"):
        events = list(generate(scenario))
    run_id = scenario.run_id
    before = _worker_stats(settings) or {"consumed": 0}
    state = _Publishing(total=len(events))

    def produce() -> None:
        try:
            with EventProducer.from_settings(settings, spool=False) as producer:
                def progress(done: int, _total: int) -> None:
                    state.published = done

                publish(events, producer, speed=speed, progress=progress)
            state.published = len(events)
        except BaseException as exc:  # reported by the main thread
            state.error = exc
        finally:
            state.done = True

    thread = threading.Thread(target=produce, name="demo-publisher", daemon=True)
    started = time.monotonic()
    thread.start()
    stats: dict[str, Any] = dict(before)
    view = _MetricsView(settings, run_id)
    with Live(console=console, refresh_per_second=4, transient=True) as live:
        while True:
            stats = _worker_stats(settings) or stats
            view.refresh()
            live.update(_progress_view(state, stats, before, view, time.monotonic() - started))
            caught_up = state.done and stats["consumed"] - before["consumed"] >= state.published
            if state.error is not None or caught_up:
                break
            if time.monotonic() - started > timeout:
                raise ServiceUnavailable(
                    f"the worker did not catch up within {timeout:.0f} s; see {settings.data_dir / 'logs'}"
                )
            time.sleep(0.5)
    view.refresh()
    console.print(view.render())
    if state.error is not None:
        if isinstance(state.error, RolloutError):
            raise state.error
        raise RolloutError(f"publishing failed: {state.error!r}") from state.error
    elapsed = time.monotonic() - started
    _summary(settings, run_id, stats, before, state.published, elapsed)


_THROUGHPUT = (
    "WITH span AS (SELECT greatest(dateDiff('second', min(window_start), max(window_end)), 1) AS s "
    "FROM v_effective_throughput WHERE run_id = {run:String}) "
    "SELECT domain, sum(finished) AS f, sum(env_valid) AS ev, sum(decided) AS d, "
    "f * 3600 / any(span.s) AS finished_per_hour, if(f > 0, ev / f, NULL) AS validity, "
    "if(ev > 0, d / ev, NULL) AS decidable, d * 3600 / any(span.s) AS effective_per_hour "
    "FROM v_effective_throughput, span WHERE run_id = {run:String} GROUP BY domain ORDER BY domain"
)
_FAILURES = (
    "SELECT domain, failure_class, sum(failures) AS n FROM v_env_failures "
    "WHERE run_id = {run:String} AND origin = 'environment' GROUP BY domain, failure_class ORDER BY domain, n DESC"
)
_QUALITY = (
    "SELECT domain, policy_version, sum(passed) / sum(decided) AS rate FROM v_domain_quality "
    "WHERE run_id = {run:String} GROUP BY domain, policy_version HAVING sum(decided) > 0 "
    "ORDER BY domain, policy_version"
)
_LAG = (
    "SELECT domain, quantileExact(0.95)(lag_versions), quantileExact(0.95)(lag_seconds) FROM v_trajectories "
    "WHERE run_id = {run:String} AND status = 'finished' GROUP BY domain"
)
_ALERTS = (
    "SELECT alert_id, domain, policy_version, state, baseline_pass_rate, candidate_pass_rate, p_value, overall_rose "
    "FROM v_alerts WHERE run_id = {run:String} ORDER BY domain, policy_version"
)


class _MetricsView:
    """The live per-domain metrics of one run, read from the contract views."""

    def __init__(self, settings: Settings, run_id: str) -> None:
        self.settings = settings
        self.run_id = run_id
        self.throughput: list[list[Any]] = []
        self.failures: dict[str, list[tuple[str, int]]] = {}
        self.quality: dict[str, list[tuple[int, float]]] = {}
        self.lag: dict[str, tuple[Any, Any]] = {}
        self.alerts: list[list[Any]] = []
        self._announced: set[tuple[str, str]] = set()

    def refresh(self) -> None:
        """Read the views again; announce alerts that fired since the last refresh."""
        params = {"run": self.run_id}
        try:
            self.throughput = query(self.settings, _THROUGHPUT, params).rows
            failures: dict[str, list[tuple[str, int]]] = {}
            for domain, cls, n in query(self.settings, _FAILURES, params).rows:
                failures.setdefault(domain, []).append((cls, int(n)))
            self.failures = failures
            quality: dict[str, list[tuple[int, float]]] = {}
            for domain, version, rate in query(self.settings, _QUALITY, params).rows:
                quality.setdefault(domain, []).append((int(version), float(rate)))
            self.quality = quality
            self.lag = {d: (v, s) for d, v, s in query(self.settings, _LAG, params).rows}
            self.alerts = query(self.settings, _ALERTS, params).rows
        except RolloutError:
            return  # the worker may be busy migrating on its first batch; the next refresh catches up
        for alert_id, domain, version, state, base, cand, p_value, rose in self.alerts:
            if (alert_id, state) in self._announced:
                continue
            self._announced.add((alert_id, state))
            note = " while the run overall improved" if rose else ""
            console.print(
                f"[bold red]ALERT[/] {state}: domain [bold]{domain}[/] regressed on policy version {version}: "
                f"pass rate {base:.1%} -> {cand:.1%} (one-sided p = {p_value:.2g}){note}"
            )

    def render(self) -> Table:
        """One row per domain: effective/h and its factors, failures, pass rate by version, lag."""
        table = Table(title=f"run {self.run_id}: live metrics (event time)", show_lines=True)
        for column in ("domain", "finished/h", "env validity", "decidable", "effective/h",
                       "env failures by class", "pass rate by policy version", "lag p95"):
            table.add_column(column)
        for domain, finished, _ev, _d, fph, validity, decidable, eph in self.throughput:
            fails = ", ".join(f"{cls} {n / finished:.1%}" for cls, n in self.failures.get(domain, [])[:3]) or "-"
            rates = " ".join(f"v{v} {r:.0%}" for v, r in self.quality.get(domain, []))
            lag_v, lag_s = self.lag.get(domain, (None, None))
            lag = f"{lag_v} versions / {lag_s:.0f} s" if lag_v is not None and lag_s is not None else "-"
            table.add_row(domain, f"{fph:,.0f}", _pct(validity), _pct(decidable), f"{eph:,.0f}", fails, rates, lag)
        return table


def _pct(value: Any) -> str:
    return "-" if value is None else f"{value:.1%}"


def _progress_view(state: _Publishing, stats: dict[str, Any], before: dict[str, Any],
                   view: _MetricsView, elapsed: float) -> Group:
    head = Table.grid(padding=(0, 2))
    consumed = stats["consumed"] - before["consumed"]
    head.add_row("published", f"{state.published:,} / {state.total:,}")
    head.add_row("consumed by the worker", f"{consumed:,}")
    head.add_row("stored (new rows)", f"{stats.get('stored', 0) - before.get('stored', 0):,}")
    head.add_row("duplicates ignored", f"{stats.get('duplicates', 0) - before.get('duplicates', 0):,}")
    head.add_row("dead-lettered", f"{stats.get('dead_lettered', 0) - before.get('dead_lettered', 0):,}")
    head.add_row("elapsed", f"{elapsed:.1f} s")
    return Group(head, view.render())


def _summary(settings: Settings, run_id: str, stats: dict[str, Any], before: dict[str, Any],
             published: int, elapsed: float) -> None:
    stored_total = query(settings, "SELECT count() FROM events_raw WHERE run_id = {run:String}", {"run": run_id})
    console.rule("summary")
    console.print(
        f"Published {published:,} messages in {elapsed:.1f} s; the worker consumed "
        f"{stats['consumed'] - before['consumed']:,}, stored {stats['stored'] - before['stored']:,} new rows, "
        f"ignored {stats['duplicates'] - before['duplicates']:,} duplicates and dead-lettered "
        f"{stats['dead_lettered'] - before['dead_lettered']:,}."
    )
    console.print(f"Run {run_id!r} now holds {stored_total.rows[0][0]:,} distinct events.")


def _explore_hint(settings: Settings, keep_running: bool) -> None:
    env = "" if settings.data_dir == Path(".data").resolve() else f"ROLLOUT_DATA_DIR={settings.data_dir} "
    console.rule("explore")
    console.print("Query the metrics and events (read-only SQL; --format csv or json; docs/sql.md lists every view):")
    for statement in (
        "SELECT domain, sum(finished), sum(decided), sum(decided) / sum(finished) FROM v_effective_throughput "
        "GROUP BY domain",
        "SELECT domain, policy_version, sum(passed) / sum(decided) AS pass_rate FROM v_domain_quality "
        "GROUP BY ALL ORDER BY ALL",
        "SELECT domain, policy_version, state, baseline_pass_rate, candidate_pass_rate, p_value FROM v_alerts",
        "SELECT event_type, count() FROM events_raw GROUP BY event_type ORDER BY event_type",
    ):
        console.print(f"  {env}.venv/bin/rollout sql \"{statement}\"", highlight=False, soft_wrap=True)
    if keep_running:
        console.print("The broker and worker are still running: stop them with `rollout infra down` and Ctrl-C/kill.")
    console.print(
        f"Data lives in {settings.data_dir}; {owner_file(settings).name} appears there while a worker runs."
    )
