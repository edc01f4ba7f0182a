"""``rollout bench``: the performance benchmarks, side by side with their baselines, into docs/performance.md."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer

_HELP_PARAGRAPHS = (
    "Run every benchmark with its baseline on a stack of its own; print the table and write the document.",
    "Starts a Kafka broker on free ports and worker subprocesses with their own data folders under"
    " --work-dir, so it never touches a running `rollout infra up` broker or `rollout worker`.",
)
HELP = "\n\n".join(_HELP_PARAGRAPHS)

# Options that change where the run writes, not what it measures: left out of the command the document records,
# so that the command shown reproduces the measurements wherever the document was written.
_PLACE_OPTIONS = ("--out", "-o", "--work-dir")  # each followed by its value
_PLACE_JOINED = ("--out=", "--work-dir=", "-o")  # the value in the same argument (checked after the above)
_PLACE_FLAGS = ("--keep",)


def recorded_command(program: str, arguments: list[str]) -> str:
    """The command line the document gives: ``program`` and ``arguments`` shell-quoted, without ``--out``/``-o``,
    ``--work-dir`` (with their values, in either spelling) and ``--keep``."""
    kept: list[str] = []
    remaining = iter(arguments)
    for argument in remaining:
        if argument in _PLACE_OPTIONS:
            next(remaining, None)
        elif argument not in _PLACE_FLAGS and not argument.startswith(_PLACE_JOINED):
            kept.append(argument)
    return " ".join([program, *(shlex.quote(a) for a in kept)])


def register(app: typer.Typer) -> None:
    """Add the bench command."""
    app.command("bench", help=HELP)(bench)


def bench(
    quick: bool = typer.Option(False, "--quick", help="Small sizes for development (about 2-3 minutes)."),
    out: Path = typer.Option(Path("docs/performance.md"), "--out", "-o",
                             help="Where to write the document ('-' for nowhere)."),
    ingest: str = typer.Option("direct", "--ingest",
                               help="How the replay, freshness and profile workers read the raw topics: direct "
                                    "(confluent-kafka below Faust's stream) or faust (the Faust agent). The live "
                                    "worker always uses the Faust agent."),
    only: str = typer.Option("", "--only",
                             help="Comma-separated subset: sdk, worker (also replay and memory), profile, "
                                  "freshness, dashboards."),
    wait_quiet: bool = typer.Option(True, "--wait-quiet/--no-wait-quiet",
                                    help="Wait for the 1-minute load average to fall below --max-load first."),
    max_load: float = typer.Option(1.5, "--max-load", help="Load average counted as quiet."),
    quiet_timeout: float = typer.Option(600.0, "--quiet-timeout", help="Longest wait for a quiet machine (s)."),
    work_dir: Path | None = typer.Option(None, "--work-dir", help="Folder for broker and worker data "
                                                                  "(default .data/bench)."),
    keep: bool = typer.Option(False, "--keep", help="Keep the run's data folder."),
    sdk_events: int | None = typer.Option(None, "--sdk-events", help="Events per SDK publish run."),
    sdk_repeats: int | None = typer.Option(
        None, "--sdk-repeats", help="Alternated SDK and raw publish runs; the ratio is the median of the pairs'."),
    log_events: int | None = typer.Option(None, "--log-events",
                                          help="Events in the log the worker and replay rows read."),
    baseline_repeats: int | None = typer.Option(None, "--baseline-repeats", help="Plain consumer runs (median)."),
    replay_events: int | None = typer.Option(
        None, "--replay-events",
        help="Events in the log the bulk replay is timed on, which a fresh worker then reads for the memory row "
             "(0: none; the memory row then comes from the replays of the worker's log)."),
    replay_repeats: int | None = typer.Option(
        None, "--replay-repeats", help="Bulk replays of that log (median; one uncounted warm-up first)."),
    freshness_rate: float | None = typer.Option(None, "--freshness-rate", help="Steady publishing rate (events/s)."),
    freshness_seconds: float | None = typer.Option(None, "--freshness-seconds", help="Seconds of steady publishing."),
    freshness_drain: float | None = typer.Option(None, "--freshness-drain",
                                                 help="Longest wait for the worker after publishing (s)."),
    freshness_sustainable: bool | None = typer.Option(None, "--freshness-sustainable/--no-freshness-sustainable",
                                                      help="Also measure at half the worker's measured rate."),
    month_events: int | None = typer.Option(None, "--month-events", help="Events' worth of dashboard data."),
    month_days: float | None = typer.Option(None, "--month-days", help="Days the dashboard data spans."),
    seed_hours: float | None = typer.Option(None, "--seed-hours", help="Hours of workload derived for real."),
    query_budget: float | None = typer.Option(None, "--query-budget", help="Seconds of repeats per query."),
    query_max_repeats: int | None = typer.Option(None, "--query-max-repeats", help="Most repeats per query."),
    profile_seconds: float | None = typer.Option(None, "--profile-seconds", help="Seconds of py-spy recording."),
    batch_size: int | None = typer.Option(None, "--batch-size", help="Workers' batch size (ROLLOUT_SINK_BATCH_SIZE)."),
    baseline_batch_size: int | None = typer.Option(
        None, "--baseline-batch-size",
        help="Plain consumer loop's batch size (default 10,000, near its fastest; not changed by --batch-size)."),
) -> None:
    """The ``rollout bench`` command (its help: ``HELP``)."""
    from bench.config import BENCHMARKS, FULL, QUICK
    from bench.runner import run_suite

    sizes = (QUICK if quick else FULL).with_overrides({
        "sdk_events": sdk_events, "sdk_repeats": sdk_repeats, "log_events": log_events,
        "baseline_repeats": baseline_repeats, "replay_events": replay_events, "replay_repeats": replay_repeats,
        "freshness_rate": freshness_rate,
        "freshness_seconds": freshness_seconds, "freshness_drain": freshness_drain,
        "freshness_sustainable": freshness_sustainable, "month_events": month_events, "month_days": month_days,
        "seed_hours": seed_hours, "query_budget": query_budget, "query_max_repeats": query_max_repeats,
        "profile_seconds": profile_seconds, "batch_size": batch_size,
        "baseline_batch_size": baseline_batch_size,
    })
    if ingest not in ("direct", "faust"):
        raise typer.BadParameter(f"unknown ingestion {ingest!r}; choose direct or faust", param_hint="--ingest")
    from bench.stack import INGEST

    INGEST["mode"] = ingest
    selected = tuple(b.strip() for b in only.split(",") if b.strip()) or BENCHMARKS
    unknown = sorted(set(selected) - set(BENCHMARKS))
    if unknown:
        raise typer.BadParameter(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}",
                                 param_hint="--only")
    program = "python -m bench" if Path(sys.argv[0]).name == "__main__.py" else "rollout bench"
    arguments = sys.argv[1:] if program == "python -m bench" else sys.argv[2:]
    run_suite(command=recorded_command(program, arguments), quick=quick, sizes=sizes,
              out=None if str(out) == "-" else out, selected=selected, wait_quiet=wait_quiet, max_load=max_load,
              quiet_timeout=quiet_timeout, work_dir=work_dir, keep=keep)
