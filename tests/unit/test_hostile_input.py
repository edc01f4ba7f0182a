"""Property-based: every hostile or broken message gets the outcome the platform promises (pure validation)."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from producers.scenario import load_scenario
from producers.simulator import generate
from schemas import TopicNames
from streams.records import Accepted, DeadLetter, SourceRef, classify
from tests.support.hostile import ACCEPTED, DEAD, DUPLICATE, KINDS, RARE_KINDS, make_case
from tests.support.play import SCENARIOS

TOPICS = TopicNames("hostile")
POOL = list(generate(load_scenario(SCENARIOS / "golden.yaml")))


@settings(max_examples=10_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(KINDS + RARE_KINDS), seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_every_hostile_message_is_dead_lettered_with_its_reason_or_handled(kind: str, seed: int) -> None:
    case = make_case(random.Random(seed), kind, POOL, TOPICS)
    outcome = classify(case.value, case.key, SourceRef(case.topic, 0, 0), TOPICS)  # never raises
    if case.expected in (ACCEPTED, DUPLICATE):
        assert isinstance(outcome, Accepted), (kind, outcome)
    elif case.expected == DEAD:
        assert isinstance(outcome, DeadLetter), (kind, case.value)
        assert outcome.raw == (case.value or b"")
    else:
        assert isinstance(outcome, DeadLetter), (kind, case.value)
        assert outcome.reason == case.expected, (kind, outcome.reason, outcome.detail)
        assert outcome.raw == (case.value or b"")
