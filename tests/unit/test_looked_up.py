"""streams.state.LookedUp: which trajectories certainly have no stored event, answered without a query."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from streams.state import LookedUp

_STEPS = st.lists(st.one_of(
    st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.lists(st.text(max_size=3), max_size=8, unique=True)),
    st.integers(0, 12),  # a batch ends; the next one will look up about this many trajectories
), max_size=50)


@given(_STEPS, st.integers(0, 60), st.integers(1, 4))
@settings(max_examples=500, deadline=None)
def test_a_trajectory_is_new_once_and_never_after(steps: list[tuple[str, list[str]] | int], capacity: int,
                                                   block: int) -> None:
    """The safety property: once looked up, a trajectory is never answered as new again (a tiny filter, so
    that its false positives show: they may only make a new trajectory look looked up; and a small capacity,
    so that the filter starts over, several times, within batches and between them). The owner begins a run
    at its first lookup since the filter last forgot its runs, with what ClickHouse holds then: the run's
    trajectories looked up in earlier batches (stored), in blocks, each id as often as it has events."""
    looked = LookedUp(bits=64, hashes=3, capacity=capacity)
    stored: set[tuple[str, str]] = set()
    batch: set[tuple[str, str]] = set()
    for step in steps:
        if isinstance(step, int):
            stored |= batch
            batch = set()
            looked.make_room(step)
            continue
        run, tids = step
        if not looked.knows(run):
            rows = [tid for r, tid in sorted(stored) for _ in range(2) if r == run]
            looked.begin(run, (rows[i:i + block] for i in range(0, len(rows), block)))
        answers = looked.first_lookups(run, tids)
        assert len(answers) == len(tids)
        for tid, new in zip(tids, answers, strict=True):
            assert not (new and ((run, tid) in stored or (run, tid) in batch))
        batch.update((run, tid) for tid in tids)


def test_new_trajectories_of_a_run_that_began_under_the_owner() -> None:
    looked = LookedUp()
    assert not looked.knows("r")
    assert looked.begin("r", iter([]))
    assert looked.knows("r")
    assert looked.first_lookups("r", ["t1", "t2"]) == [True, True]
    assert looked.first_lookups("r", ["t2", "t3"]) == [False, True]
    looked.begin("other", iter([]))
    assert looked.first_lookups("other", ["t1"]) == [True]  # keyed by run and trajectory
    assert looked.first_lookups("r", []) == []
    assert looked.first_lookups("r", ["\ud800", "\ud800x"]) == [True, True]  # any str, even one UTF-8 refuses
    assert looked.first_lookups("unknown", ["t1"]) == [False]  # never begun: no answer


def test_a_run_stored_before_is_begun_with_its_stored_trajectories() -> None:
    """E.g. a worker restarted mid-run: the trajectories with stored events are read, the others are new."""
    looked = LookedUp()
    assert looked.begin("old", iter([["t1", "t2", "t1"], ["t2", "t3"]]))
    assert looked.first_lookups("old", ["t1", "t2", "t3", "t4"]) == [False, False, False, True]
    assert looked.reload_limit() == 6_000_000 // 2  # at most half the filter for one run


def test_a_run_with_more_stored_trajectories_than_the_limit_gets_no_answers() -> None:
    looked = LookedUp(capacity=8)
    assert looked.reload_limit() == 4
    read: list[str] = []

    def blocks():  # type: ignore[no-untyped-def]
        for block in (["t1", "t2"], ["t3", "t4"], ["t5", "t6"], ["t7"]):
            read.extend(block)
            yield block

    assert not looked.begin("big", blocks())
    assert read == ["t1", "t2", "t3", "t4", "t5", "t6"]  # stopped reading once past the limit
    assert looked.knows("big") and looked.first_lookups("big", ["t9"]) == [False]


def test_between_batches_a_full_filter_starts_over_and_runs_are_begun_again() -> None:
    looked = LookedUp(capacity=6)
    looked.begin("r", iter([]))
    assert looked.first_lookups("r", ["t1", "t2", "t3"]) == [True, True, True]
    looked.make_room(3)  # fits: nothing changes
    assert looked.rotations == 0 and looked.knows("r")
    looked.make_room(4)  # would not fit: start over, forget the runs
    assert looked.rotations == 1 and not looked.knows("r")
    assert looked.begin("r", iter([["t1", "t2", "t3"]]))  # the owner reads what is stored now
    assert looked.first_lookups("r", ["t3", "t4"]) == [False, True]


def test_within_a_batch_a_full_filter_answers_no_run_until_the_next_batch() -> None:
    looked = LookedUp(capacity=6)
    looked.begin("r", iter([]))
    assert looked.first_lookups("r", ["t1", "t2"]) == [True, True]
    looked.begin("s", iter([]))
    assert looked.first_lookups("s", ["u1", "u2", "u3", "u4", "u5"]) == [False] * 5  # past capacity: starts over
    assert looked.rotations == 1
    # r's t1 and t2 may not be stored yet: no run can be begun again from ClickHouse within this batch.
    assert looked.first_lookups("r", ["t3"]) == looked.first_lookups("s", ["u6"]) == [False]
    assert looked.knows("r") and looked.knows("s")
    looked.begin("later", iter([]))  # a run first seen now gets answers
    assert looked.first_lookups("later", ["v1"]) == [True]
    looked.make_room(0)  # the next batch: everything is stored, so every run is begun again
    assert looked.rotations == 2 and not looked.knows("r") and not looked.knows("later")
    assert looked.begin("r", iter([["t1", "t2", "t3"]]))
    assert looked.first_lookups("r", ["t3", "t4"]) == [False, True]
