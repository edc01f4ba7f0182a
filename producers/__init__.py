"""The producer SDK: sandboxes, verifiers and policies/trainers publish their events to Kafka.

```python
from producers import connect
with connect() as kafka, kafka.sandbox(run_id="run-7", domain="code", task_id="task-42",
                                        environment_version="env-3") as rollout:
    rollout.started(policy_version=12, sandbox_id="sb-1")
    ...  # run the agent; an exception here is reported as a sandbox crash, never lost
    rollout.finished(termination="completed", steps=40, tokens=9000, artifact_digest="sha256:ab12",
                     oldest_policy_version=12, newest_policy_version=12)
```
"""

from __future__ import annotations

from pydantic import ValidationError

from producers.emitters import (
    Clock,
    EventSink,
    PolicyEmitter,
    SandboxEmitter,
    TelemetryClient,
    VerifierEmitter,
    utc_now,
)
from producers.exceptions import (
    DeliveryError,
    DeliveryFailure,
    EmitterStateError,
    ProduceFailed,
    ProducerClosed,
    ProducerConfigError,
    ProduceRejected,
    ProducerError,
    ProducerFatalError,
    ProducerQueueFull,
    SpoolUnavailable,
)
from producers.kafka import DEFAULT_LINGER_MS, EventProducer, ProducerStats, producer_config
from producers.spool import Spool, SpooledMessage, SpoolStats
from rollout.errors import ConfigurationError
from rollout.settings import Settings

__all__ = [
    "Clock",
    "DeliveryError",
    "DeliveryFailure",
    "EmitterStateError",
    "EventProducer",
    "EventSink",
    "PolicyEmitter",
    "ProduceFailed",
    "ProduceRejected",
    "ProducerClosed",
    "ProducerConfigError",
    "ProducerError",
    "ProducerFatalError",
    "ProducerQueueFull",
    "ProducerStats",
    "SandboxEmitter",
    "Spool",
    "SpoolStats",
    "SpoolUnavailable",
    "SpooledMessage",
    "TelemetryClient",
    "VerifierEmitter",
    "connect",
    "producer_config",
]


def connect(
    settings: Settings | None = None,
    *,
    producer_id: str | None = None,
    producer_version: str | None = None,
    clock: Clock = utc_now,
    linger_ms: int = DEFAULT_LINGER_MS,
    compression: str = "lz4",
    extra: dict[str, object] | None = None,
    spool: Spool | bool = True,
) -> TelemetryClient:
    """A client whose emitters share one ``EventProducer``; use it as a ``with`` block (flushes on exit).

    Without ``settings`` they are read from the environment (``KAFKA_BOOTSTRAP_SERVERS``,
    ``ROLLOUT_TOPIC_PREFIX``, SASL/SSL variables), as the ``rollout`` CLI does. Events sent while
    Kafka is unreachable wait in the on-disk spool (``ROLLOUT_SPOOL_DIR``, ``ROLLOUT_SPOOL_MAX_BYTES``)
    and are resent when it is back; ``spool=False`` turns that off (docs/reliability.md).
    """
    if settings is None:
        try:
            settings = Settings()
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ConfigurationError(f"setting {where}: {first['msg']}") from exc
    producer = EventProducer.from_settings(
        settings, linger_ms=linger_ms, compression=compression, extra=extra, spool=spool
    )
    return TelemetryClient(producer, producer_id=producer_id, producer_version=producer_version, clock=clock)
