"""Pure parts of the bulk replay: validation into plain tuples, the statements it builds."""

from __future__ import annotations

from datetime import timedelta

import pytest
from confluent_kafka import KafkaError, KafkaException

from rollout.errors import ServiceUnavailable
from rollout.settings import Settings
from schemas import TopicNames, encode_event
from streams import window_store
from streams.audit import FAMILIES
from streams.replay import (
    IN_MEMORY,
    IN_MEMORY_MAX_EVENTS,
    ON_DISK,
    WINDOW_FAMILIES,
    _unanswered,
    choose_engine,
    on_assembled,
    require_idle_group,
    sql_literal,
    validate,
    window_metrics_select,
)
from tests.support.events import BASE_TIME, queued


def test_validate_keeps_plain_values_of_valid_events_and_dead_letters_the_rest() -> None:
    topics = TopicNames("p")
    event = queued(7)
    raw = encode_event(event)
    valid, dead = validate([(raw, b"k", topics.sandbox, 2, 40), (b"{not json", None, topics.sandbox, 2, 41),
                            (raw, b"k", topics.policy, 0, 5)], "p", BASE_TIME + timedelta(hours=1))
    assert valid == [(event.event_id.bytes, event.run_id, raw.decode(), topics.sandbox, 2, 40)]
    assert [(d.reason, d.source.offset) for d in dead] == [("invalid_json", 41), ("wrong_topic", 5)]


def test_every_audit_family_has_a_window_family() -> None:
    assert set(WINDOW_FAMILIES) == {f.name for f in FAMILIES}
    assert set(WINDOW_FAMILIES.values()) == {f.family for f in window_store.FAMILIES}


def test_empty_values_become_sql_literals() -> None:
    assert [sql_literal(v) for v in (0, 0.0, None, 2.5)] == ["0", "0.0", "NULL", "2.5"]
    with pytest.raises(TypeError, match="no SQL literal"):
        sql_literal("zero")


def test_the_window_select_reads_every_family_once() -> None:
    read: list[str] = []

    def source(name: str) -> str:
        read.append(name)
        return f"SELECT * FROM `{name}`"

    sql = window_metrics_select(source)
    assert sorted(read) == sorted([f.sql_file for f in FAMILIES] + ["windows.sql", "weights.sql"])
    assert sql.count("LEFT JOIN") == len(window_store.FAMILIES) + 1


def test_on_assembled_replaces_only_the_assembled_expressions() -> None:
    sql = "SELECT * FROM traj UNION ALL SELECT * FROM trajectories UNION ALL SELECT * FROM consumed"
    assert on_assembled(sql, "t_") == (
        "SELECT * FROM t_traj UNION ALL SELECT * FROM trajectories UNION ALL SELECT * FROM t_consumed")


def test_large_runs_are_assembled_on_disk() -> None:
    assert choose_engine(0) == choose_engine(IN_MEMORY_MAX_EVENTS) == IN_MEMORY
    assert choose_engine(IN_MEMORY_MAX_EVENTS + 1) == ON_DISK


def test_a_hand_off_without_a_broker_says_what_to_start() -> None:
    # Depending on timing, the describe's future times out or librdkafka reports its own time-out first.
    settings = Settings(kafka_bootstrap_servers_setting="127.0.0.1:1", consumer_group="nobody-home")
    with pytest.raises(ServiceUnavailable, match=r"'nobody-home' \(no answer in 1 s\); start Kafka"):
        require_idle_group(settings, timeout=1.0)


@pytest.mark.parametrize(("exc", "said"), [
    (TimeoutError(), "no answer in 2 s"),
    (KafkaException(KafkaError(KafkaError._TIMED_OUT)), "no answer in 2 s"),
    (KafkaException(KafkaError(KafkaError._TRANSPORT)), "no answer in 2 s"),
    (KafkaException(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED, "not allowed")), "not allowed"),
])
def test_a_broker_that_did_not_answer_is_told_apart_from_one_that_refused(exc: BaseException, said: str) -> None:
    error = exc.args[0] if exc.args else None
    code = error.code() if isinstance(error, KafkaError) else None
    assert said in _unanswered(exc, code, 2.0)
