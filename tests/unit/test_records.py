"""Validation, dead-lettering and row shaping of raw messages (pure logic)."""

from __future__ import annotations

import base64
import json
import tracemalloc
from datetime import UTC, datetime, timedelta, timezone

import pytest

from schemas import TopicNames, encode_event
from streams.records import RAW_COLUMNS, Accepted, DeadLetter, SourceRef, classify, dedupe, ingestion_ms, raw_row
from tests.support.events import BASE_TIME, queued

TOPICS = TopicNames("unit")
SOURCE = SourceRef(TOPICS.sandbox, 3, 17)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"{", "invalid_json"),
        (b"\xc3\x28", "invalid_utf8"),
        (b'"a string"', "not_an_object"),
        (b'{"event_type": "sandbox.teleported"}', "unknown_event_type"),
        (b'{"event_type": "sandbox.rollout_queued", "schema_version": 99}', "unsupported_schema_version"),
        (b'{"event_type": "sandbox.rollout_queued", "schema_version": 1}', "validation"),
        (None, "empty"),
    ],
)
def test_bad_messages_are_dead_lettered_with_their_reason(value: bytes | None, reason: str) -> None:
    item = classify(value, b"key", SOURCE, TOPICS)
    assert isinstance(item, DeadLetter)
    assert item.reason == reason
    assert item.source == SOURCE


@pytest.mark.parametrize("year", [1999, 2300])
def test_event_times_far_from_now_are_dead_lettered(year: int) -> None:
    event = queued(1).model_copy(update={"occurred_at": BASE_TIME.replace(year=year)})
    item = classify(encode_event(event), b"k", SOURCE, TOPICS, now=BASE_TIME)
    assert isinstance(item, DeadLetter)
    assert item.reason == "timestamp_out_of_range"


def test_an_event_a_little_ahead_of_the_clock_is_accepted() -> None:
    item = classify(encode_event(queued(1)), b"k", SOURCE, TOPICS, now=BASE_TIME - timedelta(hours=12))
    assert isinstance(item, Accepted)


def test_an_event_on_the_wrong_topic_is_dead_lettered() -> None:
    item = classify(encode_event(queued(1)), b"k", SourceRef(TOPICS.verifier, 0, 0), TOPICS)
    assert isinstance(item, DeadLetter)
    assert item.reason == "wrong_topic"


def test_dead_letter_message_keeps_raw_bytes_and_position() -> None:
    raw = b"\x00\xffnot an event"
    item = classify(raw, b"\x01k", SOURCE, TOPICS)
    assert isinstance(item, DeadLetter)
    message = json.loads(item.to_message())
    assert base64.b64decode(message["raw_b64"]) == raw
    assert base64.b64decode(message["key_b64"]) == b"\x01k"
    assert message["source"] == {"topic": TOPICS.sandbox, "partition": 3, "offset": 17}
    assert message["reason"] == item.reason


def test_valid_event_becomes_a_raw_row_with_its_source() -> None:
    event = queued(5, domain="math")
    item = classify(encode_event(event), b"k", SOURCE, TOPICS)
    assert isinstance(item, Accepted)
    row = dict(zip(RAW_COLUMNS, raw_row(item, BASE_TIME), strict=True))
    assert row["event_id"] == event.event_id
    assert row["domain"] == "math"
    assert row["trajectory_id"] == "traj-5"
    assert (row["source_topic"], row["source_partition"], row["source_offset"]) == (TOPICS.sandbox, 3, 17)
    assert json.loads(row["payload"])["task_id"] == event.task_id


def test_dedupe_keeps_the_first_of_each_event_id() -> None:
    items = [classify(encode_event(queued(i)), None, SourceRef(TOPICS.sandbox, 0, n), TOPICS)
             for n, i in enumerate([1, 2, 1, 3, 2])]
    kept = dedupe([i for i in items if isinstance(i, Accepted)])
    assert [k.source.offset for k in kept] == [0, 1, 3]


def test_a_dead_letter_near_the_broker_limit_keeps_all_its_raw_bytes() -> None:
    raw = b"\xff" * 1_100_000
    item = classify(raw, None, SOURCE, TOPICS)
    assert isinstance(item, DeadLetter)
    message = json.loads(item.to_message())
    assert message["raw_truncated"] is False
    assert base64.b64decode(message["raw_b64"]) == raw


def test_a_dead_letter_too_large_for_its_topic_is_truncated_with_size_and_digest() -> None:
    import hashlib

    raw = b"x" * 10_000
    item = classify(raw, b"k", SOURCE, TOPICS)
    assert isinstance(item, DeadLetter)
    wire = item.to_message(max_bytes=8_000)
    assert len(wire) <= 8_000
    message = json.loads(wire)
    assert message["raw_truncated"] is True
    assert message["raw_bytes"] == 10_000
    assert message["raw_sha256"] == hashlib.sha256(raw).hexdigest()
    assert raw.startswith(base64.b64decode(message["raw_b64"]))


def test_an_accepted_payload_holds_no_more_memory_than_its_text() -> None:
    # A batch in flight keeps every payload until its rows are stored: orjson's output bytes keep the
    # whole write buffer (4 KiB or more each), which made ~100 MiB of a worker's steady memory.
    messages = [encode_event(queued(i)) for i in range(200)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        payloads = [item.payload for item in (classify(m, b"k", SOURCE, TOPICS) for m in messages)
                    if isinstance(item, Accepted)]
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    text = sum(len(p) for p in payloads)
    assert len(payloads) == len(messages)
    assert payloads[0] == encode_event(queued(0)).decode()
    assert held < 1.5 * text + 200 * 100, (held, text)


@pytest.mark.parametrize("at", [datetime(2026, 5, 1, 12, 0, 0, 123456, tzinfo=UTC), datetime(1970, 1, 1, tzinfo=UTC),
                                datetime(2100, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
                                datetime(2026, 5, 1, 14, 0, 0, 999, tzinfo=timezone(timedelta(hours=2)))])
def test_ingestion_ms_are_the_ticks_the_client_writes_for_the_datetime(at: datetime) -> None:
    from clickhouse_connect.datatypes.registry import get_from_name

    column = get_from_name("DateTime64(3, 'UTC')")
    assert ingestion_ms(at) == column._datetime64_ticks(at)  # what the client computes for each datetime row
