"""``rollout replay``: rebuild a database from the raw topics in bulk (raw rows, then every derived table in SQL)."""

from __future__ import annotations

from typing import Annotated

import typer

from rollout.cli_support import console, err_console, fail, load_settings
from rollout.errors import ConfigurationError, RolloutError, ServiceUnavailable

_HELP_PARAGRAPHS = (
    "Rebuild a database from the raw topics, several times faster than a worker on a fresh consumer group:"
    " every raw topic is read from its first offset to the end it has when the replay starts, each message"
    " is validated as the worker does (malformed ones go to dead_letters with the reason), events already"
    " stored are skipped by event id, and the rest are stored in large batches. Then, for every run the log"
    " holds, trajectories, consumptions, the metric windows (m_window_metrics, read by the v_* views) and"
    " the firing regression alerts are computed from the stored raw events in SQL (the audit's queries,"
    " streams/audit_sql) and written in bulk. The views then equal what a worker that read the same log"
    " shows.",
    "It does not publish the derived topics or dead letters to Kafka again. A run that already has"
    " derived rows in the database is refused: replay into another database (--database). With the"
    " embedded ClickHouse, stop the worker that owns the data folder first.",
    "To catch a worker up on a backlog that is most of the log (a new deployment on a long history, a"
    " rebuild), stop it and replay with --hand-off into a database without the log's runs: once every run"
    " is rebuilt, the worker's consumer group (ROLLOUT_CONSUMER_GROUP) is committed at the offsets the"
    " replay read to, and a worker started on that database (CLICKHOUSE_DATABASE) reads only what came"
    " after. Refused while the group has members. The replay reads the whole log: after a short outage in"
    " a long run, let the worker catch up itself.",
    "Memory: the replay keeps the id of every event it stores (~16 bytes each), and while a run is rebuilt"
    " its events, parsed, are held in tables of the engine: in memory for runs of up to 2,000,000 events"
    " (a 1,000,000-event run took ~2.2 GB of peak RSS in all), on disk for larger ones (a 3,000,000-event"
    " run took ~2.2 GB too: large runs are folded in parts of ~1,000,000 events); --in-memory or"
    " --on-disk decides for every run.",
    "Window size, verdict timeout, staleness bound and regression thresholds come from the worker's"
    " settings (ROLLOUT_METRICS_WINDOW_SECONDS, ...).",
    "Examples:",
    "rollout replay --database rebuilt",
    "rollout replay --database caught_up --hand-off   (then: CLICKHOUSE_DATABASE=caught_up rollout worker)",
    "ROLLOUT_TOPIC_PREFIX=demo rollout replay --database demo_again --on-disk",
)
HELP = "\n\n".join(_HELP_PARAGRAPHS)


def register(app: typer.Typer) -> None:
    """Add the replay command."""
    app.command("replay", help=HELP)(replay)


def _positive(value: int) -> int:
    if value < 1:
        raise typer.BadParameter(f"must be at least 1, got {value}")
    return value


def replay(
    database: Annotated[str, typer.Option(
        "--database", "-d", show_default=False,
        help="Database to rebuild into (created when missing). Default: ROLLOUT_CLICKHOUSE_DATABASE.")] = "",
    batch_size: Annotated[int, typer.Option("--batch-size", callback=_positive,
                                            help="Messages validated and inserted at a time.")] = 50_000,
    on_disk: Annotated[bool, typer.Option(
        "--on-disk", help="Keep every run's assembled events in on-disk tables while it is rebuilt: ~250 MB "
                          "compressed per 1,000,000 events instead of ~730 MB of memory, ~1.5 s slower per "
                          "1,000,000 events. Default: on disk only for runs of more than 2,000,000 events.")] = False,
    in_memory: Annotated[bool, typer.Option(
        "--in-memory", help="Keep every run's assembled events in memory, however large the run.")] = False,
    hand_off: Annotated[bool, typer.Option(
        "--hand-off", help="Then commit the worker's consumer group at the offsets the replay read to, so a "
                           "worker on this database goes on from there. Refused while the group has members "
                           "(stop the worker first).")] = False,
) -> None:
    """Rebuild a database from the raw topics in bulk."""
    try:
        if on_disk and in_memory:
            raise ConfigurationError("--on-disk and --in-memory exclude each other: give one, or neither to let "
                                     "the replay choose by each run's size")
        _replay(database, batch_size, True if on_disk else False if in_memory else None, hand_off)
    except RolloutError as exc:
        fail(str(exc))


def _replay(database: str, batch_size: int, on_disk: bool | None, hand_off: bool) -> None:
    from infra.clickhouse.client import connect
    from infra.clickhouse.migrate import migrate
    from infra.clickhouse.reader import live_owner
    from streams.app import derive_config
    from streams.collector import tune_collector
    from streams.replay import IN_MEMORY, ON_DISK
    from streams.replay import replay as run_replay

    settings = load_settings()
    target = database or settings.clickhouse_database
    owner = live_owner(settings)
    if owner is not None:
        raise ServiceUnavailable(
            f"a worker (pid {owner.get('pid')}) owns the embedded ClickHouse in {settings.data_dir}: stop it first, "
            "or replay into another data folder (ROLLOUT_DATA_DIR)")
    if not target.replace("_", "").isalnum():
        raise ConfigurationError(f"database name {target!r}: use letters, digits and _ only")
    client = connect(settings.clickhouse_url, database=target)
    freezer = tune_collector()
    try:
        migrate(client, target)
        result = run_replay(settings, client, target, derive_config(settings), batch=batch_size,
                            progress=lambda text: err_console.print(text, highlight=False),
                            engine=None if on_disk is None else ON_DISK if on_disk else IN_MEMORY,
                            hand_off=hand_off)
    finally:
        freezer.stop()
        client.close()
    loaded = result.load
    console.print(
        f"replayed {loaded.messages:,} messages into {target} in {result.seconds:.1f} s "
        f"({result.per_second:,.0f} messages/s): {loaded.stored:,} raw events stored, {loaded.duplicates:,} "
        f"duplicates skipped, {loaded.dead_lettered:,} dead letters; "
        f"{sum(r.trajectories for r in result.runs):,} trajectories, {sum(r.windows for r in result.runs):,} "
        f"windows, {sum(r.alerts for r in result.runs)} alerts over {len(result.runs)} run(s)", highlight=False)
    if hand_off:
        where = "" if target == settings.clickhouse_database else f"CLICKHOUSE_DATABASE={target} "
        console.print(
            f"handed off: consumer group {settings.consumer_group} committed at the replay's end on "
            f"{len(result.handed_off)} partition(s); start the worker on {target} to go on from there "
            f"({where}rollout worker)", highlight=False)
