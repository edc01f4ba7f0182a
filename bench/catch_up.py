"""``python -m bench.catch_up``: a backlog caught up by a worker alone, and by ``rollout replay --hand-off``.

A worker far behind its topics catches up at its live rate. ``rollout replay --hand-off`` rebuilds the
database from the log in bulk and commits the worker's consumer group at the replay's end, so a worker
started on it goes on from there (``docs/architecture.md``, *Handing the log back to the worker*). This
measures both ways on the same backlog, on a Kafka broker of its own:

- **worker alone:** a fresh ``rollout worker`` (data folder and consumer group of its own) from its start
  until it consumed the whole log;
- **hand-off:** ``rollout replay --hand-off`` into another fresh data folder for another group, then a
  worker on it, from the replay's start until that worker serves; the worker must then read nothing.

The two alternate, in pairs; the first pair's views are compared (every ``v_*`` view equal, or the
differences are printed and the command exits 1). Usage::

    python -m bench.catch_up [--events 300000] [--pairs 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.cli import at_least
from bench.pipeline import compare_views, snapshot_views
from bench.stack import Broker, Worker, create_topics, deliver_all, settings_env, stack_settings
from bench.workload import events_for
from producers.kafka import EventProducer
from rollout.settings import Settings

BATCH = 10_000
"""The worker's default batch (ROLLOUT_SINK_BATCH_SIZE)."""
SETTLE_S = 2.0
"""How long the handed-off worker runs before its count of messages read is taken (it should stay 0)."""


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _settings(bootstrap: str, work: Path, tag: str, prefix: str) -> Settings:
    return stack_settings(bootstrap, work / tag, tag, batch_size=BATCH, topic_prefix=prefix)


def worker_alone(settings: Settings, work: Path, events: int, *, views: bool) -> tuple[float, Any]:
    """Seconds from a fresh worker's start until it consumed ``events`` messages; its views if asked."""
    worker = Worker(settings, work / f"{settings.consumer_group}.log")
    began = time.monotonic()
    worker.start()
    try:
        worker.watch(events, timeout=3600)
        seconds = time.monotonic() - began
        return seconds, snapshot_views(worker) if views else None
    finally:
        worker.stop()


def hand_off(settings: Settings, work: Path, *, views: bool) -> tuple[float, float, int, Any]:
    """``rollout replay --hand-off``, then a worker on its database: the replay's seconds, the seconds until the
    worker serves (both from the replay's start), what the worker read after ``SETTLE_S``, its views if asked."""
    env = {**os.environ, **settings_env(settings)}
    env.pop("CLICKHOUSE_URL", None)
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "rollout.cli", "replay", "--hand-off"], env=env,
                          capture_output=True, text=True, check=False)
    replayed = time.monotonic() - began
    if done.returncode != 0:
        raise RuntimeError(f"rollout replay --hand-off failed:\n{done.stderr[-2000:]}")
    worker = Worker(settings, work / f"{settings.consumer_group}.log").start()
    try:
        serving = time.monotonic() - began
        time.sleep(SETTLE_S)
        read = int(worker.stats()["consumed"])
        return replayed, serving, read, snapshot_views(worker) if views else None
    finally:
        worker.stop()


@dataclass
class CatchUp:
    """Both ways over one backlog: seconds per run, in pairs; the first pair's views compared."""

    events: int
    alone: list[float] = field(default_factory=list)
    handed: list[float] = field(default_factory=list)
    replays: list[float] = field(default_factory=list)
    read_after: list[int] = field(default_factory=list)
    compared: dict[str, int] = field(default_factory=dict)
    differences: dict[str, str] = field(default_factory=dict)


def run(bootstrap: str, work: Path, events: int, pairs: int, *, prefix: str = "catch-up") -> CatchUp:
    """Publish ``events`` bench events under ``prefix``, then ``pairs`` alternated pairs of the two ways."""
    publisher = _settings(bootstrap, work, "publish", prefix)
    create_topics(publisher)
    log(f"  publishing {events:,} bench events")
    with EventProducer.from_settings(publisher) as producer:
        for event in events_for(events, run_id="catch-up"):
            producer.send(event)
        deliver_all(producer)
    result = CatchUp(events)
    for pair in range(pairs):
        first = pair == 0
        seconds, alone_views = worker_alone(_settings(bootstrap, work, f"alone-{pair}", prefix), work, events,
                                            views=first)
        result.alone.append(seconds)
        log(f"  pair {pair + 1}: worker alone {seconds:.1f} s ({events / seconds:,.0f} events/s)")
        replayed, serving, read, handed_views = hand_off(_settings(bootstrap, work, f"hand-off-{pair}", prefix),
                                                         work, views=first)
        result.replays.append(replayed)
        result.handed.append(serving)
        result.read_after.append(read)
        log(f"  pair {pair + 1}: replay --hand-off {replayed:.1f} s, its worker serving at {serving:.1f} s "
            f"({events / serving:,.0f} events/s); that worker then read {read:,} messages")
        if read:
            result.differences[f"pair {pair + 1}: messages read after the hand-off"] = f"{read:,} (0 expected)"
        if first:
            result.compared, differing = compare_views(alone_views, handed_views)
            result.differences.update(differing)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.catch_up", description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=at_least(1000), default=300_000,
                        help="bench events in the backlog (default 300,000)")
    parser.add_argument("--pairs", type=at_least(1), default=2, help="alternated pairs of runs (default 2)")
    parser.add_argument("--work-dir", type=Path, default=None, help="broker and worker data (default: a temporary "
                                                                     "folder, removed afterwards)")
    args = parser.parse_args(argv)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="catch-up-"))
    broker = Broker(work / "kafka").up()
    try:
        result = run(broker.bootstrap, work, args.events, args.pairs)
    finally:
        broker.down()
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"catch-up of {args.events:,} bench events ({args.pairs} alternated pairs, medians)")
    for name, runs in (("worker alone", result.alone), ("replay --hand-off, then the worker", result.handed)):
        middle = statistics.median(runs)
        print(f"{name:36s} {middle:7.1f} s  {args.events / middle:9,.0f} events/s  "
              f"(runs: {', '.join(f'{s:.1f}' for s in runs)} s)")
    speedup = statistics.median(result.alone) / statistics.median(result.handed)
    print(f"{'hand-off against the worker alone':36s} {speedup:7.2f}x")
    print(f"views of the first pair: {len(result.compared)} compared, {sum(result.compared.values()):,} rows")
    for name, what in result.differences.items():
        print(f"DIFFERENT {name}: {what}")
    return 1 if result.differences else 0


if __name__ == "__main__":
    raise SystemExit(main())
