"""Errors of the producers package, leaves of the platform's one error root."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rollout.errors import ConfigurationError, PermanentError, RolloutError, TransientError


class ProducerError(RolloutError):
    """Root of the producer SDK's errors; ``code`` is the Kafka error name when there is one."""

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class ProducerConfigError(ProducerError, ConfigurationError):
    """The Kafka client refused its configuration."""


class ProducerClosed(ProducerError, PermanentError):
    """An event was sent through a producer that was already closed."""


class ProducerFatalError(ProducerError, PermanentError):
    """The Kafka client hit a fatal error: it cannot continue and must be recreated."""


class ProducerQueueFull(ProducerError, TransientError):
    """The local send queue stayed full for too long (the broker is slow or unreachable)."""


class ProduceFailed(ProducerError, TransientError):
    """The Kafka client refused a message for a reason that may go away (retry later)."""


class ProduceRejected(ProducerError, PermanentError):
    """A message can never be sent as it is (too large, not a catalog event, unknown topic)."""


class SpoolUnavailable(ProducerError, ConfigurationError):
    """The spool directory cannot be used (not writable, not a directory) or its bound is invalid."""


class EmitterStateError(ProducerError, PermanentError):
    """An emitter was used out of order (for example a second ``finished`` for one trajectory)."""


@dataclass(frozen=True, slots=True)
class DeliveryFailure:
    """One message the broker did not accept, as reported by its delivery report."""

    topic: str
    partition: int | None
    key: str | None
    code: str
    reason: str
    retriable: bool
    fatal: bool

    def __str__(self) -> str:
        known = self.partition is not None and self.partition >= 0
        where = f"{self.topic}[{self.partition}]" if known else self.topic
        return f"{where} key={self.key!r}: {self.code} ({self.reason})"


class DeliveryError(ProducerError):
    """Messages were not confirmed by the broker: ``failed`` were refused, ``pending`` still queued.

    ``undelivered = failed + pending``; ``errors`` holds the first delivery failures seen.
    Whether a retry can help is ``retriable`` (every failure retriable, or only pending messages).
    """

    def __init__(
        self,
        *,
        undelivered: int,
        errors: Sequence[DeliveryFailure] = (),
        failed: int = 0,
        hint: str = "",
    ) -> None:
        pending = max(undelivered - failed, 0)
        parts = []
        if failed:
            parts.append(f"{failed} message(s) failed")
        if pending:
            parts.append(f"{pending} message(s) still queued after the flush timeout")
        message = "Kafka delivery incomplete: " + ", ".join(parts or ["0 messages"])
        if errors:
            message += f"; first error: {errors[0]}"
        if hint:
            message += f"; {hint}"
        super().__init__(message, code=errors[0].code if errors else None)
        self.undelivered = undelivered
        self.failed = failed
        self.pending = pending
        self.errors: tuple[DeliveryFailure, ...] = tuple(errors)

    @property
    def retriable(self) -> bool:
        """True when sending the same messages again may succeed."""
        return all(e.retriable and not e.fatal for e in self.errors)
