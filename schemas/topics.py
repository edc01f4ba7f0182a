"""Kafka topic names: which event goes where. Part of the contract with producers in any language."""

from __future__ import annotations

from dataclasses import dataclass

DEADLETTER_MAX_BYTES = 4 * 1024 * 1024
"""Largest dead-letter message (a raw message near the broker's limit grows by a third in base64)."""


@dataclass(frozen=True, slots=True)
class TopicNames:
    """The platform's topics under one prefix (unique prefixes keep tests and runs apart)."""

    prefix: str = "rollout"

    @property
    def sandbox(self) -> str:
        """Raw sandbox events, keyed by trajectory_id."""
        return f"{self.prefix}.raw.sandbox"

    @property
    def verifier(self) -> str:
        """Raw verifier events, keyed by trajectory_id."""
        return f"{self.prefix}.raw.verifier"

    @property
    def policy(self) -> str:
        """Raw policy and trainer events, keyed by run_id."""
        return f"{self.prefix}.raw.policy"

    @property
    def deadletter(self) -> str:
        """Messages that are not valid events, with the reason and their source position."""
        return f"{self.prefix}.deadletter"

    @property
    def trajectories(self) -> str:
        """Derived trajectory records (JSON), keyed by trajectory_id; a newer revision supersedes older ones."""
        return f"{self.prefix}.derived.trajectories"

    @property
    def alerts(self) -> str:
        """Regression alerts (JSON, with evidence), keyed by alert_id; once per run, domain and version."""
        return f"{self.prefix}.alerts"

    @property
    def raw(self) -> tuple[str, str, str]:
        """Every raw topic."""
        return (self.sandbox, self.verifier, self.policy)

    @property
    def all(self) -> tuple[str, ...]:
        """Every topic of the platform (raw, dead letters, derived, alerts)."""
        return (*self.raw, self.deadletter, self.trajectories, self.alerts)

    def configs(self) -> dict[str, dict[str, str]]:
        """Topic-level settings the platform creates its topics with."""
        return {self.deadletter: {"max.message.bytes": str(DEADLETTER_MAX_BYTES + 65536)}}

    def for_event_type(self, event_type: str) -> str:
        """The raw topic an event type is published to."""
        family = event_type.split(".", 1)[0]
        if family == "sandbox":
            return self.sandbox
        if family == "verifier":
            return self.verifier
        if family in ("policy", "trainer"):
            return self.policy
        raise ValueError(f"no topic for event type {event_type!r}")
