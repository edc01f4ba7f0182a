"""Run the whole suite on a stack of its own, print the table and write the document."""

from __future__ import annotations

import json
import os
import pickle
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.config import BENCHMARKS, Sizes
from bench.document import build_rows, render_document
from bench.freshness import FreshnessResult, run_freshness
from bench.machine import (
    LOOP_ITERATIONS,
    CpuMark,
    Machine,
    QuietWait,
    describe_machine,
    other_share,
    python_loop_seconds,
    wait_until_quiet,
)
from bench.pipeline import PipelineResult, run_bulk_log, run_log_replay, run_pipeline
from bench.profile import (
    Profile,
    analyse,
    cpu_by_role,
    cpu_of_other_threads,
    parse_raw,
    py_spy,
    start_recording,
    task_cpu_seconds,
    thread_names,
)
from bench.publish import PublishResult, run_publish
from bench.report import HEADERS, MIB, table_cells, text_table
from bench.stack import Broker, Worker, create_topics, deliver_all, exit_on_sigterm, stack_settings
from bench.workload import EVENTS_PER_TRAJECTORY, encode_all, events_for

REPO = Path(__file__).resolve().parents[1]


@dataclass
class ProfileRun:
    """The profiling worker's recording and what it processed meanwhile."""

    profile: Profile
    rate_hz: int
    events: int
    batches: int
    spy_cpu_s: float
    gil: Profile | None = None
    gil_share: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)
    """CPU seconds each role's threads used during the first recording (``bench.profile.cpu_by_role``)."""
    cpu_wall_s: float = 0.0
    """Wall-clock seconds between the two readings of ``cpu``."""
    cpu_others: dict[str, float] = field(default_factory=dict)
    """CPU seconds of the ``other threads`` by name over the same span (``bench.profile.cpu_of_other_threads``)."""


@dataclass
class Results:
    """Everything one run measured; the document is rendered from this alone."""

    command: str
    quick: bool
    sizes: Sizes
    machine: Machine
    quiet: QuietWait | None
    started: datetime
    density_per_hour: float
    selected: tuple[str, ...]
    finished: datetime | None = None
    phase_seconds: dict[str, float] = field(default_factory=dict)
    phase_loads: dict[str, tuple[float, float]] = field(default_factory=dict)
    """1-minute load average at the start and at the end of each phase."""
    phase_other_cpu: dict[str, float] = field(default_factory=dict)
    """Share of the machine's CPU that processes outside this run used during each phase."""
    other_cpu: float | None = None
    """The same over the whole run."""
    publish: PublishResult | None = None
    pipeline: PipelineResult | None = None
    profile: ProfileRun | None = None
    freshness: FreshnessResult | None = None
    sustainable: FreshnessResult | None = None
    inprocess: dict[str, Any] | None = None
    errors: dict[str, str] = field(default_factory=dict)


def _say(text: str) -> None:
    print(text, flush=True)


@contextmanager
def _phase(results: Results, name: str) -> Iterator[None]:
    _say(f"\n== {name}")
    began = time.monotonic()
    load_before = os.getloadavg()[0]
    mark = CpuMark.now()
    try:
        yield
    except Exception as exc:  # one failed benchmark must not hide the others' numbers
        results.errors[name] = f"{type(exc).__name__}: {str(exc).strip()[:2000]}"
        _say(f"  FAILED: {results.errors[name]}")
        traceback.print_exc()
    finally:
        results.phase_seconds[name] = time.monotonic() - began
        results.phase_loads[name] = (load_before, os.getloadavg()[0])
        results.phase_other_cpu[name] = other_share(mark, CpuMark.now(), results.machine.cores)


def run_profile(bootstrap: str, work: Path, prefix: str, total: int, *, seconds: float, batch_size: int,
                rate_hz: int = 50, expected_rate: float | None = None) -> ProfileRun:
    """A fresh worker over the log's topics, sampled by py-spy for ``seconds`` once its first batch is stored.

    Both recordings are shortened to fit in the log (``recording_seconds``): a worker that runs out of
    events while sampled would show idle time that is not its own. The rate they are fitted to is
    ``expected_rate`` (the replay's, measured earlier in the run) or, without one (``--only profile``),
    the profiling worker's own over its first ``RATE_PROBE_SECONDS`` after its first batch.
    """
    if py_spy() is None:
        raise FileNotFoundError("py-spy is not installed (pip install -e '.[dev]')")
    settings = stack_settings(bootstrap, work / "profile", "profile", batch_size=batch_size, topic_prefix=prefix)
    worker = Worker(settings, work / "profile.log").start()
    try:
        deadline = time.monotonic() + 120
        while int(worker.stats()["consumed"]) == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        before = worker.stats()
        if not expected_rate:
            time.sleep(RATE_PROBE_SECONDS)
            probed, before = before, worker.stats()
            expected_rate = (int(before["consumed"]) - int(probed["consumed"])) / RATE_PROBE_SECONDS
            _say(f"  the worker's own rate before recording: {expected_rate:,.0f} events/s")
        seconds, gil_seconds = recording_seconds(seconds, total - int(before["consumed"]), expected_rate)
        out = work / "profile.txt"
        cpu_before = _children_cpu_seconds()
        threads_before, began = task_cpu_seconds(worker.pid), time.monotonic()
        _record(worker.pid, out, seconds=seconds, rate=rate_hz, gil=False)
        threads_after, cpu_wall = task_cpu_seconds(worker.pid), time.monotonic() - began
        spy_cpu = _children_cpu_seconds() - cpu_before  # only py-spy was reaped in between
        after = worker.stats()
        raw = out.read_text()
        profile = analyse(parse_raw(raw), seconds)
        events = int(after["consumed"]) - int(before["consumed"])
        names = thread_names(raw)
        run = ProfileRun(profile, rate_hz, events, int(after["batches"]) - int(before["batches"]), spy_cpu,
                         cpu=cpu_by_role(threads_before, threads_after, names), cpu_wall_s=cpu_wall,
                         cpu_others=cpu_of_other_threads(threads_before, threads_after, names))
        _say(f"  {seconds:.0f}s of every thread: {events:,} events in {run.batches} batches")
        gil_out = work / "profile-gil.txt"
        _record(worker.pid, gil_out, seconds=gil_seconds, rate=rate_hz, gil=True)
        if int(worker.stats()["consumed"]) >= total:
            _say("  note: the profiling worker reached the end of the log during the recordings")
        run.gil = analyse(parse_raw(gil_out.read_text()), gil_seconds)
        ticks_per_second = max(t.samples for t in profile.roles.values()) / seconds
        held = sum(t.samples for t in run.gil.roles.values())
        run.gil_share = held / (ticks_per_second * gil_seconds) if ticks_per_second else 0.0
        _say(f"  {gil_seconds:.0f}s of the GIL holder: held {100 * run.gil_share:.0f}% of the time")
        return run
    finally:
        worker.stop()


RATE_PROBE_SECONDS = 2.0
"""Without a rate from earlier in the run, the profile watches its worker this long before recording."""


def recording_seconds(seconds: float, remaining: int, rate: float | None) -> tuple[float, float]:
    """The profile's two recordings (every thread, then the interpreter lock's holder), in whole seconds
    as py-spy records them: at most ``seconds`` and half of it (at least 5 s), and fitted to the
    ``remaining`` events at ``rate``: the first in 55% of the time they need, the second in 30%, so that
    both end before the worker runs out of events (at least 3 and 2 s). Pure."""
    gil_seconds = max(5.0, seconds / 2)
    if rate and rate > 0:
        needed = remaining / rate
        seconds = max(3.0, min(seconds, 0.55 * needed))
        gil_seconds = max(2.0, min(gil_seconds, 0.30 * needed))
    return float(int(seconds)), float(int(gil_seconds))


def _record(pid: int, out: Path, *, seconds: float, rate: int, gil: bool) -> None:
    spy = start_recording(pid, out, seconds=seconds, rate=rate, gil=gil)
    _, stderr = spy.communicate(timeout=seconds + 60)
    if spy.returncode != 0 or not out.exists():
        raise RuntimeError(f"py-spy failed ({spy.returncode}): {stderr.decode()[-1000:]}")


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _inprocess(work: Path, sizes: Sizes) -> dict[str, Any]:
    out = work / "inprocess.json"
    command = [
        sys.executable, "-m", "bench.inprocess", "--data-dir", str(work / "inprocess"), "--out", str(out),
        "--month-events", str(sizes.month_events), "--days", str(sizes.month_days),
        "--seed-hours", str(sizes.seed_hours), "--batch-size", str(sizes.batch_size),
        "--query-budget", str(sizes.query_budget), "--max-repeats", str(sizes.query_max_repeats),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=None, timeout=3600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"bench.inprocess exited with {done.returncode}")
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def run_suite(*, command: str, quick: bool, sizes: Sizes, out: Path | None, selected: tuple[str, ...],
              wait_quiet: bool, max_load: float, quiet_timeout: float, work_dir: Path | None, keep: bool,
              log: Callable[[str], None] = _say) -> Results:
    """Everything: quiet wait, broker, benchmarks in order, the table on stdout, the document in ``out``."""
    unknown = sorted(set(selected) - set(BENCHMARKS))
    if unknown:
        raise ValueError(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    quiet = None
    if wait_quiet:
        quiet = wait_until_quiet(max_load=max_load, timeout=quiet_timeout, log=log)
        log(f"load average {quiet.loads[-1]:.2f}: {'quiet' if quiet.quiet else 'still busy, measuring anyway'}"
            f" after {quiet.waited_s:.0f}s")
    density = sizes.month_events / (sizes.month_days * 24)
    loop_at_start = python_loop_seconds()
    results = Results(command=command, quick=quick, sizes=sizes, machine=describe_machine(), quiet=quiet,
                      started=datetime.now(UTC), density_per_hour=density, selected=selected)
    run_mark = CpuMark.now()
    load = results.machine.load_at_start
    log(f"{results.machine.cores} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, a "
        f"{LOOP_ITERATIONS:,}-iteration Python loop in {loop_at_start:.2f} s")
    base = work_dir or REPO / ".data" / "bench"
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=results.started.strftime("%Y%m%d-%H%M%S-"), dir=base))
    log(f"work folder {work}")
    trajectories_per_hour = density / EVENTS_PER_TRAJECTORY
    broker: Broker | None = None
    exit_on_sigterm()
    try:
        needs_kafka = any(b in selected for b in ("sdk", "worker", "profile", "freshness"))
        log_prefix = ""
        events: list[Any] = []
        if needs_kafka:
            with _phase(results, "broker"):
                broker = Broker(work).up()
                results.machine.packages["Kafka broker"] = broker.kafka.version
                log(f"  Kafka {broker.kafka.version} on {broker.bootstrap}")
            count = max(sizes.log_events, sizes.sdk_events if "sdk" in selected else 0)
            with _phase(results, "generate events"):
                events = events_for(count, run_id="bench", trajectories_per_hour=trajectories_per_hour)
                log(f"  {len(events):,} events of the bench scenario")
        if broker is not None and "sdk" in selected:
            with _phase(results, "SDK publish"):
                settings = stack_settings(broker.bootstrap, work / "sdk", "sdk", batch_size=sizes.batch_size)
                create_topics(settings)
                sdk_events = events[: sizes.sdk_events]
                results.publish = run_publish(settings, sdk_events, encode_all(sdk_events, settings.topic_prefix),
                                              repeats=sizes.sdk_repeats, log=log)
        if broker is not None and "worker" in selected:
            with _phase(results, "worker and replay"):
                results.pipeline = run_pipeline(broker.bootstrap, work, events[: sizes.log_events],
                                                batch_size=sizes.batch_size, baseline_repeats=sizes.baseline_repeats,
                                                baseline_batch_size=sizes.baseline_batch_size,
                                                timeout=max(600.0, sizes.log_events / 50), log=log)
                log_prefix = results.pipeline.topic_prefix
            if sizes.replay_events > 0 and results.pipeline is not None:
                with _phase(results, f"bulk replay of {sizes.replay_events:,} events"):
                    replay_log = events_for(sizes.replay_events, run_id="replay",
                                            trajectories_per_hour=trajectories_per_hour)
                    results.pipeline.bulk_log_warm_up, results.pipeline.bulk_log_runs = run_bulk_log(
                        broker.bootstrap, work, replay_log, repeats=sizes.replay_repeats,
                        timeout=max(600.0, sizes.replay_events / 1000), log=log)
                    del replay_log
            if results.pipeline is not None and results.pipeline.bulk_log_runs:  # that log is there
                with _phase(results, f"memory: a worker replaying the {sizes.replay_events:,} events"):
                    memory = results.pipeline.memory_log = run_log_replay(
                        broker.bootstrap, work, sizes.replay_events, batch_size=sizes.batch_size,
                        timeout=max(600.0, sizes.replay_events / 1000), log=log)
                    log(f"  worker over the bulk replay's log: {memory.rate.per_second:,.0f} events/s, "
                        f"peak RSS {memory.progress.peak_rss / MIB:,.0f} MiB")
        if broker is not None and "profile" in selected:
            with _phase(results, "profile"):
                prefix = log_prefix or _publish_log(broker.bootstrap, work, events[: sizes.log_events], sizes)
                results.profile = run_profile(
                    broker.bootstrap, work, prefix, sizes.log_events, seconds=sizes.profile_seconds,
                    batch_size=sizes.batch_size,
                    expected_rate=results.pipeline.replay.per_second if results.pipeline is not None else None)
        if broker is not None and "freshness" in selected:
            with _phase(results, "freshness"):
                results.freshness = _freshness(broker.bootstrap, work, sizes, sizes.freshness_rate, "fresh",
                                               trajectories_per_hour)
            if sizes.freshness_sustainable and results.pipeline is not None:
                rate = round(results.pipeline.replay.per_second / 2, -1)
                with _phase(results, f"freshness at {rate:,.0f} events/s"):
                    results.sustainable = _freshness(broker.bootstrap, work, sizes, rate, "fresh-half",
                                                     trajectories_per_hour)
        if "dashboards" in selected:
            with _phase(results, "dashboards (in-process seed, month of data, queries)"):
                results.inprocess = _inprocess(work, sizes)
    finally:
        if broker is not None:
            broker.down()
        results.other_cpu = other_share(run_mark, CpuMark.now(), results.machine.cores)
        results.machine.loop_seconds = (loop_at_start, python_loop_seconds())
        results.finished = datetime.now(UTC)
    try:
        rows = build_rows(results)
        log("\n" + text_table(HEADERS, table_cells(rows)))
        if out is not None:
            out.write_text(render_document(results))
            log(f"\nwrote {out}")
    except Exception:
        saved = work / "results.pickle"
        saved.write_bytes(pickle.dumps(results))
        log(f"rendering failed; the measurements are kept in {saved}")
        raise
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    return results


def _publish_log(bootstrap: str, work: Path, events: list[Any], sizes: Sizes) -> str:
    """Publish the log for the profile when the worker benchmark did not run (``--only profile``)."""
    from producers.kafka import EventProducer

    settings = stack_settings(bootstrap, work / "log", "log", batch_size=sizes.batch_size)
    create_topics(settings)
    with EventProducer.from_settings(settings) as producer:
        for event in events:
            producer.send(event)
        deliver_all(producer)
    return settings.topic_prefix


def _freshness(bootstrap: str, work: Path, sizes: Sizes, rate: float, tag: str,
               trajectories_per_hour: float) -> FreshnessResult:
    count = int(rate * sizes.freshness_seconds)
    events = events_for(count, run_id=tag, trajectories_per_hour=trajectories_per_hour, faults=False)
    warmup = events_for(200, run_id=f"{tag}-warmup", trajectories_per_hour=trajectories_per_hour, faults=False)
    return run_freshness(bootstrap, work, events, warmup, rate=rate, seconds=sizes.freshness_seconds,
                         warmup_s=sizes.freshness_warmup, drain_s=sizes.freshness_drain, poll_interval=0.2,
                         batch_size=sizes.batch_size, tag=tag, log=_say)
