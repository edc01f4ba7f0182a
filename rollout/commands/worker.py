"""``rollout worker``: run the stream processors and the ClickHouse sink."""

from __future__ import annotations

import typer

from infra.kafka.topics import ensure_topics
from rollout.cli_support import console, load_settings
from schemas import TopicNames

_HELP_PARAGRAPHS = (
    "Run the Faust worker: validate raw events, dead-letter bad ones, store them and derive the metrics in"
    " ClickHouse.",
    "Runs until stopped (Ctrl-C or SIGTERM). Start several on a ClickHouse server to share the partitions; with the"
    " embedded ClickHouse one worker owns the engine and serves reads for `rollout sql` on 127.0.0.1"
    " (ROLLOUT_WORKER_WEB_PORT).",
    "Every 10 s (ROLLOUT_WORKER_REPORT_SECONDS) it logs its totals (also at"
    " http://127.0.0.1:ROLLOUT_WORKER_WEB_PORT/stats) and, while it is 10,000 messages or more behind its"
    " topics, how far, how fast the backlog shrinks and about how long is left (`rollout status` says the same"
    " on demand). A long history is rebuilt faster by `rollout replay --hand-off` (see its --help).",
)
HELP = "\n\n".join(_HELP_PARAGRAPHS)


def register(app: typer.Typer) -> None:
    """Add the worker command."""
    app.command("worker", help=HELP)(worker)


def worker(
    log_level: str = typer.Option("info", "--log-level", "-l", help="crit, error, warn, info or debug."),
) -> None:
    """Run the stream processors and the ClickHouse sink until stopped (the command's help: ``HELP``)."""
    from faust import Worker

    from streams.app import create_app
    from streams.collector import tune_collector

    settings = load_settings()
    (settings.data_dir / "faust").mkdir(parents=True, exist_ok=True)
    topics = TopicNames(settings.topic_prefix)
    created = ensure_topics(settings.kafka_client_config(), topics.all,
                            partitions=settings.topic_partitions, configs=topics.configs())
    if created:
        console.print(f"created topics: {', '.join(created)}")
    app = create_app(settings)
    owner = app.rollout_owner  # type: ignore[attr-defined]
    freezer = tune_collector()
    try:
        Worker(app, loglevel=log_level, quiet=True).execute_from_commandline()
    finally:
        freezer.stop()
        owner.close()
