"""Event-time merge of raw partitions (direct ingestion): order, per-partition order, idle partitions, memory bound."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from streams.align import EventTimeMerge, event_time

A = ("rollout.raw.sandbox", 0)
B = ("rollout.raw.verifier", 0)
C = ("rollout.raw.policy", 0)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _merge(clock: Clock, *, slack_s: float = 60.0, idle_s: float = 2.0, max_hold_s: float = 10.0,
           hold_limit: int = 100) -> EventTimeMerge[str]:
    return EventTimeMerge(slack_s=slack_s, idle_s=idle_s, max_hold_s=max_hold_s, hold_limit=hold_limit, clock=clock)


def test_event_time_read_without_decoding() -> None:
    assert event_time(b'{"event_id":"x","occurred_at":"2026-01-01T00:01:00Z","run_id":"r"}') == \
        datetime(2026, 1, 1, 0, 1, tzinfo=UTC).timestamp()
    assert event_time(b'{"occurred_at":"2026-01-01T02:00:00+02:00"}') == datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    for bad in (None, b"", b"not json", b'{"occurred_at":"yesterday"}', b'{"occurred_at":"2026-01-01T00:00:00"}',
                b'{"occurred_at":"2026-01-01T00:00:00Z', b'{"occurred_at":"\xff\xfe"}'):
        assert event_time(bad) is None


def test_a_partition_far_ahead_waits_for_the_slow_one() -> None:
    clock = Clock()
    merge = _merge(clock)
    merge.add(A, 0.0, "a0")
    merge.add(B, 0.0, "b0")
    merge.add(B, 500.0, "b500")
    merge.add(B, 1000.0, "b1000")
    assert merge.release(100) == ["a0", "b0"]  # A read up to 0 s: B may go to 60 s
    merge.add(A, 480.0, "a480")
    assert merge.release(100) == ["a480", "b500"]
    merge.add(A, 950.0, "a950")
    assert merge.release(100) == ["a950", "b1000"]
    assert merge.held == 0


def test_interleaved_partitions_are_released_in_one_call() -> None:
    clock = Clock()
    merge = _merge(clock)
    for i in range(200):
        merge.add(A, i * 100.0, f"a{i}")
        merge.add(B, i * 100.0 + 50.0, f"b{i}")
    out = merge.release(10_000)
    assert len(out) == 400
    assert out.index("b10") < out.index("a30")  # released together, not one partition after the other


def test_each_partition_keeps_its_order_and_unknown_times_never_jump_ahead() -> None:
    clock = Clock()
    merge = _merge(clock)
    merge.add(A, 0.0, "a0")
    merge.add(B, 900.0, "b900")
    merge.add(B, None, "b-malformed")
    merge.add(B, 10.0, "b10-late")
    assert merge.release(100) == ["a0"]  # nothing of B passes its held head
    merge.add(A, 850.0, "a850")
    assert merge.release(100) == ["a850", "b900", "b-malformed", "b10-late"]


def test_an_idle_empty_partition_holds_nobody_back() -> None:
    clock = Clock()
    merge = _merge(clock, idle_s=2.0)
    merge.add(C, 0.0, "c0")
    merge.add(B, 3600.0, "b3600")
    assert merge.release(100) == ["c0"]
    clock.now = 1.0
    assert merge.release(100) == []  # C may still deliver earlier events
    clock.now = 2.5
    assert merge.release(100) == ["b3600"]


def test_a_silent_empty_partition_with_a_backlog_still_holds_the_others_back() -> None:
    """A replay: a partition behind that has nothing fetched for a moment is still being read, not idle.

    Treating it as idle let the others run hours ahead; their trajectories left the owner's cache
    before its events came (2,000,000-event replay: 12,084 events read back from ClickHouse; none)."""
    clock = Clock()
    merge = _merge(clock, idle_s=2.0, max_hold_s=10.0)
    merge.add(A, 0.0, "a0")
    merge.add(B, 3_600.0, "b3600")
    merge.backlogged = frozenset({A})
    assert merge.release(100) == ["a0"]
    clock.now = 30.0  # A silent and empty, long past idle_s and max_hold_s
    assert merge.release(100) == []
    merge.add(A, 3_590.0, "a3590")
    assert merge.release(100) == ["a3590", "b3600"]
    merge.add(B, 7_200.0, "b7200")
    merge.backlogged = frozenset()  # A caught up with the broker: silent now means idle
    clock.now = 33.0
    assert merge.release(100) == ["b7200"]


def test_nothing_waits_longer_than_max_hold() -> None:
    clock = Clock()
    merge = _merge(clock, idle_s=60.0, max_hold_s=10.0)
    merge.add(A, 0.0, "a0")  # A stays "active" for a minute: it could still deliver earlier events
    merge.add(B, 86_400.0, "b-tomorrow")
    merge.add(B, 5.0, "b5")
    assert merge.release(100) == ["a0"]
    clock.now = 9.0
    assert merge.release(100) == []
    clock.now = 10.5
    assert merge.release(100) == ["b-tomorrow", "b5"]


def test_held_messages_of_the_partition_behind_go_before_anything_times_out() -> None:
    """A replay: every message waits longer than max_hold for the worker's pace; order must still hold."""
    clock = Clock()
    merge = _merge(clock, idle_s=600.0, max_hold_s=10.0)
    for i in range(5):
        merge.add(A, 3_600.0 * (i + 1), f"a{i}")  # A (read first) runs hours ahead
    for i in range(5):
        merge.add(B, 600.0 * i, f"b{i}")  # B is behind, all of it held here, none at the broker
    clock.now = 100.0  # everything was read long ago
    assert merge.release(2) == ["b0", "b1"]  # B holds messages here: A's time limit does not apply
    assert merge.release(2) == ["b2", "b3"]
    # B holds nothing more and has no backlog: now A's messages, read long ago, go.
    assert merge.release(100) == ["b4"] + [f"a{i}" for i in range(5)]


def test_waiting_for_a_partition_with_a_backlog_has_no_time_limit() -> None:
    """A replay: the policy topic arrives days ahead of the sandbox partitions that are still being read."""
    clock = Clock()
    merge = _merge(clock, idle_s=60.0, max_hold_s=10.0)
    merge.add(A, 0.0, "a0")
    merge.add(C, 86_400.0, "c-next-day")
    merge.backlogged = frozenset({A})
    assert merge.release(100) == ["a0"]
    clock.now = 600.0
    merge.add(A, 3_600.0, "a3600")
    assert merge.release(100) == ["a3600"]  # long past max_hold: C still waits, A is catching up
    merge.backlogged = frozenset({C})  # only the partition ahead has a backlog: the usual time limit
    assert merge.release(100) == ["c-next-day"]
    assert merge.held == 0


def test_an_assigned_partition_that_has_not_delivered_yet_holds_everyone_back() -> None:
    """The policy topic's first fetch comes back before the sandbox topic's: it must not go whole."""
    clock = Clock()
    merge = _merge(clock, idle_s=2.0)
    merge.expect([A, C])
    merge.add(C, 0.0, "c0")
    merge.add(C, 86_400.0, "c-next-day")
    assert merge.release(100) == []  # A may deliver anything
    merge.add(A, 10.0, "a10")
    assert sorted(merge.release(100)) == ["a10", "c0"]  # A is known now: only C's next day waits
    assert merge.held == 1
    clock.now = 1.0
    merge.expect([B])  # a partition assigned later that never delivers holds back for idle_s only
    merge.add(A, 20.0, "a20")
    assert merge.release(100) == []
    clock.now = 2.5
    assert merge.release(100) == []
    clock.now = 3.5  # B silent for 2.5 s: ignored (so is A, caught up and empty)
    assert sorted(merge.release(100)) == ["a20", "c-next-day"]


def test_release_is_bounded_and_resumes_where_it_stopped() -> None:
    clock = Clock()
    merge = _merge(clock)
    for i in range(5):
        merge.add(A, float(i), f"a{i}")
    assert merge.release(3) == ["a0", "a1", "a2"]
    assert merge.release(3) == ["a3", "a4"]


def test_off_releases_everything_in_arrival_order() -> None:
    clock = Clock()
    merge = _merge(clock, slack_s=0)
    merge.add(A, 0.0, "a0")
    merge.add(B, 9999.0, "b")
    assert merge.release(100) == ["a0", "b"]


def test_a_partition_holding_too_much_is_paused_then_resumed() -> None:
    clock = Clock()
    merge = _merge(clock, hold_limit=4)
    merge.add(A, 0.0, "a0")
    for i in range(6):
        merge.add(B, 1000.0 + i, f"b{i}")
    assert merge.release(100) == ["a0"]
    assert merge.flow() == ([B], [])
    assert merge.flow() == ([], [])
    merge.add(A, 1001.5, "a1")
    assert merge.release(100) == [f"b{i}" for i in range(6)] + ["a1"]  # within the slack: B (behind) first
    assert merge.flow() == ([], [B])


def test_revoked_partitions_drop_what_they_held() -> None:
    clock = Clock()
    merge = _merge(clock)
    merge.add(A, 0.0, "a0")
    merge.add(B, 1000.0, "b")
    merge.revoked([B])
    assert merge.held == 1
    assert merge.release(100) == ["a0"]


@pytest.mark.parametrize("slack", [0.0, 60.0])
def test_nothing_is_lost_or_repeated(slack: float) -> None:
    clock = Clock()
    merge = _merge(clock, slack_s=slack)
    sent = []
    for i in range(300):
        partition = (A, B, C)[i % 3]
        when = float(i * (1 + i % 3) * 7 % 1000) if i % 11 else None
        merge.add(partition, when, f"m{i}")
        sent.append(f"m{i}")
    got: list[str] = []
    for step in range(50):
        got += merge.release(17)
        clock.now = step * 1.0
    assert sorted(got) == sorted(sent)
    for index in range(3):
        mine = [m for m in got if int(m[1:]) % 3 == index]
        assert mine == sorted(mine, key=lambda m: int(m[1:]))
