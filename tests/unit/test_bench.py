"""The benchmark harness's pure parts: percentiles, rates, latencies, flatness, targets, tables, profiles."""

from __future__ import annotations

import argparse
import math
import os
import re
import signal
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from statistics import median
from typing import Any

import pytest

from bench.cli import at_least
from bench.config import FULL, QUICK
from bench.dashboards import alert_cases, expand, panel_cases, ranges, variable_cases
from bench.document import build_rows, render_document
from bench.freshness import FreshnessResult
from bench.machine import Machine, wait_until_quiet
from bench.measure import (
    INF,
    cpu_per_event,
    halves,
    memory_flatness,
    paired_ratio,
    percentile,
    sustained_rate,
    visibility_latencies,
)
from bench.pipeline import compare_views
from bench.profile import (
    NATIVE,
    analyse,
    cpu_by_role,
    cpu_of_other_threads,
    is_idle,
    kind,
    parse_raw,
    step,
    task_cpu_seconds,
    thread_names,
)
from bench.report import GIB, HEADERS, Row, Target, format_value, markdown_table, table_cells, text_table
from bench.runner import Results
from bench.stack import deliver_all
from bench.workload import Encoded
from producers.kafka import ProducerStats
from rollout.commands.bench import recorded_command
from rollout.settings import Settings

# -- percentiles -----------------------------------------------------------------------------------


def test_percentile_interpolates_linearly_between_closest_ranks() -> None:
    values = list(range(1, 101))  # 1..100
    assert percentile(values, 0) == 1
    assert percentile(values, 100) == 100
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile([3.0], 95) == 3.0
    assert percentile([10.0, 20.0], 50) == 15.0


def test_percentile_ignores_input_order() -> None:
    assert percentile([5, 1, 4, 2, 3], 50) == 3


def test_percentile_falls_on_censored_samples_as_infinite() -> None:
    values = [1.0, 2.0, 3.0, INF]
    assert percentile(values, 50) == 2.5
    assert percentile(values, 99) == INF
    assert percentile([INF, INF], 0) == INF


def test_percentile_refuses_nothing_and_bad_quantiles() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


# -- rates -----------------------------------------------------------------------------------------


def test_sustained_rate_excludes_the_warm_up() -> None:
    # 10 s of start-up with nothing, then 1,000 events/s.
    samples = [(0.0, 0), (10.0, 0)] + [(10.0 + i, 1000 * i) for i in range(1, 11)]
    rate = sustained_rate(samples, 10_000, warmup_fraction=0.1)
    assert rate.per_second == pytest.approx(1000.0)
    assert rate.warmup_events == 1000
    assert rate.events == 9000


def test_cpu_per_event_covers_the_span_the_rate_measures() -> None:
    # Start-up burns 5 CPU seconds with nothing consumed; then 2 ms of CPU per 1,000 events.
    samples = [(0.0, 0), (10.0, 0)] + [(10.0 + i, 1000 * i) for i in range(1, 11)]
    cpu = [0.0, 5.0] + [5.0 + 0.002 * i for i in range(1, 11)]
    assert cpu_per_event(samples, cpu, 10_000) == pytest.approx(0.002 / 1000)
    assert cpu_per_event(samples, cpu[:-1], 10_000) is None  # lists that do not pair up
    assert cpu_per_event([(0.0, 0), (1.0, 10)], [0.0, 1.0], 100) is None  # the total never reached


def test_sustained_rate_needs_the_total() -> None:
    with pytest.raises(ValueError):
        sustained_rate([(0.0, 0), (1.0, 10)], 100)


def test_sustained_rate_when_everything_lands_in_one_sample() -> None:
    rate = sustained_rate([(0.0, 0), (2.0, 100)], 100)
    assert rate.per_second == pytest.approx(50.0)


def test_halves_show_a_slowdown() -> None:
    samples = [(float(t), n) for t, n in [(0, 0), (1, 100), (10, 550), (30, 1000)]]
    early, late = halves(samples, 1000)
    assert early == pytest.approx(450 / 9)
    assert late == pytest.approx(450 / 20)


# -- freshness ---------------------------------------------------------------------------------------


def test_visibility_latency_is_the_first_poll_covering_the_kth_finish() -> None:
    finishes = [("w1", 100.0), ("w1", 101.0), ("w2", 102.0), ("w1", 100.5)]
    polls = [(100.2, {"w1": 1}), (101.0, {"w1": 2}), (103.0, {"w1": 3, "w2": 1})]
    latencies = visibility_latencies(finishes, polls)
    # Aligned with the input: w1@100 first seen at 100.2, w1@100.5 at 101.0, w1@101 at 103.0, w2@102 at 103.0.
    assert latencies == pytest.approx([0.2, 2.0, 1.0, 0.5])


def test_finishes_never_covered_are_censored() -> None:
    latencies = visibility_latencies([("w", 1.0), ("w", 2.0)], [(5.0, {"w": 1})])
    assert latencies[0] == 4.0 and latencies[1] == INF


def test_counts_above_the_published_finishes_do_not_overflow() -> None:
    assert visibility_latencies([("w", 1.0)], [(1.5, {"w": 7})]) == [0.5]


# -- memory ------------------------------------------------------------------------------------------


def test_flat_memory() -> None:
    samples = [(n, 500 * 1024**2 + (n % 3) * 1024**2) for n in range(0, 100_001, 1000)]
    flat = memory_flatness(samples)
    assert flat.flat
    assert abs(flat.growth_bytes) < 5 * 1024**2


def test_growing_memory_is_not_flat_and_is_extrapolated() -> None:
    # 1 KiB per event after a 400 MiB start.
    samples = [(n, 400 * 1024**2 + n * 1024) for n in range(0, 100_001, 1000)]
    flat = memory_flatness(samples)
    assert not flat.flat
    assert flat.growth_per_million_events == pytest.approx(1_000_000 * 1024, rel=0.01)


# -- targets and tables ------------------------------------------------------------------------------


def test_ratio_targets() -> None:
    row = Row("SDK publish", "events/s", 40_000.0, 100_000.0, targets=(Target("ratio_at_least", 0.5),))
    assert row.ratio == pytest.approx(0.4)
    assert row.met is False
    row.value = 60_000.0
    assert row.met is True


def test_a_paired_ratio_is_the_median_of_the_pairs_ratios() -> None:
    # The host slowed down after the first pair: each pair's ratio is 0.6, the two medians' 80/120 = 0.67.
    values, baselines = [120.0, 80.0, 60.0], [200.0, 120.0, 100.0]
    assert paired_ratio(values, baselines) == pytest.approx(0.6)
    assert paired_ratio([1.0, 3.0], [2.0, 2.0]) == pytest.approx(1.0)  # median of 0.5 and 1.5
    row = Row("SDK publish", "events/s", 80.0, 120.0, targets=(Target("ratio_at_least", 0.65),),
              paired_ratio=paired_ratio(values, baselines))
    assert row.ratio == pytest.approx(0.6)
    assert row.met is False  # value / baseline alone would say yes
    for bad in (([1.0], [1.0, 2.0]), ([], []), ([1.0], [0.0])):
        with pytest.raises(ValueError):
            paired_ratio(*bad)


def test_every_condition_must_hold() -> None:
    targets = (Target("ratio_at_least", 0.3), Target("at_least", 20_000))
    assert Row("worker", "events/s", 10_000.0, 20_000.0, targets=targets).met is False  # ratio ok, absolute not
    assert Row("worker", "events/s", 25_000.0, 20_000.0, targets=targets).met is True


def test_checks_and_unknowns() -> None:
    targets = (Target("at_least", 50_000), Target("holds", check="identical to live"))
    fast_but_different = Row("replay", "events/s", 60_000.0, targets=targets, checks={"identical to live": False})
    assert fast_but_different.met is False
    unknown = Row("replay", "events/s", None, targets=targets)
    assert unknown.met is False or unknown.met is None
    assert Row("x", "s", None, targets=(Target("at_most", 1.0),)).met is None
    assert Row("x", "s", 2.0).met is None  # no target


def test_latency_targets_with_censored_values() -> None:
    row = Row("freshness p99", "s", math.inf, targets=(Target("at_most", 3.0),))
    assert row.met is False
    assert format_value(math.inf, "s") == "never (censored)"


def test_format_value() -> None:
    assert format_value(12345.6, "events/s") == "12,346 events/s"
    assert format_value(0.84, "s") == "0.84 s"
    assert format_value(42.0, "s") == "42 s"
    assert format_value(87.4, "ms") == "87 ms"
    assert format_value(3.21, "ms") == "3.2 ms"
    assert format_value(4153.2, "ms") == "4,153 ms"
    assert format_value(812 * 1024**2, "bytes") == "812 MiB"
    assert format_value(float(GIB), "bytes") == "1.00 GiB"
    assert format_value(None, "s") == "-"


def test_table_cells_and_markdown() -> None:
    rows = [Row("SDK publish", "events/s", 40_000.0, 100_000.0, "raw", (Target("ratio_at_least", 0.5),),
                note="a | b")]
    cells = table_cells(rows)
    assert cells == [["SDK publish", "40,000 events/s", "100,000 events/s (raw)", "0.40x", ">= 0.5x baseline",
                      "NO", "a | b"]]
    text = markdown_table(HEADERS, cells)
    lines = text.splitlines()
    assert lines[0].startswith("| benchmark | value |")
    assert lines[1] == "| --- | --- | --- | --- | --- | --- | --- |"
    assert "a \\| b" in lines[2]


def test_text_table_aligns_and_cuts() -> None:
    text = text_table(("a", "bb"), [["1", "x" * 60], ["22", "y"]], max_width=10)
    lines = text.splitlines()
    assert lines[0] == "a   bb"
    assert lines[1] == "--  ----------"
    assert lines[2] == "1   xxxxxxx..."
    assert lines[3] == "22  y"


# -- the rest ----------------------------------------------------------------------------------------


def test_quiet_wait_checks_until_below_the_threshold() -> None:
    loads = iter([3.0, 2.0, 1.2])
    slept: list[float] = []
    result = wait_until_quiet(max_load=1.5, interval=30, timeout=600, load=lambda: next(loads),
                              sleep=slept.append, log=lambda _: None)
    assert result.quiet and result.waited_s == 60 and result.loads == (3.0, 2.0, 1.2)
    assert slept == [30, 30]


def test_quiet_wait_gives_up_after_the_timeout() -> None:
    result = wait_until_quiet(max_load=1.5, interval=30, timeout=90, load=lambda: 4.0, sleep=lambda _: None,
                              log=lambda _: None)
    assert not result.quiet and result.waited_s == 90 and len(result.loads) == 4


def test_sizes_overrides_keep_the_preset_for_none() -> None:
    sizes = QUICK.with_overrides({"log_events": 5000, "sdk_events": None})
    assert sizes.log_events == 5000 and sizes.sdk_events == QUICK.sdk_events
    assert FULL.month_events == 10_000_000 and FULL.month_days == 30


def test_view_comparison() -> None:
    live = {"v_a": [(1, "x")], "v_b": [(2,)], "v_c": [(3,)]}
    replay = {"v_a": [(1, "x")], "v_b": [(9,)]}
    compared, differences = compare_views(live, replay)
    assert compared == {"v_a": 1, "v_b": 1}
    assert set(differences) == {"v_b", "v_c"}


RAW = """\
thread (1): MainThread;run (asyncio/base_events.py:1);select (selectors.py:468) 40
thread (1): MainThread;process (streams/app.py:150);classify (streams/records.py:80);\
decode_event (schemas/parse.py:50) 10
thread (2): clickhouse_0;Thread.run (threading.py:982);_worker (concurrent/futures/thread.py:81) 20
thread (2): clickhouse_0;persist (streams/app.py:145);Deriver.derive (streams/derive.py:121);\
OwnerState._load_events (streams/state.py:150);Client.query (clickhouse_connect/driver/client.py:469);\
Connection.query (chdb/state/sqlitelike.py:756) 20
thread (2): clickhouse_0;persist (streams/app.py:145);Deriver.derive (streams/derive.py:124);\
OwnerState._load_events (streams/state.py:160);decode_event (schemas/parse.py:56) 5
thread (2): clickhouse_0;persist (streams/app.py:145);ClickHouseSink.write (streams/sink_clickhouse.py:61);\
ClickHouseSink._drop_stored_by_query (streams/sink_clickhouse.py:80);Client.query (clickhouse_connect/a.py:4) 5
"""


def test_profile_attributes_samples_to_threads_steps_and_kinds() -> None:
    samples = parse_raw(RAW)
    assert [s.thread for s in samples][:3] == ["MainThread", "MainThread", "clickhouse_0"]
    profile = analyse(samples, seconds=1.0)
    owner = profile.roles["ClickHouse owner"]
    assert (owner.samples, owner.idle, owner.busy) == (50, 20, 30)
    assert owner.steps["load: stored events of trajectories"] == 25
    assert owner.steps["sink: duplicate check (query)"] == 5
    assert owner.kinds["ClickHouse engine (chdb: query execution)"] == 20
    assert owner.kinds["decode events (pydantic)"] == 5
    assert owner.kinds["ClickHouse client (bind, encode, parse)"] == 5
    loop = profile.roles["event loop"]
    assert (loop.samples, loop.idle) == (50, 40)
    assert loop.steps["validate messages (records.classify)"] == 10
    assert profile.seconds_of("ClickHouse owner", 25) == pytest.approx(0.5)


def test_profile_threads_cpu_by_role() -> None:
    names = thread_names(RAW + "thread (3): clickhouse_0 7\n")
    assert names == {1: "MainThread", 2: "clickhouse_0", 3: "clickhouse_0"}
    used = cpu_by_role({1: 1.0, 2: 5.0, 9: 0.5}, {1: 1.5, 2: 7.0, 3: 0.25, 9: 0.75, 10: 0.1}, names)
    assert used == pytest.approx({"event loop": 0.5, "ClickHouse owner": 2.25, NATIVE: 0.35})
    names.update({4: "sink-insert_0", 5: "sink-insert_1", 6: "gc-freezer", 7: "Thread-1"})
    others = cpu_of_other_threads({4: 1.0, 6: 2.0}, {2: 9.0, 4: 1.5, 5: 0.25, 6: 2.5, 7: 0.0, 10: 3.0}, names)
    # one pool's threads added up under its prefix; the owner, the event loop and unnamed threads left out
    assert others == pytest.approx({"sink-insert": 0.75, "gc-freezer": 0.5, "Thread-1": 0.0})
    mine = task_cpu_seconds(os.getpid())
    assert threading.get_native_id() in mine and all(v >= 0 for v in mine.values())


def test_profile_attribution_rules() -> None:
    assert is_idle(("run (asyncio/base_events.py:1)", "EpollSelector.select (selectors.py:468)"))
    assert not is_idle(("Deriver._write_windows (streams/derive.py:260)",))
    assert step(("Deriver._derive_run (streams/derive.py:1)", "OwnerState.window_members (streams/state.py:2)")) \
        == "load: window members"
    assert step(("ClickHouseSink._drop_stored (streams/sink_clickhouse.py:1)",)) \
        == "sink: duplicate check (cached trajectories)"
    assert step(("foo (x.py:1)",)) == "other"
    assert kind(("window_rows (streams/metrics.py:10)",)) == "window metrics"
    assert kind(("foo (x.py:1)",)) == "other Python"


def test_every_dashboard_query_expands_without_variables_or_macros_left() -> None:
    start, end = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 31, tzinfo=UTC)
    spans = ranges(start, end)
    assert list(spans) == ["last 6 h", "all 30 d"]
    cases = [*variable_cases(), *panel_cases(), *alert_cases()]
    assert len([c for c in cases if c.kind == "panel"]) >= 30
    assert len([c for c in cases if c.kind == "alert"]) >= 5
    for case in cases:
        sql = expand(case, time_range=spans["last 6 h"], run="r", domains=["a", "b"], drill_down="a")
        assert "$" not in sql, case.name


def _empty_results(**changes: object) -> Results:
    machine = Machine(cores=2, cpu="cpu", memory_bytes=GIB, load_at_start=(0.5, 0.4, 0.3), kernel="k", python="3")
    results = Results(command="python -m bench --quick", quick=True, sizes=QUICK, machine=machine, quiet=None,
                      started=datetime(2026, 1, 1, tzinfo=UTC), density_per_hour=1000.0,
                      selected=("sdk", "worker", "profile", "freshness", "dashboards"))
    for name, value in changes.items():
        setattr(results, name, value)
    return results


def test_a_run_where_everything_failed_still_renders_every_row() -> None:
    results = _empty_results(errors={"worker and replay": "RuntimeError: boom"},
                             finished=datetime(2026, 1, 1, 0, 5, tzinfo=UTC))
    rows = build_rows(results)
    assert [r.name for r in rows] == [
        "SDK publish", "worker", "freshness p50", "freshness p99", "replay", "dashboard queries, last 6 h",
        "dashboard queries, whole month", "memory (worker peak RSS)"]
    assert all(r.value is None and r.met is None for r in rows)
    assert rows[1].note.startswith("failed: RuntimeError: boom")
    document = render_document(results)
    assert document.startswith("# Performance")
    assert "`python -m bench --quick`" in document
    assert "Quick mode" in document


def test_a_complete_run_renders_every_section() -> None:
    from bench.measure import Rate
    from bench.pipeline import PipelineResult
    from bench.publish import Burst, PublishResult, Run
    from bench.runner import ProfileRun
    from bench.stack import Progress

    samples = [(i * 0.25, i * 100, 500 * 1024**2 + (i % 5) * 1024**2) for i in range(401)]
    progress = Progress(samples=samples, peak_rss=520 * 1024**2)
    pipeline = PipelineResult(
        events=40_000, topic_prefix="p", live=Rate(36_000, 40.0, 4000, 2.0), live_progress=progress,
        replay=Rate(36_000, 30.0, 4000, 2.0), replay_progress=progress, replay_stats={"stored": 40_000},
        baseline_rates=[30_000.0, 31_000.0], baseline_runs=[Rate(36_000, 1.2, 4000, 0.1)] * 2, publish_seconds=1.0,
        views_compared={"v_a": 3, "v_b": 2}, view_differences={"v_b": "2 live rows vs 1 replayed"},
        replay_busy=0.95,
        baseline_cpu_per_event=[10e-6, 12e-6, 11e-6], replay_cpu_per_event=800e-6,
        replay_runs=[Rate(36_000, 1.2, 4000, 0.1)] * 2,
    )
    fresh = FreshnessResult(rate=5000.0, seconds=10.0, published=50_000, achieved_rate=4990.0,
                            latencies=[0.5, 1.0, 2.0, INF], warmup_s=1.0, drain_limit_s=30.0, poll_interval_s=0.2,
                            polls=100, consumed_samples=[(0.0, 0), (1.0, 900), (10.0, 9000)])
    profile = analyse(parse_raw(RAW), seconds=10.0)
    query = {"kind": "panel", "board": "b", "title": "t", "ref": "A", "rows": 3, "error": None,
             "samples_ms": [50.0, 60.0, 70.0], "p50_ms": 60.0, "p95_ms": 69.0}
    inprocess = {
        "seed": {"events": 1000, "trajectories": 200, "hours": 1.0, "start": "2026-01-01T00:00:00+00:00",
                 "versions": 6, "domains": ["a"], "batches": 1, "batch_size": 2000, "seconds": 0.5,
                 "phases": {"classify": 0.1, "sink.write": 0.1, "derive": 0.3},
                 "calls": [{"caller": "_recompute", "kind": "insert", "calls": 10, "seconds": 0.05}]},
        "month": {"copies": 720, "shift_s": 3600, "start": "2026-01-01T00:00:00+00:00",
                  "end": "2026-01-31T00:00:00+00:00", "events_equivalent": 720_000, "rows": {"m_window_metrics": 10},
                  "windows": 10, "load_seconds": 1.0, "settle_seconds": 0.0, "dropped_seed_windows": 2},
        "queries": [{**query, "range": "last 6 h"}, {**query, "range": "all 30 d", "p95_ms": 150.0}],
        "probes": [{"title": "v_windows", "sql": "SELECT 1", "error": None, "samples_ms": [1.0], "p50_ms": 1.0}],
        "explain": {"sql": "SELECT 1", "tables": ["db.m_window_metrics"], "final": True, "granules": "4/22"},
        "seconds": 1.0, "budget_s": 1.0, "max_repeats": 20,
        "ranges": {"last 6 h": ["2026-01-30T18:00:00+00:00", "2026-01-31T00:00:00+00:00"]},
    }
    results = _empty_results(
        publish=PublishResult(1000, {"SDK": [Run(40_000.0, 6.0, 9.0), Run(50_000.0, 5.0, 8.0)],
                                     "raw": [Run(100_000.0, 3.0, 4.0), Run(90_000.0, 3.5, 4.5)],
                                     "loop": [Run(50_000.0, 5.0, 6.0), Run(40_000.0, 6.0, 7.0)]},
                              {"acks": "all"}, True, Burst(3000, Run(45_000.0, 5.0, 8.0), 0)),
        pipeline=pipeline, freshness=fresh, sustainable=fresh, inprocess=inprocess,
        profile=ProfileRun(profile, 50, 20_000, 10, 0.5, gil=profile, gil_share=0.6,
                           cpu={"ClickHouse owner": 2.0, "event loop": 1.0, NATIVE: 0.5}, cpu_wall_s=10.0,
                           cpu_others={"sink-insert": 0.3, "gc-freezer": 0.1}),
        finished=datetime(2026, 1, 1, 0, 12, tzinfo=UTC),
    )
    rows = {r.name: r for r in build_rows(results)}
    assert rows["SDK publish"].ratio == pytest.approx((40_000 / 100_000 + 50_000 / 90_000) / 2)  # pairs' median
    assert rows["worker"].ratio == pytest.approx((36_000 / 1.2 / 30_000 + 36_000 / 1.2 / 31_000) / 2)
    assert rows["replay"].met is False and rows["replay"].checks == {"identical to live": False}
    assert rows["dashboard queries, last 6 h"].met is True
    assert rows["dashboard queries, whole month"].met is False
    assert rows["memory (worker peak RSS)"].scaled
    assert rows["freshness p99"].value == INF
    document = render_document(results)
    for heading in ("## Results", "## How it was measured", "## What was scaled down, and why", "### SDK publish",
                    "### Worker throughput", "### Freshness", "### Replay", "### Dashboard queries", "### Memory",
                    "## Where the time goes", "**The GIL.**", "**Without Kafka and Faust.**"):
        assert heading in document, heading
    assert "the row's ratio the median of the pairs' ratios (1.00x / 0.97x)" in document
    assert "| 1 (SDK first) | 40,000 | 100,000 | 0.40x | 50,000 | 0.80x | 0.50x |" in document
    assert "The SDK reached a median 1.02x of it" in document  # pairs' SDK / loop: 0.80x and 1.25x
    assert rows["SDK publish"].note.endswith("; the SDK at 1.02x of a bare encode-and-produce loop")
    # CPU per event: the median of each side's runs, sending thread and whole process
    assert "| side | sending thread | whole process |" in document
    assert "| SDK | 5.5 | 8.5 |" in document and "| raw produce (baseline) | 3.2 | 4.2 |" in document
    assert "| encode-and-produce loop | 5.5 | 6.5 |" in document
    assert ("sent the events 3 times over without a pause (3,000 messages; librdkafka's send queue holds 100,000, "
            "`queue.buffering.max.messages`): 45,000 events/s, 5.0 / 8.0 µs of CPU per event (sending thread / "
            "process), 0 messages spooled") in document
    # owner: busy 30 of 50 samples, 2.0 s of CPU in 10 s; 20,000 events
    assert "| ClickHouse owner | 60% | 40% | 600 | 20% | 100.0 |" in document
    assert f"| {NATIVE} | - | - | - | 5% | 25.0 |" in document
    assert "| `sink-insert` | 3% | 15.0 |\n| `gc-freezer` | 1% | 5.0 |" in document  # largest first
    assert "The Python threads used 0.30 of a core (150.0 µs per event). The owner thread was busy in 60% of " \
           "py-spy's samples but on a CPU 20% of the time" in document
    assert "waited for it about 40% of the time" in document
    assert "| 2 (raw first) | 50,000 | 90,000 | 0.56x | 40,000 | 1.25x | 0.44x |" in document
    assert "reads `db.m_window_metrics` with FINAL, narrowed to 4/22 granules by the primary key" in document
    # 1,200 events/s x 800 µs; 0.3 x 30,500 events/s x 800 µs; 20,000 events/s x 800 µs
    assert "11.0 µs of CPU per event in the plain consumer loop (median of its runs) and 800.0 µs in the replay " \
           "worker, 72.7 times as much. At its rate the worker kept 0.96 of the machine's 2 cores busy (all " \
           "processes together: 95% of the machine" in document
    assert "0.3x the loop's rate would keep 7.32 cores busy and 20,000 events/s 16.00; the worker runs at about " \
           "one core" in document


def test_the_host_speed_line_gives_the_loop_at_both_ends_of_the_run() -> None:
    from bench.document import _speed_lines
    from bench.machine import Machine, python_loop_seconds

    machine = Machine(cores=2, cpu="x", memory_bytes=0, load_at_start=(0.0, 0.0, 0.0), kernel="k", python="3")
    assert _speed_lines(machine) == []
    machine.loop_seconds = (1.04, 1.61)
    (line,) = _speed_lines(machine)
    assert line.startswith("- **Host speed:** a 10,000,000-iteration Python loop") and \
        "took 1.04 s at the start and 1.61 s at the end" in line
    assert 0 < python_loop_seconds(repeats=1) < 60


def test_the_worker_without_derivation_gives_the_derivations_share_and_what_0_3x_leaves_it() -> None:
    from bench.document import _derivation_text
    from bench.measure import Rate
    from bench.pipeline import PipelineResult
    from bench.stack import Progress

    def pipeline(bare_cpu: float | None, loop: float = 100_000.0) -> PipelineResult:
        # the full worker: 20,000 events/s at 50 µs per event, one core
        return PipelineResult(
            events=40_000, topic_prefix="p", live=Rate(40_000, 4.0, 0, 0.0), live_progress=Progress(),
            replay=Rate(40_000, 2.0, 0, 0.0), replay_progress=Progress(), replay_stats={},
            baseline_rates=[loop], baseline_runs=[Rate(40_000, 0.4, 0, 0.0)], publish_seconds=1.0,
            replay_cpu_per_event=50e-6, without_derivation=Rate(40_000, 1.0, 0, 0.0),
            without_derivation_cpu_per_event=bare_cpu)

    assert _derivation_text(pipeline(None)) == ""
    text = _derivation_text(pipeline(25e-6))
    assert "40,000 events/s, 0.40x the plain loop's median, at 25.0 µs of CPU per event against the full " \
           "worker's 50.0. By difference the derivation takes 50% of the worker's CPU per event" in text
    # 0.3 x 100,000 events/s on 1.00 core: 33.3 µs per event, 8.3 of them left for the derivation's 25.0
    assert "0.3x of the loop needs 33.3 µs per event: the derivation cut to 33% of its cost" in text
    assert "less than the worker costs without deriving anything" in _derivation_text(pipeline(40e-6))
    assert "needs no cut" in _derivation_text(pipeline(25e-6, loop=50_000.0))


def test_replays_alternate_with_the_baseline_and_the_memory_row_takes_the_highest_peak() -> None:
    from bench.measure import Rate
    from bench.pipeline import PipelineResult
    from bench.stack import Progress

    mib = 1024**2
    low = Progress(samples=[(i * 0.25, i * 100, 500 * mib) for i in range(401)], peak_rss=520 * mib)
    high = Progress(samples=[(i * 0.25, i * 100, 600 * mib) for i in range(401)], peak_rss=640 * mib)
    replays = [Rate(36_000, 2.0, 4000, 2.0), Rate(30_000, 2.0, 4000, 2.0), Rate(33_000, 2.0, 4000, 2.0)]
    pipeline = PipelineResult(
        events=40_000, topic_prefix="p", live=Rate(36_000, 40.0, 4000, 2.0), live_progress=low,
        replay=replays[2], replay_progress=low, replay_stats={"stored": 40_000},
        baseline_rates=[90_000.0, 80_000.0, 100_000.0],
        baseline_runs=[Rate(36_000, 0.4, 4000, 0.1), Rate(36_000, 0.45, 4000, 0.1), Rate(36_000, 0.36, 4000, 0.1)],
        publish_seconds=1.0, views_compared={"v_a": 3}, replay_runs=replays,
        replay_peaks=[520 * mib, 640 * mib, 520 * mib], memory_progress=high,
    )
    results = _empty_results(pipeline=pipeline, finished=datetime(2026, 1, 1, 0, 12, tzinfo=UTC))
    rows = {r.name: r for r in build_rows(results)}
    assert rows["worker"].value == 16_500 and rows["worker"].baseline == 90_000  # the median run of each side
    assert rows["memory (worker peak RSS)"].value == 640 * mib
    document = render_document(results)
    table = [line.split(" | ")[0].lstrip("| ") for line in document.splitlines()
             if line.startswith(("| plain consumer loop", "| replay worker"))]
    assert table == ["plain consumer loop, run 1", "replay worker, run 1 (fresh folder and group)",
                     "plain consumer loop, run 2", "replay worker, run 2 (fresh folder and group)",
                     "plain consumer loop, run 3", "replay worker, run 3 (fresh folder and group)"]
    assert "their peaks: 520 / 640 / 520 MiB" in document
    assert "(`VmHWM`): 640 MiB" in document


def test_the_memory_row_is_the_worker_that_replayed_the_bulk_log_when_there_is_one() -> None:
    from bench.measure import Rate
    from bench.pipeline import LogReplay, PipelineResult
    from bench.stack import Progress

    mib = 1024**2
    short = Progress(samples=[(i * 0.25, i * 100, 500 * mib) for i in range(401)], peak_rss=520 * mib)
    # RSS climbs over the first quarter (caches filling), then stays level: flat after warm-up.
    long = Progress(samples=[(i * 0.25, i * 2500, (400 + min(i, 100)) * mib) for i in range(401)],
                    peak_rss=777 * mib)
    pipeline = PipelineResult(
        events=40_000, topic_prefix="p", live=Rate(36_000, 40.0, 4000, 2.0), live_progress=short,
        replay=Rate(36_000, 2.0, 4000, 2.0), replay_progress=short, replay_stats={"stored": 40_000},
        baseline_rates=[90_000.0], baseline_runs=[Rate(36_000, 0.4, 4000, 0.1)], publish_seconds=1.0,
        views_compared={"v_a": 3}, replay_runs=[Rate(36_000, 2.0, 4000, 2.0)], replay_peaks=[520 * mib],
        memory_progress=short,
        memory_log=LogReplay(1_000_000, Rate(900_000, 50.0, 100_000, 5.0), long))
    results = _empty_results(pipeline=pipeline, finished=datetime(2026, 1, 1, 0, 12, tzinfo=UTC))
    row = next(r for r in build_rows(results) if r.name == "memory (worker peak RSS)")
    assert row.value == 777 * mib and row.met is True
    assert row.note.startswith("a fresh worker replaying the bulk replay's log over 1,000,000 events")
    assert "~9 min" in row.note  # 10,000,000 events at 18,000 events/s (900,000 in 50 s)
    document = render_document(results)
    assert "that read the bulk replay's 1,000,000-message log after the bulk replays, at 18,000 events/s" in document
    assert "The replays of the 40,000-event log peaked at 520 MiB, the live worker at 520 MiB" in document
    # At 1,000 events/h the records (20,000 x 4.66 events) fill last; a quarter of 1,000,000 events is past them.
    assert "caches fill during the first ~93,000 events at this density" in document
    assert "this run's first quarter covers that." in document

    failed = _empty_results(pipeline=pipeline, errors={"memory: a worker replaying": "RuntimeError: boom"})
    row = next(r for r in build_rows(failed) if r.name == "memory (worker peak RSS)")
    assert row.value is None and row.note == "failed: RuntimeError: boom"


def test_the_plain_loop_keeps_its_own_batch_size_and_the_row_says_when_the_workers_differ() -> None:
    import dataclasses

    from bench.config import DEFAULT_BATCH_SIZE
    from bench.measure import Rate
    from bench.pipeline import PipelineResult, _reader_arguments
    from bench.stack import Progress

    progress = Progress(samples=[(i * 0.25, i * 100, 500 * 1024**2) for i in range(401)], peak_rss=520 * 1024**2)
    pipeline = PipelineResult(
        events=40_000, topic_prefix="p", live=Rate(36_000, 40.0, 4000, 2.0), live_progress=progress,
        replay=Rate(36_000, 2.0, 4000, 2.0), replay_progress=progress, replay_stats={"stored": 40_000},
        baseline_rates=[90_000.0], baseline_runs=[Rate(36_000, 0.4, 4000, 0.1)], publish_seconds=1.0,
        views_compared={"v_a": 3}, replay_runs=[Rate(36_000, 2.0, 4000, 2.0)], replay_peaks=[520 * 1024**2],
        memory_progress=progress)
    same = _empty_results(pipeline=pipeline, finished=datetime(2026, 1, 1, 0, 12, tzinfo=UTC))
    assert "(plain loop)" not in next(r for r in build_rows(same) if r.name == "worker").note
    apart = _empty_results(pipeline=pipeline, finished=datetime(2026, 1, 1, 0, 12, tzinfo=UTC),
                           sizes=dataclasses.replace(QUICK, batch_size=20_000))
    assert QUICK.baseline_batch_size == DEFAULT_BATCH_SIZE  # --batch-size alone leaves the loop's batches alone
    note = next(r for r in build_rows(apart) if r.name == "worker").note
    assert note.endswith(f"; batches of 20,000 (worker) and {DEFAULT_BATCH_SIZE:,} (plain loop)")
    assert f"batch insert of up to {DEFAULT_BATCH_SIZE:,} rows into chdb" in render_document(apart)

    settings = Settings(sink_batch_size=20_000)
    arguments = _reader_arguments(settings, Path("/w"), "baseline-0", 100, 60.0, batch_size=7_000)
    assert arguments[arguments.index("--batch-size") + 1] == "7000"
    arguments = _reader_arguments(settings, Path("/w"), "faust-floor", 100, 60.0)
    assert arguments[arguments.index("--batch-size") + 1] == "20000"


def test_the_bulk_replay_row_is_the_median_of_the_runs_after_the_warm_up() -> None:
    from bench.measure import Rate
    from bench.pipeline import PipelineResult
    from bench.stack import Progress

    def bulk(seconds: float) -> dict[str, Any]:
        return {"messages": 1_000_000, "seconds": seconds, "load_seconds": seconds / 2, "wall_seconds": seconds + 1,
                "peak_rss": 2048 * 1024**2, "runs": [{"seconds": {"assembly": 1.0, "windows": 0.5}}]}

    progress = Progress(samples=[(i * 0.25, i * 100, 500 * 1024**2) for i in range(401)], peak_rss=520 * 1024**2)
    pipeline = PipelineResult(
        events=40_000, topic_prefix="p", live=Rate(36_000, 40.0, 4000, 2.0), live_progress=progress,
        replay=Rate(36_000, 2.0, 4000, 2.0), replay_progress=progress, replay_stats={"stored": 40_000},
        baseline_rates=[90_000.0], baseline_runs=[Rate(36_000, 0.4, 4000, 0.1)], publish_seconds=1.0,
        views_compared={"v_a": 3}, bulk_log_warm_up=bulk(40.0), bulk_log_runs=[bulk(16.0), bulk(20.0), bulk(18.0)],
    )
    rows = {r.name: r for r in build_rows(_empty_results(pipeline=pipeline))}
    assert rows["replay"].value == pytest.approx(1_000_000 / 18.0)  # the slow warm-up is not counted
    document = render_document(_empty_results(pipeline=pipeline))
    assert "median of 3 runs, after a warm-up run" in document
    labels = [line.split(" | ")[0].lstrip("| ") for line in document.splitlines()
              if line.startswith("| bulk replay of the")]
    assert labels == ["bulk replay of the 1,000,000-message log, warm-up (not counted)",
                      *(f"bulk replay of the 1,000,000-message log, run {i}" for i in (1, 2, 3))]


def test_the_reported_replay_is_the_median_one_and_memory_the_highest_peak() -> None:
    from bench.measure import Rate
    from bench.pipeline import _Replay, median_and_highest
    from bench.stack import Progress

    def run(events: int, peak: int) -> _Replay:
        return _Replay(Rate(events, 1.0, 0, 0.0), Progress(samples=[], peak_rss=peak), {}, None, 0.5, {})

    a, b, c = run(18_000, 700), run(15_000, 800), run(17_000, 600)
    assert median_and_highest([a, b, c]) == (c, b)
    assert median_and_highest([a]) == (a, a)
    assert median_and_highest([a, b]) == (b, b)  # an even count reports the lower middle


def test_busy_share_counts_every_process_and_is_capped() -> None:
    from bench.machine import CpuMark, busy_share

    before = CpuMark(at=100.0, machine=1000.0, own=50.0)
    assert busy_share(before, CpuMark(at=110.0, machine=1015.0, own=58.0), cores=2) == pytest.approx(0.75)
    assert busy_share(before, CpuMark(at=110.0, machine=1030.0, own=58.0), cores=2) == 1.0  # clock skew: capped
    assert busy_share(before, before, cores=2) == 0.0


def test_cpu_used_by_others_is_machine_busy_time_minus_our_own() -> None:
    from bench.machine import CpuMark, other_share

    before = CpuMark(at=100.0, machine=1000.0, own=50.0)
    after = CpuMark(at=110.0, machine=1012.0, own=58.0)  # 12 s busy in 10 s on 2 cores, 8 s of it ours
    assert other_share(before, after, cores=2) == pytest.approx(0.2)
    assert other_share(before, CpuMark(at=110.0, machine=1005.0, own=58.0), cores=2) == 0.0  # clamped
    assert other_share(before, before, cores=2) == 0.0


def test_the_direct_consumer_waiting_for_messages_is_idle() -> None:
    from bench.profile import role

    assert role("ingest_0") == "direct ingest (consumer)"
    assert is_idle(("DirectIngest._poll (streams/direct.py:118)", "DirectIngest._fetch (streams/direct.py:140)"))
    assert not is_idle(("DirectIngest._poll (streams/direct.py:118)", "event_time (streams/align.py:50)"))


def test_the_collector_timer_between_ticks_is_idle_and_its_collections_are_not() -> None:
    timer = ("Thread.run (threading.py:982)", "Freezer._run (streams/collector.py:170)",
             "Event.wait (threading.py:629)", "Condition.wait (threading.py:331)")
    assert is_idle(timer)
    assert not is_idle(("Thread.run (threading.py:982)", "Freezer._run (streams/collector.py:171)",
                        "Freezer.tick (streams/collector.py:140)", "full_collection (streams/collector.py:110)"))
    # A wait inside pipeline work is not idle (the owner waiting for the raw insert beside it).
    assert not is_idle(("PendingWrite.result (streams/sink_clickhouse.py:200)",
                        "Future.result (concurrent/futures/_base.py:451)", "Condition.wait (threading.py:327)"))


def test_memory_run_report_gives_the_verdict_and_says_when_it_is_scaled_down() -> None:
    from bench.memory_run import render
    from bench.stack import Progress

    mib = 1024 * 1024
    flat = Progress(samples=[(float(i), i * 10_000, 600 * mib) for i in range(101)], peak_rss=700 * mib,
                    peak_file_rss=250 * mib)
    text = render(command="python -m bench.memory_run --events 1000000", events=1_000_000, hours=75.0,
                  progress=flat, stats={"consumed": 1_000_000, "read_back": {"events": 12_000, "members": 0}},
                  publish_s=30.0,
                  started=datetime(2026, 11, 30, tzinfo=UTC))
    assert "Memory target met" in text
    assert "scaled down from the target's 10,000,000" in text
    assert "3.1 days of event time" in text
    assert "consumed 1,000,000;" in text
    assert "caches did not hold them: events 12,000." in text
    assert "Up to 250 MiB of RSS were file-backed pages" in text
    assert "The engine's tracked memory was not sampled." in text
    growing = Progress(samples=[(float(i), i * 100_000, (500 + 10 * i) * mib) for i in range(101)],
                       peak_rss=1600 * mib)
    started_on = Machine(cores=2, cpu="cpu", memory_bytes=GIB, load_at_start=(0.5, 0.4, 0.3), kernel="k",
                         python="3", commit="abc1234")
    text = render(command="python -m bench.memory_run", events=10_000_000, hours=720.0, progress=growing,
                  stats={}, publish_s=250.0, started=datetime(2026, 11, 30, tzinfo=UTC), machine=started_on)
    assert "at commit abc1234: 2 cores" in text  # the commit when the run started, not when it ended
    assert "Memory target NOT met" in text
    assert "at the size the target names (10,000,000 events)" in text
    assert "| worker peak RSS over 10,000,000 events | 1,600 MiB | <= 1 GiB | no |" in text
    assert "caches did not hold them: none." in text
    assert "(default settings, direct ingestion among them, as in the suite;" in text
    other = render(command="python -m bench.memory_run --batch-size 20000", events=10_000_000, hours=720.0,
                   progress=growing, stats={}, publish_s=250.0, started=datetime(2026, 11, 30, tzinfo=UTC),
                   machine=started_on, batch_size=20_000)
    assert "(default settings but batches of 20,000 events (`ROLLOUT_SINK_BATCH_SIZE`)" in other
    off = render(command="python -m bench.memory_run", events=10_000_000, hours=720.0, progress=growing, stats={},
                 publish_s=250.0, started=datetime(2026, 11, 30, tzinfo=UTC), machine=started_on, batch_size=20_000,
                 page_out_s=0.0)
    assert ("(default settings but batches of 20,000 events (`ROLLOUT_SINK_BATCH_SIZE`) and the engine library "
            "never paged out (`ROLLOUT_ENGINE_PAGE_OUT_SECONDS=0`), direct ingestion among them;") in off


def test_memory_run_report_says_what_the_engine_tracked_and_what_merged_at_its_peak() -> None:
    from bench.memory_run import EngineSample, engine_text

    mib = 1024 * 1024
    samples = [EngineSample(float(i), (700 + i) * mib, 10 * mib, 0, "") for i in range(9)]
    samples.insert(4, EngineSample(4.5, 950 * mib, 330 * mib, 2, "events_raw (9 parts, 120.00 MiB), trajectories",
                                   300 * mib, held=42_000))
    text = engine_text(samples)
    assert ("median 10 MiB, peak 330 MiB while merging events_raw (9 parts, 120.00 MiB), trajectories"
            "; the merges' own count 300 MiB") in text
    assert "(anonymous RSS then 950 MiB)" in text
    assert "Merges were running in 1 of the probes" in text
    assert "median 705 MiB, largest sampled 950 MiB" in text
    assert "held a median of 0 messages (largest sampled 42,000)" in text


def test_publish_pairs_alternate_which_side_runs_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from bench import publish

    calls: list[str] = []

    def sdk(_settings: Any, _events: Any) -> publish.Run:
        calls.append("sdk")
        return publish.Run(50_000.0, 5.0, 7.0 + len(calls))

    def raw(_config: Any, _encoded: Any) -> publish.Run:
        calls.append("raw")
        return publish.Run(100_000.0, 3.0, 4.0)

    def loop(_config: Any, _events: Any, prefix: str) -> publish.Run:
        assert prefix == "bench-sdk"
        calls.append("loop")
        return publish.Run(60_000.0 + len(calls), 5.0, 6.0)

    monkeypatch.setattr(publish, "sdk_once", sdk)
    monkeypatch.setattr(publish, "raw_once", raw)
    monkeypatch.setattr(publish, "loop_once", loop)

    def burst(_settings: Any, events: list[Any]) -> publish.Burst:
        calls.append("burst")
        return publish.Burst(len(events) * publish.BURST_TIMES, publish.Run(45_000.0, 5.0, 7.0), 0)

    monkeypatch.setattr(publish, "burst_once", burst)
    settings = Settings(data_dir=tmp_path, topic_prefix="bench-sdk")
    result = publish.run_publish(settings, [], Encoded([], [], []), repeats=4, log=lambda _s: None)
    # a warm-up of each side, then alternating pairs, each followed by the loop
    assert calls == ["sdk", "raw", "loop"] + ["sdk", "raw", "loop", "raw", "sdk", "loop"] * 2 + ["burst"]
    assert result.sdk_rates == [50_000.0] * 4 and result.raw_rates == [100_000.0] * 4
    assert result.loop_rates == [60_006.0, 60_009.0, 60_012.0, 60_015.0]
    assert result.sdk_to_loop == pytest.approx(median([50_000.0 / r for r in result.loop_rates]))
    # the warm-ups are not among the runs kept with their CPU; the SDK's measured runs were calls 4, 8, 10 and 14
    assert [r.process_us for r in result.runs["SDK"]] == [11.0, 15.0, 17.0, 21.0]
    assert result.cpu_medians("SDK") == (5.0, 16.0) and result.cpu_medians("raw") == (3.0, 4.0)
    assert len(result.runs["loop"]) == 4


def test_freshness_worker_rate_leaves_out_the_warm_up_and_what_came_after_publishing() -> None:
    # Nothing stored in the first second (the first events are still on their way), then 4,000/s; after
    # publishing stopped (at 10 s) the worker drains its backlog, which is not its rate while publishing.
    samples = [(0.0, 0), (1.0, 0), (2.0, 4_000), (6.0, 20_000), (10.0, 36_000), (12.0, 50_000)]
    fresh = FreshnessResult(rate=5000.0, seconds=10.0, published=50_000, achieved_rate=5000.0, latencies=[0.5],
                            warmup_s=2.0, drain_limit_s=30.0, poll_interval_s=0.2, polls=60, consumed_samples=samples)
    assert fresh.worker_rate == 4_000.0


def test_counts_on_the_command_line_are_checked_with_a_one_line_reason() -> None:
    parse = at_least(1000)
    assert parse("1000") == 1000
    for text, reason in (("999", "must be at least 1,000, got 999"), ("1e6", "'1e6' is not a whole number")):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(reason)):
            parse(text)


def test_event_ids_bench_sides_keep_the_same_ids() -> None:
    from bench import event_ids

    sides = [event_ids.measure(side, 120_000) for side in event_ids.SIDES]
    # Three batches, the last one short; each repeats ids of its own and of the batch before.
    assert sides[0]["kept"] == sides[1]["kept"] < 120_000


class _Producer:
    """Counts as ``EventProducer.stats`` gives them: each ``poll`` confirms one more spooled message."""

    def __init__(self, sent: int, delivered: int, spooled: int = 0, failed: int = 0) -> None:
        self.sent, self.delivered, self.spooled, self.failed = sent, delivered, spooled, failed
        self.polls = 0

    def flush(self, timeout: float) -> None:
        pass

    @property
    def stats(self) -> Any:
        return ProducerStats(self.sent, self.delivered, self.failed, self.sent - self.delivered - self.failed,
                             spool_pending=self.spooled)

    def poll(self, timeout: float) -> int:
        self.polls += 1
        if self.spooled:
            self.spooled -= 1
            self.delivered += 1
        return 1


def test_a_benchmark_log_is_published_only_once_the_spool_delivered_it_too() -> None:
    producer = _Producer(sent=10, delivered=7, spooled=3)
    stats = deliver_all(producer, timeout=5)
    assert (stats.delivered, stats.spool_pending, producer.polls) == (10, 0, 3)


def test_a_benchmark_log_with_lost_or_stuck_messages_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="refused messages"):
        deliver_all(_Producer(sent=10, delivered=9, failed=1), timeout=5)
    stuck = _Producer(sent=10, delivered=9)  # pending, never confirmed
    with pytest.raises(RuntimeError, match="not every message .* within 0 s: sent=10 delivered=9"):
        deliver_all(stuck, timeout=0.2)
    assert stuck.polls >= 1


def test_sigterm_ends_a_benchmark_through_its_finally_blocks(tmp_path: Path) -> None:
    marker = tmp_path / "cleaned"
    script = (
        "import os, signal, time\n"
        "from bench.stack import exit_on_sigterm\n"
        "exit_on_sigterm()\n"
        "try:\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(10)\n"
        "finally:\n"
        f"    open({str(marker)!r}, 'w').close()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[2], timeout=60,
                          check=False)
    assert done.returncode == 128 + signal.SIGTERM
    assert marker.exists()


def test_the_profile_recordings_end_before_the_log_does() -> None:
    from bench.runner import recording_seconds

    # 100,000 events left at 20,000/s: 5 s of work, so 2.75 and 1.5 s, raised to the floors of 3 and 2 s.
    assert recording_seconds(30.0, 100_000, 20_000.0) == (3.0, 2.0)
    # 1,000,000 left: 50 s of work; 27.5 and 15 s, in py-spy's whole seconds.
    assert recording_seconds(30.0, 1_000_000, 20_000.0) == (27.0, 15.0)
    assert recording_seconds(10.0, 1_000_000, 20_000.0) == (10.0, 5.0)  # at most what was asked for
    # Without a rate nothing is fitted.
    assert recording_seconds(30.0, 100_000, None) == (30.0, 15.0)
    assert recording_seconds(30.0, 100_000, 0.0) == (30.0, 15.0)


@pytest.mark.parametrize(("arguments", "expected"), [
    ([], "python -m bench"),
    (["--out", "/tmp/p.md", "--only", "sdk"], "python -m bench --only sdk"),
    (["-o", "-", "--quick", "--keep", "--work-dir", "/tmp/w"], "python -m bench --quick"),
    (["--out=/tmp/p.md", "--work-dir=/tmp/w", "-o/tmp/q.md", "--batch-size", "20000"],
     "python -m bench --batch-size 20000"),
    (["--only", "sdk,worker", "--log-events", "400000"], "python -m bench --only sdk,worker --log-events 400000"),
    (["--only", "a b"], "python -m bench --only 'a b'"),
])
def test_the_recorded_command_leaves_out_where_the_run_writes(arguments: list[str], expected: str) -> None:
    assert recorded_command("python -m bench", arguments) == expected
