"""A run's facts taken in event by event equal the facts built from all of its stored policy events at once."""

from __future__ import annotations

import itertools
import random
import uuid
from datetime import UTC, datetime, timedelta

from schemas import Envelope, PolicyVersionPublished, Producer, RunConfigured
from streams.metrics import RunConfig
from streams.state import RunFacts
from streams.trajectory import VersionTimeline

RUN = "run-facts"
POLICY = Producer(kind="policy", id="trainer-1", version="1.0")
T0 = datetime(2026, 3, 1, tzinfo=UTC)
_ids = itertools.count(1)


def published(version: int, seconds: float) -> PolicyVersionPublished:
    return PolicyVersionPublished(event_id=uuid.UUID(int=next(_ids), version=4),
                                  occurred_at=T0 + timedelta(seconds=seconds), run_id=RUN, producer=POLICY,
                                  version=version, checkpoint_digest=f"sha256:c{version}")


def configured(seconds: float, bound: int, event_id: int | None = None) -> RunConfigured:
    return RunConfigured(event_id=uuid.UUID(int=event_id or next(_ids), version=4),
                         occurred_at=T0 + timedelta(seconds=seconds), run_id=RUN, producer=POLICY,
                         domain_weights={"math": float(bound)}, staleness_bound=bound)


def test_first_publication_of_a_version_counts_whatever_the_arrival_order() -> None:
    facts = RunFacts()
    facts.add([published(2, 50.0), published(1, 10.0)])
    facts.add([published(2, 30.0), published(2, 70.0)])  # republished, and a late earlier publication
    assert facts.timeline() == VersionTimeline.from_pairs([(1, T0 + timedelta(seconds=10)),
                                                           (2, T0 + timedelta(seconds=30))])


def test_latest_configuration_wins_and_ties_go_to_the_higher_event_id() -> None:
    facts = RunFacts()
    assert facts.config(7) == RunConfig({}, 7)
    facts.add([configured(20.0, 3), configured(10.0, 5)])
    assert facts.config(7) == RunConfig({"math": 3.0}, 3)
    facts.add([configured(20.0, 9, event_id=10**9)])  # same time, higher id
    assert facts.config(7) == RunConfig({"math": 9.0}, 9)
    facts.add([configured(20.0, 4, event_id=1)])  # same time, lower id: older
    assert facts.config(7) == RunConfig({"math": 9.0}, 9)


def test_events_added_in_any_batches_equal_all_events_at_once() -> None:
    rng = random.Random(6)
    events: list[Envelope] = [published(rng.randint(1, 12), rng.uniform(0, 3600)) for _ in range(60)]
    events += [configured(rng.uniform(0, 3600), rng.randint(1, 8)) for _ in range(15)]
    events += events[:20]  # re-delivered duplicates
    whole = RunFacts()
    whole.add(events)
    for _ in range(20):
        rng.shuffle(events)
        piecewise = RunFacts()
        cut = sorted(rng.sample(range(1, len(events)), 6))
        for lo, hi in itertools.pairwise([0, *cut, len(events)]):
            piecewise.add(events[lo:hi])
        assert piecewise.timeline() == whole.timeline()
        assert piecewise.config(7) == whole.config(7)
