"""Sizes of the benchmarks: the full suite, the quick one for development, and the sizes the targets name."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from rollout.settings import Settings

DEFAULT_BATCH_SIZE: int = Settings.model_fields["sink_batch_size"].default
"""The worker's own batch size (``ROLLOUT_SINK_BATCH_SIZE``): what the benchmarks run with unless told."""
DEFAULT_PAGE_OUT_S: float = Settings.model_fields["engine_page_out_seconds"].default
"""How often the worker pages the engine library out (``ROLLOUT_ENGINE_PAGE_OUT_SECONDS``) unless told."""

BENCHMARKS = ("sdk", "worker", "profile", "freshness", "dashboards")
"""What ``--only`` may choose; ``worker`` also gives the replay and memory rows."""


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much every benchmark does. Every field is a ``rollout bench`` option."""

    sdk_events: int
    sdk_repeats: int
    log_events: int
    baseline_repeats: int
    freshness_rate: float
    freshness_seconds: float
    freshness_warmup: float
    freshness_drain: float
    freshness_sustainable: bool
    month_events: int
    month_days: float
    seed_hours: float
    query_budget: float
    query_max_repeats: int
    profile_seconds: float
    replay_events: int = 0
    """Events in the log the bulk replay is timed on (the replay target names 1,000,000), which a fresh worker
    then reads for the memory row (``bench.pipeline.run_log_replay``); 0: none."""
    replay_repeats: int = 1
    batch_size: int = DEFAULT_BATCH_SIZE
    """The workers' batch size (``ROLLOUT_SINK_BATCH_SIZE``)."""
    baseline_batch_size: int = DEFAULT_BATCH_SIZE
    """The plain consumer loop's batch size, kept apart from the workers': the loop is at its fastest near
    10,000 (one run each: 90,471 events/s at 5,000, 88,999-96,341 at 10,000, 67,531-68,136 at 20,000), so
    giving it the workers' larger batches would slow the baseline and flatter the ratio."""

    def with_overrides(self, overrides: dict[str, Any]) -> Sizes:
        """A copy with the options given on the command line (None means: keep the preset)."""
        return dataclasses.replace(self, **{k: v for k, v in overrides.items() if v is not None})


FULL = Sizes(
    sdk_events=100_000, sdk_repeats=5,  # pairs take ~3 s; five steady the median of their ratios
    log_events=150_000, baseline_repeats=3,
    freshness_rate=5000.0, freshness_seconds=15.0, freshness_warmup=3.0, freshness_drain=90.0,
    freshness_sustainable=True,
    month_events=10_000_000, month_days=30.0, seed_hours=2.0, query_budget=1.0, query_max_repeats=20,
    profile_seconds=30.0, replay_events=1_000_000, replay_repeats=3,
)
QUICK = Sizes(
    sdk_events=20_000, sdk_repeats=2,
    log_events=12_000, baseline_repeats=1,
    freshness_rate=5000.0, freshness_seconds=4.0, freshness_warmup=1.0, freshness_drain=20.0,
    freshness_sustainable=False,
    month_events=1_000_000, month_days=30.0, seed_hours=1.0, query_budget=0.2, query_max_repeats=2,
    profile_seconds=6.0, replay_events=20_000, replay_repeats=1,
)

SPEC_REPLAY_EVENTS = 1_000_000
"""The replay target's log size."""
SPEC_MEMORY_EVENTS = 10_000_000
"""The memory target's run size."""
SPEC_MONTH_EVENTS = 10_000_000
SPEC_MONTH_DAYS = 30.0
SPEC_DENSITY_PER_HOUR = SPEC_MONTH_EVENTS / (SPEC_MONTH_DAYS * 24)
"""Events per hour of event time: the suite's (10M events over 30 days)."""
