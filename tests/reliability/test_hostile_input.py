"""10,000 hostile and broken messages through the real broker and worker, around a scenario's valid events."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from confluent_kafka import Producer

from producers.simulator import generate
from rollout.settings import Settings
from schemas import TopicNames, encode_event, event_key
from tests.support.hostile import ACCEPTED, DEAD, DUPLICATE, KINDS, RARE_KINDS, Case, make_case
from tests.support.play import audit_differences, domain_totals, expected_totals, scenario
from tests.support.worker import WorkerProcess

pytestmark = pytest.mark.reliability
CASES = 10_000


def test_hostile_input_never_stops_the_worker_and_everything_reconciles(stack_settings: Settings,
                                                                       worker: WorkerProcess) -> None:
    golden = scenario("golden")
    valid = list(generate(golden))
    topics = TopicNames(stack_settings.topic_prefix)
    rng = random.Random(5)
    cases = [make_case(rng, rng.choice(KINDS), valid, topics) for _ in range(CASES)]
    cases += [make_case(rng, kind, valid, topics) for kind in RARE_KINDS for _ in range(5)]

    # Valid events and hostile cases interleaved, in one stream per topic.
    messages: list[Case] = [Case("valid", topics.for_event_type(e.event_type), event_key(e).encode(),  # type: ignore[attr-defined]
                                 encode_event(e), ACCEPTED) for e in valid]
    for case in cases:
        messages.insert(rng.randint(0, len(messages)), case)

    positions: dict[tuple[str, int, int], Case] = {}
    errors: list[str] = []
    producer = Producer({**stack_settings.kafka_client_config(), "enable.idempotence": True,
                         "partitioner": "murmur2_random", "message.max.bytes": 2_000_000,
                         "compression.type": "none", "linger.ms": 20})
    for case in messages:
        def delivered(err: object, msg: object, case: Case = case) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                positions[(msg.topic(), msg.partition(), msg.offset())] = case  # type: ignore[attr-defined]
        while True:
            try:
                producer.produce(case.topic, value=case.value, key=case.key, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert errors == []
    assert len(positions) == len(messages)

    stats = worker.wait_consumed(len(messages), timeout=600)
    assert worker.process is not None and worker.process.poll() is None, "the worker crashed"
    assert stats["consumed"] == len(messages)
    assert stats["consumed"] == stats["stored"] + stats["duplicates"] + stats["dead_lettered"]

    expected = Counter(c.expected for c in positions.values())
    dead_expected = sum(n for outcome, n in expected.items() if outcome not in (ACCEPTED, DUPLICATE))
    assert stats["dead_lettered"] == dead_expected
    assert stats["duplicates"] == expected[DUPLICATE]

    stored = worker.query("SELECT source_topic, source_partition, source_offset, reason FROM dead_letters").rows
    reasons = {(t, int(p), int(o)): r for t, p, o, r in stored}
    assert len(reasons) == dead_expected
    for position, case in positions.items():
        if case.expected in (ACCEPTED, DUPLICATE):
            assert position not in reasons, (case.kind, reasons.get(position))
        elif case.expected == DEAD:
            assert position in reasons, case.kind
        else:
            assert reasons.get(position) == case.expected, (case.kind, reasons.get(position))

    # The valid events around the hostile ones are unaffected.
    assert domain_totals(worker, golden.run_id) == expected_totals(golden)
    assert audit_differences(worker, stack_settings, golden.run_id) == []
