"""Derived messages (trajectory records, alerts) to Kafka with confluent-kafka, delivered before a batch is acked.

The worker used to send each derived message through Faust (one coroutine and future per
message, each record deep-copied into a dict first). Here they are produced from the ClickHouse
owner thread right after the batch is stored, in C, and the call returns once the broker
confirmed every one of them (acks=all, idempotent producer), retrying until then: the topics are
at-least-once, like before, and a message is never dropped silently.

librdkafka reports only failed deliveries (``delivery.report.only.error``): a batch's thousands of
delivered messages cost no Python callback each, and a failed one is rebuilt from the report
(topic, key and value are all it had).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from confluent_kafka import KafkaError, Message, Producer

log = logging.getLogger(__name__)

Outgoing = tuple[str, bytes, bytes]
"""(topic, key, value) of one derived message."""


class DerivedPublisher:
    """A producer for derived topics; ``publish`` blocks until everything it was given is delivered."""

    def __init__(self, config: Mapping[str, object], *, max_request_size: int) -> None:
        self._config: dict[str, object] = {
            "enable.idempotence": True,
            "acks": "all",
            "partitioner": "murmur2_random",
            "compression.type": "lz4",
            "linger.ms": 5,
            "message.max.bytes": max_request_size,
            "client.id": "rollout-worker-derived",
            **config,
            # Not overridable: _send counts on hearing only of failures (a success report would be
            # taken for one).
            "delivery.report.only.error": True,
        }
        self._producer: Producer | None = None
        self._lock = threading.Lock()
        self._failed: list[tuple[Outgoing, str]] = []

    def _client(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(self._config)
        return self._producer

    def publish(self, messages: Iterable[Outgoing], *, should_stop: Callable[[], bool],
                backoff: float = 0.2, max_backoff: float = 5.0) -> bool:
        """Send and wait for every message; failed ones are sent again. False when asked to stop first.

        ``messages`` is read once, as it is sent (a generator that serialises them one by one keeps no list
        of a whole batch's encoded messages alive); those to send again come from the failure reports.
        """
        todo: Iterable[Outgoing] = messages
        while True:
            self._send(todo)
            with self._lock:
                failed = [m for m, _ in self._failed]
                reasons = {r for _, r in self._failed}
                self._failed.clear()
            if not failed:
                return True
            log.warning("%d derived message(s) not delivered (%s); retrying in %.1fs", len(failed),
                        ", ".join(sorted(reasons)), backoff)
            if should_stop():
                log.error("stopping with %d derived message(s) undelivered; the batch stays unacknowledged",
                          len(failed))
                return False
            time.sleep(backoff)
            backoff = min(backoff * 2, max_backoff)
            todo = failed

    def _send(self, messages: Iterable[Outgoing]) -> None:
        producer = self._client()
        produce = producer.produce
        report = self._failure
        for topic, key, value in messages:
            while True:
                try:
                    produce(topic, value=value, key=key, on_delivery=report)
                    break
                except BufferError:
                    producer.poll(0.05)
        while producer.flush(1.0) > 0:
            pass

    def _failure(self, error: KafkaError | None, msg: Message) -> None:
        """Delivery report of a failed message (the only kind librdkafka sends here)."""
        if error is None:  # not expected with delivery.report.only.error; nothing to retry
            return
        failed: Outgoing = (str(msg.topic()), msg.key() or b"", msg.value() or b"")
        with self._lock:
            self._failed.append((failed, str(error)))
