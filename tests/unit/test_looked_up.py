"""streams.state.LookedUp: which trajectories certainly have no stored event, answered without a query."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from streams.state import LookedUp

_CALLS = st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d"]),
                            st.lists(st.text(max_size=3), max_size=8, unique=True)), max_size=40)


@given(_CALLS, st.integers(0, 60))
@settings(max_examples=400, deadline=None)
def test_a_trajectory_is_new_once_and_never_after(calls: list[tuple[str, list[str]]], capacity: int) -> None:
    """The safety property: once looked up, a trajectory is never answered as new again (a tiny filter, so
    that its false positives show: they may only make a new trajectory look looked up; and a small capacity,
    so that the filter starts over, several times, between calls). Runs are first seen as the owner sees
    them, at their first lookup, before or after a start-over; one that has trajectories looked up (stored)
    by then is begun as stored before, as the owner's query would find."""
    looked = LookedUp(bits=64, hashes=3, capacity=capacity)
    before: set[tuple[str, str]] = set()
    for run, tids in calls:
        if not looked.knows(run):
            looked.begin(run, stored_before=any(r == run for r, _ in before))
        answers = looked.first_lookups(run, tids)
        assert len(answers) == len(tids)
        for tid, new in zip(tids, answers, strict=True):
            assert not (new and (run, tid) in before)
        before.update((run, tid) for tid in tids)


def test_new_trajectories_of_a_run_that_began_under_the_owner() -> None:
    looked = LookedUp()
    assert not looked.knows("r")
    looked.begin("r", stored_before=False)
    assert looked.knows("r")
    assert looked.first_lookups("r", ["t1", "t2"]) == [True, True]
    assert looked.first_lookups("r", ["t2", "t3"]) == [False, True]
    looked.begin("other", stored_before=False)
    assert looked.first_lookups("other", ["t1"]) == [True]  # keyed by run and trajectory
    assert looked.first_lookups("r", []) == []
    assert looked.first_lookups("r", ["\ud800", "\ud800x"]) == [True, True]  # any str, even one UTF-8 refuses


def test_no_answer_for_a_run_stored_before_nor_past_capacity() -> None:
    looked = LookedUp(capacity=3)
    looked.begin("old", stored_before=True)  # e.g. a worker restarted mid-run: anything may be stored
    assert looked.first_lookups("old", ["t1"]) == [False]
    assert looked.first_lookups("unknown", ["t1"]) == [False]
    looked.begin("r", stored_before=False)
    assert looked.first_lookups("r", ["t1", "t2"]) == [True, True]
    assert looked.rotations == 0
    assert looked.first_lookups("r", ["t3", "t4"]) == [False, False]  # past capacity: the filter starts over
    assert looked.rotations == 1
    assert looked.first_lookups("r", ["t5"]) == [False]  # ... and r is read for good: t3 may be stored meanwhile
    assert looked.knows("r")  # not begun again


def test_runs_first_seen_after_the_filter_started_over_get_answers_again() -> None:
    looked = LookedUp(capacity=3)
    looked.begin("r", stored_before=False)
    assert looked.first_lookups("r", ["t1", "t2", "t3"]) == [True, True, True]
    looked.begin("s", stored_before=False)
    assert looked.first_lookups("s", ["t1"]) == [False]  # the filter is full: it starts over
    assert looked.rotations == 1
    looked.begin("later", stored_before=False)
    assert looked.first_lookups("later", ["t1", "t2"]) == [True, True]
    assert looked.first_lookups("later", ["t2", "t9"]) == [False, False]  # full again: starts over
    assert looked.rotations == 2
    assert looked.first_lookups("r", ["t4"]) == looked.first_lookups("s", ["t2"]) == [False]
    looked.begin("last", stored_before=False)
    assert looked.first_lookups("last", ["t1"]) == [True]
