"""The worker's catch-up lines (streams.progress): rates, time left, caught up, and the hand-off hint."""

from __future__ import annotations

import pytest

from streams.progress import CatchUpProgress, duration


def test_durations_read_like_a_person_would_write_them() -> None:
    assert duration(0.4) == "0.4 s"  # the spans of a short report interval
    assert duration(5) == "5 s"
    assert duration(9.96) == "10 s"
    assert duration(45) == "45 s"
    assert duration(200) == "3 min 20 s"
    assert duration(7_500) == "2 h 05 min"
    assert duration(-3) == "0 s"


def test_a_worker_that_keeps_up_or_does_not_know_says_nothing() -> None:
    progress = CatchUpProgress(threshold=10_000)
    assert progress.update(0, 0, None) == []
    assert progress.update(10, 50_000, 900) == []
    assert progress.update(20, 100_000, 9_999) == []
    assert progress.update(30, 150_000, 0) == []  # never counted as catching up: no "caught up" line either


def test_a_backlog_gets_its_rate_and_time_left_then_a_caught_up_line() -> None:
    progress = CatchUpProgress(threshold=10_000, hint_at=10**9)
    assert progress.update(0, 0, 500_000) == ["catching up: 500,000 messages behind"]
    # 200,000 stored in 10 s while 20,000 more arrived: the backlog shrank by 18,000/s.
    assert progress.update(10, 200_000, 320_000) == [
        "catching up: 320,000 messages behind; over the last 10 s 20,000 messages/s stored, the backlog shrinking "
        "by 18,000/s: about 18 s to go"]
    assert progress.update(28, 520_000, 0) == ["caught up: 0 message(s) behind after 28 s of catching up"]
    assert progress.update(38, 600_000, 0) == []  # caught up once: not again


def test_a_backlog_that_does_not_shrink_says_so_instead_of_a_time() -> None:
    progress = CatchUpProgress(threshold=10_000, hint_at=10**9)
    progress.update(0, 0, 50_000)
    line, = progress.update(10, 40_000, 60_000)
    assert line == ("catching up: 60,000 messages behind; over the last 10 s 4,000 messages/s stored, the backlog "
                    "not shrinking (the topics grow as fast as they are stored, or faster)")


def test_nothing_stored_over_a_span_gives_no_rate_time_or_hint() -> None:
    progress = CatchUpProgress(threshold=10_000, hint_at=1_000_000, hint_after_s=300)
    progress.update(0, 0, 5_000_000)
    assert progress.update(0.5, 0, 5_000_000) == [
        "catching up: 5,000,000 messages behind; nothing stored over the last 0.5 s (a batch takes longer than "
        "that, or is being retried: the log says why if a write fails)"]
    # Once batches come, the pace is known, and a slow one gets the hint.
    lines = progress.update(10.5, 10_000, 4_990_000)
    assert lines[0].endswith("the backlog shrinking by 1,000/s: about 1 h 23 min to go")
    assert "`rollout replay --hand-off`" in lines[1]


@pytest.mark.parametrize(("behind_before", "behind_after", "hinted"), [
    (2_010_000, 2_000_000, True),    # shrinking by 1,000/s: ~33 min to go
    (3_000_000, 2_000_000, False),   # shrinking by 100,000/s: 20 s to go
    (1_990_000, 2_000_000, True),    # not shrinking
    (501_000, 500_000, False),       # too small a backlog for a replay to pay, however slow
])
def test_the_hand_off_hint_comes_for_a_large_slow_backlog(behind_before: int, behind_after: int,
                                                          hinted: bool) -> None:
    progress = CatchUpProgress(threshold=10_000, hint_at=1_000_000, hint_after_s=300)
    progress.update(0, 0, behind_before)
    lines = progress.update(10, 50_000, behind_after)
    assert any("`rollout replay --hand-off`" in line for line in lines) == hinted


def test_the_hint_comes_once_per_catch_up() -> None:
    progress = CatchUpProgress(threshold=10_000, hint_at=1_000_000, hint_after_s=300)
    hints = []
    for at, behind in [(0, 2_000_000), (10, 1_990_000), (20, 1_980_000), (30, 0), (40, 2_000_000), (50, 1_990_000)]:
        hints.append(sum("--hand-off" in line for line in progress.update(at, at * 1_000, behind)))
    assert hints == [0, 1, 0, 0, 0, 1]
