"""Pure arithmetic of the benchmarks: percentiles, sustained rates, freshness latencies, memory flatness."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

INF = math.inf


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between closest ranks (numpy's default).

    ``inf`` stands for "never observed" (a censored sample): a percentile that falls on or between
    such samples is ``inf``. Raises ValueError on no values or q outside [0, 100].
    """
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside [0, 100]")
    position = (len(ordered) - 1) * q / 100
    lower = math.floor(position)
    upper = math.ceil(position)
    fraction = position - lower
    if fraction == 0:
        return ordered[lower]
    low, high = ordered[lower], ordered[upper]
    if math.isinf(low) or math.isinf(high):
        return INF
    return low + (high - low) * fraction


def median_of(values: Sequence[float]) -> float:
    """The median of repeats (ValueError when empty)."""
    if not values:
        raise ValueError("median of no values")
    return float(median(values))


def paired_ratio(values: Sequence[float], baselines: Sequence[float]) -> float:
    """The median of ``values[i] / baselines[i]``: the ratio of runs that took turns with their baseline's.

    A shared host's speed drifts during a run; each pair ran at nearly the same moment, so its ratio
    cancels the drift, which the ratio of the two sides' medians (taken from different pairs) does not.
    Raises ValueError when the sides differ in length, are empty or a baseline is not positive.
    """
    if len(values) != len(baselines):
        raise ValueError(f"{len(values)} values against {len(baselines)} baselines")
    if any(b <= 0 for b in baselines):
        raise ValueError("a baseline rate is not positive")
    return median_of([v / b for v, b in zip(values, baselines, strict=True)])


@dataclass(frozen=True, slots=True)
class Rate:
    """A sustained rate: ``events`` processed in ``seconds`` after the warm-up (which is excluded)."""

    events: int
    seconds: float
    warmup_events: int
    warmup_seconds: float

    @property
    def per_second(self) -> float:
        """Events per second over the measured span (0 when the span is empty)."""
        return self.events / self.seconds if self.seconds > 0 else 0.0


def measured_span(samples: Sequence[tuple[float, int]], total: int, *, warmup_fraction: float = 0.1
                  ) -> tuple[int, int] | None:
    """Indexes of the first sample at or past the warm-up and of the first with all ``total`` processed.

    The warm-up ends at ``warmup_fraction * total`` events (and at least one). None when either sample is
    missing. ``sustained_rate`` and ``cpu_per_event`` both measure over this span.
    """
    threshold = max(1, math.ceil(total * warmup_fraction))
    start = next((i for i, (_, n) in enumerate(samples) if n >= threshold), None)
    end = next((i for i, (_, n) in enumerate(samples) if n >= total), None)
    return None if start is None or end is None else (start, end)


def sustained_rate(samples: Sequence[tuple[float, int]], total: int, *, warmup_fraction: float = 0.1) -> Rate:
    """Rate from (time, processed) samples: from the first sample at or past the warm-up to ``total``.

    The warm-up ends at the first sample with at least ``warmup_fraction * total`` events processed
    (and at least one): start-up, group join and first-batch costs fall before it. The end is the
    first sample at which everything was processed. Raises ValueError if ``total`` was never reached.
    """
    if total <= 0:
        raise ValueError("total must be positive")
    span = measured_span(samples, total, warmup_fraction=warmup_fraction)
    if span is None:
        raise ValueError(f"processed count never reached {total}")
    start, end = samples[span[0]], samples[span[1]]
    first_progress = next((t for t, n in samples if n > 0), start[0])
    events = min(end[1], total) - start[1]
    seconds = end[0] - start[0]
    if events <= 0:  # everything arrived in the warm-up sample: fall back to the whole span after the first batch
        events = min(end[1], total)
        seconds = end[0] - samples[0][0]
        return Rate(events, seconds, 0, 0.0)
    return Rate(events, seconds, start[1], start[0] - first_progress)


def cpu_per_event(samples: Sequence[tuple[float, int]], cpu: Sequence[float], total: int, *,
                  warmup_fraction: float = 0.1) -> float | None:
    """CPU seconds per event over the span ``sustained_rate`` measures, from the reader's CPU time at each sample.

    ``cpu[i]`` is the reader's CPU seconds (all its threads) when ``samples[i]`` was taken. None when the
    lists do not pair up or the span holds no events.
    """
    if len(cpu) != len(samples) or total <= 0:
        return None
    span = measured_span(samples, total, warmup_fraction=warmup_fraction)
    if span is None:
        return None
    start, end = span
    events = min(samples[end][1], total) - samples[start][1]
    if events <= 0:
        return None
    return max(0.0, cpu[end] - cpu[start]) / events


def halves(samples: Sequence[tuple[float, int]], total: int) -> tuple[float, float]:
    """Rates (events/s) from 10% to 55% of ``total`` and from 55% to the end, from (time, processed) samples.

    Shows whether a rate holds as the run goes on; 0.0 for a half without two samples.
    """
    def rate(low: float, high: float) -> float:
        start = next(((t, n) for t, n in samples if n >= low * total), None)
        end = next(((t, n) for t, n in samples if n >= high * total), None)
        if start is None or end is None or end[0] <= start[0]:
            return 0.0
        return (end[1] - start[1]) / (end[0] - start[0])

    return rate(0.10, 0.55), rate(0.55, 1.0)


def visibility_latencies(
    finishes: Sequence[tuple[Any, float]],
    polls: Sequence[tuple[float, Mapping[Any, int]]],
) -> list[float]:
    """Seconds from each finish's event time to the first poll whose count for its window covers it.

    ``finishes`` are (window key, occurred at); ``polls`` are (time the poll's answer came back,
    {window key: finished count visible}) in time order. Within a window the k-th finish (by event
    time) counts as visible once the window's count reaches k. A finish never covered gets ``inf``
    (censored). The result is aligned with ``finishes``. Times share one clock (e.g. epoch seconds).
    """
    by_window: dict[Hashable, list[tuple[float, int]]] = defaultdict(list)
    for index, (key, occurred) in enumerate(finishes):
        by_window[key].append((occurred, index))
    latencies: list[float] = [INF] * len(finishes)
    for key, items in by_window.items():
        items.sort()
        seen = 0  # finishes of this window already assigned a poll
        for polled_at, counts in polls:
            visible = min(counts.get(key, 0), len(items))
            while seen < visible:
                occurred, index = items[seen]
                latencies[index] = max(0.0, polled_at - occurred)
                seen += 1
            if seen == len(items):
                break
    return latencies


@dataclass(frozen=True, slots=True)
class Flatness:
    """Whether memory stayed flat after the warm-up, and by how much it grew."""

    flat: bool
    warm_rss: int
    end_rss: int
    growth_bytes: int
    growth_per_million_events: float


def memory_flatness(samples: Sequence[tuple[int, int]], *, warmup_fraction: float = 0.25,
                    tolerance: float = 0.10) -> Flatness:
    """From (events processed, RSS bytes) samples: flat when RSS grew by at most ``tolerance`` after the warm-up.

    The warm-up level is the median RSS of the samples in the second quarter of the run's events
    (after ``warmup_fraction``), the end level the median of the last quarter, so single spikes do
    not decide it. Growth per million events is the least-squares slope of RSS over events processed,
    fitted to every sample after the warm-up.
    """
    if not samples:
        raise ValueError("no memory samples")
    total = max(n for n, _ in samples)
    if total <= 0:
        raise ValueError("no events processed")
    warm = [r for n, r in samples if warmup_fraction * total <= n <= (warmup_fraction + 0.25) * total] or \
        [samples[0][1]]
    end = [r for n, r in samples if n >= 0.75 * total] or [samples[-1][1]]
    warm_rss = int(median(warm))
    end_rss = int(median(end))
    growth = end_rss - warm_rss
    after = [(float(n), float(r)) for n, r in samples if n >= warmup_fraction * total]
    per_million = _slope(after) * 1_000_000
    return Flatness(growth <= tolerance * warm_rss, warm_rss, end_rss, growth, per_million)


def _slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of y over x (0.0 with fewer than two distinct x)."""
    if len(points) < 2:
        return 0.0
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    if spread == 0:
        return 0.0
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread
