"""The event catalog (DESIGN.md "Events"): sandbox, verifier and policy/trainer events.

Each class pins its ``event_type`` and current ``schema_version``. Sandbox and verifier events
are keyed by ``trajectory_id``; policy and trainer events by ``run_id`` (see ``schemas.parse.event_key``).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, ClassVar, Literal

from pydantic import Field

from schemas.base import Digest, Envelope, Frozen, Name, Origin, Slug

UINT32_MAX = 4_294_967_295
COUNT_MAX = 2**40

Version = Annotated[int, Field(ge=0, le=UINT32_MAX)]
"""A policy or trainer version, or a bound counted in versions: stored as UInt32, so larger values are refused
here (accepted, they would fail every insert of their batch and stall the worker on it)."""
NonNegInt = Annotated[int, Field(ge=0, le=COUNT_MAX)]
"""A count or size (steps, tokens, bytes) up to 2^40 (a trillion, or a TiB), so sums per trajectory and
window stay far inside the UInt64 columns they are stored in."""
Seconds = Annotated[float, Field(ge=0, le=1e9)]


class Termination(StrEnum):
    """How a rollout ended."""

    COMPLETED = "completed"  # the agent declared the task done
    MAX_STEPS = "max_steps"
    MAX_TOKENS = "max_tokens"
    AGENT_ERROR = "agent_error"  # the model's own failure (bad tool call, crash in its code)
    ENVIRONMENT_FAILURE = "environment_failure"
    CANCELLED = "cancelled"


class InterruptReason(StrEnum):
    """Why a running rollout was interrupted (it may resume from a snapshot)."""

    PREEMPTED = "preempted"
    STALE_POLICY = "stale_policy"
    BUDGET = "budget"
    CANCELLED = "cancelled"
    SANDBOX_LOST = "sandbox_lost"


class Verdict(StrEnum):
    """The independent verifier's verdict on one artifact."""

    PASSED = "passed"
    FAILED = "failed"
    UNDECIDABLE = "undecidable"
    ERROR = "error"


class _Trajectory(Envelope):
    """Events about one trajectory, keyed by ``trajectory_id``."""

    trajectory_id: Name
    domain: Name


class RolloutQueued(_Trajectory):
    """A rollout of a task was queued for a sandbox."""

    CURRENT_VERSION: ClassVar[int] = 1
    event_type: Literal["sandbox.rollout_queued"] = "sandbox.rollout_queued"
    schema_version: Literal[1] = 1
    task_id: Name
    attempt: int = Field(default=1, ge=1, le=UINT32_MAX)
    environment_version: Name


class RolloutStartedV1(_Trajectory):
    """Version 1 of ``sandbox.rollout_started``: kept to validate and export old payloads (see upcasters)."""

    CURRENT_VERSION: ClassVar[int] = 1
    event_type: Literal["sandbox.rollout_started"] = "sandbox.rollout_started"
    schema_version: Literal[1] = 1
    policy_version: Version
    sandbox_id: Name


class RolloutStarted(_Trajectory):
    """A sandbox started running the rollout with a policy version.

    Version 2 adds ``sandbox_pool`` (the scheduler pool the sandbox came from); version-1 payloads
    are upcast on read with ``sandbox_pool = "default"`` (``schemas.upcast``).
    """

    CURRENT_VERSION: ClassVar[int] = 2
    event_type: Literal["sandbox.rollout_started"] = "sandbox.rollout_started"
    schema_version: Literal[2] = 2
    policy_version: Version
    sandbox_id: Name
    sandbox_pool: Name


class EnvironmentFailed(_Trajectory):
    """Something failed; ``origin`` says whose fault, ``failure_class`` what (taxonomy in data)."""

    CURRENT_VERSION: ClassVar[int] = 1
    event_type: Literal["sandbox.environment_failed"] = "sandbox.environment_failed"
    schema_version: Literal[1] = 1
    failure_class: Slug
    origin: Origin
    detail: str = Field(default="", max_length=4000)
    retryable: bool = False
    environment_version: Name | None = None


class SnapshotTaken(_Trajectory):
    """A snapshot of context and environment state (filesystem, services) was taken."""

    CURRENT_VERSION: ClassVar[int] = 1
    event_type: Literal["sandbox.snapshot_taken"] = "sandbox.snapshot_taken"
    schema_version: Literal[1] = 1
    snapshot_id: Name
    step: NonNegInt
    filesystem_digest: Digest
    context_digest: Digest
    bytes: NonNegInt
    duration_s: Seconds


class RolloutResumed(_Trajectory):
    """A rollout resumed from a snapshot."""

    CURRENT_VERSION: ClassVar[int] = 1
    event_type: Literal["sandbox.resumed"] = "sandbox.resumed"
    schema_version: Literal[1] = 1
    snapshot_id: Name
    steps_restored: NonNegInt
    succeeded: bool = True


class RolloutInterrupted(_Trajectory):
    """A running rollout was interrupted."""

    CURRENT_VERSION: ClassVar[int] = 1
    event_type: Literal["sandbox.interrupted"] = "sandbox.interrupted"
    schema_version: Literal[1] = 1
    reason: InterruptReason
    step: NonNegInt = 0


class RolloutFinished(_Trajectory):
    """A rollout finished (whatever the outcome); the artifact digest is what the verifier must check."""

    CURRENT_VERSION: ClassVar[int] = 1
    event_type: Literal["sandbox.rollout_finished"] = "sandbox.rollout_finished"
    schema_version: Literal[1] = 1
    termination: Termination
    steps: NonNegInt
    tokens: NonNegInt
    artifact_digest: Digest | None = None
    oldest_policy_version: Version
    newest_policy_version: Version


class VerificationCheck(Frozen):
    """One individual check the verifier ran."""

    name: Annotated[str, Field(min_length=1, max_length=200)]
    passed: bool


class VerificationFinished(_Trajectory):
    """An independent verifier's verdict on the artifact with ``artifact_digest``."""

    CURRENT_VERSION: ClassVar[int] = 1
    event_type: Literal["verifier.verification_finished"] = "verifier.verification_finished"
    schema_version: Literal[1] = 1
    verifier_id: Name
    verifier_version: Name
    verdict: Verdict
    reward: float | None = Field(default=None, allow_inf_nan=False)
    artifact_digest: Digest
    checks: tuple[VerificationCheck, ...] = ()
    duration_s: Seconds = 0.0


class RunConfigured(Envelope):
    """An RL run's configuration: the budget share per domain and the staleness bound."""

    CURRENT_VERSION: ClassVar[int] = 1
    event_type: Literal["policy.run_configured"] = "policy.run_configured"
    schema_version: Literal[1] = 1
    domain_weights: dict[Name, Annotated[float, Field(ge=0, allow_inf_nan=False)]]
    staleness_bound: Version = Field(description="Largest acceptable policy lag, in versions")


class PolicyVersionPublished(Envelope):
    """The trainer published a new policy version."""

    CURRENT_VERSION: ClassVar[int] = 1
    event_type: Literal["policy.version_published"] = "policy.version_published"
    schema_version: Literal[1] = 1
    version: Version
    checkpoint_digest: Digest


class BatchConsumed(Envelope):
    """The trainer consumed a batch of trajectories for a training step."""

    CURRENT_VERSION: ClassVar[int] = 1
    event_type: Literal["trainer.batch_consumed"] = "trainer.batch_consumed"
    schema_version: Literal[1] = 1
    batch_id: Name
    trainer_version: Version
    trajectory_ids: tuple[Name, ...] = Field(max_length=100_000)


Event = Annotated[
    RolloutQueued
    | RolloutStarted
    | EnvironmentFailed
    | SnapshotTaken
    | RolloutResumed
    | RolloutInterrupted
    | RolloutFinished
    | VerificationFinished
    | RunConfigured
    | PolicyVersionPublished
    | BatchConsumed,
    Field(discriminator="event_type"),
]
"""Any event of the catalog, told apart by ``event_type``."""

EVENT_CLASSES: tuple[type[Envelope], ...] = (
    RolloutQueued,
    RolloutStarted,
    EnvironmentFailed,
    SnapshotTaken,
    RolloutResumed,
    RolloutInterrupted,
    RolloutFinished,
    VerificationFinished,
    RunConfigured,
    PolicyVersionPublished,
    BatchConsumed,
)

PREVIOUS_VERSIONS: tuple[type[Envelope], ...] = (RolloutStartedV1,)
"""Older versions of catalog events, still accepted on the wire (upcast on read) and exported as JSON Schema."""

EVENT_TYPES: dict[str, type[Envelope]] = {
    cls.model_fields["event_type"].default: cls for cls in EVENT_CLASSES
}
"""event_type -> model class."""
