"""``rollout replay --hand-off`` on the real broker and engine: a worker goes on where the replay ended.

A backlog is caught up in bulk (the first half of a scenario's log), the worker's consumer group is committed at
the replay's end, and a worker started on the rebuilt database reads only the second half. Its views must equal
those of one replay of the whole log, which ``test_replay.py`` holds to a live worker's.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from bench.pipeline import compare_views, snapshot_views
from infra.kafka.topics import ensure_topics
from producers.kafka import EventProducer
from producers.scenario import load_scenario
from producers.simulator import generate, publish
from rollout.errors import ServiceUnavailable
from rollout.settings import Settings
from schemas import Envelope, TopicNames
from streams.replay import commit_hand_off, consumer_config, log_end
from tests.support.replay import run_replay
from tests.support.worker import WorkerProcess, committed_offsets

GOLDEN = Path(__file__).resolve().parents[2] / "scenarios" / "golden.yaml"


def _send(settings: Settings, events: list[Envelope], bad: bytes) -> int:
    """Publish ``events`` and one malformed message; the number of messages sent."""
    with EventProducer.from_settings(settings) as producer:
        report = publish(events, producer)
        producer.send_raw(TopicNames(settings.topic_prefix).sandbox, bad, key=b"bad")
    return int(report.published) + 1


def test_a_worker_goes_on_where_a_hand_off_replay_ended(stack_settings: Settings, tmp_path: Path) -> None:
    topics = TopicNames(stack_settings.topic_prefix)
    ensure_topics(stack_settings.kafka_client_config(), list(topics.raw), partitions=4)
    events = list(generate(load_scenario(GOLDEN)))
    half = len(events) // 2  # trajectories, windows and the run's versions span the two halves
    first = _send(stack_settings, events[:half], b"{not json")

    caught_up = f"{stack_settings.clickhouse_database}_caught_up"
    result = run_replay(stack_settings, "--database", caught_up, "--hand-off", "--batch-size", "500")
    assert result.returncode == 0, result.stderr
    said = " ".join(result.stdout.split())  # the console wraps lines
    assert f"replayed {first:,} messages into {caught_up}" in said
    assert f"handed off: consumer group {stack_settings.consumer_group} committed at the replay's end" in said
    assert f"CLICKHOUSE_DATABASE={caught_up} rollout worker" in said
    assert committed_offsets(stack_settings) == first  # offsets from 0, no gaps: the end of each partition

    worker = WorkerProcess(stack_settings.model_copy(update={"clickhouse_database": caught_up}),
                           tmp_path / "worker.log").start()
    try:
        second = _send(stack_settings, events[half:], b'{"event_type": "sandbox.unknown"}')
        stats = worker.wait_consumed(second)
        time.sleep(1.0)  # anything read twice would show up as more
        stats = worker.stats()
        assert stats["consumed"] == second, stats
        assert stats["dead_lettered"] == 1 and stats["duplicates"] == 0, stats
        assert committed_offsets(stack_settings) == first + second
    finally:
        assert worker.stop() == 0

    whole = f"{stack_settings.clickhouse_database}_whole"
    reference = run_replay(stack_settings.model_copy(update={"consumer_group": f"{stack_settings.consumer_group}x"}),
                           "--database", whole)
    assert reference.returncode == 0, reference.stderr
    worker.start()  # reads the two databases (the embedded engine is the worker's while it runs)
    try:
        compared, differences = compare_views(snapshot_views(worker, whole), snapshot_views(worker, caught_up))
        assert differences == {}
        assert len(compared) == 14 and compared["v_trajectories"] == 1000 and compared["v_alerts"] == 1
        for table in ("events_raw", "consumptions", "dead_letters"):
            counts = [worker.scalar(f"SELECT count() FROM `{db}`.{table}") for db in (whole, caught_up)]
            assert counts[0] == counts[1] > 0, table
    finally:
        worker.stop()


def test_a_hand_off_is_refused_while_the_worker_runs(stack_settings: Settings, worker: WorkerProcess,
                                                      tmp_path: Path) -> None:
    """Refused before reading anything (another data folder, so the embedded engine's owner does not stop it
    first); and the broker itself refuses the commit of a group with members, which ends a replay that a worker
    joined meanwhile with a message instead of moving a running worker's offsets."""
    events = list(generate(load_scenario(GOLDEN)))[:200]
    sent = _send(stack_settings, events, b"{not json")
    worker.wait_consumed(sent)
    elsewhere = stack_settings.model_copy(update={"data_dir": tmp_path / "elsewhere"})
    result = run_replay(elsewhere, "--database", "never_written", "--hand-off")
    assert result.returncode == 1
    message = " ".join(result.stderr.split())
    assert f"consumer group {stack_settings.consumer_group!r} has 1 active member(s)" in message
    assert "stop the worker first" in message and "Traceback" not in message
    assert "reading" not in message  # refused before the topics were read

    before = committed_offsets(stack_settings)
    consumer = Consumer(consumer_config(stack_settings))
    try:
        ends = log_end(consumer, TopicNames(stack_settings.topic_prefix).raw)
    finally:
        consumer.close()
    with pytest.raises(ServiceUnavailable, match="the replay is stored, but"):
        commit_hand_off(stack_settings, ends)
    assert committed_offsets(stack_settings) == before == sent


def test_a_worker_that_reads_a_replayed_log_again_counts_nothing_twice(stack_settings: Settings,
                                                                        tmp_path: Path) -> None:
    """Without the hand-off (or when its commit fails) a worker on the rebuilt database reads the log from its
    group's old offsets: every event is a duplicate, nothing is stored or derived again."""
    topics = TopicNames(stack_settings.topic_prefix)
    ensure_topics(stack_settings.kafka_client_config(), list(topics.raw), partitions=4)
    sent = _send(stack_settings, list(generate(load_scenario(GOLDEN))), b"{not json")
    rebuilt = f"{stack_settings.clickhouse_database}_rebuilt"
    result = run_replay(stack_settings, "--database", rebuilt)
    assert result.returncode == 0, result.stderr

    on_rebuilt = stack_settings.model_copy(update={"clickhouse_database": rebuilt})
    # The views before, read the way they are read after: through a worker, one on topics without messages.
    idle = WorkerProcess(on_rebuilt.model_copy(update={"topic_prefix": f"{stack_settings.topic_prefix}none"}),
                         tmp_path / "idle.log").start()
    try:
        before = snapshot_views(idle, rebuilt)
        raw = idle.scalar(f"SELECT count() FROM `{rebuilt}`.events_raw")
    finally:
        assert idle.stop() == 0
    worker = WorkerProcess(on_rebuilt, tmp_path / "worker.log").start()
    try:
        stats = worker.wait_consumed(sent)
        assert stats["stored"] == 0 and stats["duplicates"] == raw, stats
        assert committed_offsets(stack_settings) == sent
        compared, differences = compare_views(before, snapshot_views(worker, rebuilt))
        assert differences == {} and compared["v_trajectories"] == 1000
        assert worker.scalar(f"SELECT count() FROM `{rebuilt}`.events_raw") == raw
    finally:
        worker.stop()
