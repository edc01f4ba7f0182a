"""Errors of the native Kafka broker: missing tools, failed downloads, ports, start and stop."""

from __future__ import annotations

from rollout.errors import ConfigurationError, RolloutError, ServiceUnavailable


class KafkaInfraError(RolloutError):
    """Root of the errors raised while fetching, starting or stopping the native broker."""


class ToolMissing(KafkaInfraError, ConfigurationError):
    """A program the broker needs (Maven, Java) is not installed or too old."""


class FetchFailed(KafkaInfraError):
    """Maven could not copy the broker's jars from Maven Central."""


class PortInUse(KafkaInfraError, ConfigurationError):
    """A port the broker needs is taken by a process that is not this data directory's broker."""


class BrokerConfigChanged(KafkaInfraError, ConfigurationError):
    """The running broker was started with other settings than the ones now in force."""


class BrokerStartFailed(KafkaInfraError, ServiceUnavailable):
    """The broker exited during startup or did not become ready in time."""


class BrokerStopFailed(KafkaInfraError):
    """The broker could not be stopped (it survived SIGKILL or may not be signalled)."""
