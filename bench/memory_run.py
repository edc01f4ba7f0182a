"""``python -m bench.memory_run``: the memory benchmark at full size, outside the 15-minute suite.

The suite measures the replay worker's RSS over its (scaled-down) log. This run publishes the
bench scenario's events to a broker of its own, streaming them from the simulator (10,000,000
events never sit in memory at once), then starts a fresh worker that reads the whole log and
samples its RSS every second until it has consumed every message. It writes the peak, the
flatness verdict the suite uses (``bench.measure.memory_flatness``) and RSS by progress to a
markdown file (default ``docs/memory-run.md``).

At ~15,000 events/s on two cores, 10,000,000 events take ~4 min to publish and ~12 min to read.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.cli import at_least, log
from bench.config import DEFAULT_BATCH_SIZE, DEFAULT_PAGE_OUT_S, SPEC_DENSITY_PER_HOUR, SPEC_MEMORY_EVENTS
from bench.machine import Machine, describe_machine, engine_library
from bench.measure import cpu_per_event, memory_flatness, sustained_rate
from bench.pipeline import reporter
from bench.report import GIB, MIB
from bench.stack import (
    Broker,
    Progress,
    Worker,
    create_topics,
    deliver_all,
    exit_on_sigterm,
    proc_status_bytes,
    stack_settings,
)
from bench.workload import EVENTS_PER_TRAJECTORY, scenario_for
from producers.kafka import EventProducer
from producers.simulator import generate

ENGINE_SQL = (
    "SELECT (SELECT value FROM system.metrics WHERE metric = 'MemoryTracking'), "
    "(SELECT count() FROM system.merges), (SELECT sum(memory_usage) FROM system.merges), "
    "(SELECT arrayStringConcat(groupArray(concat(table, ' (', toString(num_parts), ' parts, ', "
    "formatReadableSize(total_size_bytes_compressed), ')')), ', ') FROM system.merges)"
)
"""The engine's own account of its memory (what its allocations track: queries, inserts, merges) and
the merges running, read through the worker's /sql endpoint."""


@dataclass
class EngineSample:
    """One probe of the worker: seconds since the probe started, anonymous RSS, what the engine tracks."""

    seconds: float
    anon_rss: int
    tracked: int
    merges: int
    merging: str
    merge_memory: int = 0
    """What the running merges report using themselves (``system.merges.memory_usage``)."""
    held: int = 0
    """Messages the worker's event-time merge held back (``/stats`` ``held``)."""


class EngineProbe(threading.Thread):
    """Samples the worker's anonymous RSS and the engine's tracked memory and merges about once a second.

    The query waits for the owner thread between batches, so samples come as often as batches allow.
    """

    def __init__(self, worker: Worker, interval: float = 1.0) -> None:
        super().__init__(daemon=True, name="engine-probe")
        self.worker = worker
        self.interval = interval
        self.samples: list[EngineSample] = []
        self.halt = threading.Event()

    def run(self) -> None:
        began = time.monotonic()
        while not self.halt.is_set():
            try:
                tracked, merges, merge_memory, merging = self.worker.query(ENGINE_SQL).rows[0]
                held = int(self.worker.stats().get("held", 0))
                (anon,) = proc_status_bytes(self.worker.pid, "RssAnon")
                self.samples.append(EngineSample(time.monotonic() - began, anon, int(tracked),
                                                 int(merges), str(merging), int(merge_memory or 0), held))
            except Exception:  # a sample missed is a sample missed; the RSS samples are the measurement
                pass
            self.halt.wait(self.interval)


def engine_text(samples: list[EngineSample]) -> str:
    """What the engine's share of the memory was: typical and peak tracked memory, what merged at the peak."""
    if not samples:
        return "The engine's tracked memory was not sampled."
    tracked = sorted(s.tracked for s in samples)
    anon = sorted(s.anon_rss for s in samples)
    top = max(samples, key=lambda s: s.tracked)
    held = sorted(s.held for s in samples)
    busy = [s for s in samples if s.merges]
    merging = (f" while merging {top.merging}; the merges' own count {top.merge_memory / MIB:,.0f} MiB"
               if top.merges else " (no merge running)")
    return (
        f"The engine's own account ({len(samples):,} probes of `system.metrics` `MemoryTracking` through `/sql`, "
        f"about one per second between batches): median {tracked[len(tracked) // 2] / MIB:,.0f} MiB, peak "
        f"{top.tracked / MIB:,.0f} MiB{merging} (anonymous RSS then {top.anon_rss / MIB:,.0f} MiB). Merges were "
        f"running in {len(busy):,} of the probes. Anonymous RSS (`RssAnon`: everything but file pages): median "
        f"{anon[len(anon) // 2] / MIB:,.0f} MiB, largest sampled {anon[-1] / MIB:,.0f} MiB; what the engine does "
        f"not track is the Python side (caches, the event-time merge's held messages, batches in flight, the "
        f"allocator's free lists) and the Kafka clients. The event-time merge held a median of "
        f"{held[len(held) // 2]:,} messages (largest sampled {held[-1]:,})."
    )


def publish(settings: Any, events: int, log: Any) -> tuple[int, float]:
    """Publish the first ``events`` messages of the sized bench scenario; how many, and the hours they span."""
    scenario = scenario_for(events, run_id="memory",
                            trajectories_per_hour=SPEC_DENSITY_PER_HOUR / EVENTS_PER_TRAJECTORY)
    step = max(events // 10, 1)
    began = time.monotonic()
    sent = 0
    first = last = scenario.start
    with EventProducer.from_settings(settings) as producer:
        for event in generate(scenario):
            if sent >= events:
                break
            producer.send(event)
            first, last = min(first, event.occurred_at), max(last, event.occurred_at)
            sent += 1
            if sent % 1000 == 0:
                producer.poll(0)
            if sent % step == 0:
                log(f"  published {sent:,} / {events:,} ({sent / (time.monotonic() - began):,.0f} events/s)")
        deliver_all(producer)
    return sent, (last - first).total_seconds() / 3600


def render(*, command: str, events: int, hours: float, progress: Progress, stats: dict[str, Any],
           publish_s: float, started: datetime, engine: list[EngineSample] | None = None,
           machine: Machine | None = None, batch_size: int = DEFAULT_BATCH_SIZE,
           page_out_s: float = DEFAULT_PAGE_OUT_S) -> str:
    """The markdown report of one run; ``machine`` as described when it started (default: now)."""
    machine = machine or describe_machine()
    samples = progress.samples
    flat = memory_flatness([(n, r) for _, n, r in samples])
    rate = sustained_rate([(t, n) for t, n, _ in samples], events)
    cpu = cpu_per_event([(t, n) for t, n, _ in samples], progress.cpu, events)
    cpu_text = (f" using {cpu * 1e6:,.1f} us of CPU per event (all its threads, the engine's included)"
                if cpu is not None else "")
    met = progress.peak_rss <= GIB and flat.flat
    picks = [samples[round(i * (len(samples) - 1) / 19)] for i in range(20)] if len(samples) > 20 else samples
    rows = "\n".join(f"| {t:,.0f} | {n:,} | {r / MIB:,.0f} |" for t, n, r in picks)
    span = f"{hours / 24:,.1f} days" if hours >= 48 else f"{hours:,.1f} h"
    size = (f"at the size the target names ({SPEC_MEMORY_EVENTS:,} events)" if events >= SPEC_MEMORY_EVENTS
            else f"over {events:,} events, scaled down from the target's {SPEC_MEMORY_EVENTS:,}")
    commit = machine.commit + (" with uncommitted changes" if machine.uncommitted else "")
    peak_row = (f"| worker peak RSS over {events:,} events | {progress.peak_rss / MIB:,.0f} MiB | <= 1 GiB | "
                f"{'yes' if progress.peak_rss <= GIB else 'no'} |")
    flat_row = (f"| flat after warm-up | {flat.warm_rss / MIB:,.0f} MiB (second quarter) -> "
                f"{flat.end_rss / MIB:,.0f} MiB (last quarter), {flat.growth_bytes / MIB:+,.0f} MiB; slope "
                f"{flat.growth_per_million_events / MIB:+,.1f} MiB per 1M events | growth <= 10% | "
                f"{'yes' if flat.flat else 'no'} |")
    totals = ", ".join(f"{k} {v:,}" for k, v in stats.items() if isinstance(v, int))
    read_back = ", ".join(f"{k} {v:,}" for k, v in sorted(stats.get("read_back", {}).items()) if v) or "none"
    library = engine_library()
    changed: list[str] = []
    if batch_size != DEFAULT_BATCH_SIZE:
        changed.append(f"batches of {batch_size:,} events (`ROLLOUT_SINK_BATCH_SIZE`)")
    if page_out_s == 0:
        changed.append("the engine library never paged out (`ROLLOUT_ENGINE_PAGE_OUT_SECONDS=0`)")
    elif page_out_s != DEFAULT_PAGE_OUT_S:
        changed.append(f"the engine library paged out every {page_out_s:g} s (`ROLLOUT_ENGINE_PAGE_OUT_SECONDS`)")
    setup = ("default settings, direct ingestion among them, as in the suite" if not changed
             else f"default settings but {' and '.join(changed)}, direct ingestion among them")
    return f"""# Worker memory over a long replay

Written by `{command}` on {started:%Y-%m-%d %H:%M} UTC at commit {commit}: {machine.cores} cores
({machine.cpu}), {machine.memory_bytes / GIB:.1f} GiB, Python {machine.python}. The suite
(`python -m bench`, [performance.md](performance.md)) measures memory over its smaller log; this run
is the memory benchmark {size}.

| what | value | target | met? |
| --- | --- | --- | --- |
{peak_row}
{flat_row}

Memory target {"met" if met else "NOT met"}. The worker ({setup}; a fresh data folder
and consumer group) read a log published before it started: {events:,}
messages of the bench scenario ({span} of event time at the suite's density, with its
duplicate and late deliveries), published in {publish_s:,.0f} s. It read them at {rate.per_second:,.0f} events/s
(sustained rate, first 10% excluded){cpu_text}. RSS is the process's `VmRSS` sampled every second, the peak its
`VmHWM`; the process holds the embedded ClickHouse engine, so the engine's caches and merges count.
Up to {progress.peak_file_rss / MIB:,.0f} MiB of RSS were file-backed pages (`RssFile`: mostly the engine's
{library}, mapped from disk; the kernel can drop and re-read them), the rest the process's own memory.
{engine_text(engine or [])}

Worker totals at the end (`/stats`): {totals}; rows read back from ClickHouse because the owner's
caches did not hold them: {read_back}.

| seconds | events consumed | RSS MiB |
| --- | --- | --- |
{rows}
"""


def main(argv: list[str] | None = None) -> int:
    """Run it; 0 when it completed (whatever the verdict), 1 on failure, 2 on bad arguments."""
    parser = argparse.ArgumentParser(prog="python -m bench.memory_run", description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=at_least(1000), default=SPEC_MEMORY_EVENTS,
                        help="messages to publish and read")
    parser.add_argument("--out", default="docs/memory-run.md", help="where to write the report ('-' for nowhere)")
    parser.add_argument("--work-dir", type=Path, default=Path(".data/bench-memory"),
                        help="broker and worker data (removed afterwards unless --keep)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--timeout", type=float, default=7200.0, help="longest wait for the worker (s)")
    parser.add_argument("--batch-size", type=at_least(1), default=DEFAULT_BATCH_SIZE,
                        help="the worker's batch size, ROLLOUT_SINK_BATCH_SIZE "
                             f"(default: its own, {DEFAULT_BATCH_SIZE:,})")
    args = parser.parse_args(argv)
    command = " ".join(["python -m bench.memory_run", *map(shlex.quote, argv if argv is not None else sys.argv[1:])])
    started = datetime.now(UTC)
    machine = describe_machine()  # the commit the worker runs: the tree may change during a long run
    work: Path = args.work_dir.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    exit_on_sigterm()
    broker = Broker(work)
    worker: Worker | None = None
    try:
        broker.up()
        log(f"Kafka {broker.kafka.version} on {broker.bootstrap}; publishing {args.events:,} events")
        settings = stack_settings(broker.bootstrap, work / "worker", "memory", batch_size=args.batch_size,
                                  partitions=4, ingest="direct")
        create_topics(settings)
        began = time.monotonic()
        sent, hours = publish(settings, args.events, log)
        publish_s = time.monotonic() - began
        log(f"published {sent:,} in {publish_s:.0f}s; starting the worker")
        worker = Worker(settings, work / "worker.log").start()
        probe = EngineProbe(worker)
        probe.start()
        try:
            progress = worker.watch(sent, timeout=args.timeout, interval=1.0, on_sample=reporter(log, sent, parts=20))
        finally:
            probe.halt.set()
            probe.join(timeout=330)
        stats = worker.stats()
        text = render(command=command, events=sent, hours=hours, progress=progress, stats=stats,
                      publish_s=publish_s, started=started, engine=probe.samples, machine=machine,
                      batch_size=args.batch_size, page_out_s=settings.engine_page_out_seconds)
        print(text)
        if args.out != "-":
            Path(args.out).write_text(text)
            log(f"wrote {args.out}")
        return 0
    except Exception as exc:  # one line for the person who ran it; the worker's log says more
        log(f"memory run failed: {str(exc).splitlines()[0] if str(exc) else exc!r}")
        if worker is not None:
            log(worker.tail())
        return 1
    finally:
        if worker is not None:
            worker.stop()
        broker.down()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
