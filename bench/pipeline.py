"""Worker throughput, replay and memory: one event log, a live worker, a replaying worker, a plain consumer.

1. A fresh worker (``live``) runs while the SDK publishes the log as fast as it can: its sustained
   rate is the worker's *live* rate.
2. The plain consumer loop (``bench.consumer_baseline``) reads the same topics with its own group
   and ClickHouse folder, several times (median), taking turns with the replays of step 3; then a
   Faust agent with no work in its body (``bench.faust_floor``) reads them once: the framework's own
   ceiling, for reference; and a fresh worker with its derivation left out (``bench.without_derivation``)
   replays them once: what the worker costs without it, so the derivation's share by difference.
3. After each plain consumer run, a fresh worker (``replay``: new data folder, new consumer group)
   reads the same, now complete, topics from the start: the log is published before it starts.
   The median of their sustained rates is both the worker benchmark's value and the replay
   benchmark's value.
4. Every ``v_*`` view of every replaying worker is compared row by row with the live worker's.
5. The bulk replay (``rollout replay``: ``streams.replay`` run by ``bench.bulk_replay``) reads the same
   topics into a fresh folder as many times as the plain consumer loop ran; its median rate is the
   replay benchmark's value, and its views are compared with the live worker's too.
6. The memory benchmark: a fresh worker reads the bulk replay's own log (``run_bulk_log``, the replay
   target's 1,000,000 messages) while its RSS is sampled (``run_log_replay``). Without that log, the
   replays of step 3 stand in (the highest of their peaks).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from bench.config import DEFAULT_BATCH_SIZE
from bench.machine import CpuMark, busy_share
from bench.measure import Rate, cpu_per_event, median_of, paired_ratio, sustained_rate
from bench.publish import effective_config, raw_once
from bench.stack import Progress, Worker, create_topics, deliver_all, stack_settings
from bench.workload import encode_all
from infra.clickhouse.reader import QueryResult
from producers.kafka import EventProducer
from rollout.settings import Settings
from schemas import Envelope, TopicNames

REPO = Path(__file__).resolve().parents[1]
WALL_CLOCK_COLUMNS = frozenset({"version", "first_fired_at", "updated_at"})
"""Columns that say when a row was computed, not what it says: left out of the live/replay comparison."""


@dataclass
class PipelineResult:
    """Everything the worker, replay and memory rows need."""

    events: int
    topic_prefix: str
    live: Rate
    live_progress: Progress
    replay: Rate
    replay_progress: Progress
    replay_stats: dict[str, Any]
    baseline_rates: list[float]
    baseline_runs: list[Rate]
    publish_seconds: float
    faust_floor: Rate | None = None
    without_derivation: Rate | None = None
    """A fresh worker with its derivation left out (``bench.without_derivation``) replaying the log once, after the
    full worker's replays (None: not run)."""
    without_derivation_cpu_per_event: float | None = None
    """That worker's own CPU seconds per event over its measured span (every thread, its engine's)."""
    replay_busy: float | None = None
    """Share of the machine's CPU in use while the replay worker ran (start-up included; any process, the
    broker's too)."""
    baseline_cpu_per_event: list[float] = field(default_factory=list)
    """Each plain consumer run's own CPU seconds per event over its measured span (every thread, its engine's)."""
    replay_cpu_per_event: float | None = None
    """The replay worker's own CPU seconds per event over its measured span (every thread, its engine's)."""
    views_compared: dict[str, int] = field(default_factory=dict)
    view_differences: dict[str, str] = field(default_factory=dict)
    replay_runs: list[Rate] = field(default_factory=list)
    """Every replay's rate, in the order they ran (each after a plain consumer run); ``replay`` is the median one."""
    replay_peaks: list[int] = field(default_factory=list)
    """Every replay's peak RSS (bytes), in the same order."""
    memory_progress: Progress | None = None
    """The progress samples of the replay with the highest peak RSS (None: ``replay_progress``); see ``memory``."""
    bulk_runs: list[dict[str, Any]] = field(default_factory=list)
    """Each bulk replay's result (``bench.bulk_replay`` without its views), in the order they ran."""
    bulk_differences: dict[str, str] = field(default_factory=dict)
    """Views of a bulk replay that differ from the live worker's."""
    bulk_log_runs: list[dict[str, Any]] = field(default_factory=list)
    """Bulk replays of the replay target's log (``run_bulk_log``), in the order they ran, warm-up excluded."""
    bulk_log_warm_up: dict[str, Any] | None = None
    """The warm-up bulk replay of that log, run first and not counted (None: none ran)."""
    memory_log: LogReplay | None = None
    """A worker replaying the bulk replay's log (``run_log_replay``): the memory row's run when there is one."""

    @property
    def bulk(self) -> Rate | None:
        """The bulk replay with the median rate: of the target's log when it ran, else of the pipeline's log."""
        runs = self.bulk_log_runs or self.bulk_runs
        if not runs:
            return None
        rates = sorted((Rate(int(r["messages"]), float(r["seconds"]), 0, 0.0) for r in runs),
                       key=lambda r: r.per_second)
        return rates[(len(rates) - 1) // 2]

    @property
    def memory(self) -> Progress:
        """What the memory row reports: the worker that replayed the bulk replay's log, else the replay of this
        log with the highest peak RSS."""
        if self.memory_log is not None:
            return self.memory_log.progress
        return self.memory_progress or self.replay_progress

    @property
    def memory_events(self) -> int:
        """How many events the memory row's worker read."""
        return self.memory_log.events if self.memory_log is not None else self.events

    @property
    def memory_rate(self) -> Rate:
        """The sustained rate of the memory row's worker."""
        return self.memory_log.rate if self.memory_log is not None else self.replay

    @property
    def baseline(self) -> float:
        """Median rate of the plain consumer loop."""
        return median_of(self.baseline_rates)

    @property
    def ratio(self) -> float | None:
        """The median of the replay / plain-loop ratios of the pairs that took turns (None without pairs)."""
        if not self.replay_runs or len(self.replay_runs) != len(self.baseline_rates):
            return None
        return paired_ratio([r.per_second for r in self.replay_runs], self.baseline_rates)

    @property
    def identical(self) -> bool:
        """True when every view of every replay (worker and bulk) equals the live one."""
        return bool(self.views_compared) and not self.view_differences and not self.bulk_differences


def _publish(settings: Settings, events: list[Envelope], done: dict[str, Any]) -> None:
    began = time.monotonic()
    try:
        with EventProducer.from_settings(settings) as producer:
            for i, event in enumerate(events):
                producer.send(event)
                if i % 1000 == 0:
                    producer.poll(0)
            deliver_all(producer)
        done["seconds"] = time.monotonic() - began
    except BaseException as exc:  # reported by the caller
        done["error"] = exc


def _run_child(module: str, arguments: list[str], what: str, timeout: float) -> dict[str, Any]:
    """Run ``python -m module`` from the repository root; its JSON result from stdout."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", module, *arguments], cwd=REPO, env=env, capture_output=True,
                          timeout=timeout + 60, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({done.returncode}):\n{done.stderr.decode()[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _reader_arguments(settings: Settings, work: Path, tag: str, events: int, timeout: float, *,
                      batch_size: int | None = None) -> list[str]:
    """The options both reference readers take: where to read, as which group, how much, how long, in batches
    of how many (default: the settings' worker batch size)."""
    return ["--bootstrap", settings.kafka_bootstrap_servers,
            "--topics", ",".join(TopicNames(settings.topic_prefix).raw),
            "--group", f"{settings.consumer_group}-{tag}",
            "--data-dir", str(work / tag),
            "--batch-size", str(settings.sink_batch_size if batch_size is None else batch_size),
            "--expect", str(events),
            "--timeout", str(timeout)]


def run_baseline(settings: Settings, work: Path, tag: str, events: int, timeout: float, *, batch_size: int
                 ) -> tuple[Rate, float | None]:
    """One run of the plain consumer loop in its own process, in batches of ``batch_size``; its sustained rate and
    CPU seconds per event."""
    result = _run_child("bench.consumer_baseline",
                        _reader_arguments(settings, work, tag, events, timeout, batch_size=batch_size),
                        "baseline consumer", timeout)
    if result["stored"] != events:
        raise RuntimeError(f"baseline consumer stored {result['stored']} rows, expected {events}")
    samples = [(float(t), int(n)) for t, n in result["samples"]]
    return sustained_rate(samples, events), cpu_per_event(samples, [float(c) for c in result.get("cpu", [])], events)


def run_bulk_replay(bootstrap: str, folder: Path, topic_prefix: str, timeout: float, *, views: bool = True
                    ) -> dict[str, Any]:
    """One bulk replay (``bench.bulk_replay``) of the topics into a fresh folder; its result (with the views' rows)."""
    return _run_child("bench.bulk_replay", ["--bootstrap", bootstrap, "--topic-prefix", topic_prefix,
                                            "--data-dir", str(folder), *([] if views else ["--no-views"])],
                      "bulk replay", timeout)


@dataclass
class LogReplay:
    """A fresh worker's read of the bulk replay's log (``run_log_replay``)."""

    events: int
    rate: Rate
    progress: Progress


REPLAY_LOG_PREFIX = "bench-replay-log"
"""The topic prefix of the bulk replay's log (``run_bulk_log``), which ``run_log_replay`` reads again."""


def run_log_replay(bootstrap: str, work: Path, total: int, *, batch_size: int, timeout: float,
                   log: Any = print) -> LogReplay:
    """A fresh worker (new data folder and consumer group) reads the bulk replay's log (``run_bulk_log`` published
    it) from the start; its rate and RSS by progress. No views are read back: this run is about memory."""
    tag = "memory"
    settings = stack_settings(bootstrap, work / tag, tag, batch_size=batch_size, topic_prefix=REPLAY_LOG_PREFIX)
    worker = Worker(settings, work / f"{tag}.log").start()
    try:
        progress = worker.watch(total, timeout=timeout, on_sample=reporter(log, total))
        return LogReplay(total, sustained_rate([(t, n) for t, n, _ in progress.samples], total), progress)
    finally:
        worker.stop()


def run_bulk_log(bootstrap: str, work: Path, events: list[Envelope], *, repeats: int, timeout: float,
                 log: Any = print) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The bulk replay timed on a log of its own (the replay target's size): published once, replayed once as a
    warm-up, then ``repeats`` times, each into a fresh folder. The warm-up's result, then the timed runs'. Their
    views are not compared (no live worker read this log); the pipeline's are.

    In the three suite runs before the warm-up was added, the first replay of a freshly published log was the
    slowest (42,116-45,250 events/s against 46,525-51,307 for the next two, 1,000,000 messages); in the first run
    with it, the fastest (63,038 against 59,845-62,815). It is reported, not counted."""
    settings = stack_settings(bootstrap, work / "replay-log", "replay-log", batch_size=len(events),
                              topic_prefix=REPLAY_LOG_PREFIX)
    create_topics(settings)
    encoded = encode_all(events, settings.topic_prefix)
    config, _ = effective_config(settings)
    log(f"  publishing {len(events):,} events for the bulk replay")
    raw_once(config, encoded, warm_up=False)
    runs = []
    for i in range(repeats + 1):
        run = run_bulk_replay(bootstrap, work / f"replay-log-{i}", settings.topic_prefix, timeout, views=False)
        run.pop("views", None)
        runs.append(run)
        log(f"  bulk replay of {run['messages']:,} messages, {f'run {i}' if i else 'warm-up (not counted)'}: "
            f"{run['messages'] / run['seconds']:,.0f} events/s ({run['seconds']:.1f} s)")
    return runs[0], runs[1:]


def run_faust_floor(settings: Settings, work: Path, events: int, timeout: float) -> Rate:
    """One run of the no-op Faust agent in its own process; its sustained rate."""
    arguments = [*_reader_arguments(settings, work, "faust-floor", events, timeout),
                 "--within", str(settings.sink_batch_seconds)]
    result = _run_child("bench.faust_floor", arguments, "no-op Faust agent", timeout)
    return sustained_rate([(float(t), int(n)) for t, n in result["samples"]], events)


class Reads(Protocol):
    """What reads a worker's database: ``bench.stack.Worker``, the tests' ``WorkerProcess``."""

    def query(self, sql: str, parameters: dict[str, Any] | None = None) -> QueryResult: ...


def snapshot_views(worker: Reads, database: str | None = None) -> dict[str, list[tuple[Any, ...]]]:
    """Every ``v_*`` view's rows of ``database`` (the worker's own by default), sorted, without the wall-clock
    columns."""
    where = "{db:String}" if database else "currentDatabase()"
    names = [str(r[0]) for r in worker.query(
        f"SELECT name FROM system.tables WHERE database = {where} AND name LIKE 'v\\_%' ORDER BY name",
        {"db": database} if database else None).rows]
    prefix = f"`{database}`." if database else ""
    views: dict[str, list[tuple[Any, ...]]] = {}
    for name in names:
        result = worker.query(f"SELECT * FROM {prefix}{name}")
        views[name] = comparable_rows(result.columns, result.rows)
    return views


def comparable_rows(columns: list[str], rows: list[list[Any]]) -> list[tuple[Any, ...]]:
    """A view's rows as compared: without the wall-clock columns, floats rounded, lists as tuples, sorted."""
    keep = [i for i, c in enumerate(columns) if c not in WALL_CLOCK_COLUMNS]
    return sorted((tuple(_normal(row[i]) for i in keep) for row in rows), key=repr)


def _normal(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isnan(value) else round(value, 9)
    if isinstance(value, list):
        return tuple(_normal(v) for v in value)
    return value


def compare_views(live: dict[str, list[tuple[Any, ...]]],
                  replay: dict[str, list[tuple[Any, ...]]]) -> tuple[dict[str, int], dict[str, str]]:
    """Rows per view, and a description of each view whose rows differ."""
    compared: dict[str, int] = {}
    differences: dict[str, str] = {}
    for name in sorted(set(live) | set(replay)):
        a, b = live.get(name), replay.get(name)
        if a is None or b is None:
            differences[name] = "missing in the " + ("live" if a is None else "replay") + " database"
            continue
        compared[name] = len(a)
        if a != b:
            only_live = len(set(a) - set(b))
            only_replay = len(set(b) - set(a))
            differences[name] = f"{len(a)} live rows vs {len(b)} replayed; {only_live} only live, " \
                                f"{only_replay} only replayed"
    return compared, differences


def run_pipeline(bootstrap: str, work: Path, events: list[Envelope], *, batch_size: int, baseline_repeats: int,
                 timeout: float, baseline_batch_size: int = DEFAULT_BATCH_SIZE, log: Any = print) -> PipelineResult:
    """Live worker while publishing, plain consumer baselines, replaying worker, view comparison."""
    total = len(events)
    # The live worker reads with the Faust agent (the default); the replay with the suite's ingestion,
    # so the replay row compares the two ways of reading and checks they give identical views.
    live_settings = stack_settings(bootstrap, work / "live", "log", batch_size=batch_size, ingest="faust")
    live = Worker(live_settings, work / "live.log").start()
    try:
        log(f"  live worker up; publishing {total:,} events with the SDK while it consumes")
        published: dict[str, Any] = {}
        publisher = threading.Thread(target=_publish, args=(live_settings, events, published), daemon=True)
        publisher.start()
        live_progress = live.watch(total, timeout=timeout, on_sample=reporter(log, total))
        publisher.join()
        if "error" in published:
            raise RuntimeError(f"publishing the log failed: {published['error']}")
        live_rate = sustained_rate([(t, n) for t, n, _ in live_progress.samples], total)
        log(f"  live: {live_rate.per_second:,.0f} events/s (publishing took {published['seconds']:.1f}s)")

        live_views = snapshot_views(live)
        live.stop()
        # The plain consumer loop and a fresh replaying worker take turns, so a machine whose speed drifts
        # during the run (a shared host) slows both alike; each side's value is its median.
        baseline_runs: list[Rate] = []
        baseline_cpu_per_event: list[float] = []
        replays: list[_Replay] = []
        compared: dict[str, int] = {}
        differences: dict[str, str] = {}
        for i in range(baseline_repeats):
            rate, cpu = run_baseline(live_settings, work, f"baseline-{i}", total, timeout,
                                     batch_size=baseline_batch_size)
            baseline_runs.append(rate)
            if cpu is not None:
                baseline_cpu_per_event.append(cpu)
            log(f"  plain consumer loop, run {i + 1}: {rate.per_second:,.0f} events/s")
            run = _run_replay(bootstrap, work, f"replay-{i}", live_settings.topic_prefix,
                              batch_size, total, timeout, log)
            replays.append(run)
            log(f"  replay worker, run {i + 1}: {run.rate.per_second:,.0f} events/s "
                f"(the machine's CPU {run.busy:.0%} busy)")
            # Every replay must give the live worker's views.
            found, differ = compare_views(live_views, run.views)
            compared = found
            differences.update({name: f"run {i + 1}: {text}" for name, text in differ.items()})
            log(f"  compared {len(found)} views: {differ or 'identical'}")

        bulk_runs: list[dict[str, Any]] = []
        bulk_differences: dict[str, str] = {}
        for i in range(baseline_repeats):
            bulk = run_bulk_replay(bootstrap, work / f"bulk-{i}", live_settings.topic_prefix, timeout)
            views = {name: comparable_rows(view["columns"], view["rows"]) for name, view in bulk.pop("views").items()}
            bulk_runs.append(bulk)
            _, differ = compare_views(live_views, views)
            bulk_differences.update({name: f"bulk run {i + 1}: {text}" for name, text in differ.items()})
            log(f"  bulk replay, run {i + 1}: {bulk['messages'] / bulk['seconds']:,.0f} events/s "
                f"({bulk['seconds']:.1f} s; {len(views)} views compared: {differ or 'identical'})")

        floor = run_faust_floor(live_settings, work, total, timeout)
        log(f"  no-op Faust agent: {floor.per_second:,.0f} events/s")
        bare = _run_replay(bootstrap, work, "without-derivation", live_settings.topic_prefix, batch_size, total,
                           timeout, log, module="bench.without_derivation", views=False)
        log(f"  worker without derivation: {bare.rate.per_second:,.0f} events/s")

        middle, highest = median_and_highest(replays)
        return PipelineResult(
            events=total, topic_prefix=live_settings.topic_prefix, live=live_rate, live_progress=live_progress,
            replay=middle.rate,
            replay_progress=middle.progress, replay_stats=middle.stats,
            baseline_rates=[r.per_second for r in baseline_runs], baseline_runs=baseline_runs,
            publish_seconds=float(published["seconds"]), views_compared=compared, view_differences=differences,
            faust_floor=floor, without_derivation=bare.rate, without_derivation_cpu_per_event=bare.cpu_per_event,
            replay_busy=middle.busy,
            baseline_cpu_per_event=baseline_cpu_per_event, replay_cpu_per_event=middle.cpu_per_event,
            replay_runs=[r.rate for r in replays], replay_peaks=[r.progress.peak_rss for r in replays],
            memory_progress=highest.progress, bulk_runs=bulk_runs, bulk_differences=bulk_differences,
        )
    finally:
        live.stop()


R = TypeVar("R", bound="_Replay")


def median_and_highest(replays: list[R]) -> tuple[R, R]:
    """The replay with the median rate (the lower middle of an even count) and the one with the highest peak RSS."""
    middle = sorted(replays, key=lambda r: r.rate.per_second)[(len(replays) - 1) // 2]
    return middle, max(replays, key=lambda r: r.progress.peak_rss)


@dataclass
class _Replay:
    rate: Rate
    progress: Progress
    stats: dict[str, Any]
    cpu_per_event: float | None
    busy: float
    views: dict[str, list[tuple[Any, ...]]]


def _run_replay(bootstrap: str, work: Path, tag: str, topic_prefix: str, batch_size: int, total: int,
                timeout: float, log: Any, *, module: str = "rollout.cli", views: bool = True) -> _Replay:
    """A fresh worker (new data folder and consumer group) reads the whole log; its rate, memory and views
    (``views=False``: none read). ``module`` runs the worker (``stack.Worker``)."""
    settings = stack_settings(bootstrap, work / tag, tag, batch_size=batch_size, topic_prefix=topic_prefix)
    worker = Worker(settings, work / f"{tag}.log", module=module).start()
    try:
        mark = CpuMark.now()
        progress = worker.watch(total, timeout=timeout, on_sample=reporter(log, total))
        busy = busy_share(mark, CpuMark.now(), os.cpu_count() or 1)
        samples = [(t, n) for t, n, _ in progress.samples]
        return _Replay(sustained_rate(samples, total), progress, worker.stats(),
                       cpu_per_event(samples, progress.cpu, total), busy, snapshot_views(worker) if views else {})
    finally:
        worker.stop()


def reporter(log: Any, total: int, parts: int = 5) -> Any:
    """An ``on_sample`` callback that logs progress each time another 1/``parts`` of ``total`` is consumed."""
    step = max(total // parts, 1)
    state = {"next": step}

    def report(seconds: float, consumed: int) -> None:
        if consumed >= state["next"] and consumed < total:
            log(f"    {consumed:,} / {total:,} after {seconds:.0f}s")
            while state["next"] <= consumed:
                state["next"] += step

    return report
