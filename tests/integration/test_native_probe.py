"""The native assembly probe (bench/native_probe): built with cargo, its records equal Python's ``assemble`` over the
owner's cached events and from its own store of parsed payloads, on the bench's events, on parts of them, and on the
edge cases of the unit tests."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta, timezone
from types import ModuleType
from typing import Any

import pytest

from bench.native_probe import (
    DEFAULT_TARGET,
    STEPS,
    Corpus,
    ProbeUnavailable,
    build,
    check,
    corpus,
    find_cargo,
    make_probe,
    measure,
    report,
)
from schemas import Envelope, Origin
from schemas.events import InterruptReason, Termination, Verdict
from schemas.parse import encode_event
from streams.trajectory import AssemblyConfig, VersionTimeline, assemble, cached_copy
from tests.unit import test_trajectory as t


@pytest.fixture(scope="module")
def native() -> ModuleType:
    try:
        # The folder `python -m bench.native_probe` builds in: cargo builds once for both.
        return build(DEFAULT_TARGET, progress=lambda _line: None)
    except ProbeUnavailable as exc:
        if find_cargo() is None:
            pytest.skip(f"{exc}: install Rust to check the native probe")
        raise


@pytest.fixture(scope="module")
def data() -> Corpus:
    return corpus(20_000)


def _native_records(native: ModuleType, events: list[Envelope], timeline: VersionTimeline,
                    config: AssemblyConfig) -> tuple[Any, Any]:
    """The record of ``events`` over their cached copies and from a store of their payloads."""
    copies = [cached_copy(e) for e in events]
    probe = make_probe(native, timeline, config, {type(c): type(e) for c, e in zip(copies, events, strict=True)})
    store = native.Store()
    store.add([encode_event(e).decode() for e in events])
    trajectory_id = str(getattr(events[0], "trajectory_id", "")) if events else ""
    return probe.assemble(copies), store.assemble(probe, trajectory_id)


def test_every_record_of_the_bench_events_equals_pythons(native: ModuleType, data: Corpus) -> None:
    probe = make_probe(native, data.timeline, AssemblyConfig(), data.copy_classes)
    store = native.Store()
    assert store.add(data.payloads) == len(data.payloads)
    objects, stored = check(probe, store, data, AssemblyConfig())
    assert objects.compared == stored.compared == len(data.groups) > 4_000
    assert objects.differing == stored.differing == 0


def test_records_of_parts_of_trajectories_equal_pythons(native: ModuleType, data: Corpus) -> None:
    # Any subset of a trajectory's events (queued only, a verdict before its finish, ...) in any order, some twice.
    rng = random.Random(11)
    by_id = {}
    for event in data.originals:
        by_id.setdefault(str(event.trajectory_id), []).append(event)
    compared = 0
    for trajectory_id in rng.sample(sorted(by_id), 400):
        events = by_id[trajectory_id]
        part = rng.sample(events, rng.randint(1, len(events)))
        part += rng.sample(part, rng.randint(0, min(2, len(part))))
        rng.shuffle(part)
        expected = assemble([cached_copy(e) for e in part], data.timeline, AssemblyConfig())
        assert _native_records(native, part, data.timeline, AssemblyConfig()) == (expected, expected), trajectory_id
        compared += 1
    assert compared == 400


EDGE_CASES: list[tuple[str, list[Envelope], VersionTimeline, AssemblyConfig]] = [
    ("late verdict", [t.queued(), t.started(), t.finished(65), t.verdict(65 + 601)], t.NO_TIMELINE, t.CONFIG),
    ("verdict at the timeout", [t.queued(), t.started(), t.finished(65), t.verdict(665)], t.NO_TIMELINE, t.CONFIG),
    ("short timeout", [t.queued(), t.started(), t.finished(65), t.verdict(100)], t.NO_TIMELINE,
     AssemblyConfig(verdict_timeout_s=30)),
    ("verifier error", [t.queued(), t.started(), t.finished(), t.verdict(outcome=Verdict.ERROR, reward=None)],
     t.NO_TIMELINE, t.CONFIG),
    ("undecidable", [t.queued(), t.started(), t.finished(), t.verdict(outcome=Verdict.UNDECIDABLE)], t.NO_TIMELINE,
     t.CONFIG),
    ("digest mismatch", [t.queued(), t.started(), t.finished(), t.verdict(digest=t.OTHER_DIGEST)], t.NO_TIMELINE,
     t.CONFIG),
    ("no artifact", [t.queued(), t.started(), t.finished(digest=None), t.verdict()], t.NO_TIMELINE, t.CONFIG),
    ("timely and late verdicts", [t.queued(), t.started(), t.finished(65), t.verdict(90, Verdict.FAILED),
                                  t.verdict(2_000, Verdict.PASSED)], t.NO_TIMELINE, t.CONFIG),
    ("verdicts at one instant", [t.queued(), t.started(), t.finished(65), t.verdict(90, Verdict.FAILED),
                                 t.verdict(90, Verdict.PASSED)], t.NO_TIMELINE, t.CONFIG),
    ("verdict before the finish", [t.queued(), t.started(), t.verdict(30)], t.NO_TIMELINE, t.CONFIG),
    ("failures of every origin", [t.queued(), t.started(), t.failure(20, "tool_crash", Origin.MODEL),
                                  t.failure(30, "disk_full", Origin.ENVIRONMENT),
                                  t.failure(40, "verifier_down", Origin.VERIFIER),
                                  t.finished(termination=Termination.ENVIRONMENT_FAILURE), t.verdict()],
     t.NO_TIMELINE, t.CONFIG),
    ("model failure only", [t.queued(), t.started(), t.failure(20, "bad_tool_call", Origin.MODEL), t.finished()],
     t.NO_TIMELINE, t.CONFIG),
    ("snapshots, resumes, interruptions", [t.queued(), t.started(), t.snapshot(10, 1_000), t.snapshot(20, 2_500),
                                           t.interrupted(25, InterruptReason.PREEMPTED),
                                           t.resumed(30, 7, succeeded=False), t.resumed(35, 9),
                                           t.interrupted(40, InterruptReason.BUDGET), t.finished(), t.verdict()],
     t.NO_TIMELINE, t.CONFIG),
    ("queued only", [t.queued()], t.NO_TIMELINE, t.CONFIG),
    ("started only", [t.started()], t.NO_TIMELINE, t.CONFIG),
    ("policy lag", [t.queued(), t.started(policy_version=2), t.finished(65, oldest=2, newest=3), t.verdict()],
     VersionTimeline.from_events([t.published(1, -100), t.published(2, -50), t.published(3, 10),
                                  t.published(4, 50), t.published(3, 60), t.published(5, 100)]), t.CONFIG),
    ("lag without publications", [t.queued(), t.started(), t.finished(65, oldest=1, newest=4)], t.NO_TIMELINE,
     t.CONFIG),
]


@pytest.mark.parametrize(("name", "events", "timeline", "config"), EDGE_CASES, ids=[c[0] for c in EDGE_CASES])
def test_edge_cases_equal_pythons(native: ModuleType, name: str, events: list[Envelope], timeline: VersionTimeline,
                                  config: AssemblyConfig) -> None:
    expected = assemble(events, timeline, config)
    assert expected is not None
    assert _native_records(native, events, timeline, config) == (expected, expected)
    # In any order, with an event twice.
    mixed = list(reversed(events)) + events[:1]
    assert _native_records(native, mixed, timeline, config) == (expected, expected)


def test_no_events_give_no_record(native: ModuleType) -> None:
    probe = make_probe(native, t.NO_TIMELINE, t.CONFIG, {})
    assert probe.assemble([]) is None
    assert native.Store().assemble(probe, "unknown") is None


def test_a_record_that_differs_is_told_apart(native: ModuleType, data: Corpus) -> None:
    # The comparison the probe relies on sees one event less.
    probe = make_probe(native, data.timeline, AssemblyConfig(), data.copy_classes)
    group = next(g for g in data.groups if len(g) >= 4)
    assert probe.assemble(group[:-1]) != assemble(group, data.timeline, AssemblyConfig())


def test_a_time_outside_utc_or_not_canonical_is_refused(native: ModuleType) -> None:
    probe = make_probe(native, t.NO_TIMELINE, t.CONFIG, {})
    event = t.queued()
    copy = cached_copy(event)
    copy.occurred_at = datetime(2026, 1, 1, tzinfo=UTC).astimezone(timezone(timedelta(hours=2)))
    with pytest.raises(ValueError, match="datetime.UTC"):
        probe.assemble([copy])
    payload = encode_event(event).decode().replace("T12:00:00Z", "T12:00:00+00:00")
    with pytest.raises(ValueError, match="not canonical"):
        native.Store().add([payload])


def test_measure_times_every_step_and_reports_equal_records(native: ModuleType) -> None:
    small = corpus(3_000)
    result = measure(native, small, AssemblyConfig(), repeats=1, progress=lambda _line: None)
    assert set(result.timings) == {step for step, _ in STEPS}
    assert all(len(v) == 1 and v[0] > 0 for v in result.timings.values())
    text = "\n".join(report(result))
    n = len(small.groups)
    assert f"over the cached events {n:,} of {n:,}, from the store {n:,} of {n:,}" in text
    assert "differing" not in text


def test_a_second_build_in_one_process_returns_the_loaded_extension(native: ModuleType) -> None:
    # An extension module initialises once per process; building again must not load it twice.
    assert build(DEFAULT_TARGET, progress=lambda _line: None) is native
