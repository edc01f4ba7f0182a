"""The SDK publish benchmark's three publishers on the real broker: each delivers every event, with the same bytes."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from bench.publish import burst_once, effective_config, loop_once, raw_once, sdk_once
from bench.stack import create_topics, stack_settings
from bench.workload import encode_all, events_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

EVENTS = 400
PARTITIONS = 2


def _read(bootstrap: str, topics: set[str], expected: int,
          timeout_s: float = 60.0) -> Counter[tuple[str, bytes, bytes]]:
    """(topic, key, value) of every message of the topics, once ``expected`` arrived or the time is up."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"it-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t in topics for p in range(PARTITIONS)])
        seen: Counter[tuple[str, bytes, bytes]] = Counter()
        deadline = time.monotonic() + timeout_s
        while sum(seen.values()) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            seen[(msg.topic() or "", msg.key() or b"", msg.value() or b"")] += 1
        return seen
    finally:
        consumer.close()


def test_sdk_raw_and_the_encode_loop_send_the_same_messages(kafka_bootstrap: str, tmp_path: Path) -> None:
    settings = stack_settings(kafka_bootstrap, tmp_path / "sdk", f"pub{uuid.uuid4().hex[:8]}", batch_size=1000,
                              partitions=PARTITIONS)
    create_topics(settings)
    events = events_for(EVENTS, run_id="bench-publish")
    encoded = encode_all(events, settings.topic_prefix)
    config, spool = effective_config(settings)
    assert spool and "on_delivery" not in config

    runs = [sdk_once(settings, events), raw_once(config, encoded), loop_once(config, events, settings.topic_prefix)]
    # the sending thread did some work per event, and the process (librdkafka's threads too) at least as much
    assert all(run.rate > 0 and 0 < run.thread_us <= run.process_us for run in runs), runs

    # Each side sent its warm-up message (the first event) and then every event: three copies of each.
    one_side = Counter(zip(encoded.topics, encoded.keys, encoded.values, strict=True))
    one_side[(encoded.topics[0], encoded.keys[0], encoded.values[0])] += 1
    expected = Counter({message: 3 * n for message, n in one_side.items()})
    seen = _read(kafka_bootstrap, set(encoded.topics), sum(expected.values()))
    assert seen == expected
    assert len(set(encoded.topics)) > 1  # several event types, so the loop's topic lookup is exercised

    # The burst run sends every event again, twice over, all delivered (else it raises) and none spooled.
    burst = burst_once(settings, events, times=2)
    assert (burst.events, burst.spooled) == (2 * len(events), 0) and burst.run.rate > 0
