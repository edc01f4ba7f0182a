"""The per-batch SQL probe's medians leave the first batch out."""

from __future__ import annotations

from bench.batch_sql_probe import Batch, ProbeResult


def _batch(derive_ms: float) -> Batch:
    return Batch(trajectories=10, derive=(derive_ms, derive_ms), steps={})


def test_median_leaves_the_first_batch_out() -> None:
    result = ProbeResult(events=40, batch_size=10, batches=[_batch(900), _batch(10), _batch(30), _batch(20)])
    assert result.median(lambda b: b.derive[0]) == 20


def test_median_of_one_batch_is_that_batch() -> None:
    result = ProbeResult(events=10, batch_size=10, batches=[_batch(900)])
    assert result.median(lambda b: b.derive[0]) == 900
