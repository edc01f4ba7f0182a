"""Bulk replay (``rollout replay``) on the real broker and engine: the same views as the live worker's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.pipeline import compare_views, snapshot_views
from infra.kafka.topics import ensure_topics
from producers.kafka import EventProducer
from producers.scenario import load_scenario
from producers.simulator import generate, publish
from rollout.settings import Settings
from schemas import TopicNames
from streams.replay import TEMP_PREFIX
from tests.support.replay import run_replay
from tests.support.worker import WorkerProcess

GOLDEN = Path(__file__).resolve().parents[2] / "scenarios" / "golden.yaml"
BAD = [b"{not json", b'{"event_type": "sandbox.unknown"}']


@pytest.fixture
def live_run(stack_settings: Settings, worker: WorkerProcess) -> int:
    """The golden scenario and two malformed messages, consumed by the live worker, which is then stopped."""
    topics = TopicNames(stack_settings.topic_prefix)
    events = list(generate(load_scenario(GOLDEN)))
    with EventProducer.from_settings(stack_settings) as producer:
        report = publish(events, producer)
        for value in BAD:
            producer.send_raw(topics.sandbox, value, key=b"bad")
    stats = worker.wait_consumed(report.published + len(BAD))
    assert stats["dead_lettered"] == len(BAD)
    assert worker.stop() == 0  # the embedded engine's folder is the worker's while it runs
    return int(report.published + len(BAD))


def test_replay_rebuilds_the_live_views_exactly(stack_settings: Settings, worker: WorkerProcess,
                                                 live_run: int) -> None:
    live_db = stack_settings.clickhouse_database
    rebuilt = f"{live_db}_replayed"
    result = run_replay(stack_settings, "--database", rebuilt, "--batch-size", "1000")
    assert result.returncode == 0, result.stderr
    assert f"replayed {live_run:,} messages into {rebuilt}" in result.stdout
    assert "2 dead letters" in result.stdout
    assert "(assembled in memory)" in result.stderr  # a small run: the replay's own choice
    assert "run golden: folded them per trajectory in" in result.stderr  # each step of the rebuild is reported

    # A second replay into the same database would lay new rows beside the rebuilt ones: refused, nothing written.
    again = run_replay(stack_settings, "--database", rebuilt)
    assert again.returncode == 1
    assert "run 'golden' already has derived rows" in again.stderr and "--database" in again.stderr

    on_disk = f"{live_db}_on_disk"
    disk = run_replay(stack_settings, "--database", on_disk, "--on-disk")
    assert disk.returncode == 0 and "(assembled on disk)" in disk.stderr

    # Read the databases through a worker (the test process may own another embedded engine already).
    worker.start()
    live, replayed = snapshot_views(worker, live_db), snapshot_views(worker, rebuilt)
    compared, differences = compare_views(live, replayed)
    assert differences == {}
    assert compare_views(live, snapshot_views(worker, on_disk))[1] == {}
    assert compared["v_trajectories"] == 1000 and compared["v_alerts"] == 1 and compared["v_windows"] > 0
    assert len(compared) == 14
    for table in ("events_raw", "consumptions", "dead_letters"):
        counts = [worker.scalar(f"SELECT count() FROM `{db}`.{table}") for db in (live_db, rebuilt)]
        assert counts[0] == counts[1] > 0, table
    letters = "SELECT source_topic, source_partition, source_offset, reason, raw FROM `{}`.dead_letters ORDER BY 3"
    assert worker.query(letters.format(live_db)).rows == worker.query(letters.format(rebuilt)).rows
    leftovers = worker.query("SELECT database, name FROM system.tables WHERE database IN ({a:String}, {b:String}) "
                             "AND startsWith(name, {prefix:String})",
                             {"a": rebuilt, "b": on_disk, "prefix": TEMP_PREFIX}).rows
    assert leftovers == []


def test_replay_refuses_a_database_name_it_cannot_quote(stack_settings: Settings) -> None:
    result = run_replay(stack_settings, "--database", "bad-name;")
    assert result.returncode == 1
    assert "letters, digits and _ only" in result.stderr


def test_replay_refuses_two_places_for_the_assembly(stack_settings: Settings) -> None:
    result = run_replay(stack_settings, "--on-disk", "--in-memory")
    assert result.returncode == 1
    assert "exclude each other" in result.stderr and "Traceback" not in result.stderr


def test_a_replay_of_topics_without_messages_says_where_it_looked(stack_settings: Settings) -> None:
    result = run_replay(stack_settings, "--database", "nothing_here")
    assert result.returncode == 0, result.stderr
    assert "replayed 0 messages" in result.stdout
    assert f"no messages on {stack_settings.topic_prefix}" in result.stderr
    assert "ROLLOUT_TOPIC_PREFIX" in result.stderr


def test_replay_stores_each_event_once_however_often_the_log_has_it(stack_settings: Settings) -> None:
    """Copies of events later in the log (other batches, after the set of ids merged its levels) and right
    after themselves (one batch) are skipped; every other event is stored once."""
    topics = TopicNames(stack_settings.topic_prefix)
    ensure_topics({"bootstrap.servers": stack_settings.kafka_bootstrap_servers}, list(topics.raw), partitions=4)
    events = list(generate(load_scenario(GOLDEN)))
    copied = events[::9]
    twice = {event.event_id for event in copied[:20]}
    with EventProducer.from_settings(stack_settings) as producer:
        for event in events:
            producer.send(event)
            if event.event_id in twice:
                producer.send(event)  # the same bytes again at once
        for event in copied:
            producer.send(event)  # and at the end of the log
    result = run_replay(stack_settings, "--database", "once", "--batch-size", "100")
    assert result.returncode == 0, result.stderr
    said = " ".join(result.stdout.split())  # the console wraps lines
    assert f"replayed {len(events) + 20 + len(copied):,} messages into once" in said
    assert f"{len(events):,} raw events stored, {20 + len(copied):,} duplicates skipped" in said

    # A run whose raw events are stored but not its derived rows (a replay stopped before deriving): a replay
    # again loads the stored ids from the engine (streams.replay.StoredIds) and stores nothing twice.
    _engine(stack_settings, "once", "TRUNCATE TABLE trajectories", "TRUNCATE TABLE m_window_metrics")
    again = run_replay(stack_settings, "--database", "once", "--batch-size", "100")
    assert again.returncode == 0, again.stderr
    said = " ".join(again.stdout.split())
    assert f"0 raw events stored, {len(events) + 20 + len(copied):,} duplicates skipped" in said
    assert _engine(stack_settings, "once", "SELECT count(), uniqExact(event_id) FROM events_raw") == [
        f"{len(events)}\t{len(events)}"]


def _engine(settings: Settings, database: str, *statements: str) -> list[str]:
    """Run ``statements`` on ``database`` in a process of its own (one embedded engine per process); the rows of
    the SELECTs among them as tab-separated lines."""
    script = ("import sys\nfrom infra.clickhouse.client import connect\n"
              "client = connect(sys.argv[1], database=sys.argv[2])\n"
              "for sql in sys.argv[3:]:\n"
              "    if not sql.startswith('SELECT'):\n        client.command(sql)\n        continue\n"
              "    for row in client.query(sql).result_rows:\n        print(*row, sep='\\t')\n")
    done = subprocess.run([sys.executable, "-c", script, settings.clickhouse_url, database, *statements],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()
