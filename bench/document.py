"""The results table's rows and ``docs/performance.md``, both from a run's ``Results`` alone."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bench.config import SPEC_MEMORY_EVENTS, SPEC_MONTH_DAYS, SPEC_MONTH_EVENTS, SPEC_REPLAY_EVENTS, Sizes
from bench.machine import LOOP_ITERATIONS, engine_library
from bench.measure import halves, median_of, memory_flatness
from bench.profile import NATIVE
from bench.publish import sdk_goes_first
from bench.report import GIB, HEADERS, MIB, Row, Target, format_value, markdown_table, table_cells
from bench.workload import EVENTS_PER_TRAJECTORY, scenario_for
from streams.state import CacheLimits

if TYPE_CHECKING:
    from bench.runner import Results
    from rollout.settings import Settings

IDENTICAL = "identical to live"
FLAT = "flat after warm-up"
QUERY_TARGET_MS = 100.0


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _failed(results: Results, phase_prefix: str) -> str:
    for name, error in results.errors.items():
        if name.startswith(phase_prefix):
            return f"failed: {error.splitlines()[0][:160]}"
    return "not run"


def _panel_queries(results: Results, range_prefix: str) -> list[dict[str, Any]]:
    if results.inprocess is None:
        return []
    return [q for q in results.inprocess["queries"] if q["kind"] == "panel" and q["range"].startswith(range_prefix)]


def _worst(queries: list[dict[str, Any]]) -> dict[str, Any] | None:
    measured = [q for q in queries if q["p95_ms"] is not None]
    failed = [q for q in queries if q["error"]]
    if failed:
        return {**failed[0], "p95_ms": math.inf}
    return max(measured, key=lambda q: q["p95_ms"]) if measured else None


def _batch_note(sizes: Sizes) -> str:
    """What the worker row says when the workers and the plain loop were not given the same batch size."""
    if sizes.batch_size == sizes.baseline_batch_size:
        return ""
    return f"; batches of {sizes.batch_size:,} (worker) and {sizes.baseline_batch_size:,} (plain loop)"


def build_rows(results: Results) -> list[Row]:
    """The table: one row per target of the brief, in its order."""
    rows: list[Row] = []
    publish = results.publish
    if publish is not None:
        rows.append(Row("SDK publish", "events/s", publish.sdk, publish.raw, "raw confluent-kafka",
                        (Target("ratio_at_least", 0.5),), paired_ratio=publish.ratio,
                        note=f"{publish.events:,} pre-built events, {len(publish.sdk_rates)} alternated pairs of runs"
                        + ("" if publish.sdk_to_loop is None
                           else f"; the SDK at {publish.sdk_to_loop:.2f}x of a bare encode-and-produce loop")))
    else:
        rows.append(Row("SDK publish", "events/s", None, targets=(Target("ratio_at_least", 0.5),),
                        note=_failed(results, "SDK")))

    pipeline = results.pipeline
    worker_targets = (Target("ratio_at_least", 0.3), Target("at_least", 20_000))
    replay_targets = (Target("at_least", 50_000), Target("holds", check=IDENTICAL))
    memory_targets = (Target("at_most", GIB), Target("holds", check=FLAT))
    if pipeline is not None:
        rate = pipeline.replay.per_second
        rows.append(Row(
            "worker", "events/s", rate, pipeline.baseline, "plain consumer loop", worker_targets,
            paired_ratio=pipeline.ratio,
            note=f"{pipeline.events:,} events published first, then a fresh worker; first 10% excluded as warm-up"
                 + _batch_note(results.sizes),
        ))
    else:
        rows.append(Row("worker", "events/s", None, targets=worker_targets, note=_failed(results, "worker")))

    for label, q, limit in (("freshness p50", 50, 1.0), ("freshness p99", 99, 3.0)):
        fresh = results.freshness
        if fresh is not None and fresh.latencies:
            note = (f"at {fresh.achieved_rate:,.0f} events/s for {fresh.seconds:.0f} s; the worker stored "
                    f"{fresh.worker_rate:,.0f} events/s meanwhile")
            if fresh.never_visible:
                note += (f"; {fresh.never_visible:,} of {fresh.measured:,} finishes not visible "
                         f"{fresh.drain_limit_s:.0f} s after publishing stopped")
            rows.append(Row(label, "s", fresh.p(q), targets=(Target("at_most", limit),), note=note))
        else:
            rows.append(Row(label, "s", None, targets=(Target("at_most", limit),), note=_failed(results, "freshness")))

    if pipeline is not None:
        bulk = pipeline.bulk
        rate = bulk.per_second if bulk is not None else pipeline.replay.per_second
        spec_time = SPEC_REPLAY_EVENTS / rate if rate > 0 else math.inf
        timed_on = bulk.events if bulk is not None else pipeline.events
        if pipeline.bulk_log_runs:
            warm = ", after a warm-up run" if pipeline.bulk_log_warm_up is not None else ""
            note = (f"bulk replay (`rollout replay`, median of {len(pipeline.bulk_log_runs)} runs{warm}) of a "
                    f"{timed_on:,}-message log; identical to live checked on the {pipeline.events:,}-event log "
                    f"({len(pipeline.views_compared)} views of the bulk and the worker replays against the live "
                    f"worker's); the replaying worker {pipeline.replay.per_second:,.0f} events/s")
        else:
            how = (f"bulk replay (`rollout replay`, median of {len(pipeline.bulk_runs)} runs; the replaying worker "
                   f"{pipeline.replay.per_second:,.0f} events/s)" if bulk is not None else "replaying worker")
            note = (f"{how} on a {pipeline.events:,}-event log (scaled down from {SPEC_REPLAY_EVENTS:,}: "
                    f"that would take ~{_duration(spec_time)} at this rate); {len(pipeline.views_compared)} views "
                    "compared with the live worker's")
        if pipeline.view_differences or pipeline.bulk_differences:
            note += "; differing: " + ", ".join(sorted({**pipeline.view_differences, **pipeline.bulk_differences}))
        rows.append(Row("replay", "events/s", rate, pipeline.live.per_second, "live worker", replay_targets,
                        checks={IDENTICAL: pipeline.identical}, note=note,
                        scaled=timed_on < SPEC_REPLAY_EVENTS))
    else:
        rows.append(Row("replay", "events/s", None, targets=replay_targets, note=_failed(results, "worker")))

    month = results.inprocess["month"] if results.inprocess else None
    for range_prefix, label in (("last", "dashboard queries, last 6 h"), ("all", "dashboard queries, whole month")):
        queries = _panel_queries(results, range_prefix)
        worst = _worst(queries)
        if worst is None or month is None:
            rows.append(Row(label, "ms", None, targets=(Target("at_most", QUERY_TARGET_MS),),
                            note=_failed(results, "dashboards")))
            continue
        within = sum(1 for q in queries if q["p95_ms"] is not None and q["p95_ms"] <= QUERY_TARGET_MS)
        rows.append(Row(
            label, "ms", worst["p95_ms"], targets=(Target("at_most", QUERY_TARGET_MS),),
            note=(f"worst p95 of {len(queries)} panel queries ({worst['board']} / {worst['title']}); {within} of "
                  f"{len(queries)} within 100 ms; {month['events_equivalent']:,} events' worth of metric rows over "
                  f"{_days(month):.0f} days, loaded directly (see below)"),
        ))

    memory = pipeline.memory if pipeline is not None else None
    memory_failed = _failed(results, "memory")
    if memory_failed != "not run":
        rows.append(Row("memory (worker peak RSS)", "bytes", None, targets=memory_targets, note=memory_failed))
    elif pipeline is not None and memory is not None and memory.samples:
        flat = memory_flatness([(n, r) for _, n, r in memory.samples])
        rate = pipeline.memory_rate.per_second
        spec_time = SPEC_MEMORY_EVENTS / rate if rate > 0 else math.inf
        which = ("a fresh worker replaying the bulk replay's log" if pipeline.memory_log is not None
                 else "replay worker")
        rows.append(Row(
            "memory (worker peak RSS)", "bytes", float(memory.peak_rss), targets=memory_targets,
            checks={FLAT: flat.flat}, scaled=pipeline.memory_events < SPEC_MEMORY_EVENTS,
            note=(f"{which} over {pipeline.memory_events:,} events (scaled down from {SPEC_MEMORY_EVENTS:,}: that "
                  f"would take ~{_duration(spec_time)} at this rate); RSS {flat.growth_bytes / MIB:+,.0f} MiB "
                  f"({100 * flat.growth_bytes / max(flat.warm_rss, 1):+.0f}%) from the second to the last quarter; "
                  f"fitted slope {flat.growth_per_million_events / MIB:+,.0f} MiB per 1M events (see Memory)"),
        ))
    else:
        rows.append(Row("memory (worker peak RSS)", "bytes", None, targets=memory_targets,
                        note=_failed(results, "worker")))
    return rows


def _days(month: dict[str, Any]) -> float:
    from datetime import datetime

    start = datetime.fromisoformat(month["start"])
    end = datetime.fromisoformat(month["end"])
    return (end - start).total_seconds() / 86400


# -- the document --------------------------------------------------------------------------------


def render_document(results: Results) -> str:
    """``docs/performance.md`` for one run."""
    parts = [_header(results), _results_section(results), _how(results), _scaled(results), _details(results),
             _where(results), _changes(results)]
    return "\n\n".join(p.strip() for p in parts if p.strip()) + "\n"


def _header(results: Results) -> str:
    lines = [
        "# Performance",
        "",
        "Written by `rollout bench` (the `bench/` package) from one run on the machine described below; "
        "regenerate it with the command shown there rather than editing it. Every value is measured side "
        "by side with its baseline in the same run, on the native stack (a Kafka broker of the bench's own "
        "on free ports, `rollout worker` subprocesses with their own data folders).",
    ]
    if results.quick:
        lines += ["", "**Quick mode: development sizes, not a reference measurement.**"]
    if results.selected != ("sdk", "worker", "profile", "freshness", "dashboards"):
        lines += ["", f"**Only some benchmarks ran: {', '.join(results.selected)}.**"]
    return "\n".join(lines)


def _results_section(results: Results) -> str:
    rows = build_rows(results)
    met = sum(1 for r in rows if r.met is True and not r.scaled)
    scaled = sum(1 for r in rows if r.met is True and r.scaled)
    missed = [r.name for r in rows if r.met is False]
    summary = f"{met} of {len(rows)} rows meet their target"
    summary += f", {scaled} more only at a scaled-down size." if scaled else "."
    if missed:
        summary += " Not met: " + ", ".join(missed) + "."
    return "\n".join([
        "## Results", "", markdown_table(HEADERS, table_cells(rows)), "",
        "*value* and *baseline* are medians of repeats; *ratio* is value / baseline, except where the two sides "
        "ran in alternated pairs (SDK publish, worker): there it is the median of the pairs' ratios, as each pair "
        "saw the machine at nearly the same moment (the two medians may come from different pairs of a host whose "
        "speed drifts); *met?* checks every condition of the target column; *yes\\** means met "
        "at the scaled-down size the notes give, which does not show the full size would meet it. " + summary,
    ])


def _how(results: Results) -> str:
    m = results.machine
    load = m.load_at_start
    elapsed = (results.finished - results.started).total_seconds() if results.finished else 0.0
    sizes = results.sizes
    lines = [
        "## How it was measured",
        "",
        f"- **Command:** `{results.command}` (from the repository root; `python -m bench` takes the same options).",
        f"- **When:** {results.started:%Y-%m-%d %H:%M} UTC, {_duration(elapsed)} in all; commit `{m.commit or '?'}`"
        + (" with uncommitted changes in the working tree" if m.uncommitted else "") + ".",
        f"- **Machine:** {m.cores} cores ({m.cpu}), {m.memory_bytes / GIB:.1f} GiB memory, Linux {m.kernel}, "
        f"Python {m.python}.",
        f"- **Load average at start:** {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1 / 5 / 15 min)"
        + _quiet_text(results) + ".",
        *_speed_lines(m),
        "- **Versions:** " + ", ".join(f"{k} {v}" for k, v in m.packages.items()) + " (the project's native "
        "single-node KRaft broker with its own settings).",
        f"- **Workload:** the demo scenario's run shape (`scenarios/default.yaml`: four domains with their "
        f"failure, verdict, snapshot and interruption rates, six policy versions, a trainer, 0.5% duplicate and "
        f"0.5% late deliveries) at {results.density_per_hour / EVENTS_PER_TRAJECTORY:,.0f} trajectories "
        f"({results.density_per_hour:,.0f} events) per hour of event time, the density of "
        f"{sizes.month_events:,} events in {sizes.month_days:g} days; about {EVENTS_PER_TRAJECTORY} events per "
        "trajectory. The freshness runs leave out the duplicate and late deliveries.",
        f"- **Worker settings:** defaults (batches of {sizes.batch_size:,} events or {_batch_seconds():g} s, "
        "with direct ingestion sooner once the previous batch is stored and it is "
        f"{_defaults().sink_batch_min_seconds:g} s old; "
        "4 partitions per "
        "topic, 60 s windows), embedded ClickHouse (chdb). "
        "**Ingestion:** the live worker reads the raw topics with the Faust agent (`ROLLOUT_INGEST=faust`, the "
        f"alternative); the replay, freshness and profile workers with `ROLLOUT_INGEST={_ingest()}`"
        + (" (the default: a confluent-kafka consumer below Faust's stream, `streams/direct.py`)"
           if _ingest() == "direct" else "")
        + ". The worker and replay rows are the replay worker's, the memory row a worker's that replayed the "
        "bulk replay's longer log; the replay row's baseline is the live "
        "worker, so it compares the two ways of reading the same log, views included.",
    ]
    if results.other_cpu is not None:
        lines.append(f"- **Other work on the machine during the run:** processes outside the bench used "
                     f"{100 * results.other_cpu:.0f}% of the machine's CPU capacity (user, system and steal time from "
                     "`/proc/stat` minus the CPU time of the bench and every process it started), phase by phase "
                     "below.")
    if results.phase_seconds:
        loads = results.phase_loads
        other = results.phase_other_cpu
        lines += ["", "Time per phase, the 1-minute load average as it started and ended (the bench's own "
                  "processes count towards it), and the share of the machine's CPU used by processes outside "
                  "the bench during the phase (any other work on this machine):", "",
                  markdown_table(("phase", "seconds", "load at start", "load at end", "CPU used by others"),
                                 [[k, f"{v:.0f}", f"{loads[k][0]:.2f}" if k in loads else "-",
                                   f"{loads[k][1]:.2f}" if k in loads else "-",
                                   f"{100 * other[k]:.0f}%" if k in other else "-"]
                                  for k, v in results.phase_seconds.items()])]
    if results.errors:
        lines += ["", "Failures:", ""] + [f"- {k}: `{v.splitlines()[0][:300]}`" for k, v in results.errors.items()]
    return "\n".join(lines)


def _quiet_text(results: Results) -> str:
    quiet = results.quiet
    if quiet is None:
        return "; the run did not wait for a quiet machine"
    if quiet.quiet and quiet.waited_s == 0:
        return f"; below {1.5:g} at the first check"
    if quiet.quiet:
        return f"; reached after waiting {quiet.waited_s:.0f} s (loads seen: " + \
            ", ".join(f"{v:.2f}" for v in quiet.loads) + ")"
    return (f"; the machine did not get below the threshold within {quiet.waited_s:.0f} s (loads seen: "
            + ", ".join(f"{v:.2f}" for v in quiet.loads) + "), so the run measured anyway")


def _scaled(results: Results) -> str:
    lines = ["## What was scaled down, and why", ""]
    pipeline = results.pipeline
    if pipeline is not None:
        rate = pipeline.replay.per_second
        early, late = halves([(t, n) for t, n, _ in pipeline.replay_progress.samples], pipeline.events)
        both = SPEC_REPLAY_EVENTS / rate + SPEC_REPLAY_EVENTS / max(pipeline.live.per_second, 1.0)
        others = sum(v for k, v in results.phase_seconds.items() if not k.startswith("worker"))
        if pipeline.bulk_log_runs:
            lines.append(
                f"- **Replay:** the bulk replay is timed on a log of {pipeline.bulk_log_runs[0]['messages']:,} "
                f"messages, the target's size; whether its rows equal the live path's is checked on the "
                f"{pipeline.events:,}-event log, which a live worker also read (a live worker reading 1M events "
                f"would take ~{_duration(SPEC_REPLAY_EVENTS / max(pipeline.live.per_second, 1.0))} more). The "
                f"replaying worker (the worker row) reads the {pipeline.events:,}-event log; its rate as tables grow: "
                f"{early:,.0f} events/s from 10% to 55% of the log, {late:,.0f} events/s from 55% to the end.")
        else:
            lines.append(
                f"- **Replay:** a {pipeline.events:,}-event log instead of {SPEC_REPLAY_EVENTS:,}. At the measured "
                f"rates the live run and the replay of 1M events would take ~{_duration(both)} together, and the "
                f"other benchmarks took {_duration(others)} in this run"
                + (": more than the suite's 15-minute budget" if both + others > 900 else "") + ". Whether "
                f"the rate holds as tables grow: {early:,.0f} events/s from 10% to 55% of the log, {late:,.0f} "
                "events/s from 55% to the end.")
        memory_rate = max(pipeline.memory_rate.per_second, 1.0)
        fill = _cache_fill(results.density_per_hour)
        if pipeline.memory_log is not None:
            text = (f"- **Memory:** peak RSS of a fresh worker replaying the bulk replay's "
                    f"{pipeline.memory_events:,}-message log instead of a {SPEC_MEMORY_EVENTS:,}-event run "
                    f"(~{_duration(SPEC_MEMORY_EVENTS / memory_rate)} at its rate). Flatness is judged on the RSS "
                    "samples after the first quarter of the run and extrapolated per million events. ")
        else:
            text = (f"- **Memory:** peak RSS over the same {pipeline.events:,}-event replay instead of a "
                    f"{SPEC_MEMORY_EVENTS:,}-event run (~{_duration(SPEC_MEMORY_EVENTS / memory_rate)} at this rate). "
                    "Flatness is judged on the RSS samples after the first quarter of the run and extrapolated per "
                    "million events. ")
        limits = CacheLimits()
        text += (f"The owner's caches fill during the first ~{fill.events:,} events at this density (the records "
                 f"of {limits.records:,} trajectories take ~{fill.record_events:,} events, the {limits.windows:,} "
                 f"windows {fill.window_hours:.0f} h of the scenario's domains' minutes, ~{fill.window_events:,}), "
                 "and RSS climbs while they do; ")
        text += ("this run's first quarter covers that." if pipeline.memory_events / 4 >= fill.events else
                 "this run's first quarter does not, so its flatness check judges part of that warm-up: a *NO* "
                 "there is not evidence of growth (the full-size run in [memory-run.md](memory-run.md) decides).")
        lines.append(text)
        lines.append(
            f"- **Worker:** {pipeline.events:,} events; the target names no size. The same run is the replay "
            "benchmark's value: publishing first and then starting a fresh worker is a replay.")
    fresh = results.freshness
    if fresh is not None:
        text = (f"- **Freshness:** {fresh.seconds:.0f} s of steady publishing at {fresh.rate:,.0f} events/s (the "
                f"first {fresh.warmup_s:g} s excluded), then at most {fresh.drain_limit_s:.0f} s for the worker to "
                "catch up.")
        if fresh.worker_rate and fresh.worker_rate < 0.95 * fresh.achieved_rate:
            text += (f" The worker stored {fresh.worker_rate:,.0f} events/s while {fresh.achieved_rate:,.0f} arrived, "
                     "so its backlog, and with it the latency, grows for as long as publishing goes on: a longer "
                     "run would only give larger numbers.")
        lines.append(text)
    if results.inprocess is not None:
        month = results.inprocess["month"]
        seed = results.inprocess["seed"]
        lines.append(
            "- **Dashboard queries:** "
            + ("not scaled down, but synthetic" if month["events_equivalent"] >= SPEC_MONTH_EVENTS else
               "scaled down and synthetic")
            + f": {seed['events']:,} events ({seed['hours']:g} h "
            f"of the workload) went through the real sink and derivation in-process, and their derived rows were "
            f"copied {month['copies']} times, each copy shifted by {seed['hours']:g} h, to span "
            f"{_days(month):.0f} days: {month['events_equivalent']:,} events' worth "
            f"(target: {SPEC_MONTH_EVENTS:,} over {SPEC_MONTH_DAYS:g} days)."
            + (f" Deriving that many events through the worker would take "
               f"~{_duration(month['events_equivalent'] / pipeline.replay.per_second)} at its measured rate."
               if pipeline is not None and pipeline.replay.per_second > 0 else ""))
    if results.profile is not None:
        lines.append(f"- **Profile:** {results.profile.profile.seconds:g} s of a worker replaying the log (at most "
                     f"{results.sizes.profile_seconds:g} s, fitted to end before the log does), not a whole run.")
    if len(lines) == 2:
        lines.append("- Nothing ran that needed scaling.")
    return "\n".join(lines)


def _details(results: Results) -> str:
    return "\n\n".join(s for s in (_publish_details(results), _worker_details(results), _freshness_details(results),
                                   _replay_details(results), _dashboard_details(results), _memory_details(results))
                       if s)


def _publish_details(results: Results) -> str:
    publish = results.publish
    if publish is None:
        return ""
    runs = [[f"{i + 1} ({'SDK' if sdk_goes_first(i) else 'raw'} first)", f"{s:,.0f}", f"{r:,.0f}", f"{s / r:.2f}x"]
            for i, (s, r) in enumerate(zip(publish.sdk_rates, publish.raw_rates, strict=True))]
    headings: tuple[str, ...] = ("run", "SDK events/s", "raw events/s", "ratio")
    loop_text = ""
    if publish.loop_rates:
        headings += ("then encode-and-produce loop events/s", "SDK / loop", "loop / raw")
        for run, s, r, loop in zip(runs, publish.sdk_rates, publish.raw_rates, publish.loop_rates, strict=True):
            run += [f"{loop:,.0f}", f"{s / loop:.2f}x", f"{loop / r:.2f}x"]
        loop_text = (
            "After each pair, outside the row's ratio, a third publisher ran (`bench.publish.loop_once`): the "
            "baseline's loop, but taking the typed events and doing per event only what any publisher of them must "
            "(`encode_event`, `event_key`, the topic of its type). The SDK reached a median "
            f"{publish.sdk_to_loop:.2f}x of it: that is what the SDK itself costs (its checks, its delivery "
            "accounting, its spool's thread). The loop against the baseline is what turning typed events into "
            "bytes costs; it bounds the SDK's ratio on this machine.")
    cpu_rows = [[name, f"{medians[0]:.1f}", f"{medians[1]:.1f}"]
                for side, name in (("SDK", "SDK"), ("raw", "raw produce (baseline)"),
                                   ("loop", "encode-and-produce loop"))
                if (medians := publish.cpu_medians(side)) is not None]
    cpu_text = (
        "**CPU per event.** Each measured run also took the CPU clocks over its timed span: the thread that sent "
        "(`time.thread_time`; for the bare producers it also serves the delivery reports, for the SDK its spool's "
        "thread does) and the whole process (`time.process_time`: librdkafka's threads and the SDK's spool thread "
        "included, the broker not). Medians of the runs, µs per event:") if cpu_rows else ""
    burst = publish.burst
    burst_text = "" if burst is None else (
        f"**A burst beyond the send queue.** Last, one SDK run sent the events {burst.events // publish.events} "
        f"times over without a pause ({burst.events:,} messages; librdkafka's send queue holds 100,000, "
        f"`queue.buffering.max.messages`): {burst.run.rate:,.0f} events/s, {burst.run.thread_us:.1f} / "
        f"{burst.run.process_us:.1f} µs of CPU per event (sending thread / process), {burst.spooled:,} messages "
        "spooled. With the broker answering, a full queue makes `send` wait for room as deliveries come in "
        "(`producers.kafka.QUEUE_STALL_S`, docs/reliability.md); when it went to the on-disk spool instead, "
        "such a burst ran at 0.10-0.17x of raw produce.")
    config = ", ".join(f"`{k}={v}`" for k, v in sorted(publish.config.items()) if k != "bootstrap.servers")
    return "\n".join([
        "## Benchmarks in detail", "",
        "### SDK publish", "",
        f"{publish.events:,} typed events built in advance. **Value:** `EventProducer.from_settings(settings)` "
        "(the SDK's defaults" + (", with its on-disk spool" if publish.spool else "") + "), `send` of every event, "
        "then `flush`, which returns only when the broker confirmed all of them. **Baseline:** a bare "
        "confluent-kafka `Producer` with the same configuration producing the same events' pre-encoded bytes "
        "(topic, key, value computed before the clock starts), `poll(0)` every 1,000 messages, then `flush`; "
        "delivery reports counted. Each side sends one warm-up message first (connections, producer id); "
        "a full-size warm-up pair precedes the measured pairs, which alternate which side runs first (the "
        "order changed the ratio in some runs on this machine; see `bench.publish.sdk_goes_first`).", "",
        f"librdkafka configuration of both: {config}.", "",
        *([loop_text, ""] if loop_text else []),
        markdown_table(headings, runs),
        *(["", cpu_text, "", markdown_table(("side", "sending thread", "whole process"), cpu_rows)]
          if cpu_rows else []),
        *(["", burst_text] if burst_text else []),
    ])


def _worker_details(results: Results) -> str:
    pipeline = results.pipeline
    if pipeline is None:
        return ""
    runs = [["live worker (SDK publishing meanwhile)", f"{pipeline.live.per_second:,.0f}",
             f"{pipeline.live.events:,}", f"{pipeline.live.seconds:.1f}"]]
    replays = pipeline.replay_runs or [pipeline.replay]
    for i, r in enumerate(pipeline.baseline_runs):
        runs.append([f"plain consumer loop, run {i + 1}", f"{r.per_second:,.0f}", f"{r.events:,}", f"{r.seconds:.1f}"])
        if i < len(replays):
            runs.append([f"replay worker, run {i + 1} (fresh folder and group)", f"{replays[i].per_second:,.0f}",
                         f"{replays[i].events:,}", f"{replays[i].seconds:.1f}"])
    floor = pipeline.faust_floor
    if floor is not None:
        runs.append(["no-op Faust agent (framework ceiling, reference)", f"{floor.per_second:,.0f}",
                     f"{floor.events:,}", f"{floor.seconds:.1f}"])
    bare = pipeline.without_derivation
    if bare is not None:
        runs.append(["worker without derivation (reference, fresh folder and group)", f"{bare.per_second:,.0f}",
                     f"{bare.events:,}", f"{bare.seconds:.1f}"])
    stats = pipeline.replay_stats
    floor_text = "" if floor is None else (
        " Then a Faust agent with the worker's consumer settings and an empty body "
        f"(`bench/faust_floor.py`: `take_events({results.sizes.batch_size:,}, within={_batch_seconds():g})`, "
        "nothing else) read "
        f"the same topics once: {floor.per_second:,.0f} events/s is what Faust's stream machinery (conductor, "
        "channel queue, stream iteration, acks) allows by itself on this machine, so it bounds any worker "
        f"built on a Faust stream; the replay worker reached {pipeline.replay.per_second / floor.per_second:.0%} "
        "of it.")
    return "\n".join([
        "### Worker throughput", "",
        f"One log of {pipeline.events:,} events on 4-partition topics. The SDK published it while a fresh "
        f"worker consumed (live, {pipeline.publish_seconds:.1f} s of publishing); then the plain consumer loop "
        "(`bench/consumer_baseline.py`: confluent-kafka consumer, `orjson.loads`, one `events_raw` row per "
        f"message, batch insert of up to {results.sizes.baseline_batch_size:,} rows into chdb, commit) read the same "
        "topics with its own group and ClickHouse folder, "
        f"{len(pipeline.baseline_runs)} time(s), each run followed by a fresh worker (new data folder and "
        "consumer group) replaying the log, so that both sides see the machine at the same moments; each "
        "side's value is the median of its runs, the row's ratio the median of the pairs' ratios"
        + _pair_ratios(pipeline) + ", and the replay figures below (what it stored, its CPU per event) "
        "are the median run's. A rate counts from the "
        "first progress sample at or past 10% of the log to the sample at which everything was consumed "
        "(samples every 0.25 s; for the worker `consumed` counts a batch only after its raw rows, trajectories, "
        "windows and alerts are stored), so start-up, group join and table creation are excluded." + floor_text, "",
        markdown_table(("run", "events/s", "events timed", "seconds"), runs), "",
        f"The replay worker stored {stats.get('stored', 0):,} events, dropped {stats.get('duplicates', 0):,} "
        f"duplicates, wrote {stats.get('trajectories', 0):,} trajectory versions and {stats.get('windows', 0):,} "
        f"window recomputations in {stats.get('batches', 0):,} batches." + _cpu_text(pipeline, results.machine.cores)
        + _derivation_text(pipeline),
    ])


def _pair_ratios(pipeline: Any) -> str:
    """Each pair's replay / plain-loop ratio in parentheses, in run order ('' without pairs)."""
    if pipeline.ratio is None:
        return ""
    pairs = zip(pipeline.replay_runs, pipeline.baseline_rates, strict=True)
    return " (" + " / ".join(f"{replay.per_second / loop:.2f}x" for replay, loop in pairs) + ")"


def _cpu_text(pipeline: Any, cores: int) -> str:
    """CPU per event of the worker against the plain loop, and the cores each target would take at that cost."""
    worker = pipeline.replay_cpu_per_event
    loop = median_of(pipeline.baseline_cpu_per_event) if pipeline.baseline_cpu_per_event else None
    if worker is None or loop is None or loop <= 0:
        return ""
    used = _cores_used(pipeline, worker)
    for_ratio = 0.3 * pipeline.baseline * worker
    for_rate = 20_000 * worker
    text = (f"\n\n**CPU per event.** Over the same measured spans, each reader's own process (every thread, its "
            f"embedded engine's included; the broker not) used {loop * 1e6:,.1f} µs of CPU per event in the plain "
            f"consumer loop (median of its runs) and {worker * 1e6:,.1f} µs in the replay worker, "
            f"{worker / loop:,.1f} times as much. At its rate the worker kept {used:,.2f} of the machine's "
            f"{cores} cores busy")
    if pipeline.replay_busy is not None:
        text += f" (all processes together: {pipeline.replay_busy:.0%} of the machine, start-up included)"
    text += (". At this cost per event, 0.3x the loop's rate would keep "
             f"{for_ratio:,.2f} cores busy and 20,000 events/s {for_rate:,.2f}")
    if 0.8 <= used <= 1.3:
        text += ("; the worker runs at about one core because one thread at a time runs Python (the interpreter "
                 "lock) and the work outside it, in the engine and librdkafka, is small. Both targets need the "
                 "cost per event cut, or the Python spread over processes without paying for it twice")
    return text + "."


def _cores_used(pipeline: Any, cpu_per_event: float) -> float:
    """Cores the replay worker kept busy: its rate times its CPU seconds per event."""
    return float(pipeline.replay.per_second * cpu_per_event)


def _speed_lines(machine: Any) -> list[str]:
    """The host's speed for the interpreter at the start and the end of the run (none when not measured)."""
    if machine.loop_seconds is None:
        return []
    start, end = machine.loop_seconds
    return [f"- **Host speed:** a {LOOP_ITERATIONS:,}-iteration Python loop (`bench.machine.python_loop_seconds`, "
            f"best of 3) took {start:.2f} s at the start and {end:.2f} s at the end. A shared host's speed changes "
            "from hour to hour and the absolute rates below move with it, the Python-bound sides more than the "
            "C-bound baselines: compare runs of this document by this line first."]


def _derivation_text(pipeline: Any) -> str:
    """What the worker costs without its derivation, so what the derivation costs, and what 0.3x would leave it."""
    bare, bare_cpu = pipeline.without_derivation, pipeline.without_derivation_cpu_per_event
    worker = pipeline.replay_cpu_per_event
    if bare is None or bare_cpu is None or worker is None or worker <= 0 or pipeline.baseline <= 0:
        return ""
    derivation = worker - bare_cpu
    text = ("\n\n**Without the derivation.** Last, a fresh worker whose `Deriver.derive` does nothing "
            "(`bench/without_derivation.py`: reading, validation, dead letters, the duplicate check, the owner's "
            "cache of events and the raw rows as in the worker; no trajectory record, window, consumption or alert "
            "written and no derived message sent) replayed the log once: "
            f"{bare.per_second:,.0f} events/s, {bare.per_second / pipeline.baseline:.2f}x the plain loop's median, "
            f"at {bare_cpu * 1e6:,.1f} µs of CPU per event against the full worker's {worker * 1e6:,.1f}. By "
            f"difference the derivation takes {derivation / worker:.0%} of the worker's CPU per event (CPU time: the "
            "profile's busy time below also counts a thread's waits for the interpreter lock).")
    used = _cores_used(pipeline, worker)
    needed = used / (0.3 * pipeline.baseline)  # CPU per event at which those cores would give 0.3x
    if needed >= worker:
        return text + " On the cores the worker keeps busy, 0.3x of the loop needs no cut."
    if needed <= bare_cpu:
        return text + (f" On the {used:,.2f} cores the worker keeps busy, 0.3x of the loop needs {needed * 1e6:,.1f} "
                       "µs per event, less than the worker costs without deriving anything: the rest of the "
                       "worker has to get cheaper too.")
    return text + (f" On the {used:,.2f} cores the worker keeps busy, 0.3x of the loop needs {needed * 1e6:,.1f} µs "
                   f"per event: the derivation cut to {(needed - bare_cpu) / derivation:.0%} of its cost, the rest "
                   "of the worker as it is.")


def _latency_line(fresh: Any) -> list[str]:
    finite = [v for v in fresh.latencies if not math.isinf(v)]
    cells = [f"{fresh.achieved_rate:,.0f}", f"{fresh.worker_rate:,.0f}", f"{fresh.measured:,}",
             f"{fresh.never_visible:,}"]
    for q in (50, 90, 99):
        cells.append(format_value(fresh.p(q), "s"))
    cells.append(format_value(max(finite), "s") if finite else "-")
    return cells


def _freshness_details(results: Results) -> str:
    fresh = results.freshness
    if fresh is None:
        return ""
    rows = [["steady " + f"{fresh.rate:,.0f}/s", *_latency_line(fresh)]]
    if results.sustainable is not None:
        rows.append([f"half the worker's rate ({results.sustainable.rate:,.0f}/s, informational)",
                     *_latency_line(results.sustainable)])
    return "\n".join([
        "### Freshness", "",
        "A fresh worker consumes while the SDK publishes at a steady rate, each event stamped with the wall "
        "clock as it is sent (the workload's events in their order, so every trajectory's events stay in order). "
        f"A poller reads `v_effective_throughput` (the newest row of each window of `m_window_metrics`) "
        f"through the worker's `/sql` every {fresh.poll_interval_s:g} s. The k-th finish of a window (by event "
        "time) is visible at the first poll whose `finished` count for that window reaches k; its latency is "
        "that poll's *return* time minus the event's time (so the poll interval and the read's own time are "
        "included: the numbers err high, never low). 200 events were stored before the clock started (group "
        f"joined, engine warm); finishes of the first {fresh.warmup_s:g} s are excluded. A finish still not "
        f"visible {fresh.drain_limit_s:.0f} s after publishing stopped counts as never visible: percentiles "
        "that fall on them read *never*.", "",
        markdown_table(("run", "published events/s", "worker events/s", "finishes measured", "never visible",
                        "p50", "p90", "p99", "max seen"), rows),
    ])


def _replay_details(results: Results) -> str:
    pipeline = results.pipeline
    if pipeline is None or not pipeline.views_compared:
        return ""

    def verdict(name: str) -> str:
        texts = [d[name] for d in (pipeline.view_differences, pipeline.bulk_differences) if name in d]
        return "differs: " + "; ".join(texts) if texts else "identical"

    rows = [[name, f"{count:,}", verdict(name)] for name, count in pipeline.views_compared.items()]
    rows += [[name, "-", verdict(name)] for name in sorted({**pipeline.view_differences, **pipeline.bulk_differences})
             if name not in pipeline.views_compared]
    lines = [
        "### Replay", "",
        "The replay worker (fresh data folder, fresh consumer group, the whole log already in Kafka) and the bulk "
        "replay (`rollout replay` into a fresh data folder) against the live worker that consumed the same log as "
        "it was published. Every `v_*` view of each, all rows, compared after sorting, without the columns that "
        "record *when* a row was computed (`version`, `first_fired_at`, `updated_at`) and with floats rounded to 9 "
        "digits.", "",
        markdown_table(("view", "rows", "replays vs live"), rows),
    ]
    labelled = [(f"bulk replay of this log, run {i + 1}", run) for i, run in enumerate(pipeline.bulk_runs)]
    if pipeline.bulk_log_warm_up is not None:
        labelled.append((f"bulk replay of the {pipeline.bulk_log_warm_up['messages']:,}-message log, warm-up "
                         "(not counted)", pipeline.bulk_log_warm_up))
    labelled += [(f"bulk replay of the {run['messages']:,}-message log, run {i + 1}", run)
                 for i, run in enumerate(pipeline.bulk_log_runs)]
    if labelled:
        runs = []
        for label, run in labelled:
            steps: dict[str, float] = {}
            for derived in run["runs"]:
                for step, seconds in derived["seconds"].items():
                    steps[step] = steps.get(step, 0.0) + seconds
            runs.append([label, f"{run['messages'] / run['seconds']:,.0f}",
                         f"{run['seconds']:.1f}", f"{run['load_seconds']:.1f}",
                         ", ".join(f"{step} {seconds:.1f}" for step, seconds in steps.items()),
                         f"{run['wall_seconds']:.1f}",
                         _peaks(run)])
        lines += [
            "", "Each bulk replay, in the order they ran: its rate over its own seconds (first read to last table "
            "written), the reading and storing of the raw events within them, each derived step's seconds (SQL on the "
            "stored events), the process's whole time with its start-up (the engine, the migrations) and the "
            "views read back, and the process's peak RSS (`VmHWM`; the embedded engine's memory included, its "
            "validating helper's not).", "",
            markdown_table(("run", "events/s", "seconds", "raw events", "derived tables (s)", "process (s)",
                            "peak RSS (MiB)"), runs),
        ]
    return "\n".join(lines)


def _peaks(run: dict[str, Any]) -> str:
    """A bulk replay process's peak RSS in MiB ('-' when not recorded)."""
    return f"{run['peak_rss'] / MIB:,.0f}" if "peak_rss" in run else "-"


def _dashboard_details(results: Results) -> str:
    data = results.inprocess
    if data is None:
        return ""
    month = data["month"]
    seed = data["seed"]
    tables = [[name, f"{count:,}"] for name, count in sorted(month["rows"].items()) if name != "schema_migrations"]
    rows = []
    for q in data["queries"]:
        p95 = q["p95_ms"]
        met = "-" if q["kind"] != "panel" else ("yes" if p95 is not None and p95 <= QUERY_TARGET_MS else "NO")
        rows.append([f"{q['board']} / {q['title']} [{q['ref']}]", q["kind"], q["range"], f"{q['rows']:,}",
                     str(len(q["samples_ms"])),
                     format_value(q["p50_ms"], "ms") if q["p50_ms"] is not None else "-",
                     format_value(p95, "ms") if p95 is not None else f"error: {q['error']}", met])
    ranges = ", ".join(f"{k}: {v[0][:16]} to {v[1][:16]}" for k, v in data["ranges"].items())
    return "\n".join([
        "### Dashboard queries", "",
        f"**Data.** {seed['events']:,} events ({seed['hours']:g} h of the workload, {seed['trajectories']:,} "
        "trajectories, run `month`) went through `classify`, `ClickHouseSink.write` and `Deriver.derive` "
        f"in-process on chdb. Their derived rows were then copied {month['copies']} times into a fresh database "
        f"with `INSERT ... SELECT`, copy *c* shifted by *c* x {seed['hours']:g} h (windows, finish times, "
        "queue/start/verdict times), with trajectory and alert ids suffixed by *c* and policy versions shifted "
        f"by *c* x {seed['versions']} (so the month has {seed['versions'] * month['copies']:,} policy versions): "
        f"{month['events_equivalent']:,} events' worth of metric rows from {month['start'][:10]} to "
        f"{month['end'][:10]}, {month['windows']:,} (run, domain, minute) windows. The seed's "
        f"{month.get('dropped_seed_windows', 0)} window(s) past its {seed['hours']:g} h span (consumptions of the "
        "last training batches) were left out so copies do not overlap. "
        "`events_raw` and `consumptions` were not copied: no dashboard query reads them. Loading took "
        f"{month['load_seconds']:.0f} s; measuring started after background merges settled "
        f"({month['settle_seconds']:.0f} s).", "",
        markdown_table(("table", "rows"), tables), "",
        "**Queries.** Every target of every panel of the four generated dashboards, the `run` and `domain` "
        "variable queries, and every alert rule query, expanded by `dashboards.macros` as Grafana and the "
        "ClickHouse plugin expand them (run `month`; domain All, or `cad` on the domain board; `$__interval` "
        f"from each panel's max data points and min interval). Ranges: {ranges}; alert rules use their own "
        "relative range ending at the end of the data. Each ran read-only (`readonly=1`, like the worker's "
        "`/sql`) on the embedded engine, in a process of the bench's own (`bench/inprocess.py`) while no other "
        "benchmark ran: one warm-up round, then interleaved rounds, each query repeated until about "
        f"{data['budget_s']:g} s of its own time (at least {min(3, data['max_repeats'])}, at most "
        f"{data['max_repeats']} times). Latency is client-side wall time of the whole call, result rows included. "
        "As `timeit` does, the measuring process's garbage collector runs between rounds and not inside a "
        "timed call: this process holds the seed's data, and one full collection of it during a call had "
        "put p95s of 40-50 ms queries at 120-160 ms (Grafana's plugin is not a Python process). "
        "The 100 ms target applies to panel queries.", "",
        markdown_table(("query", "kind", "range", "rows", "runs", "p50", "p95", "<= 100 ms"), rows),
    ])


def _memory_details(results: Results) -> str:
    pipeline = results.pipeline
    if pipeline is None or not pipeline.memory.samples:
        return ""
    memory = pipeline.memory
    samples = memory.samples
    picks = _spread(samples, 10)
    rows = [[f"{t:.0f}", f"{n:,}", f"{r / MIB:,.0f}"] for t, n, r in picks]
    flat = memory_flatness([(n, r) for _, n, r in samples])
    projected = flat.end_rss + flat.growth_per_million_events * (SPEC_MEMORY_EVENTS - pipeline.memory_events) / 1e6
    live_peak = pipeline.live_progress.peak_rss
    peaks = (" / ".join(f"{p / MIB:,.0f}" for p in pipeline.replay_peaks) + " MiB")
    if pipeline.memory_log is not None:
        which = (f"a fresh worker (new data folder and consumer group) that read the bulk replay's "
                 f"{pipeline.memory_events:,}-message log after the bulk replays, at "
                 f"{pipeline.memory_rate.per_second:,.0f} events/s")
        others = f"The replays of the {pipeline.events:,}-event log peaked at {peaks}, the live worker at"
    else:
        which = "the replay worker"
        if len(pipeline.replay_peaks) > 1:
            which += f" (of the replays, the one with the highest peak; their peaks: {peaks})"
        others = "The live worker's peak was"
    return "\n".join([
        "### Memory", "",
        f"RSS (`VmRSS`) of {which}, sampled every 0.25 s with its progress; the peak is "
        f"the kernel's high-water mark (`VmHWM`): {memory.peak_rss / MIB:,.0f} MiB. {others} "
        f"{live_peak / MIB:,.0f} MiB. The process holds the embedded ClickHouse engine, so its "
        f"caches count too; up to {memory.peak_file_rss / MIB:,.0f} MiB of that worker's RSS "
        f"were file-backed pages (`RssFile`: mostly the engine's {engine_library()}, mapped from disk; the kernel "
        "can drop and re-read them), the rest its own memory. *Flat* means the median RSS of the last quarter of "
        "the run is at most 10% above the "
        f"median of the second quarter: {flat.warm_rss / MIB:,.0f} MiB then {flat.end_rss / MIB:,.0f} MiB "
        f"({flat.growth_bytes / MIB:+,.0f} MiB). The least-squares slope of RSS over events after the first "
        f"quarter is {flat.growth_per_million_events / MIB:+,.0f} MiB per million events; carried on linearly to "
        f"{SPEC_MEMORY_EVENTS / 1e6:.0f}M events it would reach ~{format_value(max(projected, 0.0), 'bytes')}. "
        "RSS moves by tens of MiB between samples (allocator, ClickHouse caches, merges), so a slope fitted on a "
        "run this short neither shows nor rules out growth over 10M events: only the full-size run can.", "",
        markdown_table(("seconds", "events consumed", "RSS MiB"), rows),
    ])


@dataclass(frozen=True)
class _CacheFill:
    """When the owner's caches are full at the bench's density: the trajectory records (``CacheLimits.records``,
    ~``EVENTS_PER_TRAJECTORY`` events each) and the windows (one per domain and window length of event time)."""

    record_events: int
    window_hours: float
    window_events: int

    @property
    def events(self) -> int:
        """Events after which every cache is full (whichever fills last)."""
        return max(self.record_events, self.window_events)


def _cache_fill(density_per_hour: float) -> _CacheFill:
    limits = CacheLimits()
    domains = len(scenario_for(1000, run_id="bench").domains)
    hours = limits.windows * _defaults().metrics_window_seconds / (domains * 3600)
    return _CacheFill(int(round(limits.records * EVENTS_PER_TRAJECTORY, -3)), hours,
                      int(round(hours * density_per_hour, -3)))


def _spread(items: Sequence[Any], count: int) -> list[Any]:
    if len(items) <= count:
        return list(items)
    step = (len(items) - 1) / (count - 1)
    return [items[round(i * step)] for i in range(count)]


# -- where the time goes ---------------------------------------------------------------------------


def _where(results: Results) -> str:
    lines = ["## Where the time goes"]
    profile = results.profile
    if profile is not None:
        lines += ["", *_profile_lines(results)]
    else:
        lines += ["", f"Worker profile: {_failed(results, 'profile')}."]
    if results.inprocess is not None:
        lines += ["", *_inprocess_lines(results)]
    return "\n".join(lines)


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


def _profile_lines(results: Results) -> list[str]:
    run = results.profile
    assert run is not None
    p = run.profile
    seconds = p.seconds
    batches = max(run.batches, 1)
    out = [
        f"**The worker, sampled.** py-spy recorded a fresh worker replaying the log for {seconds:.0f} s at "
        f"{run.rate_hz} samples/s per thread (`--idle --threads --nonblocking`; py-spy itself used "
        f"{run.spy_cpu_s:.1f} s of CPU). Meanwhile the worker consumed {run.events:,} events in {run.batches:,} "
        f"batches ({run.events / seconds:,.0f} events/s, {1000 * seconds / batches:,.0f} ms per batch). "
        "A thread's time is its share of samples times the recording's length. py-spy counts a thread that "
        "waits for the GIL as running its current Python line, so *busy* includes time spent waiting for the "
        "other thread to release the GIL.",
        "",
    ]
    role_rows = []
    cpu, wall, events = run.cpu, run.cpu_wall_s or seconds, max(run.events, 1)
    for name, t in p.roles.items():
        row = [name, _pct(t.busy, t.samples), _pct(t.idle, t.samples),
               f"{p.seconds_of(name, t.busy) * 1000 / batches:,.0f}"]
        if cpu:
            row += [_pct(cpu.get(name, 0.0), wall), f"{cpu.get(name, 0.0) / events * 1e6:,.1f}"]
        role_rows.append(row)
    if cpu and NATIVE in cpu:
        role_rows.append([NATIVE, "-", "-", "-", _pct(cpu[NATIVE], wall), f"{cpu[NATIVE] / events * 1e6:,.1f}"])
    headers = ("thread", "busy", "idle", "busy ms per batch") + (("on a CPU", "CPU µs per event") if cpu else ())
    out += [markdown_table(headers, role_rows), ""]
    if cpu:
        out += _cpu_lines(run), ""
    if run.cpu_others:
        out += ["The *other threads*, by name (a pool's threads added up):", "",
                markdown_table(("thread", "on a CPU", "CPU µs per event"), [
                    [f"`{name}`", _pct(used, wall), f"{used / events * 1e6:,.1f}"]
                    for name, used in sorted(run.cpu_others.items(), key=lambda kv: -kv[1])]), ""]
    owner = p.roles.get("ClickHouse owner")
    if owner is not None and owner.busy:
        out += ["ClickHouse owner thread (every sink and derivation call), busy time by step:", ""]
        out += [markdown_table(("step", "share of busy", "ms per batch"), [
            [label, _pct(n, owner.busy), f"{p.seconds_of('ClickHouse owner', n) * 1000 / batches:,.0f}"]
            for label, n in owner.steps.most_common()]), ""]
        out += ["The same busy time by what the CPU was doing (innermost recognisable frame):", ""]
        out += [markdown_table(("kind of work", "share of busy", "ms per batch"), [
            [label, _pct(n, owner.busy), f"{p.seconds_of('ClickHouse owner', n) * 1000 / batches:,.0f}"]
            for label, n in owner.kinds.most_common()]), ""]
    loop = p.roles.get("event loop")
    if loop is not None and loop.busy:
        out += ["Event loop thread (Kafka consumer and producer, Faust, validation, derived messages), busy time:", ""]
        out += [markdown_table(("step", "kind of work", "share of busy"), _loop_rows(loop)), ""]
    hottest = []
    for name in ("ClickHouse owner", "event loop", "direct ingest (consumer)"):
        role = p.roles.get(name)
        if role is not None and role.busy:
            hottest += [[name, f"`{fn}`", _pct(n, role.busy)] for fn, n in role.leaves.most_common(8)]
    if hottest:
        out += ["Hottest innermost frames of each thread (share of its busy samples):", "",
                markdown_table(("thread", "innermost frame", "share of busy"), hottest), ""]
    out += _gil_lines(run)
    out += _profile_summary(results)
    return out


def _cpu_lines(run: Any) -> str:
    """What the threads' CPU time says next to py-spy's busy share."""
    wall, events = run.cpu_wall_s or run.profile.seconds, max(run.events, 1)
    python = sum(used for role_name, used in run.cpu.items() if role_name != NATIVE)
    text = (f"*On a CPU* is each thread's CPU time over the same {wall:.0f} s (user and system time from "
            "`/proc/<pid>/task`, the engine work a thread calls included) against that time; *CPU µs per event* "
            f"the same over the {run.events:,} events. The Python threads used {python / wall:.2f} of a core "
            f"({python / events * 1e6:,.1f} µs per event)")
    owner = run.profile.roles.get("ClickHouse owner")
    if owner is not None and owner.samples and "ClickHouse owner" in run.cpu:
        on_cpu = run.cpu["ClickHouse owner"] / wall
        busy = owner.busy / owner.samples
        text += (f". The owner thread was busy in {_pct(busy, 1)} of py-spy's samples but on a CPU "
                 f"{_pct(on_cpu, 1)} of the time: ")
        text += ("a Python thread neither idle nor on a CPU is waiting for the interpreter lock, so the owner "
                 f"waited for it about {_pct(max(busy - on_cpu, 0.0), 1)} of the time while other threads ran "
                 "Python." if busy > on_cpu else "it hardly waited for the interpreter lock.")
    else:
        text += "."
    return text


def _gil_lines(run: Any) -> list[str]:
    gil = run.gil
    if gil is None:
        return []
    held = sum(t.samples for t in gil.roles.values())
    if not held:
        return []
    kinds: dict[str, int] = {}
    for t in gil.roles.values():
        for label, n in t.kinds.items():
            kinds[label] = kinds.get(label, 0) + n
    by_role = ", ".join(f"{name} {_pct(t.samples, held)}" for name, t in gil.roles.items())
    return [
        f"**The GIL.** A second recording of {gil.seconds:.0f} s sampled only the thread holding the GIL "
        f"(`--gil`): it was held {100 * run.gil_share:.0f}% of the time (samples against the ticks of the first "
        f"recording's rate), by: {by_role}. What the holder was doing:", "",
        markdown_table(("kind of work", "share of GIL-held samples"),
                       [[label, _pct(n, held)] for label, n in sorted(kinds.items(), key=lambda kv: -kv[1])]),
        "",
    ]


def _loop_rows(loop: Any) -> list[list[str]]:
    rows = [[label, "", _pct(n, loop.busy)] for label, n in loop.steps.most_common()]
    rows += [["", label, _pct(n, loop.busy)] for label, n in loop.kinds.most_common()]
    return rows


def _profile_summary(results: Results) -> list[str]:
    run = results.profile
    assert run is not None
    p = run.profile
    owner = p.roles.get("ClickHouse owner")
    loop = p.roles.get("event loop")
    if owner is None or loop is None or not owner.samples or not loop.samples:
        return []
    engine = owner.kinds.get("ClickHouse engine (chdb: query execution)", 0)
    client = owner.kinds.get("ClickHouse client (bind, encode, parse)", 0)
    decode = owner.kinds.get("decode events (pydantic)", 0)
    top_step, top_n = owner.steps.most_common(1)[0] if owner.steps else ("-", 0)
    derive = sum(n for label, n in owner.steps.items() if label.startswith("derive"))
    sink = sum(n for label, n in owner.steps.items() if label.startswith("sink"))
    batches = max(run.batches, 1)
    owner_ms = p.seconds_of("ClickHouse owner", owner.busy) * 1000 / batches
    loop_ms = p.seconds_of("event loop", loop.busy) * 1000 / batches
    wall_ms = p.seconds * 1000 / batches
    lines = [
        "**In short (worker):** "
        f"the ClickHouse owner thread was busy {_pct(owner.busy, owner.samples)} of the time and the event loop "
        f"{_pct(loop.busy, loop.samples)}: {owner_ms:,.0f} + {loop_ms:,.0f} ms per batch against {wall_ms:,.0f} ms "
        f"of wall time per batch ({_pct(owner_ms + loop_ms, wall_ms)}). Two batches are in flight: the next one "
        "is taken from the stream and validated on the loop while the owner thread stores, derives and publishes "
        "the previous one" + _turns(owner, loop, owner_ms + loop_ms,
                                                                               wall_ms) + ". "
        f"On the owner thread the derivation takes {_pct(derive, owner.busy)} of the busy time and the raw-event "
        f"sink {_pct(sink, owner.busy)}; the largest single step is *{top_step}* ({_pct(top_n, owner.busy)}). "
        f"By kind of work, {_pct(engine, owner.busy)} is the ClickHouse engine executing queries and inserts, "
        f"{_pct(client, owner.busy)} the client library binding parameters, encoding inserts and parsing "
        f"results, and {_pct(decode, owner.busy)} decoding stored events read back with pydantic (trajectories "
        "the owner's cache did not hold).",
    ]
    return lines


def _batches(count: int) -> str:
    return f"{count:,} batch" if count == 1 else f"{count:,} batches"


def _turns(owner: Any, loop: Any, busy_ms: float, wall_ms: float) -> str:
    """What the busy times say about the two threads, only where the numbers support it."""
    parts = []
    if wall_ms and 0.8 <= busy_ms / wall_ms <= 1.3:
        parts.append("; a batch costs about the sum of the two threads' busy times")
    if owner.samples and loop.samples and max(owner.busy / owner.samples, loop.busy / loop.samples) < 0.8:
        parts.append(", and neither thread is saturated")
    return "".join(parts)


def _inprocess_lines(results: Results) -> list[str]:
    data = results.inprocess
    assert data is not None
    seed = data["seed"]
    batches = max(int(seed["batches"]), 1)
    total = float(seed["seconds"])
    phases = seed["phases"]
    calls = seed["calls"]
    ch_seconds = sum(c["seconds"] for c in calls)
    ch_calls = sum(c["calls"] for c in calls)
    queries = sum(c["calls"] for c in calls if c["kind"] == "query")
    inserts = sum(c["calls"] for c in calls if c["kind"] == "insert")
    rate = seed["events"] / total if total else 0.0
    out = [
        f"**Without Kafka and Faust.** The dashboard seed ({seed['events']:,} events, {_batches(batches)} of "
        f"{seed['batch_size']:,}) went through `classify`, `ClickHouseSink.write` and `Deriver.derive` in one "
        "process, under the worker's collector policy (`streams.collector.tune_collector`), at "
        f"{rate:,.0f} events/s ({1000 * total / batches:,.0f} ms per batch: classify "
        f"{1000 * phases['classify'] / batches:,.0f} ms, sink {1000 * phases['sink.write'] / batches:,.0f} ms, "
        f"derive {1000 * phases['derive'] / batches:,.0f} ms). Per batch it made {ch_calls / batches:.1f} "
        f"ClickHouse calls ({queries / batches:.1f} queries, {inserts / batches:.1f} inserts) that took "
        f"{1000 * ch_seconds / batches:,.0f} ms, {_pct(ch_seconds, total)} of the time; the rest is Python "
        "(validation, re-decoding stored events, assembly, window metrics).",
        "",
        markdown_table(("caller", "call", "calls per batch", "ms per batch", "share of in-process time"), [
            [c["caller"], c["kind"], f"{c['calls'] / batches:.1f}", f"{1000 * c['seconds'] / batches:,.1f}",
             _pct(c["seconds"], total)] for c in calls]),
    ]
    pipeline = results.pipeline
    if pipeline is not None and rate > 0:
        worker_rate = pipeline.replay.per_second
        line = (f"The worker reached {worker_rate:,.0f} events/s on the same kind of events, "
                f"{worker_rate / rate:.2f}x the in-process rate (the in-process run is smaller, so its tables are "
                "too).")
        run = results.profile
        owner = run.profile.roles.get("ClickHouse owner") if run is not None else None
        if run is not None and owner is not None and owner.busy:
            owner_ms = run.profile.seconds_of("ClickHouse owner", owner.busy) * 1000 / max(run.batches, 1)
            inprocess_ms = 1000 * (phases["sink.write"] + phases["derive"]) / batches
            line += (f" In the worker the same sink and derivation calls kept the owner thread busy {owner_ms:,.0f} ms "
                     f"per batch against {inprocess_ms:,.0f} ms in-process (py-spy's busy time includes waiting for "
                     "the GIL, so these samples cannot tell how much of the difference is waiting and how much is "
                     "work), and the event loop's work (Kafka, Faust, validation, derived messages) comes on top, as "
                     "the profile above shows.")
        out += ["", line]
    probes = data.get("probes") or []
    explain = data.get("explain") or {}
    if probes:
        planned = ""
        if explain.get("granules"):
            tables = ", ".join(f"`{t}`" for t in explain.get("tables") or []) or "the table"
            final = " with FINAL" if explain.get("final") else ""
            planned = (f" `EXPLAIN indexes = 1` of `{explain['sql']}` reads {tables}{final}, narrowed to "
                       f"{explain['granules']} granules by the primary key: the outer run and time filter reaches "
                       "the table through the view.")
        out += ["", "**Dashboards.** Every metric view reads `m_window_metrics`, one row per run, domain and window "
                "holding all metric families (multi-row families as Nested arrays, unfolded with `ARRAY JOIN`), "
                "and keeps each window's newest row with `FINAL` (`ReplacingMergeTree(version)`)." + planned
                + " What the pieces cost on the month of data (p50):", "",
                markdown_table(("read", "p50"), [[f"`{p['sql']}` ({p['title']})",
                                                  format_value(p["p50_ms"], "ms") if p["p50_ms"] is not None
                                                  else f"error: {p['error']}"] for p in probes])]
    return out


def _changes(results: Results) -> str:
    """What the code does for speed, and what stands between it and the targets it misses (by design notes)."""
    pipeline = results.pipeline
    floor = pipeline.faust_floor if pipeline is not None else None
    lines = [
        "## What the code does for speed, and what is left", "",
        "Done (each kept only when the views stayed identical; `tests/integration/test_owner_state.py`, the "
        "e2e and the reliability suites check that):", "",
        "- **The owner remembers** (`streams/state.py`): stored events, current records and consumptions of "
        "recent trajectories, members and consumptions of recent windows, per-run policy facts, per-version "
        "totals and alerts, in bounded LRU caches, read from ClickHouse on first use and cleared on any failed "
        "write. Reads that must come back empty (windows past the run's newest stored window, trajectories with "
        "no stored event) are not made. In steady state a batch reads only what it has not seen. A batch's new "
        "policy versions and configurations join the cached run facts (`RunFacts`) instead of the run's policy "
        "events being read again from `events_raw` after each one: that read was 4.8% of a live worker's owner "
        "thread at 5,000 events/s (py-spy).",
        "- **One row per window** (`m_window_metrics`, `streams/window_store.py`): one INSERT per batch for every "
        "metric family instead of ten, and views that read it with `FINAL` on the sorting key "
        "`(run_id, window_start, domain)` instead of filtering every family by a version set built from the "
        "whole table; `trajectories_latest` (kept by a materialized view) answers newest-record lookups.",
        "- **Views read only the subcolumns a query uses** (migration `0008`, `docs/architecture.md`): the "
        "views of the multi-row families name the Nested subcolumns one by one in their `ARRAY JOIN`; with the "
        "whole Nested column a filter on one subcolumn unfolded all of them. Month-range panels, both "
        "definitions interleaved on the same data in one process (median of 11 runs): *Policy lag at finish* "
        "65 -> 36 ms, *Share over the staleness bound* 61 -> 35 ms, *Claimed complete, verified failed* "
        "49 -> 33 ms, *Failure rate by environment version* 69 -> 55 ms; rows identical.",
        "- **Budget share** takes the configured weights' total from a scalar subquery, computed once, instead "
        "of a `CROSS JOIN` with it: 36 -> 21 ms over the month (median of 21 runs, both forms alternated on the "
        "same data, same rows); an e2e test checks its numbers against `v_budget`'s rows.",
        "- **Write order instead of re-derivation:** metrics before the records they come from, so a re-delivered "
        "batch starts from the stored records; unchanged records are not rewritten or re-sent.",
        f"- **Batches of up to 10,000 events** (or {_batch_seconds():g} s), two in flight; column types of inserts "
        "looked up once "
        "(clickhouse-connect otherwise sends `DESCRIBE TABLE` before each insert).",
        "- **Group commit** (direct ingestion, `streams/direct.py`, `docs/architecture.md`): a batch goes as soon "
        "as the previous one is stored, once it is 0.1 s old (`ROLLOUT_SINK_BATCH_MIN_SECONDS`), instead of "
        "waiting out the batch time while the owner thread is idle; under load batches grow by themselves. "
        "Freshness at 500 events/s, two pairs alternated with the code before on a slow host: p50 0.42 / 0.60 s "
        "against 0.57 / 0.77 s, p99 0.76 / 1.13 s against 0.96 / 1.34 s; at 1,500 events/s, where that host's "
        "owner thread was busy all the time either way, no difference beyond the noise.",
        "- **Derived messages** produced with confluent-kafka (in C, one flush per batch) instead of one Faust "
        "send and future per message, on a thread of their own: the owner thread takes the next batch while they "
        "are delivered (serialising them and waiting for the broker were 21% of a live worker's owner thread at "
        "5,000 events/s). A batch's offsets are still committed only after its messages are delivered, and in "
        "batch order (`streams/direct.py`; unit test with a batch that delivers while the next is handled).",
        "- **Fewer requests to the broker** (`producers/kafka.py` `DEFAULT_LINGER_MS`, `streams/direct.py` "
        "`FETCH_MIN_BYTES`): at 5,000 events/s the single broker of this 2-core machine used more than a core "
        "(thread CPU from /proc: request threads 53-66%, the JVM's C2 compiler 48-56% while the young broker "
        "warmed up), and the worker got what was left. librdkafka sends one produce request per partition, so "
        "the publisher's 10 ms linger over 12 raw partitions made ~800 requests/s, and each append completed the "
        "worker's waiting fetch (fetch.min.bytes 1): ~900 fetches/s, each with the broker's fixed cost per request "
        "(JFR: a fifth of the request threads' samples in the latency histograms it keeps per request). The SDK "
        "now lingers 50 ms and the direct consumer fetches at 64 KiB or 40 ms: ~230 produce and ~100 fetch "
        "requests/s; request threads 29-33%, compiler 18-22%. Three freshness-only runs (`python -m bench --only "
        "freshness`) alternated with the code before (which also lacked the two bullets above): p50 "
        "1.29 / 0.60 / 0.59 s against 0.77 / 1.89 / 1.27 s, p99 2.87 / 1.33 / 1.35 s against 1.38 / 2.83 / "
        "2.08 s; the worker stored 4,363 / 4,597 / 4,749 events/s against 4,767 / 4,006 / 4,275 of the 5,000.",
        "- **SDK:** events encoded with orjson where the output is byte-identical to pydantic's (checked by "
        "`tests/unit/test_encoding.py`), topic lookups cached, delivery counts without a lock per message. "
        "The encode-and-produce loop beside the SDK row (`bench.publish.loop_once`) shows what is left of the "
        "SDK's own cost, and each run's CPU per event (*CPU per event* under *SDK publish*) where it goes: the "
        "SDK's sending thread uses what the loop's does (in the five runs of each on 2026-12-07 when this was "
        "first measured, 3.9-5.5 against 4.5-5.8 µs per event, the loop's including the "
        "delivery reports it serves itself), and the spool's thread about 1 µs per event more serving the "
        "reports beside it, on the same interpreter lock. Serving them from the sender every 1,000 sends, or "
        "from the spool's thread every 20 ms instead of as they come, left the SDK's rate within the noise "
        "(SDK / loop medians 0.82-0.90x either way), so neither was kept. Encoding a typed event costs 1.3 µs "
        "warm (orjson; pydantic's own `to_json` 2.7-3.0 µs), a third to a half of what raw produce costs per "
        "message here: on this machine a publisher of typed events stays near 0.5-0.6x of raw produce, and "
        "the SDK row meets its target with little margin. A burst larger than librdkafka's send queue (100,000 "
        "messages, which the pairs' runs fit in) went to the on-disk spool once the queue was full, though the "
        "broker answered: SDK-only runs of 300,000 events per run (`python -m bench --only sdk --sdk-events "
        "300000`, twice) reached 0.10x and 0.17x of raw produce, and single SDK runs of 300,000 events spooled "
        "13,891-46,326 of them. "
        "`send` now waits for room while deliveries come in and spools only when none is confirmed for a second "
        "(`producers.kafka.QUEUE_STALL_S`, docs/reliability.md): the same command then gave 0.48x, nothing "
        "spooled. The burst line under *SDK publish* repeats that check in every run of the suite.",
        "- **Garbage collector** (`streams/collector.py`): the worker freezes what start-up built and runs full "
        "collections a hundred times less often than CPython's default; each one walked every cached object. "
        "In-process that doubled the rate of validation, sink and derivation; a replaying worker went from "
        "about 4,000 to about 7,000 events/s with the same peak RSS. Inserts reuse one insert context per table "
        "(`infra/clickhouse/inserts.py`): a new context per insert is a reference cycle that kept each batch's "
        "rows in memory until the next full collection. Since then it also skips the middle generation: a "
        "thread freezes what is alive every second and scans the whole heap once a minute (or when the frozen "
        "objects grew by half), so each of the ~10 tracked objects an event makes is scanned about once "
        "instead of twice. Over a 300,000-event replay (`python -m bench.memory_run --events 300000`, three "
        "runs alternated with the code before) the collector's time fell from 4.8 s to 2.0-3.0 s, CPU per "
        "event from 106-115 to 97-104 us and the rate rose 12% (9,842-10,762 to 11,247-12,040 events/s on "
        "a slow hour of this host), peak RSS unchanged. The frozen objects are counted for the growth check "
        "every ten seconds instead of every second: `gc.get_freeze_count` walks the whole frozen list with the "
        "interpreter lock held (23-33 ms for 3,000,000 objects; 5.6% of a 10,000,000-event replay's sampled "
        "time at 6M events). 1,000,000-event replays alternated with the code before: 12,682 / 12,594 against "
        "11,843 / 12,014 events/s, CPU per event 96.9 / 99.6 against 103.9 / 102.1 us.",
        "- **Event-time order in a replay** (`streams/align.py`, direct ingestion): fetching the same bytes "
        "per partition, the verifier partitions ran ~4.5 h of event time ahead of the sandbox ones after "
        "10,000 events of this log and the whole policy topic came with the first fetch, so verdicts and "
        "consumptions arrived after the owner's cache had let their trajectories go and were read back. "
        "Messages more than a minute of event time ahead of another partition are now held back (each "
        "partition in its order, at most 10 s unless the partition waited for still has a backlog of "
        "10,000 messages at the broker; a newly assigned partition holds the others until it delivers, "
        "for up to 2 s): a replay of this log went from ~6,500 to ~10,000 events/s and peaked ~60 MiB "
        "lower; on a 1,000,000-event log the backlog and first-fetch rules took the peak from 2,996 to "
        "~1,450 MiB and removed a stall of several minutes (`docs/architecture.md`). The 10 s limit no "
        "longer applies while the partition waited for holds messages in the merge (it goes first): in a "
        "replay every message waits longer than that for the worker's pace, and timing out had released "
        "188,070 of a 300,000-event log's messages hours ahead, so the owner read ~287,000 rows back from "
        "ClickHouse; now none (`/stats` `read_back`), and a 1,000,000-event replay keeps its rate to the end.",
        "- **Compact cached events** (`streams/trajectory.py`, `CachedEvent`, made by `cached_copy`): the owner "
        "caches a slotted copy of each event with the fields assembly reads (not its "
        "producer, schema version, type, checks or free-text detail) and one object per repeated run, "
        "trajectory and domain string. First the decoded events themselves were kept, sharing those strings, "
        "the producer and pydantic's set of given fields (2,592 -> 1,155 bytes per event); the copies take 404 "
        "bytes against 1,016 for those shared-in-place events (tracemalloc, 29,974 bench events), and a full "
        "cache lets go of thousands of events per batch, each fewer objects to free. Worker replays alternated "
        "with the code before (`python -m bench --only worker --replay-events 0 --out -`, before, after, before, "
        "after): worker medians 20,525 / 19,233 against 22,167 / 22,303 events/s (+12%), the plain loop's "
        "88,271 / 89,371 and 96,947 / 90,670 meanwhile (ratios 0.23x / 0.22x against 0.23x / 0.24x); "
        "in-process (classify, sink and derivation of the 150,000 events) 25,503-25,980 against 27,129-27,726 "
        "events/s with identical trajectory, window and consumption rows. The 10,000,000-event run with the "
        "copies ([memory-run.md](memory-run.md), ea44b82): peak 818 MiB, flat (688 -> 654 MiB from the second "
        "to the last quarter), 18,997 events/s, 72.1 µs of CPU per event; at e8f6dd8 852 MiB, 18,055 events/s, "
        "76.7 µs (one run each, not alternated).",
        "- **Records outlive their trajectories' events** (`streams/state.py`): the records of trajectories "
        "the cache lets go stay in a second cache of 20,000. Under the live load a minute's consumptions "
        "name ~19,000 trajectories, more than the trajectory cache holds, and every batch read ~1,900 "
        "records back for the policy-lag window (15 s freshness run: 44,810 records read -> 1,911; the "
        "owner's idle share 30% -> 36%). Policy-timeline lookups bisect precomputed tables instead of "
        "scanning every version per trajectory and consumption.",
        "- **Memory of a batch in flight:** accepted events keep their payload as text sized to it "
        "(`streams/records.py`): orjson's output bytes keep their whole write buffer, 4 KiB or more per event "
        "(tracemalloc of a replaying worker: 88 MiB in 14,789 payloads). The owner gives freed heap memory "
        "back to the system at most once a second (`streams/memory.py`, `malloc_trim`): glibc otherwise keeps "
        "what each thread freed. 1,000,000-event replays (`python -m bench.memory_run --events 1000000`): "
        "peak RSS 1,047 -> 964 -> 947 MiB, median anonymous RSS 675 -> 568 -> 530 MiB. Tried and not kept: "
        "`MALLOC_ARENA_MAX=2` (no change: 1,068 MiB peak) and a 4 MiB consumer prefetch instead of 16 (300,000 "
        "events, alternated twice: ~35 MiB lower peak but 8% slower, 11,729 / 10,811 against 12,552 / 12,307 "
        "events/s).",
        "- **The engine library's pages** (`streams/memory.py`, `LibraryPager`): loading chdb touches much of its "
        "530 MiB library once, and the kernel counts every touched page in RSS until memory runs short, how many "
        "per fault depending on the kernel: on the same host and day, a 10,000,000-event replay (`python -m "
        "bench.memory_run --events 10000000`) peaked at 1,064 MiB, 397 MiB of it file-backed. The owner now asks "
        "the kernel to drop the library's clean pages (`madvise(MADV_PAGEOUT)`) 5 s after start and then once a "
        "minute; the code the worker runs faults back in when used. The same run then: peak 852 MiB, at most "
        "242 MiB file-backed, median anonymous RSS 588 MiB (576-589 before: the worker's own memory is "
        "unchanged); 18,055 against 19,487 events/s (one run each, not alternated). Alternated at 1,000,000 "
        "events (`python -m bench.memory_run --events 1000000`, then the same with "
        "`ROLLOUT_ENGINE_PAGE_OUT_SECONDS=0`, twice each, consecutive, same host): with the page-out 19,343 / "
        "18,842 events/s, peak 754 / 753 MiB, at most 241 / 243 MiB file-backed; without it 19,228 / 18,953 "
        "events/s, peak 814 / 822 MiB, at most 260 / 260 MiB file-backed. No cost in rate that the runs "
        "can show, 60-69 MiB less peak.",
        "- **Raw rows from the payload** (migration `0005`): the sink inserts each event's payload and source "
        "position into `events_raw_in` (a `Null` table) and a materialized view writes the `events_raw` row, "
        "taking the envelope columns out of the payload in the engine, which runs without the interpreter "
        "lock. Python time per 10,000-event insert 74 -> 18 ms with identical rows; 1,000,000-event replays "
        "9,743 / 10,484 -> 10,786 / 13,058 events/s (alternated). It first went in and out again (467871a, "
        "58b1b3a): the regression check tested cumulative counts at alpha after every batch, so faster "
        "batches meant more looks at small samples, and the e2e healthy scenario fired an alert for 0.2 s "
        "(15 of 38 decided passed against 390 of 641, p = 0.0045). The check now spends alpha over doublings "
        "of the candidate's sample (`streams.regression.look_level`, `docs/sql.md`): a stable version looked "
        "at after every trajectory alerts 0.75% of the time instead of 5.85% (2,000 seeded runs, alpha 0.01), "
        "whatever the batching. Migration `0007` parses each payload once (all envelope columns into one named "
        "`Tuple`) instead of once per column: 121 -> 83 ms of engine time per 10,000-event insert, rows "
        "identical; 300,000-event replays alternated with the code before it (`python -m bench.memory_run "
        "--events 300000`, pairs in the order before, after) 7,453 / 8,574 / 12,117 -> 8,127 / 10,953 / 12,221 "
        "events/s, faster in each pair (the host itself sped up from pair to pair).",
        "- **Validation in one step** (`schemas.decode_event`, `docs/architecture.md`): pydantic-core parses and "
        "validates the message bytes together (`validate_json`); only what it refuses goes the step-by-step way "
        "(`orjson`, version checks and upcasting, `validate_python`) that names the dead letter's reason. "
        "`tests/unit/test_parse_fast_path.py` holds the two to the same accepted events; it found three "
        "differences, now closed (a missing or non-integer `schema_version`, integers past 64 bits). "
        "On 20,000 bench events (best of 7 passes, six runs alternating with the previous code) `decode_event` "
        "went from a median of 20.0 to 14.6 µs per event and `classify` from 26.5 to 22.7 µs; 300,000-event "
        "replays (`python -m bench.memory_run --events 300000`, alternated) 7,743 / 8,419 / 8,087 events/s "
        "against 8,246 / 7,766 / 7,056 before (+5%, within the machine's noise), peak RSS 721-742 against "
        "745-760 MiB. The batch also reads the clock once instead of once per event.",
        "- **Cheaper assembly, record rows and derived messages** (`streams/trajectory.py`, `streams/derive.py`, "
        "`streams/publish.py`): a frozen dataclass sets each field through `object.__setattr__`, so building a "
        "43-field `TrajectoryRecord` took 13 µs against 2.8 µs unfrozen (records are still never changed in "
        "place and still hash by value); `assemble` dedupes and orders events by the UUID's 128-bit value (C) "
        "instead of the UUID (Python `__hash__`/`__lt__`); `window_start` is exact `timedelta` arithmetic; record "
        "rows come from one `attrgetter` call; librdkafka reports only failed deliveries of derived messages "
        "(`delivery.report.only.error`), so a delivered message costs no Python callback. Scratch measurements "
        "alternating with the previous code: `assemble` over 13,520 bench trajectories 58.5 / 64.2 / 53.5 -> "
        "39.3 / 41.6 / 41.7 µs per trajectory with every record equal; building and inserting 2,300 record rows "
        "80.6-96.0 -> 56.2-67.5 ms; 300,000-event replays (`python -m bench.memory_run --events 300000`, "
        "alternated) 7,795 / 7,043 / 7,229 -> 7,535 / 8,755 / 8,268 events/s (median +14%, within this host's "
        "noise run to run), peak RSS 717-756 -> 722-743 MiB. `rollout audit` of such a replay (298,514 stored "
        "events) found 0 differences in every family, the 64,305 trajectory records included. Later the record "
        "was built positionally (45 keyword arguments cost 7.3 µs per record against 1.9 µs; a unit test holds "
        "each argument's comment to the field it fills), enum values read from `_value_` (the `Enum.value` "
        "property is Python) and the verdict timeout's `timedelta` made once: `assemble` over the 12,887 "
        "trajectories of 60,000 bench events, six interleaved rounds, best of 9 passes 30.5-33.3 -> 21.6-26.2 µs "
        "per trajectory on a slow host, every record equal. A live worker assembles a trajectory about once per "
        "event (its events come in different batches), a replay about once per trajectory.",
        "- **Reads that fill their batch, and the raw insert beside the derivation** (`streams/direct.py`, "
        "`streams/sink_clickhouse.py`, `docs/architecture.md`). The consumer's prefetch (4 MiB, about 9,000 "
        "events) is smaller than a batch, and once it was full librdkafka postponed the next fetch by 1 s "
        "(`fetch.queue.backoff.ms`): traced on a 300,000-event replay, most reads of 10,000 waited out the whole "
        "0.5 s batch time while the owner thread sat idle. With 20 ms they take 70-100 ms, and replays went from "
        "16,568 to 18,561 events/s. A batch's raw events now go in on the sink's own thread while the owner "
        "derives from its cache in Python; the derivation's first ClickHouse call waits for them "
        "(`InsertGate`). Four alternated pairs of 300,000-event replays: 18,494 / 18,452 / 18,658 / 18,152 "
        "against 18,632 / 17,392 / 17,476 / 18,773 events/s (within the noise: the replay is bound by the "
        "interpreter lock, below), peak RSS 750-768 against 758-780 MiB; at 5,000 events/s live, freshness "
        "p50 / p99 0.53 / 0.86 s and 0.58 / 0.93 s against 0.59 / 0.97 s and 0.60 / 0.97 s "
        "(`python -m bench --only freshness`, alternated), the owner's batches being shorter. Event ids are "
        "keyed by their 128-bit value in the owner's cache and duplicate checks (`UUID.__hash__` is Python) and "
        "the per-message `SourceRef`, `Accepted` and `RawMessage` are not frozen (0.45 -> 0.11 µs to build "
        "five fields).",
        "- **Memory at 10,000,000 events** (`python -m bench.memory_run`, [memory-run.md](memory-run.md)): "
        "latest, peak 772 MiB at 1e4f6ca (target met, 252 MiB to spare), flat (683 MiB in the second quarter, "
        "657 in the last), 16,813 events/s sustained and 81.4 us of CPU per event; 818 MiB at ea44b82 (compact "
        "cached events, above). Before those: "
        "peak 960 MiB at 3b3ee56 (target met, 64 MiB to spare), flat (839 MiB in the second quarter, 836 in "
        "the last), 16,779 events/s sustained and 84.3 us of CPU per event; 973 MiB at 7e3a82d (15,093 "
        "events/s, 94.0 us per event); 986 MiB at 494873c (13,170 "
        "events/s, 105.4 us per event). "
        "Reads in chunks (`streams/direct.py` `READ_CHUNK`: 2,000 messages per `consume`, and the partitions the "
        "event-time merge holds too much of paused after each chunk instead of once the whole batch is read, which "
        "came mostly from the partitions furthest ahead) at 0bd0c51: 950 MiB, flat (842 -> 833 MiB), 16,507 "
        "events/s, 86.4 us of CPU per event, the merge's held median 41,892 -> 28,671 messages (at 3b3ee56, "
        "above: 28,076). "
        "With batches of 20,000 (`--batch-size 20000`) the "
        "chunks bound what the merge holds too, but the speed comes with the memory: hold limit 5,000 per "
        "partition 17,793 events/s at 1,050 MiB; 2,000: 920 MiB but 15,365 events/s, the batches shrinking to "
        "~8,000 events. "
        "A batch's derived messages now "
        "wait for delivery on their own thread while the next batch is derived, so one more batch's records "
        "are alive at a time (~10,000 in a replay; their encoded messages are made one by one as they are "
        "sent): 994 MiB at 7e230e1, before the messages were made one by one (11,952 events/s); the run "
        "before delivery left the owner thread peaked at "
        "970 MiB (74d6d9e, 841 -> 860 MiB, 10,707 events/s, 132.4 us per event); the run before the frozen objects "
        "were counted every ten seconds peaked at 985 MiB (7283d37, 9,904 events/s), and 965 MiB at 0aea230 "
        "(10,207 events/s), one run each: within the run-to-run spread, all within the target. "
        "with the collector's freezer (above) the peak is 34 MiB below the 999 MiB of 4060430 (17,701 events/s "
        "on a faster boot; one run each, so not all of it need be the freezer's). At 4d63488 (before the fetch backoff "
        "and the insert beside the derivation) it was 975 MiB at 12,233 events/s on a slower one. Of the rise, "
        "the event-time merge held more at its peak (largest sampled 75,766 messages against 53,140, now that "
        "the consumer refills its prefetch at once) and the engine merged three tables at once (its own peak "
        "115 against 96 MiB). Before that it was 1,425 MiB before migration "
        "`0004`, 1,291 with it and 1,050 with payloads kept as text and heap trimming. The last steps: (1) the "
        "event-time merge counted a partition with a backlog at the broker as idle when it had nothing fetched "
        "for 2 s, so the others ran hours ahead and their trajectories left the owner's cache before its events "
        "came; the read-back queries then lifted RSS by up to ~70 MiB each (2,000,000-event replay: 12,084 events "
        "and 6,084 consumptions read back, none with the backlog rule; a 10,000,000-event run that read 130,691 "
        "events back peaked at 1,188 MiB). (2) With no read-backs the peak (1,051 MiB) came from `events_raw` "
        "merging 8-9 parts of payload text: sampling the peak RSS every 100 ms with the ClickHouse calls in "
        "flight showed rises of 100-150 MiB lasting seconds about once a minute, with any call or none; "
        "migration `0006` lets `events_raw` merge at most 5 parts at once (engine peak 118 -> 99 MiB, run peak "
        "1,051 -> 972 MiB in the sampled run). (3) The consumer prefetches 4 MiB instead of 16 "
        "(`ROLLOUT_INGEST_PREFETCH_KBYTES`): 300,000-event replays peaked ~35 MiB lower, 1,000,000-event ones "
        "the same (925 vs 920 MiB) at 12,842 vs 13,785 events/s; a 10,000,000-event run with 16 MiB "
        "(`ROLLOUT_INGEST_PREFETCH_KBYTES=16384 python -m bench.memory_run`) peaked at 1,004 MiB against 975 "
        "with 4 MiB, so the default stays at 4 MiB: 16 MiB would leave 20 MiB below the target.",
        "",
        "Left:",
        "",
    ]
    if floor is not None and pipeline is not None:
        lines.append(
            f"- **Faust's stream is a ceiling.** A Faust agent with an empty body reads this log at "
            f"{floor.per_second:,.0f} events/s here, against {pipeline.baseline:,.0f} for the plain "
            "confluent-kafka loop: the framework's per-message path (conductor, channel queue, stream iteration, "
            "acks) alone is below the worker target of 20,000 events/s on this 2-core machine. Direct ingestion "
            "(`ROLLOUT_INGEST=direct`, `streams/direct.py`) reads below it; what is left is the worker's own "
            "Python (validation, assembly, row encoding) sharing one interpreter lock between the event loop "
            "and the owner thread. Work moved into the engine runs without that lock (deriving the raw "
            "rows from the payload there made replays 11-25% faster).")
    else:
        lines.append("- **Faust's stream is the ceiling** (run the worker benchmark to see it measured).")
    lines += [
        "- **The interpreter lock, then the cost per event** (*CPU per event* under *Worker throughput*: the "
        "worker runs at about one of the two cores). Moving Python work to another thread does not help; to "
        "another process it helps only when the moved work is not paid for again. Measured side by side on "
        "300,000-event replays (`python -m bench.memory_run --events 300000`, alternated, the code otherwise the "
        "same), neither kept: (1) derived messages serialised and delivered on a thread of their own, so the "
        "owner thread starts on the next batch meanwhile: 8,049 / 7,639 / 7,101 / 6,953 events/s against "
        "7,268 / 7,769 / 7,211 / 7,975 without, no difference (while the owner waited for deliveries the event "
        "loop already held the lock); (2) validation in a process of its own, the worker rebuilding each "
        "accepted event from its canonical payload without validating again (a builder driven by the models' "
        "field types: ~10 µs per event against ~18 µs for `decode_event` then, equal events): 7,259 / 7,289 / "
        "7,306 against 6,754 / 6,866 / 6,946 (+6%), for ~10 MiB more peak RSS in the worker and a second "
        "Python process of ~32 MiB, while the 10,000,000-event peak is within 50 MiB of its target; the "
        "rebuild and the hand-over cost the worker most of what validation had. "
        "A second try, in which the helper sent each accepted event's field values (UUIDs as integers, what a "
        "batch repeats once per batch) and the worker rebuilt the models without calling pydantic (about a "
        "third of what validating costs), together with (3) under the next point, did no better: "
        "150,000-event replays (`python -m bench.memory_run --events 150000`, three alternated pairs on a "
        "host about 3.5 times slower than the one of this run) 8,854 / 8,379 / 7,315 with the helper against "
        "8,108 / 8,144 / 8,959 events/s without, 161-195 against 120-132 µs of CPU per event (the helper's "
        "included), and the helper's 68 MiB on top of the worker's peak. "
        "The owner (sink and "
        "derivation) in a process of its own would have the same problem the other way round: it needs the "
        "events as objects. What is left is to cut the cost per event: derivation (assembly, windows, rows) "
        "in the engine, as the raw rows are now (migration `0005`), or in compiled code. "
        "The suite's worker without its derivation (`bench/without_derivation.py`, run after the pairs since "
        "commit a87588c) measures what that can give at most; in three runs on a slow host (a scratch copy of "
        "the tree, then the suite twice at commit a87588c) it took 45-48% less CPU per event and reached "
        "0.35-0.43x of the loop against the full worker's 0.21-0.23x. "
        "Deriving in the engine in the worker's batches of 10,000 would not get there: "
        "`python -m bench.batch_sql_probe` "
        "(150,000 bench events in-process in the worker's batches of 10,000, four runs on a slow host) asked "
        "the audit's assembly, limited to a batch's ~2,360 trajectories, for their records alone: 330-357 ms "
        "of wall clock and 392-423 ms of CPU (the engine's threads included) per batch (the 35,365 records "
        "agree with the Python derivation's in status, finish time, decided, passed and lag), against "
        "261-305 ms and 271-323 ms for the whole "
        "Python derivation with its windows, consumptions and writes; reading and parsing the batch's stored "
        "events took 113-133 ms of that. In batches that small the engine would take the work off the "
        "interpreter lock but not off the two cores, which it shares with the broker. In larger batches its "
        "cost per event falls and the Python derivation's does not (`python -m bench.batch_sql_probe --events "
        "300000 --batch-size N`, two runs per size at commit 5438c5d, wall clock and CPU per event): batches "
        "of 50,000, the records 14.7-15.0 µs (CPU 19.9-21.2) against 22.9-33.9 µs (23.5-38.7) for the whole "
        "Python derivation; of 100,000, 11.5-15.4 (15.9-21.0) against 32.7-36.7 (33.7-37.7); of 10,000 in one "
        "run beside them, 33.5 (40.0) against 26.1 (28.1); every record agreed. "
        "The probe's last step is the engine's derivation of the batch but its consumptions and alerts: it finds the "
        "windows a batch touched and every trajectory finished or consumed in them (from the stored records and "
        "consumptions), materialises their assembly once as the bulk replay does, writes the batch's records and "
        "every family's rows of those windows as the bulk replay writes them (into a database of its own with the "
        "same tables and materialized views) and reads the records back, as derived messages would need them. Every "
        "window row equalled the stored one (a multi-row family as a set of rows, floats to 1e-9). CPU per event, "
        "the engine's threads included, against the whole Python derivation in the same run (one run of 10,000, two "
        "of each other size): batches of 10,000 91.4 µs against 23.2; of 50,000 32.1-41.8 against 21.3-24.4; of "
        "100,000 28.9-31.4 against 30.1-30.2 (of the 100,000-event step 55-59% materialising the assembly, 10% "
        "finding the windows and their trajectories, 9-10% writing the records, 11-13% writing the window rows, 4% "
        "reading the records back). Without its writes, in two runs on a slower hour, the step took 23.9-25.3 µs at "
        "100,000 against 41.6-43.9 for Python. In batches of 100,000 the engine's derivation so costs about as much "
        "CPU as Python's, and in smaller ones more: it would move the work off the interpreter lock, not cut it. On "
        "this machine's two cores, shared with the broker, that is worth about 0.3x at best: by the normal-hour "
        "run's numbers the Python threads without the derivation need ~26-31 µs per event on one core, the engine "
        "~30 µs of derivation and the raw inserts on the other (~28,000 events/s, 0.31x of the loop's 91,275). It is "
        "one of the two paths left to 0.3x (the other, native code, under the next point), with no margin on two "
        "cores and more on a machine with more: a worker behind its topics deriving in the engine in batches of "
        "100,000 or so, and in Python in small batches once it has caught up (freshness). It is a project of its "
        "own, not a tuning step: the consumptions, alerts and derived messages too, equal to what the Python "
        "derivation writes (the audit and the replay's parity tests hold both to the same views), and the owner's "
        "caches rebuilt when the worker returns to small batches. "
        "Measured on a "
        "400,000-event replay at 18,609 events/s (commit 921448c): py-spy sampling the holder of the "
        "interpreter lock for 8 s found it held 80% of the time (by the owner thread 56% of that, the event "
        "loop 30%, almost all of it validation, the consumer thread 10%, the sink's insert thread 4%); "
        "per-thread CPU from `/proc` over the same span: the Python threads 0.96 of a core (the engine work "
        "they call included), the engine's background merges 0.10, its other threads 0.03, librdkafka 0.02. "
        "Also tried and not kept, each within the noise on 300,000-event "
        "replays: validation on the owner thread instead of the event loop (no lock contention, no overlap: "
        "18,496 / 18,497 / 18,412 / 16,671 against 18,591 / 18,724 events/s), `sys.setswitchinterval` of 1 ms "
        "and 0.5 ms instead of 5 ms, and clickhouse-connect's compiled codec (`clickhouse-connect-core`) on "
        "the embedded client (in-process sink and derivation 27.5-29.3 against 26.6-27.0 µs per event). "
        "`occurred_at`'s conversion to UTC (`Envelope._utc`) is ~4.7 of `decode_event`'s ~16 µs per event on "
        "that slower host, but without it an event keeps pydantic-core's own time zone object, whose offset "
        "every later comparison asks for in Python: `classify` as a whole went from 27.0 to 28.6 µs per event "
        "(30,000 bench events, collector off), so the conversion stays. The same "
        "work on one thread without Kafka (classify, `ClickHouseSink.write`, `Deriver.derive` over 150,000 of the"
        " bench's events in batches of 10,000, the worker's collector policy) runs 22,538 events/s, 44.4 µs per "
        "event (classify 12.1, sink 14.8, derivation 17.5): faster than the worker with its two threads and the "
        "engine beside them. A 15-s profile of a worker replaying 400,000 events (`python -m bench --only "
        "profile --log-events 400000 --profile-seconds 15`), which also reads each thread's CPU time from "
        "`/proc` (*Where the time goes*), found at 19,535 events/s the owner thread busy in 94% of py-spy's "
        "samples but on a CPU 48% of the time (25.4 µs per event, the engine work it calls included): it waits "
        "for the lock about half the time, while the event loop validates (12.4 µs per event), the consumer "
        "thread reads and orders (3.3 µs) and the insert, publishing and collector threads run (9.9 µs); all "
        "Python threads together used 0.97 of a core, 51 µs per event. py-spy of the one-thread loop is flat "
        "(no function of the worker's own above 6% of its samples). At 51 µs per event on those threads, 0.3x of "
        "the loop (~23,400 events/s) needs 1.19 cores on them, most of it Python, which the interpreter lock "
        "runs one thread at a time.",
        "- **Compiled code, larger batches, deeper pipelining: measured, not kept.** (1) The streams modules "
        "compiled as they are, with mypyc (`trajectory`, `metrics`, `window_store`, `derive`, `state`, `records`, "
        "`sink_clickhouse`) or with Cython (annotations ignored; the same without `sink_clickhouse`, with `align`): "
        "in-process sink and derivation of 55,738 events (`bench.inprocess.run_seed`, batches of 10,000, "
        "the worker's collector policy, alternated) derivation 0.85 / 0.89 -> 0.77 / 0.79 s with mypyc, "
        "0.88 / 0.94 -> 0.81 / 0.78 s with Cython, validation and the sink unchanged: about 4% of the whole, "
        "as the time is in calls into pydantic, `datetime`, clickhouse-connect and the engine rather than in "
        "the worker's own bytecode; not worth a compile step. (2) The duplicate check and the cache's update "
        "in one pass over the batch (one cache lookup per trajectory instead of two per event): 0.34 / 0.36 s "
        "against 0.30 / 0.32 s in-process, replays unchanged (16,994 / 17,141 / 16,731 against 16,694 / "
        "16,868 / 17,263 events/s): the time there is the event compactor's, which the cache's memory needs. "
        "(3) Direct ingestion reading the next batch once the batch before has left the owner rather than once "
        "it is committed (its derived messages took a median of 90 ms to be delivered and its commit 36 ms, "
        "during which nothing was read): the owner thread went from 81% to 91% busy, and 300,000-event "
        "replays from 16,811 / 16,995 to 17,291 / 16,594 events/s: the owner then waits for the interpreter "
        "lock instead of for a batch. (4) Batches of 20,000 events instead of 10,000: 300,000-event replays "
        "20,404 / 17,742 against 16,273 / 16,168 events/s, 56.1 / 60.7 against 65.8 / 66.2 µs of CPU per "
        "event, and py-spy of 600,000-event replays (`--gil`) found 45.8 against 50.1 µs per event with the "
        "lock held and the lock held 87% against 81% of the time; but peak RSS 817 / 846 against 739 / 730 "
        "MiB, and the 10,000,000-event runs had 38-51 MiB to spare: `ROLLOUT_SINK_BATCH_SIZE=20000` is for "
        "workers that can give memory for speed, the default stays 10,000. Again with the engine library paged "
        "out (`python -m bench --only worker --batch-size N --replay-events 0 --out -`, N alternated 10,000, "
        "20,000, 10,000, 20,000, 5,000 on one host in one hour): the worker's medians 19,906 / 19,245 against "
        "21,880 / 22,660 events/s (+12%; 17,324 at 5,000), its peak 591 / 586 against 629 / 658 MiB over 150,000 "
        "events; the 10,000,000-event run with 20,000 peaked at 1,050 MiB before the page-out, 100 MiB above "
        "10,000's, so it would stay within the target only while the page-out works. The plain loop, then given "
        "the same batches, ran 96,341 / 88,999 events/s at 10,000, 67,531 / 68,136 at 20,000 and 90,471 at "
        "5,000: with 20,000 the table showed the worker's ratio met (0.32x, 0.33x) only because its baseline "
        "slowed down. The loop now keeps batches of 10,000 whatever `--batch-size` says (`--baseline-batch-size` "
        "changes it), and the worker row names both sizes when they differ. (5) A second decoder tried before "
        "pydantic: msgspec structs generated from the catalog's core schema (every node translated exactly or "
        "the model left to pydantic; held to pydantic's results by tests over the parse tests' corpus and "
        "edge values of every check). Over 30,000 bench events in one process, pydantic-core's "
        "`validate_json` took 5.5-5.8 µs per event, `decode_event` 6.2, `classify` 9.7; msgspec's typed "
        "decode alone 3.7 (its identifier patterns run on Python's `re`; untyped 1.3), building the pydantic "
        "models from its structs 5.2 more, and a guard for times with more than six fractional digits "
        "(msgspec rounds them, pydantic truncates) 5.1 more as a regex over the message: 14.0 µs in all, "
        "slower than pydantic alone; not kept. (6) Validation in a helper process, as the bulk replay does it: "
        "each batch pickled to a spawned process that ran `classify` and handed back every accepted event "
        "with its trajectory events as the owner's cached copies (pickled as their class and values, the "
        "event id as an integer). Per batch of 10,000 bench events in one process, validating took 100-110 ms "
        "of the worker's CPU; with the helper its threads still used 76 ms (12 building the messages, 22 "
        "pickling them on the queue's feeder thread, 42 receiving and unpickling the results), and the helper "
        "~300 ms (validation 159, pickling 52). Worker-only runs alternated (`python -m bench --only worker "
        "--replay-events 0`, the helper on and off): 18,511 / 16,733 events/s with it against 23,086 / 22,313 "
        "without, the worker process's own CPU per event 52.5 / 47.7 against 47.2 / 47.8 µs (the helper's "
        "not counted): handing the events over cost about what validating them did, and the helper's core "
        "was taken from the engine and the broker; not kept. (7) Batches of 20,000 again, after the owner's "
        "caches held compact copies (`python -m bench --only worker --replay-events 0 --batch-size N`, N "
        "alternated 20,000, 10,000, 20,000, 10,000 in one hour, three pairs each): the replay workers ran "
        "22,531-28,502 events/s (median 24,754) against 21,180-26,614 (median 24,084) with 10,000, +3% and "
        "inside the spread of either, at peaks of 679 / 702 against 600 / 592 MiB over 150,000 events; "
        "the default stays 10,000. "
        "(8) The derived rows inserted as JSON instead of the client's own encoding: rows written by `orjson` "
        "and sent as `JSONCompactEachRow` (`raw_insert`, `date_time_input_format=best_effort`, "
        "`precise_float_parsing=1`). The derived rows of 150,000 bench events, captured from one in-process "
        "run, went into fresh tables both ways, twice alternated: the same tables (row count and `cityHash64` "
        "sum equal), the calling thread's CPU for the 35,378 trajectory rows 665 / 720 ms as JSON against 664 "
        "/ 760 ms, the whole process's 1,075 / 1,201 against 875 / 971 ms. About 19 µs per trajectory row, "
        "nearly all of it the engine's insert rather than the encoding: JSON saves no Python and costs the "
        "engine more. Arrow (`insert_arrow`) took the Python of 2,500 records' insert from 40 to 26 ms, about "
        "1% of the worker's CPU. Neither kept. (9) Writing batch N while deriving batch N+1 (*Live headroom* "
        "below): the embedded engine runs one call at a time (two `sleepEachRow` queries of 1 s each took 2.0 "
        "s from two threads; a Python thread kept running during such a query, so the interpreter lock is "
        "free during a call), and a batch's first step, the duplicate check, asks the engine for the events of every "
        "trajectory the cache does not hold (most of a replayed batch's: 10,000 events span about 43 minutes "
        "of event time). Batch N+1 would wait there for N's writes; only the Python before that query would "
        "overlap them, unless the owner knew without asking which trajectories have nothing stored. Not "
        "built. "
        "The lock held ~80-87% of the time "
        "in every replay measured: the worker gets faster only by doing less Python per event. "
        "By the worker without its derivation (0.35-0.43x of the loop where the full worker reached 0.21-0.23x, "
        "above), 0.3x needs the derivation's CPU per event cut to between a quarter and a half of what it is "
        "(by run), the rest unchanged: a "
        "derivation in native code (assembly, windows and record rows, reading the owner's cached events) "
        "would have to do it in that budget, the crossings between Python and it included."
        " `python -m bench.native_probe` measures those crossings for assembly, one of the derivation's largest "
        "steps of Python: `assemble` in Rust (`bench/native_probe/src/lib.rs`, built with cargo and loaded as an "
        "extension), every record equal to Python's (32,218 trajectories of 150,000 bench events; its tests add "
        "parts of trajectories, in any order and with events twice, and the unit tests' edge cases). Median CPU "
        "per trajectory (4.65 events each), two runs: Python 12.5-13.6 µs; native over the owner's cached events "
        "7.0-7.3 (reading the Python objects 4.8-4.9, building the record's Python values 1.1-1.3 and the record "
        "0.7, the fold itself under 1); native from a store of its own, filled by parsing the canonical "
        "payloads, 3.1-3.3 (the fold 1.2), but that parse costs 2.1 µs per event against 1.4-1.8 for the owner's "
        "cached copy. Either way native assembly would save 1.2-1.5 µs of the worker's ~46 µs per event: the "
        "cost is in crossing between Python objects and native values, not in the fold. The same probe times the "
        "Python that follows assembly for each record written (`streams.derive`): comparing it with the stored "
        "record 2.5-2.6 µs, its finish window and insert row 3.4-3.6, its derived message 5.5-5.7 (orjson), "
        "11.3-11.9 µs per record before the ClickHouse client encodes the row. Native code pays only where the "
        "values stay native from the payload to the rows written and the messages sent (assembly, windows, "
        "insert blocks, derived messages), the project of several steps named above, not a function swapped in.",
        "- **Fixed cost per INSERT, and small batches.** In-process (`bench.inprocess.run_seed`, 55,642 events), "
        "batches of 2,500 events took 5.0-5.2 s of sink and derivation against 2.8-3.8 s for batches of 10,000: "
        "about 130 ms per batch that does not shrink with the batch, nearly all of it in the engine executing "
        "inserts (py-spy, the two runs compared). An INSERT of one record into `trajectories` (about 50 "
        "columns, copied by a materialized view into `trajectories_latest`, both written as new parts) took "
        "22-46 ms against 70-90 ms for 3,000 records; one row into `consumptions` 7-18 ms; a one-row "
        "`INSERT ... VALUES` into a two-column MergeTree 2.5 ms. A batch writes up to six tables, so the live "
        "worker's 0.5 s batches (the freshness runs) pay this several times a second: fewer tables written per "
        "batch, or columns the engine derives in one insert (as `events_raw_in` does), is the lever there. "
        "The fixed part grows with the columns written: one row into a copy of `trajectories` that no view "
        "reads took 14-16 ms, the same without its bloom-filter index ~15 ms, into a one-column MergeTree 3 ms "
        "(the `trajectories_latest` view adds ~5 ms).",
        "- **Live headroom: the owner still writes between batches.** At the freshness run's density "
        "(events stamped 1/5,000 s apart, batches of 500: what group commit gives at 5,000 events/s), "
        "in-process classify, sink and derivation of 40,000 events cost 16.6 + 45.6 + 127.6 µs per event; "
        "about half of that was ClickHouse calls (each insert's encoding in Python included; the engine itself "
        "runs without the interpreter lock), per 500-event batch: `trajectories` insert 15 ms, "
        "`m_window_metrics` 12 ms, "
        "`events_raw_in` 10 ms (on the sink's own thread in the worker), the events of new trajectories looked "
        "up 7 ms (they come back empty), `consumptions` 5 ms. The window recomputation was 31.6 µs per event, "
        "assembly 5.3. The owner thread runs those inserts one after the other, in the order that keeps "
        "ClickHouse consistent after a crash (windows, consumptions, records, alerts), and only then starts "
        "the next batch. With the broker's load cut and the derived messages off the owner thread (above) the "
        "worker keeps up with 5,000 events/s here; the informational row of *Freshness* (half the replay "
        "rate) shows the headroom of the run (at 6,650 events/s one run stored ~5,400/s, at 7,500 another "
        "6,869/s: it depends on the host's hour). Writing batch N while deriving batch N+1 (writes still in "
        "order, N+1's offsets committed only after N's and its own writes, both batches retried on any "
        "failure) would overlap ~35 ms of engine time per batch with Python; it changes when a batch counts "
        "as stored, so it needs the reliability suite's crash tests extended to a failure between the two. "
        "The Faust-agent ingestion (`ROLLOUT_INGEST=faust`) is no longer the default: it fell behind a steady "
        "5,000 events/s here (see `docs/architecture.md`, *Two ways to read the raw topics*).",
        "- **Replay at 50,000 events/s** needs a bulk path (large consumer batches, raw rows in bulk, windows "
        "derived once per batch of the whole log) rather than the live path run faster: at the worker's "
        "cost per event (*CPU per event* above) it would take several cores of Python, and the interpreter lock "
        "gives it one. " + _loop_versus_replay_target(pipeline) + "The audit's SQL (`streams/audit_sql`, "
        "every family recomputed from `events_raw`) is a second implementation of the derivation to start "
        "from, not a bulk path as it stands: `rollout audit` of a 298,514-event replay took 50 s, queries and "
        "the comparison in Python together. `python -m bench.bulk_probe` measures that path's phases "
        "in-process over 1,000,000 messages: validation and raw inserts in batches of 50,000, the inserts on "
        "the validating thread 15.9 s (63,106 events/s) and beside it, as the worker's sink does, 12.8 s "
        "(78,263 events/s, near the plain consumer loop's rate); the audit's assembly run once into in-memory "
        "tables: the run's configuration 0.5 s, 214,075 trajectories 4.9 s, 166,400 consumptions 0.7 s (from "
        "the assembled trajectories); then all 15 families on them 2.0 s (0.9 s of it returning every "
        "trajectory to Python): 20.9 s, 47,953 events/s, three times the live path, but with no metric table "
        "written yet. Two changes got it there from 25.9 s (1,002,008 messages, 38,698 events/s): the audit's "
        "assembly (`streams/audit_sql/assembly.sql`) takes the fields it folds out of each payload in one "
        "parse (a named `Tuple`) instead of one parse per field (300,000 messages: trajectories 2.05 -> 1.2 "
        "s, a whole `rollout audit`'s queries 14.9 -> 12.9 s, every family equal), and the probe assembles "
        "the run's configuration once instead of once per family that reads it (0.5-0.9 s each before). "
        "Reading the raw table's typed columns for the event type, trajectory and time instead of the "
        "payload's changed nothing (2.07 / 2.07 against 1.96 / 2.10 s). `rollout replay` "
        "(`streams/replay.py`) is that bulk path, and the replay row above times it on a 1,000,000-event log: "
        "it reads the raw topics to their end, validates (42% of each batch in a helper process) and "
        "deduplicates by event id, stores raw events in batches of 50,000 with the inserts beside validation, "
        "then per run materialises the audit's assembly step by step and writes `trajectories` and "
        "`consumptions` with `INSERT ... SELECT`, `m_window_metrics` with one more (every audit family joined "
        "to the run's windows), and the firing alerts from `streams.regression`; every view equals "
        "the live worker's (*Replay* below; `tests/integration/test_replay.py`). In-process without Kafka "
        "(`python -m bench.bulk_probe`, its last line) the first version took 34.1 s for 1,000,000 messages "
        "(29,365 events/s); since then the helper process took the raw events from 20.9 to 13.5 s, "
        "materialising the parsed events and their per-trajectory fold before the records took the assembly "
        "from 7.5 to ~3.4 s, and inserting without `optimize_on_insert` (each sorting key occurs once per "
        "insert) took the trajectory records from 2.6-2.9 to 0.7-0.9 s: 20-23 s in five runs (44,000-50,000 "
        "events/s). The window rows were then still built in Python from the families' rows "
        "(`window_store.window_row`: 2.6 s in-process for the 17,232 windows of 1,000,000 events, 1.8 s of it "
        "grouping rows and building columns); one `INSERT ... SELECT` that joins every family to the run's "
        "windows (`streams.replay.window_metrics_select`) writes the same rows in 0.6 s, and 1,000,000-event "
        "replays from Kafka, alternated with the code before, went from 19.4 / 19.3 / 19.2 s to 17.7 / 17.4 / "
        "17.3 s (every view equal). py-spy of a replay (100 samples/s, every thread and the helper) then showed "
        "the helper idle 4.6 of its 12 s of raw phase, waiting while the reading thread read and stored, and "
        "the insert thread converting the batch's one ingestion time to ticks row by row (~0.8 s holding the "
        "interpreter lock); with the next batch read and its share queued for the helper before the current "
        "one is validated, and the ingestion time sent as an integer, the raw phase went from 12.3-12.5 to "
        "11.0-11.3 s (alternated, 55,498-56,404 -> 58,606-60,092 events/s). Where the rest goes: ~11 s of "
        "reading, validating and storing raw events with both cores busy (the helper validates 42% of each "
        "batch, the reading thread the rest, and its Python shares the interpreter lock with the insert "
        "thread's encoding), then ~5 s of derivation, the engine's (assembly ~3.7 s, windows and records "
        "side by side ~1.3 s). Larger runs are folded in parts of ~1,000,000 events by trajectory id "
        "(`streams.replay.trajectory_parts`): a 3,000,000-event log, assembled on disk, went from 43,559 "
        "events/s and a peak RSS of 5.2 GB in one part to 53,377 events/s and 2.2 GB in three. The raw phase "
        "is now near what two cores allow (for 1,000,000 events ~12 s of validation, ~5 s of engine inserts "
        "and ~3 s of reading, pickling and deduplicating: ~10 s at best against ~11 s), so a Kafka consumer of "
        "the helper's own would give ~1 s at most; the next real gain is cheaper validation (pydantic is "
        "~7.5 of its ~9 µs per event). "
        "On 2026-12-07, on an AMD EPYC host where the suite's bulk replay ran at 46,854-49,154 events/s (commit "
        "5973cec), "
        "three more levers were measured and not kept: the schema's two Python validators (`schema_version`'s "
        "integer check, `occurred_at`'s conversion to UTC) are 0.27 µs of `validate_json`'s 5.4 per event "
        "(its schema with all 22 of them removed, 100,000 of the bench's messages, warm), so validation is "
        "pydantic-core's own work; handing the helper its share and taking back its results as a few large "
        "objects instead of a tuple per message would save ~1.1 µs of pickling per message it validates, ~0.5 "
        "µs per event in all; and batches of 100,000 instead of 50,000 made the replay of a denser "
        "1,000,000-event log (6,000 trajectories per hour of event time) 14% faster (seven alternated pairs: "
        "median 60,800 against 53,200 events/s, peak RSS +150-200 MiB) but not the replay of the bench's log "
        "(three pairs: 53,370 / 55,565 / 51,705 against 53,524 / 49,801 / 54,438 events/s). The replay row "
        "varies on this host from run to run with the same code: 48,240 events/s in the suite's run at 5973cec (its "
        "runs 46,854-49,154), 59,870 an hour later in `python -m bench --only worker` (58,432-61,275), 56,634 in "
        "the suite's run at 7577d83 two hours after that (the same replay code). "
        "A worker whose backlog is most of its log (a new deployment on a long history, a rebuild) can take this "
        "path too: `rollout replay --hand-off` ends by committing "
        "the worker's consumer group at the offsets it read to, so a worker started on the rebuilt database goes "
        "on from there (`docs/architecture.md`, *Handing the log back to the worker*; the replay always reads the "
        "whole log, so after a short outage in a long run the worker's own catch-up is quicker). "
        "`python -m bench.catch_up "
        "--events 1000000 --pairs 3` (commit 55a7d5a, host loop 0.33 s): a fresh worker alone caught up on a "
        "1,000,000-event backlog in a median of 59.9 s (16,698 events/s), the replay with `--hand-off` and a "
        "worker serving on its database in 23.2 s (43,057 events/s, 2.58x), with the same 14 views; the worker "
        "row above still measures the live path, which every worker uses once it has caught up, and which a "
        "worker whose database already holds the log's runs keeps using (a replay refuses such runs).",
    ]
    return "\n".join(lines)


def _loop_versus_replay_target(pipeline: Any) -> str:
    """Whether the plain consumer loop of this run itself reads 50,000 events/s (the replay target)."""
    if pipeline is None:
        return ""
    if pipeline.baseline < 50_000:
        return (f"Here even the plain consumer loop, which only decodes JSON and stores raw rows, reads fewer "
                f"({pipeline.baseline:,.0f} events/s): no path that also validates each event in Python "
                "reaches it on this host. ")
    return (f"The plain consumer loop, which only decodes JSON and stores raw rows, reads "
            f"{pipeline.baseline:,.0f} events/s here, so the engine and librdkafka are not what stands in "
            "the way; validation (`streams.records.classify`: pydantic, then the canonical payload) costs about "
            "9 µs of Python per event (200,000 of the bench's messages in-process, `streams.replay.validate`). ")


def _ingest() -> str:
    from bench.stack import INGEST

    return INGEST["mode"]


def _batch_seconds() -> float:
    return _defaults().sink_batch_seconds


def _defaults() -> Settings:
    from rollout.settings import Settings

    return Settings()
