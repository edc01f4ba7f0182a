"""Create the platform's topics (idempotently) with the configured partition count."""

from __future__ import annotations

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from rollout.errors import ServiceUnavailable


def ensure_topics(
    client_config: dict[str, str], names: list[str] | tuple[str, ...], *, partitions: int,
    replication_factor: int = 1, timeout: float = 30.0, configs: dict[str, dict[str, str]] | None = None,
) -> list[str]:
    """Create the missing topics (with per-topic ``configs``); return the names created now.

    Existing topics are left as they are.
    """
    admin = AdminClient({**client_config, "socket.timeout.ms": "10000"})
    try:
        existing = set(admin.list_topics(timeout=timeout).topics)
    except KafkaException as exc:
        raise ServiceUnavailable(
            f"Kafka at {client_config.get('bootstrap.servers')} did not answer ({exc.args[0]}); "
            "start it with `rollout infra up` or set KAFKA_BOOTSTRAP_SERVERS"
        ) from exc
    missing = [n for n in names if n not in existing]
    if not missing:
        return []
    futures = admin.create_topics(
        [NewTopic(n, num_partitions=partitions, replication_factor=replication_factor,
                  config=(configs or {}).get(n, {})) for n in missing],
        operation_timeout=timeout,
    )
    created: list[str] = []
    for name, fut in futures.items():
        try:
            fut.result(timeout=timeout)
            created.append(name)
        except KafkaException as exc:
            if exc.args and getattr(exc.args[0], "name", lambda: "")() == "TOPIC_ALREADY_EXISTS":
                continue
            raise ServiceUnavailable(f"could not create topic {name}: {exc.args[0]}") from exc
    return created
