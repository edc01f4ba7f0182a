"""The worker's garbage-collector policy: full collections rare, young ones as usual.

A worker keeps hundreds of thousands of long-lived objects (the owner's caches of events, records
and windows, Faust's and aiokafka's state), and a full collection walks all of them. With CPython's
default thresholds (700, 10, 10) one runs every ten middle-generation collections once the objects
promoted since the last one exceed a quarter of the old generation, which a worker that keeps
replacing cached entries reaches every few batches. Measured on the bench workload:

- in-process (validation, sink and derivation of 100,000 events on chdb): 5,200-8,100 events/s
  with the defaults, 11,000-14,000 with full collections a hundred times rarer or the collector off;
- a replaying worker over the same 150,000-event log, one run after another: 4,052 events/s with
  the defaults (10), 6,537 and 6,786 with 100, 6,882 and 6,952 with 1,000; peak RSS 991-998 MiB in
  every case.

RSS does not grow with rarer full collections because the worker's own data holds no reference
cycles (events, records and rows are trees; ``infra.clickhouse.inserts`` reuses its insert contexts,
which otherwise were a cycle per insert holding the batch's rows). Young collections still free
what libraries leave in cycles (asyncio futures, exception tracebacks), and full collections still
run, only less often.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 700
"""Allocations minus deallocations that start a young collection (CPython's default)."""

MIDDLE_THRESHOLD = 10
"""Young collections per middle-generation collection (CPython's default)."""

FULL_THRESHOLD = 1000
"""Middle-generation collections per full collection (CPython's default is 10)."""


def tune_collector() -> None:
    """Apply the worker's policy: move what start-up built out of the collector's sight, make full collections rare."""
    gc.collect()
    # Modules, schemas and settings live as long as the process: never scan them again.
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, MIDDLE_THRESHOLD, FULL_THRESHOLD)
