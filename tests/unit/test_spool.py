"""The on-disk spool without a broker: order, acks, torn records, the bound, restarts, segments, lanes."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path

import pytest

import producers.spool as spool_module
from producers import DeliveryError, EventProducer, Spool, SpoolUnavailable
from producers.spool import MAGIC, SpooledMessage
from rollout.errors import ConfigurationError
from rollout.settings import Settings
from schemas.topics import TopicNames


def _fill(spool: Spool, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        assert spool.append("t.raw.sandbox", f"value-{i}".encode(), key=f"key-{i}")


def _values(messages: list[SpooledMessage]) -> list[str]:
    return [(m.value or b"").decode() for m in messages]


def _lanes(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.name.startswith("lane-"))


def _segments(directory: Path) -> list[Path]:
    return sorted(p for lane in _lanes(directory) for p in lane.glob("*.seg"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# -- append, read, ack ----------------------------------------------------------------------------


def test_messages_come_back_in_order_with_key_value_and_headers(tmp_path: Path) -> None:
    with Spool(tmp_path / "spool") as spool:
        assert spool.append("a", b"v1", key="k1", headers=[("h", b"x"), ("empty", None), ("text", "y")])
        assert spool.append("b", None, key=None)
        assert spool.append("c", b"", key=b"\x00binary", headers={"one": b"1"})

        first, second, third = spool.read(10)

    assert (first.topic, first.value, first.key) == ("a", b"v1", b"k1")
    assert first.headers == (("h", b"x"), ("empty", None), ("text", b"y"))
    assert (second.topic, second.value, second.key, second.headers) == ("b", None, None, None)
    assert (third.value, third.key, third.headers) == (b"", b"\x00binary", (("one", b"1"),))
    assert not any(m.recovered for m in (first, second, third))


def test_read_hands_out_each_message_once_and_ack_removes_it(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    _fill(spool, 5)

    batch = spool.read(3)
    assert _values(batch) == ["value-0", "value-1", "value-2"]
    assert (spool.stats.pending, spool.stats.unread) == (5, 2)
    assert _values(spool.read(10)) == ["value-3", "value-4"]
    assert spool.read(10) == []

    for message in batch:
        spool.ack(message)
    assert (spool.stats.pending, spool.stats.unread) == (2, 0)
    assert spool.stats.appended == 5
    spool.close()


def test_nack_hands_a_message_out_again(tmp_path: Path) -> None:
    with Spool(tmp_path / "spool") as spool:
        _fill(spool, 3)
        first, second, third = spool.read(3)

        spool.ack(first)
        spool.nack(second)
        spool.ack(third)

        assert spool.stats.unread == 1
        again = spool.read(10)
        assert _values(again) == ["value-1"]
        spool.ack(again[0])
        assert spool.pending == 0


# -- damage ----------------------------------------------------------------------------------------


def test_a_torn_tail_record_is_skipped_and_the_earlier_ones_survive(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "spool"
    with Spool(directory) as spool:
        _fill(spool, 3)
    segment = _segments(directory)[-1]
    whole = segment.read_bytes()
    # A crash in the middle of writing a fourth record: its header and part of its body.
    with Spool(tmp_path / "scratch") as scratch:
        scratch.append("t.raw.sandbox", b"value-3" * 10, key="key-3")
    fourth = _segments(tmp_path / "scratch")[-1].read_bytes()
    segment.write_bytes(whole + fourth[: len(fourth) // 2])

    with caplog.at_level(logging.WARNING, logger="producers.spool"), Spool(directory) as reopened:
        assert reopened.pending == 3
        messages = reopened.read(10)
        assert _values(messages) == ["value-0", "value-1", "value-2"]
        assert all(m.recovered for m in messages)
        assert reopened.stats.skipped_bytes == len(fourth) // 2
        # Nothing else is handed out, and appending after the damage still works.
        assert reopened.read(10) == []
        assert reopened.append("t.raw.sandbox", b"after", key="k")
        assert _values(reopened.read(10)) == ["after"]
    assert "torn" in caplog.text


def test_a_damaged_record_in_the_middle_is_skipped_and_later_ones_are_kept(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    with Spool(directory) as spool:
        _fill(spool, 3)
    segment = _segments(directory)[-1]
    data = bytearray(segment.read_bytes())
    second = data.find(MAGIC, 1)
    data[second + 12] ^= 0xFF  # a flipped bit in the second record's body
    segment.write_bytes(bytes(data))

    with Spool(directory) as reopened:
        assert _values(reopened.read(10)) == ["value-0", "value-2"]
        assert reopened.stats.skipped_bytes > 0


def test_garbage_segment_never_raises(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    with Spool(directory) as spool:
        _fill(spool, 1)
    _segments(directory)[-1].write_bytes(os.urandom(5000))

    with Spool(directory) as reopened:
        assert reopened.read(10) == []


# -- the bound --------------------------------------------------------------------------------------


def test_the_bound_refuses_counts_and_logs_once_per_interval(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = Spool(tmp_path / "spool", max_bytes=2000, refusal_log_interval_s=3600)
    caplog.set_level(logging.ERROR, logger="producers.spool")
    accepted = 0
    for i in range(100):
        accepted += spool.append("t.raw.sandbox", b"x" * 100, key=f"key-{i}")

    stats = spool.stats
    assert 0 < accepted < 100
    assert stats.refused == 100 - accepted
    assert stats.bytes <= 2000
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1  # once per interval, not once per message
    assert "refused 1 message(s)" in errors[0].getMessage()
    assert "ROLLOUT_SPOOL_MAX_BYTES" in errors[0].getMessage()

    # Delivering frees room.
    for message in spool.read(1000):
        spool.ack(message)
    assert spool.stats.bytes == 0
    assert spool.append("t.raw.sandbox", b"x" * 100, key="again")

    caplog.clear()
    spool.close()  # the refusals not yet reported are reported at close
    assert "refused" in caplog.text and f"({100 - accepted} in all)" in caplog.text


def test_the_bound_counts_lanes_of_other_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Other lanes' sizes are looked at about once a second; here at every append.
    monkeypatch.setattr(spool_module, "_FOREIGN_REFRESH_S", 0.0)
    directory = tmp_path / "spool"
    first = Spool(directory, max_bytes=3000)
    second = Spool(directory, max_bytes=3000)
    while first.append("t", b"x" * 100, key="k"):
        pass

    assert not second.append("t", b"x" * 100, key="k")
    first.close()
    second.close()


def test_a_message_larger_than_the_bound_is_refused(tmp_path: Path) -> None:
    with Spool(tmp_path / "spool", max_bytes=1000) as spool:
        assert not spool.append("t", b"x" * 2000)
        assert spool.stats.refused == 1


def test_an_unusable_directory_is_a_configuration_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")

    with pytest.raises(SpoolUnavailable) as info:
        Spool(blocker / "spool")
    assert isinstance(info.value, ConfigurationError)
    with pytest.raises(SpoolUnavailable):
        Spool(tmp_path / "spool", max_bytes=0)


# -- restarts ------------------------------------------------------------------------------------------


def test_a_new_spool_on_the_same_directory_resumes_at_the_cursor(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    spool = Spool(directory)
    _fill(spool, 10)
    for message in spool.read(4):
        spool.ack(message)
    spool.close()

    reopened = Spool(directory)

    assert reopened.pending == 6
    messages = reopened.read(100)
    assert _values(messages) == [f"value-{i}" for i in range(4, 10)]
    assert all(m.recovered for m in messages)
    for message in messages:
        reopened.ack(message)
    reopened.close()
    assert _lanes(directory) == []  # a drained lane leaves nothing behind


def test_acks_out_of_order_survive_a_restart_without_resending(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    spool = Spool(directory)
    _fill(spool, 5)
    messages = spool.read(5)
    for i in (0, 2, 4):
        spool.ack(messages[i])
    spool.close()

    with Spool(directory) as reopened:
        assert reopened.pending == 2
        assert _values(reopened.read(10)) == ["value-1", "value-3"]


def test_handed_out_but_unacknowledged_messages_come_back_after_a_restart(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    spool = Spool(directory)
    _fill(spool, 3)
    spool.read(3)  # resent, but the process goes before any delivery report
    spool.close()

    with Spool(directory) as reopened:
        assert _values(reopened.read(10)) == ["value-0", "value-1", "value-2"]


def test_a_spool_does_not_adopt_a_lane_still_in_use(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    first = Spool(directory)
    _fill(first, 2)
    second = Spool(directory)

    assert second.pending == 0
    assert second.append("t", b"mine", key="k")
    assert len(_lanes(directory)) == 2
    first.close()
    assert second.adopt() == 2
    assert _values(second.read(10)) == ["value-0", "value-1", "mine"]  # the older lane first
    second.close()


def test_lanes_of_another_scope_are_left_alone(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    with Spool(directory, scope="cluster-a:9092") as spool:
        _fill(spool, 2)

    with Spool(directory, scope="cluster-b:9092") as other:
        assert other.pending == 0
    with Spool(directory, scope="cluster-a:9092") as same:
        assert same.pending == 2
        meta = json.loads((_lanes(directory)[0] / "lane.json").read_text())
        assert meta["scope"] == "cluster-a:9092"


def test_from_settings_uses_the_spool_settings(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", spool_max_bytes=12345, kafka_bootstrap_servers_setting="b:1")
    with Spool.from_settings(settings) as spool:
        assert spool.directory == tmp_path / "data" / "spool"
        assert (spool.max_bytes, spool.scope) == (12345, "b:1")
    custom = Settings(data_dir=tmp_path / "data", spool_dir_setting=tmp_path / "elsewhere")
    assert custom.spool_dir == tmp_path / "elsewhere"
    assert custom.spool_max_bytes == 256 * 1024 * 1024


# -- segments --------------------------------------------------------------------------------------------


def test_segments_rotate_and_fully_delivered_ones_are_deleted(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    spool = Spool(directory, segment_bytes=1000)
    _fill(spool, 100)
    segments = _segments(directory)
    assert len(segments) > 3
    assert all(p.stat().st_size < 1000 + 100 for p in segments)

    messages = spool.read(100)
    # Acknowledging in order: the first segment's file goes exactly when its last record is acknowledged.
    acked = 0
    while segments[0].exists():
        spool.ack(messages[acked])
        acked += 1
    assert 0 < acked < 100
    remaining = _segments(directory)
    assert remaining == segments[1:]
    assert spool.stats.bytes == sum(p.stat().st_size for p in remaining)

    for message in messages[acked:]:
        spool.ack(message)
    assert _segments(directory) == []
    assert spool.stats.bytes == 0
    # The spool goes on in a new segment.
    assert spool.append("t", b"next", key="k")
    assert _values(spool.read(10)) == ["next"]
    spool.close()


# -- the producer with a spool, no broker -----------------------------------------------------------------


def test_producer_spools_without_blocking_when_kafka_is_unreachable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="producers.kafka")
    bootstrap = f"127.0.0.1:{_free_port()}"
    spool = Spool(tmp_path / "spool", scope=bootstrap)
    producer = EventProducer(config={"bootstrap.servers": bootstrap}, topics=TopicNames("u"), spool=spool)
    assert producer.config["message.timeout.ms"] == 15_000
    assert producer.config["reconnect.backoff.max.ms"] == 1_000

    started = time.monotonic()
    for i in range(2000):
        producer.send_raw("u.raw.sandbox", b"{}", key=f"traj-{i}", headers={"h": b"1"} if i % 2 else None)
    producer.flush(timeout=10)  # Kafka is away: no DeliveryError, and no waiting for it
    elapsed = time.monotonic() - started
    stats = producer.stats

    assert elapsed < 10
    assert (stats.sent, stats.delivered, stats.failed, stats.pending) == (2000, 0, 0, 2000)
    assert stats.spooled == stats.spool_pending == 2000
    producer.close(timeout=5)
    assert "spooling events to" in caplog.text

    # The next process finds every message on disk, headers included.
    with Spool(tmp_path / "spool", scope=bootstrap) as reopened:
        messages = reopened.read(5000)
    assert len(messages) == 2000
    assert {m.key for m in messages} == {f"traj-{i}".encode() for i in range(2000)}
    assert sum(1 for m in messages if m.headers == (("h", b"1"),)) == 1000


def test_producer_reports_what_a_full_spool_refused(tmp_path: Path) -> None:
    bootstrap = f"127.0.0.1:{_free_port()}"
    spool = Spool(tmp_path / "spool", max_bytes=4096, scope=bootstrap)
    producer = EventProducer(config={"bootstrap.servers": bootstrap}, topics=TopicNames("u"), spool=spool)
    for i in range(200):
        producer.send_raw("u.raw.sandbox", b"x" * 50, key=f"traj-{i}")

    with pytest.raises(DeliveryError) as info:
        producer.close(timeout=5)

    stats = producer.stats
    assert stats.spool_refused > 0
    assert stats.failed == stats.spool_refused == info.value.failed
    assert stats.spooled + stats.spool_refused == 200
    assert info.value.errors[0].code == "SPOOL_REFUSED"
    assert "spool" in str(info.value)


def test_from_settings_enables_the_spool_unless_told_not_to(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", kafka_bootstrap_servers_setting=f"127.0.0.1:{_free_port()}")
    with EventProducer.from_settings(settings) as producer:
        assert producer.spool is not None
        assert producer.spool.directory == settings.spool_dir
    with EventProducer.from_settings(settings, spool=False) as producer:
        assert producer.spool is None
        assert "message.timeout.ms" not in producer.config
    off = Settings(data_dir=tmp_path / "data", spool_max_bytes=0)
    with EventProducer.from_settings(off) as producer:
        assert producer.spool is None
