"""The worker's garbage-collector policy."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from streams.collector import (
    FULL_THRESHOLD,
    MIDDLE_THRESHOLD,
    YOUNG_THRESHOLD,
    FreezePlan,
    Freezer,
    tune_collector,
)


@pytest.fixture
def restored() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


class Node:
    """A container that can sit in a reference cycle."""

    def __init__(self) -> None:
        self.other: Node | None = None


def test_thresholds_set_start_up_objects_frozen_and_freezer_running(restored: None) -> None:
    gc.unfreeze()
    freezer = tune_collector()
    try:
        assert gc.get_threshold() == (YOUNG_THRESHOLD, MIDDLE_THRESHOLD, FULL_THRESHOLD)
        assert gc.get_freeze_count() > 0
        assert gc.isenabled()
        assert freezer._thread is not None and freezer._thread.is_alive()
    finally:
        freezer.stop()
    assert not freezer._thread.is_alive()


def test_plan_scans_the_heap_after_the_interval_or_when_the_frozen_objects_grew() -> None:
    plan = FreezePlan(full_interval_s=60.0, full_growth=0.5)
    plan.full_done(100.0, 1000)
    assert not plan.full_due(159.9, 1500)  # neither old enough nor grown by more than half
    assert plan.full_due(160.0, 1000)  # a minute since the last one
    assert plan.full_due(101.0, 1501)  # grown by more than half
    plan.full_done(160.0, 2000)
    assert not plan.full_due(161.0, 2999)
    assert plan.full_due(161.0, 3001)
    assert not plan.full_due(161.0, None)  # not counted: only the interval counts
    assert plan.full_due(220.0, None)


def test_the_frozen_objects_are_counted_every_count_interval() -> None:
    plan = FreezePlan(count_interval_s=10.0)
    plan.full_done(100.0, 1000)
    assert not plan.count_due(109.9)
    assert plan.count_due(110.0)
    plan.counted(110.0)
    assert not plan.count_due(119.9) and plan.count_due(120.0)


def test_a_tick_counts_the_frozen_objects_only_when_due(restored: None, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    counts: list[float] = []
    real = gc.get_freeze_count

    def counting() -> int:
        counts.append(now[0])
        return real()

    freezer = Freezer(plan=FreezePlan(full_interval_s=1e9, full_growth=0.5, count_interval_s=10.0),
                      clock=lambda: now[0])
    gc.freeze()  # everything alive now is the baseline the growth is measured from
    freezer.plan.full_done(0.0, real())
    monkeypatch.setattr(gc, "get_freeze_count", counting)
    for second in range(1, 26):
        now[0] = float(second)
        freezer.tick()
    assert counts == [10.0, 20.0]
    assert freezer.stats.freezes == 25 and freezer.stats.full_collections == 0
    grown = [Node() for _ in range(2 * real() + 1000)]  # more than half again as many tracked objects
    now[0] = 30.0
    freezer.tick()  # counted before they are frozen: no growth yet
    assert freezer.stats.full_collections == 0
    now[0] = 35.0
    freezer.tick()
    assert freezer.stats.full_collections == 0, "grown, but not counted before the count interval"
    now[0] = 40.0
    freezer.tick()
    assert freezer.stats.full_collections == 1, "a counted growth must start a full collection"
    assert counts == [10.0, 20.0, 30.0, 40.0, 40.0]  # the last one after the collection
    del grown


def test_a_frozen_cycle_is_freed_by_the_next_full_collection_and_only_then(restored: None) -> None:
    now = [0.0]
    freezer = Freezer(plan=FreezePlan(full_interval_s=60.0, full_growth=1e9), clock=lambda: now[0])
    freezer.plan.full_done(0.0, gc.get_freeze_count())
    a, b = Node(), Node()
    a.other, b.other = b, a
    alive = weakref.ref(a)
    now[0] = 1.0
    freezer.tick()  # a freeze: the cycle is out of the collector's sight
    del a, b
    gc.collect()
    assert alive() is not None, "a frozen cycle is not scanned by ordinary collections"
    now[0] = 61.0
    freezer.tick()  # a minute later: the whole heap
    assert alive() is None
    assert freezer.stats.full_collections == 1 and freezer.stats.freed >= 2
    assert freezer.stats.freezes == 2


def test_a_frozen_object_without_cycles_is_freed_as_soon_as_it_is_dropped(restored: None) -> None:
    freezer = Freezer(plan=FreezePlan(full_interval_s=1e9, full_growth=1e9), clock=lambda: 0.0)
    freezer.plan.full_done(0.0, gc.get_freeze_count())
    node = Node()
    alive = weakref.ref(node)
    freezer.tick()
    assert freezer.stats.full_collections == 0
    del node
    assert alive() is None
