"""Direct ingestion's pure parts: which offsets a stored batch commits, and the consumer's settings."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from pydantic import ValidationError

from rollout.settings import Settings
from streams.direct import DirectIngest, commit_offsets, consumer_config, partition_lag
from streams.forward import RawMessage


def _m(topic: str, partition: int, offset: int) -> RawMessage:
    return RawMessage(topic, partition, offset, None, b"{}")


def test_a_stored_batch_commits_the_next_offset_of_every_partition_it_read() -> None:
    batch = [_m("a", 0, 5), _m("a", 1, 9), _m("a", 0, 7), _m("b", 0, 2), _m("a", 0, 6)]
    got = [(tp.topic, tp.partition, tp.offset) for tp in commit_offsets(batch)]
    assert got == [("a", 0, 8), ("a", 1, 10), ("b", 0, 3)]
    assert commit_offsets([]) == []


def test_the_consumer_never_commits_on_its_own_and_uses_the_worker_group(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, consumer_group="g1", kafka_bootstrap_servers_setting="h:1")
    config = consumer_config(settings)
    assert config["group.id"] == "g1"
    assert config["enable.auto.commit"] is False
    assert config["auto.offset.reset"] == "earliest"
    assert config["bootstrap.servers"] == "h:1"


def test_the_prefetch_is_bounded_by_the_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert consumer_config(Settings(data_dir=tmp_path))["queued.max.messages.kbytes"] == 4096
    monkeypatch.setenv("ROLLOUT_INGEST_PREFETCH_KBYTES", "16384")
    assert consumer_config(Settings(data_dir=tmp_path))["queued.max.messages.kbytes"] == 16384
    monkeypatch.setenv("ROLLOUT_INGEST_PREFETCH_KBYTES", "10")
    with pytest.raises(ValidationError, match="ROLLOUT_INGEST_PREFETCH_KBYTES"):
        Settings(data_dir=tmp_path)


def _free() -> threading.Event:
    free = threading.Event()
    free.set()
    return free


class _Consumer:
    """Records what the ingest asks of the consumer in a rebalance callback."""

    def __init__(self) -> None:
        self.resumed: list[tuple[str, int]] = []

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.resumed += [(tp.topic, tp.partition) for tp in partitions]


async def _never(_messages: list[RawMessage], _released: Any) -> Any:
    raise AssertionError("nothing is stored here")


def test_a_revoked_partition_the_merge_paused_is_resumed_before_it_goes(tmp_path: Path) -> None:
    # librdkafka keeps a pause across a rebalance; the merge forgets the partition on revoke, so a
    # partition given back to this worker would never deliver again unless resumed while still assigned.
    ingest = DirectIngest(Settings(data_dir=tmp_path), _never, on_stored=lambda _n, _w: None,
                          stopping=lambda: False)
    try:
        merge = ingest._merge
        merge.paused.update({("raw", 0), ("raw", 2)})
        consumer = _Consumer()
        ingest._revoked(consumer, [TopicPartition("raw", 0), TopicPartition("raw", 1)])  # type: ignore[arg-type]
        assert consumer.resumed == [("raw", 0)]  # paused and revoked; 1 was not paused; 2 stays
        assert merge.paused == {("raw", 2)}
        ingest._revoked(consumer, [TopicPartition("raw", 1)])  # type: ignore[arg-type]
        assert consumer.resumed == [("raw", 0)]
    finally:
        ingest._executor.shutdown(wait=False)


class _Message:
    def __init__(self, partition: int, offset: int, at: str) -> None:
        self._partition, self._offset = partition, offset
        self._value = b'{"event_type":"sandbox.tool_called","occurred_at":"' + at.encode() + b'"}'

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "raw"

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> None:
        return None

    def value(self) -> bytes:
        return self._value


class _ReadingConsumer(_Consumer):
    """Hands out ``messages`` at the first read; ``ends``: each partition's end (high watermark), for the lag."""

    def __init__(self, messages: list[_Message], ends: dict[int, int] | None = None) -> None:
        super().__init__()
        self.messages = messages
        self.ends = ends or {}
        self.positions: dict[int, int] = {}

    def consume(self, num_messages: int, timeout: float) -> list[_Message]:
        out, self.messages = self.messages, []
        for m in out:
            self.positions[m.partition()] = max(self.positions.get(m.partition(), 0), m.offset() + 1)
        return out

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition("raw", p) for p in sorted(self.ends)]

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.positions.get(tp.partition, -1001)) for tp in partitions]

    def get_watermark_offsets(self, tp: TopicPartition, cached: bool) -> tuple[int, int]:
        assert cached  # never a request to the broker per read
        return 0, self.ends[tp.partition]

    def pause(self, partitions: list[TopicPartition]) -> None:
        pass


def test_every_read_reports_what_the_merge_holds(tmp_path: Path) -> None:
    reads: list[tuple[int, int, int | None]] = []
    ingest = DirectIngest(Settings(data_dir=tmp_path), _never, on_stored=lambda _n, _w: None, stopping=lambda: False,
                          on_read=lambda held, paused, behind: reads.append((held, paused, behind)))
    try:
        # Partition 1 is a day ahead of partition 0 in event time: its messages wait for partition 0.
        ingest._consumer = _ReadingConsumer(  # type: ignore[assignment]
            [_Message(0, 0, "2026-11-01T00:00:00Z")] + [_Message(1, i, "2026-11-02T00:00:00Z") for i in range(3)])
        released = ingest._poll(_free())
        assert [(m.partition, m.offset) for m in released] == [(0, 0)]
        assert reads == [(3, 0, None)] and ingest._merge.held == 3  # no partition's end known: behind unknown
    finally:
        ingest._executor.shutdown(wait=False)


def test_behind_counts_every_message_not_stored_yet_wherever_it_is(tmp_path: Path) -> None:
    reads: list[int | None] = []
    ingest = DirectIngest(Settings(data_dir=tmp_path), _never, on_stored=lambda _n, _w: None, stopping=lambda: False,
                          on_read=lambda _held, _paused, behind: reads.append(behind))
    try:
        # 10 messages in partition 0 and 50 in partition 1, of which the first read gets 1 and 3.
        ingest._consumer = _ReadingConsumer(  # type: ignore[assignment]
            [_Message(0, 0, "2026-11-01T00:00:00Z")] + [_Message(1, i, "2026-11-02T00:00:00Z") for i in range(3)],
            ends={0: 10, 1: 50})
        released = ingest._poll(_free())
        # Not read: 9 + 47; held by the merge: 3; on its way to be stored: the 1 released. Nothing is stored.
        assert len(released) == 1 and reads == [60]
        ingest._in_flight = 1  # what run() counts once the batch is handed over
        assert ingest.behind({("raw", 0): 9, ("raw", 1): 47}, 2) == 60
        ingest._in_flight = 0  # stored
        assert ingest.behind({("raw", 0): 9, ("raw", 1): 47}, 2) == 59
        # A partition without figures: no figure at all (a part of the partitions would understate it).
        assert ingest.behind({("raw", 0): 9, ("raw", 1): 47}, 3) is None
        assert ingest.behind({}, 0) is None
    finally:
        ingest._executor.shutdown(wait=False)


def test_a_partition_not_read_from_yet_counts_from_where_its_reading_begins() -> None:
    consumer = _ReadingConsumer([_Message(0, 4, "2026-11-01T00:00:00Z")], ends={0: 10, 1: 30, 2: 30, 3: 30})
    consumer.consume(1, 0)  # partition 0 read up to offset 4; nothing of 1, 2 and 3 yet
    lag = partition_lag(consumer, {("raw", 1): 12, ("raw", 2): None})  # type: ignore[arg-type]
    # 1: committed at 12; 2: nothing committed, so from its first offset (0 here); 3: start not known yet.
    assert lag == {("raw", 0): 5, ("raw", 1): 18, ("raw", 2): 30}


class _TwoBatches(_ReadingConsumer):
    """Offers the second batch only once the first is being stored; records commits."""

    def __init__(self, first: list[_Message], second: list[_Message], second_ready: threading.Event) -> None:
        super().__init__(first)
        self.second, self.second_ready = second, second_ready
        self.commits: list[list[tuple[int, int]]] = []

    def consume(self, num_messages: int, timeout: float) -> list[_Message]:
        if not self.messages and self.second and self.second_ready.is_set():
            self.messages, self.second = self.second, []
        out = super().consume(num_messages, timeout)
        if not out:
            time.sleep(min(timeout, 0.005))
        return out

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> None:
        assert not asynchronous
        self.commits.append([(tp.partition, tp.offset) for tp in offsets])

    def close(self) -> None:
        pass


def test_the_next_batch_is_handled_once_the_owner_is_released_and_commits_keep_batch_order(tmp_path: Path) -> None:
    """A batch whose derived messages are still in delivery has released the owner: the next batch is taken
    and handled meanwhile, but its offsets are committed only after the earlier batch's."""
    settings = Settings(data_dir=tmp_path, ingest_align_seconds=0, sink_batch_seconds=3.0,
                        sink_batch_min_seconds=0.05)
    second_ready = threading.Event()
    consumer = _TwoBatches([_Message(0, 0, "2026-11-01T00:00:00Z")], [_Message(0, 1, "2026-11-01T00:00:01Z")],
                           second_ready)
    events: list[str] = []

    async def run() -> None:
        second_handled = asyncio.Event()

        async def handle(messages: list[RawMessage], released: Callable[[], None]) -> Any:
            offset = messages[0].offset
            events.append(f"handle {offset}")
            in_flight.append(ingest._in_flight)
            if offset == 0:
                second_ready.set()
                released()  # stored and derived; "delivery" goes on until the next batch is being handled
                await asyncio.wait_for(second_handled.wait(), timeout=2)
            else:
                second_handled.set()
            events.append(f"return {offset}")
            return "written"

        ingest = DirectIngest(settings, handle, on_stored=lambda _n, _w: events.append("stored"),
                              stopping=lambda: len(consumer.commits) == 2)
        ingest._open = lambda: setattr(ingest, "_consumer", consumer)  # type: ignore[method-assign]
        await asyncio.wait_for(ingest.run(), timeout=30)
        in_flight.append(ingest._in_flight)

    in_flight: list[int] = []
    asyncio.run(run())
    assert events == ["handle 0", "handle 1", "return 1", "return 0", "stored", "stored"]
    assert in_flight == [1, 2, 0]  # both batches in flight together, none once stored
    assert consumer.commits == [[(0, 1)], [(0, 2)]]


class _Partitioned(_Consumer):
    """Serves each partition's messages in order, partition 1 first, nothing of a paused partition."""

    def __init__(self, messages: dict[int, list[_Message]]) -> None:
        super().__init__()
        self.messages = messages
        self.paused: set[int] = set()
        self.calls: list[tuple[str, Any]] = []

    def consume(self, num_messages: int, timeout: float) -> list[_Message]:
        out: list[_Message] = []
        for partition in sorted(self.messages, reverse=True):
            if partition not in self.paused:
                taken = self.messages[partition][:num_messages - len(out)]
                self.messages[partition] = self.messages[partition][len(taken):]
                out += taken
        self.calls.append(("consume", [m.partition() for m in out]))
        return out

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused.update(tp.partition for tp in partitions)
        self.calls.append(("pause", sorted(tp.partition for tp in partitions)))

    def resume(self, partitions: list[TopicPartition]) -> None:
        super().resume(partitions)
        self.paused.difference_update(tp.partition for tp in partitions)

    def assignment(self) -> list[TopicPartition]:
        return []


def test_a_partition_the_merge_holds_too_much_of_is_paused_before_the_batch_is_read_in_full(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads go in chunks, and a partition far ahead in event time is paused as soon as the merge holds more than
    its limit of it: the rest of the batch's read comes from the partition the merge waits for."""
    monkeypatch.setattr("streams.direct.READ_CHUNK", 3)
    ingest = DirectIngest(Settings(data_dir=tmp_path, sink_batch_size=9, sink_batch_seconds=5.0), _never,
                          on_stored=lambda _n, _w: None, stopping=lambda: False)
    ingest._merge.hold_limit = 4
    consumer = _Partitioned({0: [_Message(0, i, "2026-11-01T00:00:00Z") for i in range(20)],
                             1: [_Message(1, i, "2026-11-02T00:00:00Z") for i in range(20)]})
    try:
        ingest._consumer = consumer  # type: ignore[assignment]
        released = ingest._poll(_free())
        assert consumer.calls[:4] == [("consume", [1, 1, 1]), ("consume", [1, 1, 1]), ("pause", [1]),
                                      ("consume", [0, 0, 0])]
        assert ingest._merge.held == 6  # partition 1's, a day ahead; without the pause it would be 9
        assert [(m.partition, m.offset) for m in released] == [(0, 0), (0, 1), (0, 2)]
    finally:
        ingest._executor.shutdown(wait=False)
