"""``rollout simulate``: play a scenario file's traffic into Kafka (or summarise it with --dry-run)."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from producers.scenario import ScenarioError, load_scenario
from producers.simulator import DomainCounts, ExpectedCounts, expected_counts, generate, publish
from rollout.cli_support import console, fail, load_settings
from rollout.errors import RolloutError
from schemas.base import Envelope

_HELP_PARAGRAPHS = (
    "Publish a simulated RL run's events (sandbox, verifier, policy, trainer) to Kafka.",
    "A scenario file (YAML) describes the run: run_id, seed, start (event time), duration (the span in"
    " which trajectories finish), trajectories, allocation (exact: counts follow the rates exactly;"
    " sample: drawn at random), policy {versions, async_lag}, staleness_bound, optional training"
    " {batch_size, delay} and delivery {duplicate_rate, late_rate, late_by}, and per domain: weight,"
    " run_time, wait_time, pass_rate (pass_rate_by_version), env_failure_rate (env_failure_classes),"
    " undecidable_rate, digest_mismatch_rate, model_error_rate, snapshot_rate, interrupt_rate.",
    "Every key is explained at the top of scenarios/default.yaml (the demo). scenarios/ also holds"
    " regression.yaml, healthy.yaml and golden.yaml.",
    "The same scenario and seed always give the same events, ids included. Pace with --rate (events"
    " per second) or --speed (event-time acceleration: 60 plays an hour in a minute; max, the default,"
    " sends as fast as the broker takes them). --dry-run prints the summary (events by type, expected"
    " outcomes per domain) without a broker.",
    "Examples:",
    "rollout simulate --scenario scenarios/default.yaml",
    "rollout simulate --scenario scenarios/regression.yaml --speed 120 --run-id regression-2",
    "rollout simulate --scenario scenarios/golden.yaml --dry-run",
)
HELP = "\n\n".join(_HELP_PARAGRAPHS)

_MATERIALISE_UP_TO = 250_000
"""Scenarios with at most this many trajectories are generated up front, so progress shows a total."""


def _speed(value: str | None) -> float | None:
    """None for as fast as possible, else the acceleration factor."""
    if value is None or value.strip().lower() == "max":
        return None
    try:
        factor = float(value)
    except ValueError:
        fail(f"--speed takes 'max' or a positive number (60 plays an hour in a minute), not {value!r}")
    if not factor > 0 or factor == float("inf"):
        fail(f"--speed must be a positive number or 'max', not {value!r}")
    return factor


def simulate(
    scenario_file: Annotated[
        Path,
        typer.Option(
            "--scenario",
            "-s",
            help="Scenario YAML file; see scenarios/default.yaml for every key.",
            show_default=False,
        ),
    ],
    rate: Annotated[
        float | None,
        typer.Option(help="Pace by wall clock: events per second.", show_default=False),
    ] = None,
    speed: Annotated[
        str | None,
        typer.Option(
            help="Pace by event time: 'max' (as fast as possible) or a factor (60 = one hour per minute).",
            show_default="max",
        ),
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Override the scenario's seed.", show_default=False)] = None,
    run_id: Annotated[
        str | None,
        typer.Option("--run-id", help="Override the scenario's run_id.", show_default=False),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Generate and summarise only; no broker needed.")] = False,
) -> None:
    """Publish a simulated run described by a scenario file."""
    if rate is not None and speed is not None:
        fail("give --rate (events per second) or --speed (event-time factor), not both")
    if rate is not None and not (rate > 0 and rate != float("inf")):
        fail(f"--rate must be a positive number of events per second, not {rate}")
    factor = _speed(speed)
    try:
        scenario = load_scenario(scenario_file).with_overrides(seed=seed, run_id=run_id)
    except ScenarioError as exc:
        fail(str(exc))

    console.print(
        f"[bold]{scenario_file}[/]  run [cyan]{scenario.run_id}[/]  seed {scenario.seed}  "
        f"{scenario.start:%Y-%m-%d %H:%M:%S}Z + {_human(scenario.duration)}  "
        f"{scenario.trajectories:,} trajectories ({scenario.allocation})",
        highlight=False,
    )
    if scenario.description:
        console.print(f"[dim]{scenario.description}[/]", highlight=False)
    expected = expected_counts(scenario)

    if dry_run:
        by_type = Counter(getattr(event, "event_type", type(event).__name__) for event in generate(scenario))
        _summary(by_type, expected)
        return

    try:
        from producers.kafka import EventProducer  # the Kafka client loads only when publishing

        settings = load_settings()
        # No spool: the summary must report what the broker confirmed, not what waits on disk.
        producer = EventProducer.from_settings(settings, spool=False)
    except ImportError as exc:
        fail(f"the Kafka producer is not available ({exc}); --dry-run works without it")
    except RolloutError as exc:
        fail(str(exc))

    events: Iterable[Envelope]
    total: int | None
    if scenario.trajectories <= _MATERIALISE_UP_TO:
        events = list(generate(scenario))
        total = len(events)
    else:
        events, total = generate(scenario), None
    columns = (
        TextColumn("[bold]publishing"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
    )
    try:
        with Progress(*columns, console=console, transient=False) as bar:
            task = bar.add_task("publish", total=total, rate="")

            def progress(done: int, _total: int) -> None:
                elapsed = bar.tasks[0].elapsed or 0.0
                shown = f"{done / elapsed:,.0f} ev/s" if elapsed > 0 else ""
                bar.update(task, completed=done, rate=shown)

            report = publish(events, producer, rate=rate, speed=factor, progress=progress, total=total)
    except RolloutError as exc:
        fail(str(exc))
    finally:
        # Publishing already flushed; closing only releases the client, so its errors add nothing.
        with contextlib.suppress(RolloutError):
            producer.close()
    _summary(Counter(report.by_type), expected)
    console.print(
        f"published {report.published:,} events in {report.seconds:.1f} s "
        f"({report.events_per_second:,.0f} events/s) to topics prefixed [cyan]{settings.topic_prefix}[/]",
        highlight=False,
    )


def _human(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _summary(by_type: Counter[str], counts: ExpectedCounts) -> None:
    """Events by type, then the expected outcome counts per domain."""
    events = Table(title="Events by type", title_justify="left")
    events.add_column("event type")
    events.add_column("events", justify="right")
    for event_type, count in sorted(by_type.items()):
        events.add_row(event_type, f"{count:,}")
    events.add_row("[bold]total[/]", f"[bold]{sum(by_type.values()):,}[/]")
    console.print(events)

    exact = counts["allocation"] == "exact"
    title = "Expected outcomes" + ("" if exact else " (means of the random draws)")
    columns: list[tuple[str, DomainCounts]] = [*counts["domains"].items(), ("total", counts["total"])]
    table = Table(title=title, title_justify="left")
    table.add_column("")
    for name, _ in columns:
        table.add_column(name, justify="right", style="bold" if name == "total" else None)
    rows: list[tuple[str, Callable[[DomainCounts], float]]] = [
        ("finished", lambda c: c["finished"]),
        ("env valid", lambda c: c["env_valid"]),
        ("decided", lambda c: c["decided"]),
        ("passed", lambda c: c["passed"]),
        ("failed", lambda c: c["failed"]),
        ("  of which model errors", lambda c: c["model_errors"]),
        ("undecidable", lambda c: c["undecidable"]),
        ("digest mismatch", lambda c: c["digest_mismatch"]),
    ]
    for label, value in rows:
        table.add_row(label, *(_num(value(c)) for _, c in columns))
    table.add_row("pass rate", *(_share(c["passed"], c["decided"]) for _, c in columns))
    table.add_row("validity", *(_share(c["env_valid"], c["finished"]) for _, c in columns))
    table.add_row("decidable", *(_share(c["decided"], c["env_valid"]) for _, c in columns))
    table.add_row("env failed", *(_num(c["env_failed"]) for _, c in columns))
    for failure_class in sorted(counts["total"]["env_failures"]):
        table.add_row(
            f"  {failure_class}",
            *(_num(c["env_failures"].get(failure_class, 0)) for _, c in columns),
        )
    console.print(table)

    by_version = Table(title="Expected pass rate by policy version", title_justify="left")
    by_version.add_column("version", justify="right")
    for name, _ in columns:
        by_version.add_column(name, justify="right", style="bold" if name == "total" else None)
    for version in sorted(counts["total"]["by_version"]):
        cells = []
        for _, c in columns:
            cell = c["by_version"].get(version)
            cells.append(_share(cell["passed"], cell["decided"]) if cell else "-")
        by_version.add_row(str(version), *cells)
    console.print(by_version)


def _share(part: float, whole: float) -> str:
    return f"{part / whole:.1%}" if whole else "-"


def _num(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:,.1f}"


def register(app: typer.Typer) -> None:
    """Add the ``simulate`` command to the CLI."""
    app.command(name="simulate", help=HELP, no_args_is_help=True)(simulate)
