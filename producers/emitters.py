"""What sandboxes, verifiers and policies/trainers call to publish events, one method per fact."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar
from uuid import uuid4

from pydantic import ValidationError

from producers.exceptions import EmitterStateError
from schemas.base import Envelope, Origin, Producer, ProducerKind
from schemas.events import (
    BatchConsumed,
    EnvironmentFailed,
    InterruptReason,
    PolicyVersionPublished,
    RolloutFinished,
    RolloutInterrupted,
    RolloutQueued,
    RolloutResumed,
    RolloutStarted,
    RunConfigured,
    SnapshotTaken,
    Termination,
    Verdict,
    VerificationCheck,
    VerificationFinished,
)
from schemas.exceptions import InvalidEvent

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]
"""Returns the event time of the event being built (time-zone aware)."""

CRASH_DETAIL_CHARS = 1000
"""Longest exception text kept in a ``sandbox_crash`` failure's detail."""

_E = TypeVar("_E", bound=Envelope)


class EventSink(Protocol):
    """Anything events can be sent through: an ``EventProducer``, or a recorder in tests."""

    def send(self, event: Envelope) -> None:
        """Publish one event."""


class ClosableSink(EventSink, Protocol):
    """A sink that also delivers what it holds (``flush``) and releases its connection (``close``)."""

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until everything sent is delivered."""

    def close(self, timeout: float = 30.0) -> None:
        """Flush, then release."""


def utc_now() -> datetime:
    """The current time in UTC: the default event-time clock."""
    return datetime.now(UTC)


@cache
def default_producer_version() -> str:
    """The SDK's version, used as producer version when the caller names none."""
    try:
        return f"rollout-telemetry/{version('rollout-telemetry')}"
    except PackageNotFoundError:
        return "rollout-telemetry/unknown"


def default_producer_id() -> str:
    """``host:pid`` of this process, used as producer id when the caller names none."""
    return f"{socket.gethostname()}:{os.getpid()}"


class _Emitter:
    """Builds envelopes (fresh event_id, event time, producer) and sends the events."""

    def __init__(self, sink: EventSink, *, run_id: str, producer: Producer, clock: Clock) -> None:
        self._sink = sink
        self._clock = clock
        self.run_id = run_id
        self.producer = producer

    def _emit(self, cls: type[_E], /, **fields: Any) -> _E:
        envelope: dict[str, Any] = {
            "event_id": uuid4(),
            "occurred_at": self._clock(),
            "run_id": self.run_id,
            "producer": self.producer,
        }
        event = _build(cls, {**envelope, **fields})
        self._sink.send(event)
        return event


def _build(cls: type[_E], data: dict[str, Any]) -> _E:
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[:3]
        detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in first)
        event_type = cls.model_fields["event_type"].default
        raise InvalidEvent("validation", f"{event_type}: {detail}") from exc


def _producer(kind: ProducerKind, producer_id: str | None, producer_version: str | None) -> Producer:
    data = {
        "kind": kind,
        "id": producer_id or default_producer_id(),
        "version": producer_version or default_producer_version(),
    }
    try:
        return Producer.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(map(str, first["loc"]))
        raise InvalidEvent("validation", f"producer.{where}: {first['msg']}") from exc


class SandboxEmitter(_Emitter):
    """The events of one trajectory in a sandbox; as a context manager it reports crashes itself.

    Entering emits ``rollout_queued``. Leaving with an exception before ``finished`` emits an
    environment failure ``sandbox_crash`` and ``finished(termination="environment_failure")``
    (``cancelled`` for KeyboardInterrupt and other non-``Exception`` exits), then lets the
    exception propagate.
    """

    def __init__(
        self,
        sink: EventSink,
        *,
        run_id: str,
        domain: str,
        task_id: str,
        environment_version: str,
        trajectory_id: str | None = None,
        attempt: int = 1,
        producer_id: str | None = None,
        producer_version: str | None = None,
        clock: Clock = utc_now,
    ) -> None:
        super().__init__(
            sink,
            run_id=run_id,
            producer=_producer(ProducerKind.SANDBOX, producer_id, producer_version),
            clock=clock,
        )
        self.domain = domain
        self.task_id = task_id
        self.environment_version = environment_version
        self.trajectory_id = trajectory_id or str(uuid4())
        self.attempt = attempt
        self._queued = False
        self._finished = False
        self._policy_versions: list[int] = []
        self._steps = 0
        self._tokens = 0

    @property
    def is_finished(self) -> bool:
        """True once the finish event was sent."""
        return self._finished

    def _trajectory(self, cls: type[_E], /, **fields: Any) -> _E:
        if self._finished:
            raise EmitterStateError(
                f"trajectory {self.trajectory_id} already finished; a retry is a new emitter with attempt+1"
            )
        return self._emit(cls, trajectory_id=self.trajectory_id, domain=self.domain, **fields)

    def queued(self) -> RolloutQueued:
        """The rollout was queued for a sandbox (sent by entering the ``with`` block)."""
        if self._queued:
            raise EmitterStateError(f"trajectory {self.trajectory_id} was already queued")
        event = self._trajectory(
            RolloutQueued,
            task_id=self.task_id,
            attempt=self.attempt,
            environment_version=self.environment_version,
        )
        self._queued = True
        return event

    def started(self, policy_version: int, sandbox_id: str, sandbox_pool: str = "default") -> RolloutStarted:
        """A sandbox started running the rollout with a policy version."""
        event = self._trajectory(RolloutStarted, policy_version=policy_version, sandbox_id=sandbox_id,
                                 sandbox_pool=sandbox_pool)
        self._policy_versions.append(policy_version)
        return event

    def progress(self, *, steps: int | None = None, tokens: int | None = None) -> None:
        """Record progress so far (no event); a crash report's finish event carries it."""
        if steps is not None:
            self._steps = steps
        if tokens is not None:
            self._tokens = tokens

    def environment_failed(
        self,
        failure_class: str,
        *,
        origin: Origin | str = Origin.ENVIRONMENT,
        detail: str = "",
        retryable: bool = False,
    ) -> EnvironmentFailed:
        """Something failed; ``origin`` says whose fault (only ``environment`` lowers validity)."""
        return self._trajectory(
            EnvironmentFailed,
            failure_class=failure_class,
            origin=origin,
            detail=detail,
            retryable=retryable,
            environment_version=self.environment_version,
        )

    def snapshot(
        self,
        *,
        snapshot_id: str,
        step: int,
        filesystem_digest: str,
        context_digest: str,
        bytes: int,
        duration_s: float,
    ) -> SnapshotTaken:
        """A snapshot of context and environment state was taken."""
        event = self._trajectory(
            SnapshotTaken,
            snapshot_id=snapshot_id,
            step=step,
            filesystem_digest=filesystem_digest,
            context_digest=context_digest,
            bytes=bytes,
            duration_s=duration_s,
        )
        self._steps = max(self._steps, step)
        return event

    def resumed(self, *, snapshot_id: str, steps_restored: int, succeeded: bool = True) -> RolloutResumed:
        """The rollout resumed from a snapshot."""
        return self._trajectory(
            RolloutResumed, snapshot_id=snapshot_id, steps_restored=steps_restored, succeeded=succeeded
        )

    def interrupted(self, reason: InterruptReason | str, step: int = 0) -> RolloutInterrupted:
        """The running rollout was interrupted (it may resume from a snapshot)."""
        event = self._trajectory(RolloutInterrupted, reason=reason, step=step)
        self._steps = max(self._steps, step)
        return event

    def finished(
        self,
        *,
        termination: Termination | str,
        steps: int,
        tokens: int,
        artifact_digest: str | None = None,
        oldest_policy_version: int | None = None,
        newest_policy_version: int | None = None,
    ) -> RolloutFinished:
        """The rollout ended; policy versions default to those passed to ``started``."""
        if self._finished:
            raise EmitterStateError(
                f"trajectory {self.trajectory_id} already finished; a retry is a new emitter with attempt+1"
            )
        used = self._policy_versions
        oldest = oldest_policy_version if oldest_policy_version is not None else min(used, default=None)
        newest = newest_policy_version if newest_policy_version is not None else max(used, default=None)
        if oldest is None or newest is None:
            raise EmitterStateError(
                "finished() needs oldest_policy_version and newest_policy_version "
                "when started() was never called"
            )
        event = self._trajectory(
            RolloutFinished,
            termination=termination,
            steps=steps,
            tokens=tokens,
            artifact_digest=artifact_digest,
            oldest_policy_version=oldest,
            newest_policy_version=newest,
        )
        self._finished = True
        return event

    def __enter__(self) -> Self:
        if not self._queued:
            self.queued()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._finished:
            return
        if exc_type is None:
            log.warning(
                "trajectory %s (run %s, domain %s) left its block without finished(): "
                "no finish event was sent",
                self.trajectory_id,
                self.run_id,
                self.domain,
            )
            return
        try:
            self._report_crash(exc_type, exc)
        except Exception as err:
            # The crash itself is what the caller must see; a failed report (whatever the sink
            # raised) only gets logged.
            log.error("could not report the crash of trajectory %s: %s", self.trajectory_id, err)

    def _report_crash(self, exc_type: type[BaseException], exc: BaseException | None) -> None:
        # Without started() the versions are unknown; the finish event needs some, and 0 means "none".
        oldest = min(self._policy_versions, default=0)
        newest = max(self._policy_versions, default=0)
        if not issubclass(exc_type, Exception):
            # KeyboardInterrupt, SystemExit, task cancellation: someone stopped the rollout, and
            # counting that as an environment failure would blame the environment for it.
            self.finished(
                termination=Termination.CANCELLED,
                steps=self._steps,
                tokens=self._tokens,
                oldest_policy_version=oldest,
                newest_policy_version=newest,
            )
            return
        detail = f"{exc_type.__name__}: {exc}" if exc is not None and str(exc) else exc_type.__name__
        if len(detail) > CRASH_DETAIL_CHARS:
            detail = detail[: CRASH_DETAIL_CHARS - 1] + "…"
        self.environment_failed("sandbox_crash", origin=Origin.ENVIRONMENT, detail=detail)
        self.finished(
            termination=Termination.ENVIRONMENT_FAILURE,
            steps=self._steps,
            tokens=self._tokens,
            oldest_policy_version=oldest,
            newest_policy_version=newest,
        )


class VerifierEmitter(_Emitter):
    """Verdicts of one independent verifier for one run."""

    def __init__(
        self,
        sink: EventSink,
        *,
        run_id: str,
        verifier_id: str,
        verifier_version: str,
        producer_version: str | None = None,
        clock: Clock = utc_now,
    ) -> None:
        super().__init__(
            sink,
            run_id=run_id,
            producer=_producer(ProducerKind.VERIFIER, verifier_id, producer_version or verifier_version),
            clock=clock,
        )
        self.verifier_id = verifier_id
        self.verifier_version = verifier_version

    def verified(
        self,
        *,
        trajectory_id: str,
        domain: str,
        verdict: Verdict | str,
        artifact_digest: str,
        verifier_version: str | None = None,
        reward: float | None = None,
        checks: Mapping[str, bool] | Iterable[VerificationCheck] = (),
        duration_s: float = 0.0,
    ) -> VerificationFinished:
        """The verdict on the artifact with ``artifact_digest`` (checks as ``{name: passed}`` or models)."""
        check_list: list[Any] = (
            [{"name": name, "passed": passed} for name, passed in checks.items()]
            if isinstance(checks, Mapping)
            else list(checks)
        )
        return self._emit(
            VerificationFinished,
            trajectory_id=trajectory_id,
            domain=domain,
            verifier_id=self.verifier_id,
            verifier_version=verifier_version or self.verifier_version,
            verdict=verdict,
            reward=reward,
            artifact_digest=artifact_digest,
            checks=check_list,
            duration_s=duration_s,
        )


class PolicyEmitter(_Emitter):
    """Run configuration, policy versions and consumed batches of one RL run (policy and trainer)."""

    def __init__(
        self,
        sink: EventSink,
        *,
        run_id: str,
        producer_id: str | None = None,
        producer_version: str | None = None,
        kind: ProducerKind | str | None = None,
        clock: Clock = utc_now,
    ) -> None:
        # Without an explicit kind each event names the family it belongs to (policy.* by the
        # policy side, trainer.* by the trainer), which is what a reader of the producer expects.
        fixed = ProducerKind(kind) if kind is not None else None
        super().__init__(
            sink,
            run_id=run_id,
            producer=_producer(fixed or ProducerKind.POLICY, producer_id, producer_version),
            clock=clock,
        )
        self._trainer = (
            self.producer if fixed else self.producer.model_copy(update={"kind": ProducerKind.TRAINER})
        )

    def run_configured(self, *, domain_weights: Mapping[str, float], staleness_bound: int) -> RunConfigured:
        """The run's budget share per domain and its staleness bound (largest acceptable lag in versions)."""
        return self._emit(RunConfigured, domain_weights=dict(domain_weights), staleness_bound=staleness_bound)

    def version_published(self, *, version: int, checkpoint_digest: str) -> PolicyVersionPublished:
        """A new policy version was published."""
        return self._emit(PolicyVersionPublished, version=version, checkpoint_digest=checkpoint_digest)

    def batch_consumed(
        self, *, batch_id: str, trainer_version: int, trajectory_ids: Iterable[str]
    ) -> BatchConsumed:
        """The trainer consumed a batch of trajectories for a training step."""
        return self._emit(
            BatchConsumed,
            producer=self._trainer,
            batch_id=batch_id,
            trainer_version=trainer_version,
            trajectory_ids=tuple(trajectory_ids),
        )


class TelemetryClient:
    """One connection shared by emitters: ``.sandbox()``, ``.verifier()``, ``.policy()``; flushes on exit."""

    def __init__(
        self,
        producer: ClosableSink,
        *,
        producer_id: str | None = None,
        producer_version: str | None = None,
        clock: Clock = utc_now,
    ) -> None:
        self.producer = producer
        self._producer_id = producer_id
        self._producer_version = producer_version
        self._clock = clock

    def sandbox(
        self,
        *,
        run_id: str,
        domain: str,
        task_id: str,
        environment_version: str,
        trajectory_id: str | None = None,
        attempt: int = 1,
        producer_id: str | None = None,
        producer_version: str | None = None,
    ) -> SandboxEmitter:
        """An emitter for one trajectory; use it as a ``with`` block."""
        return SandboxEmitter(
            self.producer,
            run_id=run_id,
            domain=domain,
            task_id=task_id,
            environment_version=environment_version,
            trajectory_id=trajectory_id,
            attempt=attempt,
            producer_id=producer_id or self._producer_id,
            producer_version=producer_version or self._producer_version,
            clock=self._clock,
        )

    def verifier(
        self,
        *,
        run_id: str,
        verifier_id: str,
        verifier_version: str,
        producer_version: str | None = None,
    ) -> VerifierEmitter:
        """An emitter for one verifier's verdicts in one run."""
        return VerifierEmitter(
            self.producer,
            run_id=run_id,
            verifier_id=verifier_id,
            verifier_version=verifier_version,
            producer_version=producer_version,
            clock=self._clock,
        )

    def policy(
        self,
        *,
        run_id: str,
        producer_id: str | None = None,
        producer_version: str | None = None,
        kind: ProducerKind | str | None = None,
    ) -> PolicyEmitter:
        """An emitter for a run's configuration, policy versions and consumed batches."""
        return PolicyEmitter(
            self.producer,
            run_id=run_id,
            producer_id=producer_id or self._producer_id,
            producer_version=producer_version or self._producer_version,
            kind=kind,
            clock=self._clock,
        )

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every event sent so far is delivered (``DeliveryError`` otherwise)."""
        self.producer.flush(timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Flush, then release the connection."""
        self.producer.close(timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
            return
        # Flush anyway (a crash report is worth delivering), but never hide the exception in flight.
        try:
            self.close()
        except Exception as err:
            log.error("Kafka delivery failed while handling %s: %s", exc_type.__name__, err)
