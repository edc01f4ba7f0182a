"""Emitters build the right events in the right order, and a crash inside a rollout is never lost."""

from __future__ import annotations

import socket
from datetime import UTC, datetime, timedelta
from uuid import UUID

import pytest

from producers import (
    EmitterStateError,
    EventProducer,
    PolicyEmitter,
    ProducerError,
    SandboxEmitter,
    TelemetryClient,
    VerifierEmitter,
    connect,
)
from producers.emitters import CRASH_DETAIL_CHARS
from rollout.settings import Settings
from schemas import InvalidEvent, TopicNames, decode_event, encode_event, event_key
from schemas.base import Envelope, Origin, ProducerKind
from schemas.events import (
    BatchConsumed,
    EnvironmentFailed,
    PolicyVersionPublished,
    RolloutFinished,
    RolloutQueued,
    RolloutStarted,
    RunConfigured,
    Termination,
    VerificationCheck,
    VerificationFinished,
)

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


class Recorder:
    """Keeps what is sent, in order; optionally fails on send, flush or close."""

    def __init__(self, fail_send: bool = False) -> None:
        self.events: list[Envelope] = []
        self.fail_send = fail_send
        self.flushed = 0
        self.closed = 0
        self.fail_close = False

    def send(self, event: Envelope) -> None:
        if self.fail_send:
            raise ProducerError("broker gone")
        self.events.append(event)

    def flush(self, timeout: float = 30.0) -> None:
        self.flushed += 1

    def close(self, timeout: float = 30.0) -> None:
        self.closed += 1
        if self.fail_close:
            raise ProducerError("undelivered")

    @property
    def types(self) -> list[str]:
        return [getattr(e, "event_type", "?") for e in self.events]


class Ticker:
    """A clock that advances one second per call."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


def _sandbox(sink: Recorder, **kwargs: object) -> SandboxEmitter:
    args: dict[str, object] = {
        "run_id": "run-7",
        "domain": "code",
        "task_id": "task-42",
        "environment_version": "env-3",
        "producer_id": "sandbox-host-1",
        "producer_version": "img-5",
        "clock": Ticker(),
    }
    args.update(kwargs)
    return SandboxEmitter(sink, **args)  # type: ignore[arg-type]


def test_a_rollout_emits_queued_started_finished() -> None:
    sink = Recorder()
    with _sandbox(sink, trajectory_id="traj-1", attempt=2) as rollout:
        rollout.started(policy_version=12, sandbox_id="sb-1")
        rollout.finished(
            termination="completed",
            steps=40,
            tokens=9000,
            artifact_digest="sha256:ab12",
            oldest_policy_version=12,
            newest_policy_version=12,
        )
    assert sink.types == ["sandbox.rollout_queued", "sandbox.rollout_started", "sandbox.rollout_finished"]
    queued, started, finished = sink.events
    assert isinstance(queued, RolloutQueued) and isinstance(started, RolloutStarted)
    assert isinstance(finished, RolloutFinished)
    assert (queued.task_id, queued.attempt, queued.environment_version) == ("task-42", 2, "env-3")
    assert started.sandbox_id == "sb-1" and started.policy_version == 12
    assert finished.termination is Termination.COMPLETED and finished.artifact_digest == "sha256:ab12"
    assert {e.trajectory_id for e in (queued, started, finished)} == {"traj-1"}
    assert {event_key(e) for e in sink.events} == {"traj-1"}
    assert len({e.event_id for e in sink.events}) == 3
    assert [e.occurred_at for e in sink.events] == [T0 + timedelta(seconds=i) for i in (1, 2, 3)]
    for event in sink.events:
        assert event.run_id == "run-7"
        assert (event.producer.kind, event.producer.id, event.producer.version) == (
            ProducerKind.SANDBOX,
            "sandbox-host-1",
            "img-5",
        )
        assert decode_event(encode_event(event)) == event


def test_defaults_new_trajectory_id_utc_clock_and_producer() -> None:
    sink = Recorder()
    rollout = SandboxEmitter(sink, run_id="r", domain="math", task_id="t", environment_version="e")
    rollout.queued()
    event = sink.events[0]
    assert UUID(rollout.trajectory_id).version == 4
    assert event.occurred_at.tzinfo is not None and event.occurred_at.utcoffset() == timedelta(0)
    assert abs(datetime.now(UTC) - event.occurred_at) < timedelta(minutes=1)
    assert event.producer.id and event.producer.version.startswith("rollout-telemetry/")
    assert SandboxEmitter(
        sink, run_id="r", domain="d", task_id="t", environment_version="e"
    ).trajectory_id != (rollout.trajectory_id)


def test_every_sandbox_event_in_one_trajectory() -> None:
    sink = Recorder()
    with _sandbox(sink) as rollout:
        rollout.started(policy_version=3, sandbox_id="sb")
        rollout.environment_failed("dependency_unreachable", detail="pypi timed out", retryable=True)
        rollout.snapshot(
            snapshot_id="s1",
            step=10,
            filesystem_digest="sha256:f",
            context_digest="sha256:c",
            bytes=1024,
            duration_s=0.5,
        )
        rollout.interrupted("preempted", step=12)
        rollout.resumed(snapshot_id="s1", steps_restored=10)
        rollout.started(policy_version=5, sandbox_id="sb-2")
        rollout.finished(termination="max_steps", steps=50, tokens=100)
    assert sink.types == [
        "sandbox.rollout_queued",
        "sandbox.rollout_started",
        "sandbox.environment_failed",
        "sandbox.snapshot_taken",
        "sandbox.interrupted",
        "sandbox.resumed",
        "sandbox.rollout_started",
        "sandbox.rollout_finished",
    ]
    failed = sink.events[2]
    assert isinstance(failed, EnvironmentFailed)
    assert (failed.origin, failed.retryable, failed.environment_version) == (
        Origin.ENVIRONMENT,
        True,
        "env-3",
    )
    finished = sink.events[-1]
    assert isinstance(finished, RolloutFinished)
    # The versions default to the ones the rollout actually ran with.
    assert (finished.oldest_policy_version, finished.newest_policy_version) == (3, 5)


def test_crash_inside_the_block_is_reported_as_sandbox_crash_and_propagates() -> None:
    sink = Recorder()
    with pytest.raises(RuntimeError, match="tool server died"), _sandbox(sink) as rollout:
        rollout.started(policy_version=12, sandbox_id="sb-1")
        rollout.progress(steps=7, tokens=1234)
        raise RuntimeError("tool server died")
    assert sink.types == [
        "sandbox.rollout_queued",
        "sandbox.rollout_started",
        "sandbox.environment_failed",
        "sandbox.rollout_finished",
    ]
    failed, finished = sink.events[2], sink.events[3]
    assert isinstance(failed, EnvironmentFailed) and isinstance(finished, RolloutFinished)
    assert failed.failure_class == "sandbox_crash"
    assert failed.origin is Origin.ENVIRONMENT
    assert failed.detail == "RuntimeError: tool server died"
    assert finished.termination is Termination.ENVIRONMENT_FAILURE
    assert (finished.steps, finished.tokens) == (7, 1234)
    assert (finished.oldest_policy_version, finished.newest_policy_version) == (12, 12)


def test_crash_before_started_and_long_messages_are_truncated() -> None:
    sink = Recorder()
    with pytest.raises(ValueError), _sandbox(sink):
        raise ValueError("x" * 10_000)
    failed, finished = sink.events[1], sink.events[2]
    assert isinstance(failed, EnvironmentFailed) and isinstance(finished, RolloutFinished)
    assert failed.detail.startswith("ValueError: xxx") and len(failed.detail) <= CRASH_DETAIL_CHARS
    assert finished.oldest_policy_version == 0


def test_keyboard_interrupt_is_a_cancellation_not_an_environment_failure() -> None:
    sink = Recorder()
    with pytest.raises(KeyboardInterrupt), _sandbox(sink) as rollout:
        rollout.started(policy_version=1, sandbox_id="sb")
        raise KeyboardInterrupt
    assert sink.types[-1] == "sandbox.rollout_finished"
    assert "sandbox.environment_failed" not in sink.types
    finished = sink.events[-1]
    assert isinstance(finished, RolloutFinished) and finished.termination is Termination.CANCELLED


def test_exception_after_finished_adds_nothing() -> None:
    sink = Recorder()
    with pytest.raises(OSError), _sandbox(sink) as rollout:
        rollout.started(policy_version=1, sandbox_id="sb")
        rollout.finished(termination="completed", steps=1, tokens=1)
        raise OSError("cleanup failed")
    assert sink.types[-1] == "sandbox.rollout_finished" and len(sink.events) == 3


def test_clean_exit_without_finished_warns_and_emits_nothing(caplog: pytest.LogCaptureFixture) -> None:
    sink = Recorder()
    with _sandbox(sink, trajectory_id="traj-open") as rollout:
        rollout.started(policy_version=1, sandbox_id="sb")
    assert sink.types == ["sandbox.rollout_queued", "sandbox.rollout_started"]
    assert "traj-open" in caplog.text and "finished()" in caplog.text


def test_a_failing_crash_report_does_not_hide_the_crash(caplog: pytest.LogCaptureFixture) -> None:
    sink = Recorder()
    with pytest.raises(RuntimeError, match="original"), _sandbox(sink):
        sink.fail_send = True
        raise RuntimeError("original")
    assert "could not report the crash" in caplog.text


def test_out_of_order_and_invalid_calls_fail_clearly() -> None:
    sink = Recorder()
    rollout = _sandbox(sink)
    with pytest.raises(EmitterStateError, match="oldest_policy_version"):
        rollout.finished(termination="completed", steps=1, tokens=1)
    with pytest.raises(InvalidEvent) as info:
        rollout.started(policy_version=1, sandbox_id="")
    assert info.value.reason == "validation" and "sandbox_id" in info.value.detail
    with pytest.raises(InvalidEvent, match="termination"):
        rollout.finished(
            termination="exploded", steps=1, tokens=1, oldest_policy_version=1, newest_policy_version=1
        )
    rollout.finished(
        termination="completed", steps=1, tokens=1, oldest_policy_version=1, newest_policy_version=1
    )
    with pytest.raises(EmitterStateError, match="already finished"):
        rollout.finished(termination="completed", steps=1, tokens=1)
    naive = _sandbox(sink, clock=lambda: datetime(2026, 1, 1))
    with pytest.raises(InvalidEvent, match="occurred_at"):
        naive.queued()


def test_verifier_emits_the_verdict_bound_to_the_artifact() -> None:
    sink = Recorder()
    verifier = VerifierEmitter(
        sink, run_id="run-7", verifier_id="unit-tests", verifier_version="v9", clock=Ticker()
    )
    event = verifier.verified(
        trajectory_id="traj-1",
        domain="code",
        verdict="passed",
        artifact_digest="sha256:ab12",
        reward=1.0,
        checks={"compiles": True, "tests": True},
        duration_s=2.5,
    )
    assert isinstance(event, VerificationFinished) and sink.events == [event]
    assert event_key(event) == "traj-1"
    assert event.checks == (
        VerificationCheck(name="compiles", passed=True),
        VerificationCheck(name="tests", passed=True),
    )
    assert (event.verifier_id, event.verifier_version, event.artifact_digest) == (
        "unit-tests",
        "v9",
        "sha256:ab12",
    )
    assert (event.producer.kind, event.producer.id, event.producer.version) == (
        ProducerKind.VERIFIER,
        "unit-tests",
        "v9",
    )
    other = verifier.verified(
        trajectory_id="traj-2",
        domain="code",
        verdict="undecidable",
        artifact_digest="sha256:cd",
        verifier_version="v10",
        checks=[VerificationCheck(name="fuzz", passed=False)],
    )
    assert other.verifier_version == "v10" and other.reward is None


def test_policy_emitter_covers_policy_and_trainer_events() -> None:
    sink = Recorder()
    policy = PolicyEmitter(
        sink, run_id="run-7", producer_id="trainer-0", producer_version="git-abc", clock=Ticker()
    )
    configured = policy.run_configured(domain_weights={"code": 0.5, "math": 0.5}, staleness_bound=4)
    published = policy.version_published(version=13, checkpoint_digest="sha256:ck")
    consumed = policy.batch_consumed(batch_id="b-1", trainer_version=13, trajectory_ids=iter(["t1", "t2"]))
    assert isinstance(configured, RunConfigured) and configured.staleness_bound == 4
    assert isinstance(published, PolicyVersionPublished) and published.version == 13
    assert isinstance(consumed, BatchConsumed) and consumed.trajectory_ids == ("t1", "t2")
    assert {event_key(e) for e in sink.events} == {"run-7"}
    assert [e.producer.kind for e in sink.events] == [
        ProducerKind.POLICY,
        ProducerKind.POLICY,
        ProducerKind.TRAINER,
    ]
    fixed = PolicyEmitter(sink, run_id="run-7", kind="trainer")
    assert fixed.run_configured(domain_weights={}, staleness_bound=0).producer.kind is ProducerKind.TRAINER


def test_client_factories_share_one_sink_and_close_it_on_exit() -> None:
    sink = Recorder()
    with TelemetryClient(sink, producer_id="worker-1", producer_version="w-2", clock=Ticker()) as kafka:
        with kafka.sandbox(run_id="r", domain="d", task_id="t", environment_version="e") as rollout:
            rollout.started(policy_version=1, sandbox_id="sb")
            rollout.finished(termination="completed", steps=1, tokens=1)
        kafka.verifier(run_id="r", verifier_id="v", verifier_version="1").verified(
            trajectory_id=rollout.trajectory_id, domain="d", verdict="failed", artifact_digest="sha256:x"
        )
        kafka.policy(run_id="r").version_published(version=2, checkpoint_digest="sha256:c")
        kafka.flush()
    assert len(sink.events) == 5 and sink.flushed == 1 and sink.closed == 1
    assert sink.events[0].producer.id == "worker-1" and sink.events[0].producer.version == "w-2"


def test_client_exit_with_an_exception_still_closes_and_keeps_the_exception() -> None:
    sink = Recorder()
    sink.fail_close = True
    with (
        pytest.raises(ZeroDivisionError),
        TelemetryClient(sink) as kafka,
        kafka.sandbox(run_id="r", domain="d", task_id="t", environment_version="e"),
    ):
        1 / 0  # noqa: B018
    assert sink.closed == 1
    assert sink.types[-2:] == ["sandbox.environment_failed", "sandbox.rollout_finished"]
    with pytest.raises(ProducerError, match="undelivered"), TelemetryClient(sink):
        pass


def test_connect_builds_one_producer_from_settings() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = Settings(kafka_bootstrap_servers_setting=f"127.0.0.1:{port}", topic_prefix="unit-connect")
    kafka = connect(settings, linger_ms=0)
    assert isinstance(kafka.producer, EventProducer)
    assert kafka.producer.topics == TopicNames("unit-connect")
    assert kafka.producer.config["linger.ms"] == 0
    assert (
        kafka.sandbox(run_id="r", domain="d", task_id="t", environment_version="e").producer.kind == "sandbox"
    )
    kafka.close(timeout=0)
