"""The platform's one Kafka producer: confluent-kafka with safe defaults and every delivery checked."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from producers.exceptions import (
    DeliveryError,
    DeliveryFailure,
    ProduceFailed,
    ProducerClosed,
    ProducerConfigError,
    ProduceRejected,
    ProducerError,
    ProducerFatalError,
    ProducerQueueFull,
)
from rollout.settings import Settings
from schemas.base import Envelope
from schemas.parse import encode_event, event_key
from schemas.topics import TopicNames

log = logging.getLogger(__name__)
_librdkafka_log = logging.getLogger(f"{__name__}.librdkafka")

DEFAULT_CLIENT_ID = "rollout-producer"
"""``client.id`` unless the configuration names one; brokers use it in logs and quotas."""

COMPRESSION_TYPES = frozenset({"none", "gzip", "snappy", "lz4", "zstd"})

MAX_KEPT_ERRORS = 20
"""Delivery failures kept (and logged) between two flushes; the rest are only counted."""

_OWNED_KEYS = frozenset({"on_delivery", "error_cb", "delivery.report.only.error", "dr_cb", "dr_msg_cb"})
_SECRET_KEYS = frozenset(
    {
        "sasl.password",
        "sasl.oauthbearer.client.secret",
        "ssl.key.password",
        "ssl.keystore.password",
        "ssl.key.pem",
    }
)
_ERROR_LOG_INTERVAL_S = 60.0


def producer_config(
    config: Mapping[str, object],
    *,
    linger_ms: int = 10,
    compression: str = "lz4",
    extra: Mapping[str, object] | None = None,
) -> dict[str, object]:
    """The librdkafka configuration of an ``EventProducer`` (a plain dict: nothing connects).

    Precedence, lowest first: safe defaults, ``config`` (connection and security), the
    ``linger_ms``/``compression`` arguments, ``extra`` (deliberate overrides).
    """
    if linger_ms < 0:
        raise ProducerConfigError(f"linger_ms must be >= 0, got {linger_ms}")
    if compression not in COMPRESSION_TYPES:
        raise ProducerConfigError(
            f"compression must be one of {sorted(COMPRESSION_TYPES)}, got {compression!r}"
        )
    conf: dict[str, object] = {
        # Idempotence lets librdkafka retry without duplicating or reordering a partition's messages.
        # It needs acks=all; spelling it out makes an override that weakens it fail at creation.
        "enable.idempotence": True,
        "acks": "all",
        # librdkafka's default partitioner (consistent_random, CRC32) sends a key to a different
        # partition than the Java client, aiokafka and hence faust (murmur2). Faust's tables and
        # repartition topics are keyed by trajectory_id/run_id and assume the Java placement, so a
        # key must hash the same whichever client wrote it: murmur2_random is Java's
        # positive-murmur2 % partitions for keyed messages (keyless ones are spread randomly).
        "partitioner": "murmur2_random",
        "client.id": DEFAULT_CLIENT_ID,
    }
    conf.update(config)
    conf["compression.type"] = compression
    conf["linger.ms"] = linger_ms
    conf.update(extra or {})
    owned = sorted(_OWNED_KEYS & conf.keys())
    if owned:
        raise ProducerConfigError(
            f"{', '.join(owned)} cannot be configured: EventProducer checks every delivery report itself"
        )
    return conf


def redact_config(config: Mapping[str, object]) -> dict[str, object]:
    """A copy of a client configuration that is safe to print (secrets replaced by ``***``)."""
    return {k: ("***" if k in _SECRET_KEYS and v else v) for k, v in config.items()}


@dataclass(frozen=True, slots=True)
class ProducerStats:
    """Counts of one producer's messages: accepted by ``send``, confirmed, refused, not yet reported."""

    sent: int
    delivered: int
    failed: int
    pending: int

    def __str__(self) -> str:
        return f"sent={self.sent} delivered={self.delivered} failed={self.failed} pending={self.pending}"


class EventProducer:
    """Sends catalog events (or raw bytes) to Kafka and accounts for every delivery report.

    ``send`` never blocks on the network; ``flush``/``close`` (or leaving the ``with`` block)
    raise ``DeliveryError`` when anything was not confirmed by the broker.
    """

    buffer_full_timeout_s: float = 30.0
    """How long ``send`` waits for room in a full local queue before raising ``ProducerQueueFull``."""

    def __init__(
        self,
        *,
        config: dict[str, str],
        topics: TopicNames,
        linger_ms: int = 10,
        compression: str = "lz4",
        extra: dict[str, object] | None = None,
    ) -> None:
        self._topics = topics
        self._config = producer_config(config, linger_ms=linger_ms, compression=compression, extra=extra)
        self._secrets = tuple(str(v) for k, v in self._config.items() if k in _SECRET_KEYS and v)
        self._lock = threading.Lock()
        self._sent = 0
        self._delivered = 0
        self._failed = 0
        self._unreported_failed = 0
        self._unreported_errors: list[DeliveryFailure] = []
        self._fatal: KafkaError | None = None
        self._error_logged_at: dict[str, float] = {}
        self._closed = False
        client_conf: dict[str, Any] = {
            "logger": _librdkafka_log,
            **self._config,
            "on_delivery": self._on_delivery,
            "error_cb": self._on_error,
        }
        try:
            self._producer: Producer | None = Producer(client_conf)
        except KafkaException as exc:
            raise ProducerConfigError(
                f"Kafka producer configuration refused: {self._redact(_reason(exc))}", code=_code(exc)
            ) from exc
        except (TypeError, ValueError) as exc:
            reason = self._redact(str(exc))
            raise ProducerConfigError(f"Kafka producer configuration refused: {reason}") from exc

    @classmethod
    def from_settings(cls, settings: Settings, **kwargs: Any) -> Self:
        """A producer for the platform's topics, connected as the settings say."""
        return cls(config=settings.kafka_client_config(), topics=TopicNames(settings.topic_prefix), **kwargs)

    @property
    def topics(self) -> TopicNames:
        """The topic names events are sent to."""
        return self._topics

    @property
    def config(self) -> dict[str, object]:
        """The effective client configuration, secrets masked."""
        return redact_config(self._config)

    @property
    def stats(self) -> ProducerStats:
        """A consistent snapshot of the message counts."""
        with self._lock:
            pending = self._sent - self._delivered - self._failed
            return ProducerStats(self._sent, self._delivered, self._failed, pending)

    def send(self, event: Envelope) -> None:
        """Queue one event on its raw topic, keyed by trajectory_id or run_id; does not wait."""
        event_type = getattr(event, "event_type", None)
        if not isinstance(event_type, str):
            raise ProduceRejected(f"{type(event).__name__} is not a catalog event (it has no event_type)")
        try:
            topic = self._topics.for_event_type(event_type)
        except ValueError as exc:
            raise ProduceRejected(str(exc)) from exc
        self.send_raw(topic, encode_event(event), key=event_key(event))

    def send_raw(
        self,
        topic: str,
        value: bytes,
        key: bytes | str | None = None,
        headers: dict[str, bytes] | None = None,
    ) -> None:
        """Queue pre-encoded bytes on any topic, unchecked; delivery is still accounted for."""
        producer = self._live()
        header_list: list[tuple[str, str | bytes | None]] | None = (
            None if headers is None else list(headers.items())
        )
        # Counted before produce() so a delivery report served by another thread's poll() can
        # never make ``pending`` negative.
        with self._lock:
            self._sent += 1
        try:
            self._produce(producer, topic, value, key, header_list)
        except BaseException:
            with self._lock:
                self._sent -= 1
            raise
        # Serving delivery reports as we go keeps the queue short and surfaces fatal errors early.
        producer.poll(0)
        self._raise_if_fatal()

    def poll(self, timeout: float = 0.0) -> int:
        """Serve delivery reports and client errors, waiting up to ``timeout`` seconds; returns how many."""
        producer = self._producer
        if producer is None:
            return 0
        served = producer.poll(timeout)
        self._raise_if_fatal()
        return served

    def flush(self, timeout: float = 30.0) -> None:
        """Wait up to ``timeout`` seconds for queued messages; ``DeliveryError`` if any is unconfirmed.

        Failures are reported once: a later flush only reports what happened after this one.
        """
        producer = self._producer
        remaining = producer.flush(timeout) if producer is not None else 0
        self._raise_if_fatal()
        self._raise_undelivered(remaining)

    def close(self, timeout: float = 30.0) -> None:
        """Flush, then release the client; messages still queued after ``timeout`` are dropped."""
        if self._closed:
            return
        try:
            self.flush(timeout)
        finally:
            self._release()

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
        # Events emitted while failing (a crash report) are the ones most worth delivering, so
        # flush anyway, but never let a delivery problem hide the exception already in flight.
        try:
            self.close()
        except ProducerError as err:
            log.error("Kafka delivery failed while handling %s: %s", exc_type.__name__, err)

    def __repr__(self) -> str:
        bootstrap = self._config.get("bootstrap.servers", "?")
        client_id = self._config.get("client.id", "?")
        state = "closed" if self._closed else "open"
        return (
            f"EventProducer(bootstrap={bootstrap!r}, client_id={client_id!r}, "
            f"prefix={self._topics.prefix!r}, {state}, {self.stats})"
        )

    # -- internals -------------------------------------------------------------------------

    def _live(self) -> Producer:
        producer = self._producer
        if producer is None:
            raise ProducerClosed("this EventProducer is closed; create a new one to send more events")
        self._raise_if_fatal()
        return producer

    def _produce(
        self,
        producer: Producer,
        topic: str,
        value: bytes,
        key: bytes | str | None,
        headers: list[tuple[str, str | bytes | None]] | None,
    ) -> None:
        deadline: float | None = None
        while True:
            try:
                if headers is None:
                    producer.produce(topic, value, key)
                else:
                    producer.produce(topic, value, key, headers=headers)
                return
            except BufferError as exc:
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.buffer_full_timeout_s
                elif now >= deadline:
                    raise ProducerQueueFull(
                        f"the local Kafka send queue stayed full for {self.buffer_full_timeout_s:g}s "
                        f"({self.stats}); is the broker at {self._config.get('bootstrap.servers')} "
                        "reachable and keeping up?",
                        code="_QUEUE_FULL",
                    ) from exc
                # Only served delivery reports free queue space, so wait on them, not on a sleep.
                producer.poll(0.05)
                self._raise_if_fatal()
            except KafkaException as exc:
                raise self._wrap(exc, f"cannot send to {topic}") from exc

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            with self._lock:
                self._delivered += 1
            return
        failure = DeliveryFailure(
            topic=msg.topic() or "?",
            partition=msg.partition(),
            key=_show_key(msg.key()),
            code=err.name(),
            reason=self._redact(err.str()),
            retriable=err.retriable(),
            fatal=err.fatal(),
        )
        with self._lock:
            self._failed += 1
            self._unreported_failed += 1
            kept = len(self._unreported_errors) < MAX_KEPT_ERRORS
            if kept:
                self._unreported_errors.append(failure)
            if err.fatal() and self._fatal is None:
                self._fatal = err
        if kept:
            log.warning("Kafka delivery failed: %s", failure)

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            with self._lock:
                if self._fatal is None:
                    self._fatal = err
            log.error("Kafka producer fatal error %s: %s", err.name(), self._redact(err.str()))
            return
        # librdkafka reports passing trouble (a broker away, a timeout) here and recovers by
        # itself; one line per kind a minute says so without flooding the log.
        now = time.monotonic()
        name = err.name()
        last = self._error_logged_at.get(name)
        if last is None or now - last >= _ERROR_LOG_INTERVAL_S:
            self._error_logged_at[name] = now
            log.warning("Kafka client error %s: %s (retrying)", name, self._redact(err.str()))

    def _raise_if_fatal(self) -> None:
        err = self._fatal
        if err is None:
            return
        raise ProducerFatalError(
            f"Kafka producer hit a fatal error {err.name()}: {self._redact(err.str())}. It can send no more "
            f"(its idempotence state is lost); close it and create a new EventProducer ({self.stats})",
            code=err.name(),
        )

    def _raise_undelivered(self, remaining: int) -> None:
        with self._lock:
            failed = self._unreported_failed
            errors = list(self._unreported_errors)
            delivered = self._delivered
            self._unreported_failed = 0
            self._unreported_errors.clear()
        if not remaining and not failed:
            return
        hint = ""
        if remaining and not delivered:
            bootstrap = self._config.get("bootstrap.servers")
            hint = f"nothing was delivered yet: is Kafka reachable at {bootstrap}?"
        raise DeliveryError(undelivered=remaining + failed, failed=failed, errors=errors, hint=hint)

    def _release(self) -> None:
        producer, self._producer = self._producer, None
        self._closed = True
        if producer is None:
            return
        try:
            if len(producer):
                # Producer.close() would otherwise wait for these without a time limit; purged
                # messages get failure reports, so the counts stay exact.
                producer.purge()
                producer.poll(0)
            producer.close()
        except (KafkaException, RuntimeError) as exc:
            log.warning("closing the Kafka producer: %s", self._redact(str(exc)))

    def _wrap(self, exc: KafkaException, context: str) -> ProducerError:
        err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        if err is None:
            return ProduceFailed(f"{context}: {self._redact(str(exc))}")
        message = f"{context}: {err.name()} ({self._redact(err.str())})"
        if err.fatal():
            with self._lock:
                if self._fatal is None:
                    self._fatal = err
            return ProducerFatalError(message, code=err.name())
        if err.retriable():
            return ProduceFailed(message, code=err.name())
        return ProduceRejected(message, code=err.name())

    def _redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text


def _reason(exc: KafkaException) -> str:
    err = exc.args[0] if exc.args else None
    return err.str() if isinstance(err, KafkaError) else str(exc)


def _code(exc: KafkaException) -> str | None:
    err = exc.args[0] if exc.args else None
    return err.name() if isinstance(err, KafkaError) else None


def _show_key(key: bytes | None) -> str | None:
    if key is None:
        return None
    return key[:200].decode("utf-8", errors="replace")
