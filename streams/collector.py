"""The worker's garbage-collector policy: every object scanned about once, the whole heap once a minute.

A worker keeps hundreds of thousands of long-lived objects (the owner's caches of events, records
and windows, Faust's and aiokafka's state) and makes about ten tracked objects per event (models,
their ``__dict__``, UUIDs, rows), nearly all of which outlive the young collection that first sees
them: a batch lives for most of a second. CPython's generational collector then scans each of them
twice (young and middle generation) before it reaches the old one, and, with the default thresholds
(700, 10, 10), walks the whole old generation every few batches.

The policy, measured on the bench workload:

- *Full collections rare* (third threshold 1,000 instead of 10). In-process (validation, sink and
  derivation of 100,000 events on chdb): 5,200-8,100 events/s with the defaults, 11,000-14,000
  with full collections a hundred times rarer or the collector off; a replaying worker over a
  150,000-event log: 4,052 events/s with the defaults, 6,882 and 6,952 with 1,000.
- *No middle-generation collections, and what is alive frozen every second* (second threshold
  1,000; ``gc.freeze`` on a timer thread). With (700, 10, 1,000) a replaying worker over 300,000
  events spent 4.8 s of ~25 s in the collector (young 1.2-1.5 s, middle 3.2-3.6 s, read with
  ``gc.callbacks``); with this policy 2.0-3.0 s (young 1.5-1.8 s, the minute's full collections
  0.5-1.3 s). Young collections still run every 700 allocations and free what dies in a cycle while
  young (asyncio futures, exception tracebacks); what survives is frozen within a second, so the
  middle generation never grows and nothing is scanned a second time.
- *The whole heap once a minute*, or sooner when the frozen objects grew by half since the last time
  (``gc.unfreeze``, a full collection, ``gc.freeze``; the growth is counted every ten seconds, as
  counting walks the whole frozen list): a cycle that became garbage after it was frozen is freed
  then. The worker's own data holds no reference cycles (events, records and rows are trees;
  ``infra.clickhouse.inserts`` reuses its insert contexts); a full collection of a 300,000-event
  replay freed 42-271 objects and took 0.5-0.7 s (CPython's own full collections, which this
  replaces, stop the process just as long).

RSS does not grow with the policy: peak 736-750 MiB against 743-754 MiB over the same 300,000
events. ``gc.freeze`` moves lists; it never frees or scans, and a frozen object that loses its last
reference is freed at once as any other.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

YOUNG_THRESHOLD = 700
"""Allocations minus deallocations that start a young collection (CPython's default)."""

MIDDLE_THRESHOLD = 1000
"""Young collections per middle-generation collection (CPython's default is 10). The freezer empties
the middle generation every second, long before this many young collections run."""

FULL_THRESHOLD = 1000
"""Middle-generation collections per full collection (CPython's default is 10)."""

FREEZE_INTERVAL_S = 1.0
"""How often what is alive is frozen (moved out of the collector's sight)."""

FULL_INTERVAL_S = 60.0
"""Longest time between two full collections of the whole heap, frozen objects included."""

FULL_GROWTH = 0.5
"""A full collection also runs when the frozen objects grew by this fraction since the last one."""
COUNT_INTERVAL_S = 10.0
"""How often the frozen objects are counted for the growth check. Counting walks the whole frozen list
(``gc.get_freeze_count`` is O(n), with the interpreter lock held): 23-33 ms for 3,000,000 objects here,
and a 10,000,000-event replay spent 5.6% of its sampled time there when it counted every second."""


@dataclass(slots=True)
class FreezePlan:
    """When to freeze and when to scan the whole heap (pure: the caller passes clock and counts)."""

    full_interval_s: float = FULL_INTERVAL_S
    full_growth: float = FULL_GROWTH
    count_interval_s: float = COUNT_INTERVAL_S
    last_full: float = 0.0
    frozen_after_full: int = 0
    last_count: float = 0.0

    def count_due(self, now: float) -> bool:
        """True when the frozen objects should be counted (for ``full_due``'s growth check)."""
        return now - self.last_count >= self.count_interval_s

    def counted(self, now: float) -> None:
        """Record that the frozen objects were counted at ``now``."""
        self.last_count = now

    def full_due(self, now: float, frozen: int | None) -> bool:
        """True when the whole heap should be scanned before the next freeze (``frozen``: None when not counted)."""
        return (now - self.last_full >= self.full_interval_s
                or (frozen is not None and frozen > self.frozen_after_full * (1.0 + self.full_growth)))

    def full_done(self, now: float, frozen: int) -> None:
        """Record a full collection that left ``frozen`` objects frozen (counted then)."""
        self.last_full = now
        self.frozen_after_full = frozen
        self.last_count = now


@dataclass(slots=True)
class CollectorStats:
    """What the freezer did: full collections, their time and the objects they freed."""

    freezes: int = 0
    full_collections: int = 0
    full_seconds: float = 0.0
    freed: int = 0


def full_collection() -> tuple[int, int]:
    """Scan the whole heap (frozen objects included) and freeze what is left; (freed, frozen) objects."""
    gc.unfreeze()
    freed = gc.collect()
    gc.freeze()
    return freed, gc.get_freeze_count()


@dataclass
class Freezer:
    """The timer thread of the policy: freeze every ``interval_s``, a full collection when the plan says."""

    interval_s: float = FREEZE_INTERVAL_S
    plan: FreezePlan = field(default_factory=FreezePlan)
    clock: Callable[[], float] = time.monotonic
    stats: CollectorStats = field(default_factory=CollectorStats)
    _halt: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def tick(self) -> None:
        """One step: a full collection if due, else a freeze of what is alive."""
        now = self.clock()
        frozen: int | None = None
        if self.plan.count_due(now):
            frozen = gc.get_freeze_count()
            self.plan.counted(now)
        if self.plan.full_due(now, frozen):
            began = time.perf_counter()
            freed, frozen = full_collection()
            took = time.perf_counter() - began
            self.plan.full_done(self.clock(), frozen)
            self.stats.full_collections += 1
            self.stats.full_seconds += took
            self.stats.freed += freed
            log.debug("full collection: %.3f s, %d objects freed, %d frozen", took, freed, frozen)
        else:
            gc.freeze()
        self.stats.freezes += 1

    def start(self) -> Freezer:
        """Run ``tick`` on a daemon thread until ``stop``."""
        self.plan.full_done(self.clock(), gc.get_freeze_count())
        self._thread = threading.Thread(target=self._run, name="gc-freezer", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the thread (what is frozen stays frozen)."""
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._halt.wait(self.interval_s):
            self.tick()


def tune_collector() -> Freezer:
    """Apply the worker's policy: freeze what start-up built, set the thresholds, start the freezer.

    The thresholds and the freezer go together: without the freezer the middle generation would grow
    for 1,000 young collections and then be scanned in one long pause. ``Freezer.stop`` ends it.
    """
    gc.collect()
    # Modules, schemas and settings live as long as the process: never scan them again.
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, MIDDLE_THRESHOLD, FULL_THRESHOLD)
    return Freezer().start()
