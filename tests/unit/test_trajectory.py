"""Trajectory assembly (pure): what one trajectory's record says, whatever order or how often its events arrived."""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import random
import re
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest

from schemas import (
    Envelope,
    EnvironmentFailed,
    Origin,
    PolicyVersionPublished,
    Producer,
    RolloutFinished,
    RolloutInterrupted,
    RolloutQueued,
    RolloutResumed,
    RolloutStarted,
    SnapshotTaken,
    VerificationFinished,
)
from schemas.events import InterruptReason, Termination, Verdict
from streams.trajectory import AssemblyConfig, TrajectoryRecord, VersionTimeline, assemble, window_start

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
RUN = "run-unit"
TRAJ = "traj-1"
DOMAIN = "code"
DIGEST = "sha256:aaaa"
OTHER_DIGEST = "sha256:bbbb"
CONFIG = AssemblyConfig()  # verdict timeout 600 s
NO_TIMELINE = VersionTimeline()

SANDBOX = Producer(kind="sandbox", id="sb-host-1", version="1.0")
VERIFIER = Producer(kind="verifier", id="vf-host-1", version="1.0")
POLICY = Producer(kind="policy", id="trainer-1", version="1.0")

_ids = itertools.count(1)


def at(seconds: float) -> datetime:
    """The instant ``seconds`` after T0 (12:00:00 UTC)."""
    return T0 + timedelta(seconds=seconds)


def _envelope(seconds: float, producer: Producer) -> dict[str, object]:
    return {
        "event_id": uuid.UUID(int=next(_ids), version=4),
        "occurred_at": at(seconds),
        "run_id": RUN,
        "producer": producer,
        "trajectory_id": TRAJ,
        "domain": DOMAIN,
    }


def queued(seconds: float = 0, *, environment_version: str = "env-1") -> RolloutQueued:
    return RolloutQueued(**_envelope(seconds, SANDBOX), task_id="task-7", attempt=1,
                         environment_version=environment_version)


def started(seconds: float = 5, *, policy_version: int = 3) -> RolloutStarted:
    return RolloutStarted(**_envelope(seconds, SANDBOX), policy_version=policy_version, sandbox_id="sandbox-42",
                          sandbox_pool="default")


def finished(
    seconds: float = 65,
    *,
    digest: str | None = DIGEST,
    oldest: int = 3,
    newest: int = 3,
    termination: Termination = Termination.COMPLETED,
) -> RolloutFinished:
    return RolloutFinished(**_envelope(seconds, SANDBOX), termination=termination, steps=12, tokens=3400,
                           artifact_digest=digest, oldest_policy_version=oldest, newest_policy_version=newest)


def verdict(
    seconds: float = 80,
    outcome: Verdict = Verdict.PASSED,
    *,
    digest: str = DIGEST,
    verifier_version: str = "v1",
    reward: float | None = 1.0,
) -> VerificationFinished:
    return VerificationFinished(**_envelope(seconds, VERIFIER), verifier_id="unit-verifier",
                                verifier_version=verifier_version, verdict=outcome, reward=reward,
                                artifact_digest=digest)


def failure(seconds: float, failure_class: str, origin: Origin) -> EnvironmentFailed:
    return EnvironmentFailed(**_envelope(seconds, SANDBOX), failure_class=failure_class, origin=origin)


def snapshot(seconds: float, size: int) -> SnapshotTaken:
    return SnapshotTaken(**_envelope(seconds, SANDBOX), snapshot_id=f"snap-{seconds}", step=3,
                         filesystem_digest="sha256:fs", context_digest="sha256:ctx", bytes=size, duration_s=1.5)


def resumed(seconds: float, steps_restored: int, *, succeeded: bool = True) -> RolloutResumed:
    return RolloutResumed(**_envelope(seconds, SANDBOX), snapshot_id="snap", steps_restored=steps_restored,
                          succeeded=succeeded)


def interrupted(seconds: float, reason: InterruptReason) -> RolloutInterrupted:
    return RolloutInterrupted(**_envelope(seconds, SANDBOX), reason=reason, step=4)


def published(version: int, seconds: float) -> PolicyVersionPublished:
    return PolicyVersionPublished(event_id=uuid.UUID(int=next(_ids), version=4), occurred_at=at(seconds),
                                  run_id=RUN, producer=POLICY, version=version,
                                  checkpoint_digest=f"sha256:ckpt{version}")


def build(events: list[Envelope], timeline: VersionTimeline = NO_TIMELINE,
          config: AssemblyConfig = CONFIG) -> TrajectoryRecord:
    record = assemble(events, timeline, config)
    assert record is not None
    return record


# --- happy path --------------------------------------------------------------------------------------------------


def test_happy_path_trajectory_is_decided_and_passed() -> None:
    record = build([queued(0), started(5), finished(65), verdict(80)])

    assert record.status == "finished"
    assert record.finished and record.env_valid
    assert record.decided is True
    assert record.passed is True
    assert record.undecidable_reason == ""
    assert record.digest_match is True
    assert record.wait_s == 5.0
    assert record.run_s == 60.0
    assert record.revision == 4


def test_happy_path_record_carries_the_events_fields() -> None:
    record = build([queued(0), started(5, policy_version=3), finished(65), verdict(80, reward=0.75)])

    assert (record.run_id, record.trajectory_id, record.domain) == (RUN, TRAJ, DOMAIN)
    assert (record.task_id, record.attempt, record.environment_version) == ("task-7", 1, "env-1")
    assert record.sandbox_id == "sandbox-42"
    assert record.policy_version == 3
    assert (record.queued_at, record.started_at, record.finished_at) == (at(0), at(5), at(65))
    assert (record.termination, record.steps, record.tokens) == ("completed", 12, 3400)
    assert record.claimed_complete is True
    assert record.artifact_digest == record.verified_digest == DIGEST
    assert (record.verdict, record.verifier_id, record.verifier_version) == ("passed", "unit-verifier", "v1")
    assert record.verdict_at == at(80)
    assert record.reward == 0.75
    assert (record.env_failed, record.model_error, record.failures) == (False, False, 0)
    assert (record.failure_class, record.failure_origin) == ("", "")


def test_failed_verdict_is_decided_but_not_passed() -> None:
    record = build([queued(0), started(5), finished(65), verdict(80, Verdict.FAILED, reward=0.0)])

    assert record.decided is True
    assert record.passed is False
    assert record.verdict == "failed"


def test_no_events_give_no_record() -> None:
    assert assemble([], NO_TIMELINE, CONFIG) is None


# --- order and duplicates ----------------------------------------------------------------------------------------


def test_record_does_not_depend_on_event_order() -> None:
    events = [queued(0), started(5), snapshot(30, 1024), finished(65), verdict(80)]
    expected = build(events)

    for permutation in itertools.permutations(events):
        assert build(list(permutation)) == expected


def test_duplicated_events_count_once() -> None:
    events = [queued(0), started(5), snapshot(30, 1024), finished(65), verdict(80)]
    expected = build(events)

    duplicated = events + events[::-1] + [events[2], events[2]]
    record = build(duplicated)

    assert record == expected
    assert record.revision == 5
    assert record.snapshots == 1
    assert record.snapshot_bytes == 1024


def test_revision_grows_with_every_new_event() -> None:
    events = [queued(0), started(5), finished(65), verdict(80)]

    revisions = [build(events[: n + 1]).revision for n in range(len(events))]

    assert revisions == [1, 2, 3, 4]


# --- failures ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("with_verdict", [False, True], ids=["no-verdict", "passing-verdict"])
def test_environment_failure_is_env_failed_and_never_passed(with_verdict: bool) -> None:
    events: list[Envelope] = [
        queued(0),
        started(5),
        failure(30, "dependency_unreachable", Origin.ENVIRONMENT),
        finished(35, termination=Termination.ENVIRONMENT_FAILURE),
    ]
    if with_verdict:
        events.append(verdict(50, Verdict.PASSED, digest=DIGEST))

    record = build(events)

    assert record.finished is True
    assert record.env_failed is True
    assert record.env_valid is False
    assert record.decided is False
    assert record.passed is False
    assert record.failure_class == "dependency_unreachable"
    assert record.failure_origin == "environment"
    assert record.failures == 1
    assert record.model_error is False
    # undecidability is a property of env-valid trajectories only
    assert record.undecidable_reason == ""


def test_model_origin_failure_is_a_model_error_not_an_environment_failure() -> None:
    record = build([
        queued(0),
        started(5),
        failure(20, "invalid_tool_call", Origin.MODEL),
        finished(25, termination=Termination.AGENT_ERROR),
        verdict(40, Verdict.FAILED),
    ])

    assert record.env_failed is False
    assert record.env_valid is True
    assert record.model_error is True
    assert record.failure_class == "invalid_tool_call"
    assert record.failure_origin == "model"
    assert record.decided is True
    assert record.passed is False


def test_environment_failure_is_the_main_failure_even_after_a_model_failure() -> None:
    record = build([
        queued(0),
        started(5),
        failure(10, "invalid_tool_call", Origin.MODEL),
        failure(20, "sandbox_crash", Origin.ENVIRONMENT),
        finished(25, termination=Termination.ENVIRONMENT_FAILURE),
    ])

    assert record.env_failed is True
    assert record.model_error is True
    assert record.failures == 2
    assert (record.failure_class, record.failure_origin) == ("sandbox_crash", "environment")


@pytest.mark.parametrize("origin", [Origin.VERIFIER, Origin.SCHEDULER])
def test_other_origins_are_neither_environment_failures_nor_model_errors(origin: Origin) -> None:
    record = build([queued(0), started(5), failure(20, "other_trouble", origin), finished(25), verdict(40)])

    assert record.env_failed is False
    assert record.model_error is False
    assert record.failure_origin == origin.value
    assert record.decided is True


# --- verdicts ----------------------------------------------------------------------------------------------------


def test_verdict_on_another_artifact_is_a_digest_mismatch() -> None:
    record = build([queued(0), started(5), finished(65, digest=DIGEST), verdict(80, digest=OTHER_DIGEST)])

    assert record.env_valid is True
    assert record.decided is False
    assert record.passed is False
    assert record.digest_match is False
    assert record.verified_digest == OTHER_DIGEST
    assert record.undecidable_reason == "digest_mismatch"


def test_finish_without_artifact_digest_never_matches_a_verdict() -> None:
    record = build([queued(0), started(5), finished(65, digest=None), verdict(80)])

    assert record.artifact_digest == ""
    assert record.digest_match is False
    assert record.decided is False
    assert record.undecidable_reason == "digest_mismatch"


@pytest.mark.parametrize(
    ("outcome", "reason"),
    [(Verdict.UNDECIDABLE, "verdict_undecidable"), (Verdict.ERROR, "verifier_error")],
)
def test_undecidable_and_error_verdicts_have_their_reason(outcome: Verdict, reason: str) -> None:
    record = build([queued(0), started(5), finished(65), verdict(80, outcome, reward=None)])

    assert record.verdict == outcome.value
    assert record.decided is False
    assert record.passed is False
    assert record.undecidable_reason == reason


def test_no_verdict_is_undecidable_with_reason_no_verdict() -> None:
    record = build([queued(0), started(5), finished(65)])

    assert record.verdict == ""
    assert record.verdict_at is None
    assert record.decided is False
    assert record.undecidable_reason == "no_verdict"


def test_verdict_after_the_timeout_is_late() -> None:
    record = build([queued(0), started(5), finished(65), verdict(65 + 601)])

    assert record.verdict == "passed"  # the verdict is recorded ...
    assert record.decided is False  # ... but does not count
    assert record.passed is False
    assert record.undecidable_reason == "verdict_late"


def test_verdict_exactly_at_the_timeout_still_counts() -> None:
    record = build([queued(0), started(5), finished(65), verdict(65 + 600)])

    assert record.decided is True
    assert record.passed is True


def test_verdict_timeout_is_configurable() -> None:
    events = [queued(0), started(5), finished(65), verdict(65 + 31)]

    assert build(events, config=AssemblyConfig(verdict_timeout_s=30)).undecidable_reason == "verdict_late"
    assert build(events, config=AssemblyConfig(verdict_timeout_s=60)).decided is True


@pytest.mark.parametrize(
    ("timely", "late", "passed"),
    [(Verdict.PASSED, Verdict.FAILED, True), (Verdict.FAILED, Verdict.PASSED, False)],
)
def test_a_timely_verdict_wins_over_a_later_one(timely: Verdict, late: Verdict, passed: bool) -> None:
    record = build([queued(0), started(5), finished(65), verdict(80, timely), verdict(65 + 900, late)])

    assert record.decided is True
    assert record.passed is passed
    assert record.verdict == timely.value
    assert record.verdict_at == at(80)


def test_of_two_timely_verdicts_the_latest_counts() -> None:
    events = [queued(0), started(5), finished(65), verdict(80, Verdict.FAILED, verifier_version="v1"),
              verdict(120, Verdict.PASSED, verifier_version="v2")]

    for ordering in (events, events[::-1]):
        record = build(ordering)
        assert record.decided is True
        assert record.passed is True
        assert record.verifier_version == "v2"
        assert record.verdict_at == at(120)


def test_verdicts_at_the_same_instant_are_chosen_the_same_way_whatever_their_order() -> None:
    events = [queued(0), started(5), finished(65), verdict(80, Verdict.PASSED), verdict(80, Verdict.FAILED)]

    records = {build(list(p)) for p in itertools.permutations(events)}

    assert len(records) == 1
    assert records.pop().decided is True


def test_a_later_undecidable_verdict_overrides_an_earlier_pass() -> None:
    record = build([queued(0), started(5), finished(65), verdict(80, Verdict.PASSED),
                    verdict(120, Verdict.UNDECIDABLE, reward=None)])

    assert record.decided is False
    assert record.undecidable_reason == "verdict_undecidable"


# --- policy lag --------------------------------------------------------------------------------------------------


def test_policy_lag_at_finish_uses_the_newest_published_version_and_the_first_newer_one() -> None:
    timeline = VersionTimeline.from_events([
        published(1, -100),
        published(2, 20),
        published(3, 40),
        published(4, 200),  # after the finish: not counted in versions
    ])
    record = build([queued(0), started(5, policy_version=1), finished(65, oldest=1, newest=2), verdict(80)],
                   timeline)

    assert record.oldest_policy_version == 1
    assert record.newest_policy_version == 2
    assert record.lag_versions == 3 - 1  # newest published at the finish − oldest used
    assert record.lag_seconds == 65.0 - 20.0  # finish − publication of v2, the first version newer than v1


def test_policy_lag_is_zero_when_no_newer_version_was_published_before_the_finish() -> None:
    timeline = VersionTimeline.from_events([published(3, -10), published(4, 300)])
    record = build([queued(0), started(5), finished(65, oldest=3, newest=3)], timeline)

    assert record.lag_versions == 0
    assert record.lag_seconds == 0.0


def test_policy_lag_is_zero_when_no_newer_version_exists_at_all() -> None:
    timeline = VersionTimeline.from_events([published(2, -50), published(3, -10)])
    record = build([queued(0), started(5), finished(65, oldest=3, newest=3)], timeline)

    assert record.lag_versions == 0
    assert record.lag_seconds == 0.0


def test_policy_lag_falls_back_to_the_finish_events_newest_version_without_publications() -> None:
    record = build([queued(0), started(5, policy_version=2), finished(65, oldest=2, newest=5)], NO_TIMELINE)

    assert record.lag_versions == 5 - 2
    assert record.lag_seconds == 0.0


def test_policy_lag_counts_a_version_published_twice_from_its_first_publication() -> None:
    timeline = VersionTimeline.from_events([published(1, -100), published(2, 50), published(2, 10)])
    record = build([queued(0), started(5, policy_version=1), finished(65, oldest=1, newest=1)], timeline)

    assert record.lag_versions == 1
    assert record.lag_seconds == 55.0


def test_unfinished_trajectory_has_no_policy_lag() -> None:
    timeline = VersionTimeline.from_events([published(1, -100), published(2, 3)])
    record = build([queued(0), started(5, policy_version=1)], timeline)

    assert record.lag_versions is None
    assert record.lag_seconds is None
    assert record.oldest_policy_version == record.newest_policy_version == record.policy_version == 1


# --- snapshots, resumes, interruptions -----------------------------------------------------------------------------


def test_snapshots_resumes_and_interruptions_are_counted() -> None:
    record = build([
        queued(0),
        started(5),
        snapshot(10, 1_000),
        interrupted(12, InterruptReason.PREEMPTED),
        resumed(20, 3),
        snapshot(30, 2_500),
        interrupted(31, InterruptReason.SANDBOX_LOST),
        resumed(40, 7, succeeded=False),
        resumed(45, 7),
        finished(65),
        verdict(80),
    ])

    assert record.snapshots == 2
    assert record.snapshot_bytes == 3_500
    assert record.resumes == 3
    assert record.resumes_succeeded == 2
    assert record.steps_restored == 17
    assert record.interruptions == 2
    assert record.interruption_reasons == ("preempted", "sandbox_lost")
    assert record.passed is True


def test_trajectory_without_snapshots_counts_zero() -> None:
    record = build([queued(0), started(5), finished(65), verdict(80)])

    assert (record.snapshots, record.snapshot_bytes, record.resumes, record.resumes_succeeded) == (0, 0, 0, 0)
    assert (record.steps_restored, record.interruptions, record.interruption_reasons) == (0, 0, ())


# --- unfinished trajectories ---------------------------------------------------------------------------------------


def test_queued_only_trajectory_is_queued_without_finish() -> None:
    record = build([queued(0)])

    assert record.status == "queued"
    assert record.finished is False
    assert record.env_valid is False
    assert record.finished_at is None
    assert record.started_at is None
    assert (record.wait_s, record.run_s) == (None, None)
    assert record.decided is False
    assert record.undecidable_reason == ""
    assert record.policy_version is None


def test_started_trajectory_is_running_without_finish() -> None:
    record = build([queued(0), started(5), snapshot(30, 10), interrupted(40, InterruptReason.PREEMPTED)])

    assert record.status == "running"
    assert record.finished is False
    assert record.finished_at is None
    assert record.wait_s == 5.0
    assert record.run_s is None
    assert record.termination == ""
    assert record.claimed_complete is False


def test_verdict_before_any_finish_does_not_decide_the_trajectory() -> None:
    record = build([queued(0), started(5), verdict(30)])

    assert record.status == "running"
    assert record.verdict == "passed"
    assert record.decided is False
    assert record.passed is False
    assert record.undecidable_reason == ""


# --- VersionTimeline -----------------------------------------------------------------------------------------------


def test_empty_timeline_knows_no_version() -> None:
    timeline = VersionTimeline.from_events([])

    assert timeline.newest_at(at(0)) is None
    assert timeline.first_newer_than(0) is None


def test_newest_at_edges() -> None:
    timeline = VersionTimeline.from_events([published(1, 0), published(2, 10), published(3, 20)])

    assert timeline.newest_at(at(-0.001)) is None  # before the first publication
    assert timeline.newest_at(at(0)) == 1  # at the publication instant itself
    assert timeline.newest_at(at(9.999)) == 1
    assert timeline.newest_at(at(10)) == 2
    assert timeline.newest_at(at(1_000)) == 3


def test_first_newer_than_edges() -> None:
    timeline = VersionTimeline.from_events([published(1, 0), published(2, 10), published(5, 20)])

    assert timeline.first_newer_than(0) == at(0)
    assert timeline.first_newer_than(1) == at(10)
    assert timeline.first_newer_than(3) == at(20)  # a version that was never published itself
    assert timeline.first_newer_than(5) is None  # the newest one
    assert timeline.first_newer_than(9) is None


def test_version_published_twice_counts_from_its_first_publication() -> None:
    events = [published(1, 0), published(2, 30), published(2, 10)]  # the re-publication arrives first

    timeline = VersionTimeline.from_events(events)

    assert timeline.versions == (1, 2)
    assert timeline.times == (at(0), at(10))
    assert timeline.newest_at(at(15)) == 2
    assert timeline.first_newer_than(1) == at(10)
    assert VersionTimeline.from_events(events[::-1]) == timeline


def test_versions_published_out_of_order() -> None:
    timeline = VersionTimeline.from_events([published(3, 10), published(2, 20)])

    assert timeline.newest_at(at(15)) == 3
    assert timeline.newest_at(at(25)) == 3  # a lower version published later does not lower the newest
    assert timeline.first_newer_than(1) == at(10)
    assert timeline.first_newer_than(2) == at(10)


def test_timeline_from_pairs_equals_timeline_from_events() -> None:
    from_events = VersionTimeline.from_events([published(2, 10), published(1, 0)])
    from_pairs = VersionTimeline.from_pairs([(1, at(0)), (2, at(10))])

    assert from_pairs == from_events


# --- window_start --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("when", "window_s", "expected"),
    [
        (datetime(2026, 1, 1, 12, 0, 59, 999_000, tzinfo=UTC), 60, datetime(2026, 1, 1, 12, 0, tzinfo=UTC)),
        (datetime(2026, 1, 1, 12, 0, 59, 999_999, tzinfo=UTC), 60, datetime(2026, 1, 1, 12, 0, tzinfo=UTC)),
        (datetime(2026, 1, 1, 12, 1, 0, tzinfo=UTC), 60, datetime(2026, 1, 1, 12, 1, tzinfo=UTC)),
        (datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC), 60, datetime(2026, 1, 1, 12, 0, tzinfo=UTC)),
        (datetime(2026, 1, 1, 12, 4, 59, 999_000, tzinfo=UTC), 300, datetime(2026, 1, 1, 12, 0, tzinfo=UTC)),
        (datetime(2026, 1, 1, 12, 5, 0, tzinfo=UTC), 300, datetime(2026, 1, 1, 12, 5, tzinfo=UTC)),
        (datetime(2026, 1, 1, 12, 7, 30, tzinfo=UTC), 300, datetime(2026, 1, 1, 12, 5, tzinfo=UTC)),
        (datetime(2026, 1, 1, 12, 59, 59, tzinfo=UTC), 3600, datetime(2026, 1, 1, 12, 0, tzinfo=UTC)),
        (datetime(2026, 1, 1, 0, 0, 0, tzinfo=UTC), 86400, datetime(2026, 1, 1, 0, 0, tzinfo=UTC)),
    ],
)
def test_window_start_is_aligned_to_the_epoch(when: datetime, window_s: int, expected: datetime) -> None:
    start = window_start(when, window_s)

    assert start == expected
    assert start.tzinfo is not None and start.utcoffset() == timedelta(0)
    assert start <= when < start + timedelta(seconds=window_s)


def test_window_start_of_a_time_in_another_zone_is_the_utc_window() -> None:
    when = datetime(2026, 1, 1, 14, 0, 59, tzinfo=timezone(timedelta(hours=2)))

    assert window_start(when, 60) == datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(("finish_s", "window"), [(59.999, 0), (60, 60), (119.5, 60)])
def test_finished_trajectory_falls_in_the_window_of_its_finish(finish_s: float, window: float) -> None:
    record = build([queued(0), started(5), finished(finish_s), verdict(finish_s + 10)])

    assert record.finished_at is not None
    assert window_start(record.finished_at, 60) == at(window)


def test_lookups_agree_with_their_definitions_on_any_timeline() -> None:
    # Versions out of order in time (a re-published or late version) and gaps included.
    rng = random.Random(7)
    for _ in range(300):
        pairs = [(rng.randint(0, 12), at(rng.uniform(-50, 50))) for _ in range(rng.randint(0, 8))]
        timeline = VersionTimeline.from_pairs(dict(pairs).items())
        for version in range(-1, 14):
            newer = [t for t, v in zip(timeline.times, timeline.versions, strict=True) if v > version]
            assert timeline.first_newer_than(version) == (min(newer) if newer else None)
        for seconds in range(-55, 56, 5):
            so_far = [v for t, v in zip(timeline.times, timeline.versions, strict=True) if t <= at(seconds)]
            assert timeline.newest_at(at(seconds)) == (max(so_far) if so_far else None)


def test_window_start_is_exact_at_a_window_edge() -> None:
    edge = datetime(2026, 1, 1, 12, 1, tzinfo=UTC)

    assert window_start(edge - timedelta(microseconds=1), 60) == datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    assert window_start(edge, 60) == edge
    assert window_start(datetime(1969, 12, 31, 23, 59, 30, tzinfo=UTC), 60) == datetime(1969, 12, 31, 23, 59,
                                                                                         tzinfo=UTC)
    with pytest.raises(TypeError):
        window_start(datetime(2026, 1, 1, 12, 0), 60)  # naive: no window


def test_assemble_passes_the_record_fields_in_their_declared_order() -> None:
    # assemble builds the record positionally (keyword arguments cost several times as much); each argument
    # line ends with a comment naming its field. Those names must be the dataclass's fields, in order.
    source = inspect.getsource(assemble)
    call = source[source.index("return TrajectoryRecord(") :]
    call = call[: call.index("\n    )\n")]
    named = re.findall(r",\s+# (\w+)$", call, flags=re.MULTILINE)
    assert named == [f.name for f in dataclasses.fields(TrajectoryRecord)]
