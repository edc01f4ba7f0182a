"""Direct ingestion's pure parts: which offsets a stored batch commits, and the consumer's settings."""

from __future__ import annotations

from pathlib import Path

from rollout.settings import Settings
from streams.direct import commit_offsets, consumer_config
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
