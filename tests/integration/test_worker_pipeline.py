"""The worker through the real broker and the real ClickHouse engine: exactly once, dead letters, restarts."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from producers.kafka import EventProducer
from rollout.settings import Settings
from schemas import TopicNames
from tests.support.events import queued
from tests.support.worker import WorkerProcess, committed_offsets, settings_env

pytestmark = pytest.mark.integration


@pytest.fixture(params=["faust", "direct"])
def stack_settings(stack_settings: Settings, request: pytest.FixtureRequest) -> Settings:
    """Every test here runs with both ways of reading the raw topics (ROLLOUT_INGEST)."""
    return stack_settings.model_copy(update={"ingest": request.param})


def _consume_all(
    settings: Settings, topic: str, expected: int, timeout: float = 30.0
) -> list[tuple[bytes, dict[str, bytes]]]:
    consumer = Consumer({**settings.kafka_client_config(), "group.id": f"{settings.consumer_group}-reader",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    found: list[tuple[bytes, dict[str, bytes]]] = []
    deadline = time.monotonic() + timeout
    try:
        while len(found) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            found.append((msg.value(), dict(msg.headers() or [])))
    finally:
        consumer.close()
    return found


def test_sdk_events_are_stored_exactly_once_even_when_sent_twice(stack_settings: Settings,
                                                                  worker: WorkerProcess) -> None:
    events = [queued(i, domain=("code", "math", "cad")[i % 3]) for i in range(3000)]
    with EventProducer.from_settings(stack_settings) as producer:
        for event in events:
            producer.send(event)
        for event in events[:500]:  # a producer retrying after a lost acknowledgement
            producer.send(event)
    stats = worker.wait_consumed(3500)
    assert stats["stored"] == 3000
    assert stats["duplicates"] == 500
    # A run that began under this worker: its 3,000 new trajectories were not looked up in ClickHouse (the
    # resent events' trajectories were: they had been seen). Only the embedded engine's owner keeps caches.
    assert stats["lookups_skipped"] == (3000 if stack_settings.clickhouse_embedded else 0)
    assert stats["lookup_filter_restarts"] == 0
    rows = worker.query("SELECT count(), uniqExact(event_id) FROM events_raw WHERE run_id = {r:String}",
                        {"r": "run-test"}).rows
    assert rows == [[3000, 3000]]
    by_domain = dict(worker.query("SELECT domain, count() FROM events_raw GROUP BY domain").rows)
    assert by_domain == {"code": 1000, "math": 1000, "cad": 1000}
    # Stored batches are acked: the group's committed offsets reach the end of the log.
    deadline = time.monotonic() + 30
    while committed_offsets(stack_settings) < 3500 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert committed_offsets(stack_settings) == 3500
    # Direct ingestion reports how far behind it is (/stats `behind`): nothing once all is stored.
    if stack_settings.ingest == "direct":
        while worker.stats()["behind"] != 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert worker.stats()["behind"] == 0
    else:
        assert worker.stats()["behind"] is None
    # `rollout status` says the same in words, from the running worker.
    shown = subprocess.run([sys.executable, "-m", "rollout.cli", "status"], capture_output=True, text=True,
                           env={**os.environ, **settings_env(stack_settings)}, timeout=60, check=False)
    assert shown.returncode == 0, shown.stderr
    state = "caught up" if stack_settings.ingest == "direct" else "running"
    assert f"/stats: {state}, up " in shown.stdout
    assert "consumed 3,500 messages" in shown.stdout
    assert "stored 3,000 events, ignored 500 duplicates, dead-lettered 0" in shown.stdout


def test_malformed_messages_are_dead_lettered_and_the_worker_continues(stack_settings: Settings,
                                                                      worker: WorkerProcess) -> None:
    topics = TopicNames(stack_settings.topic_prefix)
    bad = [b"{not json", b"\xff\xfe\x00", b"[1, 2]", b'{"event_type": "sandbox.unknown"}']
    with EventProducer.from_settings(stack_settings) as producer:
        for i in range(10):
            producer.send(queued(i))
        for value in bad:
            producer.send_raw(topics.sandbox, value, key=b"bad")
        for i in range(10, 20):
            producer.send(queued(i))
    stats = worker.wait_consumed(24)
    assert stats["stored"] == 20
    assert stats["dead_lettered"] == 4
    assert stats["consumed"] == stats["stored"] + stats["duplicates"] + stats["dead_lettered"]

    letters = _consume_all(stack_settings, topics.deadletter, expected=4)
    assert len(letters) == 4
    decoded = [json.loads(value) for value, _ in letters]
    assert sorted(base64.b64decode(d["raw_b64"]) for d in decoded) == sorted(bad)
    assert {d["reason"] for d in decoded} == {"invalid_json", "invalid_utf8", "not_an_object",
                                              "unknown_event_type"}
    assert all(d["source"]["topic"] == topics.sandbox and d["source"]["offset"] >= 0 for d in decoded)
    assert {h["reason"].decode() for _, h in letters} == {d["reason"] for d in decoded}

    stored = worker.query("SELECT reason, count() FROM dead_letters GROUP BY reason ORDER BY reason").rows
    assert stored == [["invalid_json", 1], ["invalid_utf8", 1], ["not_an_object", 1], ["unknown_event_type", 1]]
    assert worker.scalar("SELECT count() FROM events_raw") == 20


def test_a_killed_worker_restarts_without_losing_or_doubling_events(stack_settings: Settings,
                                                                   worker: WorkerProcess) -> None:
    with EventProducer.from_settings(stack_settings) as producer:
        for i in range(2000):
            producer.send(queued(i))
    worker.wait_consumed(2000)
    worker.kill()  # SIGKILL right after writing: offsets of the last batches are likely uncommitted
    with EventProducer.from_settings(stack_settings) as producer:
        for i in range(2000, 2500):
            producer.send(queued(i))
    worker.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and worker.scalar("SELECT count() FROM events_raw") < 2500:
        time.sleep(0.3)
    assert worker.query("SELECT count(), uniqExact(event_id) FROM events_raw").rows == [[2500, 2500]]


def test_a_stored_version_1_payload_flows_through_as_version_2(stack_settings: Settings,
                                                               worker: WorkerProcess) -> None:
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "events" / "v1" / "sandbox.rollout_started.json"
    raw = fixture.read_bytes()
    topics = TopicNames(stack_settings.topic_prefix)
    with EventProducer.from_settings(stack_settings) as producer:
        producer.send_raw(topics.sandbox, raw, key=json.loads(raw)["trajectory_id"])
    stats = worker.wait_consumed(1)
    assert (stats["stored"], stats["dead_lettered"]) == (1, 0)
    row = worker.query("SELECT schema_version, JSONExtractString(payload, 'sandbox_pool'), "
                       "JSONExtractString(payload, 'sandbox_id') FROM events_raw").rows
    assert row == [[2, "default", "sb-legacy-7"]]
    record = worker.query("SELECT status, sandbox_id, policy_version FROM v_trajectories").rows
    assert record == [["running", "sb-legacy-7", 3]]


def test_a_worker_started_on_a_backlog_logs_how_it_catches_up(stack_settings: Settings, tmp_path: Path) -> None:
    # The catch-up lines come from the worker's report timer (streams.progress), here every 0.5 s; the backlog
    # is published before the worker starts, so it begins 60,000 messages behind.
    settings = stack_settings.model_copy(update={"worker_report_seconds": 0.5})
    total = 60_000
    with EventProducer.from_settings(settings) as producer:
        for i in range(total):
            producer.send(queued(i, domain=("code", "math", "cad")[i % 3]))
    worker = WorkerProcess(settings, tmp_path / "catch-up.log", log_level="info").start()
    try:
        assert worker.wait_consumed(total, timeout=180)["stored"] == total
        deadline = time.monotonic() + 15
        while "caught up:" not in worker.log_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        lines = [line for line in worker.log_path.read_text().splitlines() if "catching up:" in line
                 or "caught up:" in line]
    finally:
        worker.stop()
    if settings.ingest == "faust":  # the Faust agent knows no backlog figure, so it says nothing of one
        assert lines == []
        return
    behind = [int(line.split("catching up: ")[1].split(" messages")[0].replace(",", ""))
              for line in lines if "catching up:" in line]
    assert behind, "\n".join(lines)
    assert all(10_000 <= b <= total for b in behind)
    assert behind == sorted(behind, reverse=True)  # the backlog only shrinks
    assert "caught up:" in lines[-1]
    assert sum("caught up:" in line for line in lines) == 1
