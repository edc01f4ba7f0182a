"""The platform's one Kafka producer: confluent-kafka with safe defaults and every delivery checked.

With a ``Spool`` it also rides out Kafka outages: what cannot be delivered goes to disk and is
resent when the broker answers again (docs/reliability.md, "Producer outages and the spool").
"""

from __future__ import annotations

import atexit
import itertools
import logging
import re
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
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
from producers.spool import Spool, SpooledMessage
from rollout.settings import Settings
from schemas.base import Envelope
from schemas.parse import encode_event, event_key
from schemas.topics import TopicNames

log = logging.getLogger(__name__)
_librdkafka_log = logging.getLogger(f"{__name__}.librdkafka")


class _RepeatFilter(logging.Filter):
    """Lets one of a kind of librdkafka line through per interval, then says how many were held back.

    librdkafka logs every failed reconnect; with a spool it reconnects every second, which would
    be thousands of identical lines per outage.
    """

    def __init__(self, interval_s: float = 60.0) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._seen: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        kind = re.sub(r"\d+", "#", record.getMessage())
        now = time.monotonic()
        with self._lock:
            last, held = self._seen.get(kind, (float("-inf"), 0))
            if now - last < self.interval_s:
                self._seen[kind] = (last, held + 1)
                return False
            self._seen[kind] = (now, 0)
            if len(self._seen) > 1000:
                self._seen = {k: v for k, v in self._seen.items() if now - v[0] < self.interval_s}
        if held:
            record.msg = f"{record.getMessage()} ({held} similar line(s) held back in the last {now - last:.0f} s)"
            record.args = None
        return True


_librdkafka_log.addFilter(_RepeatFilter())


class Tally:
    """A count that threads bump without a lock: the per-message paths (send, delivery reports) use it.

    ``bump`` is ``itertools.count().__next__``, a single C call that the GIL makes atomic, so no
    bump is ever lost (``self.n += 1`` from two threads could lose one) and none waits on a lock
    another thread holds. Reading takes a tick of its own, which ``value`` subtracts again, so
    reads must not race each other: ``EventProducer`` reads under its lock.
    """

    __slots__ = ("_reads", "_ticks", "bump")

    def __init__(self) -> None:
        self._ticks = itertools.count()
        self._reads = 0
        self.bump: Callable[[], int] = self._ticks.__next__
        """Add one (returns a number of no meaning)."""

    def value(self) -> int:
        """How many bumps so far (callers serialise reads)."""
        total = next(self._ticks) - self._reads
        self._reads += 1
        return total

DEFAULT_CLIENT_ID = "rollout-producer"
"""``client.id`` unless the configuration names one; brokers use it in logs and quotas."""

DEFAULT_LINGER_MS = 50
"""How long a message may wait for others to the same partition before it is sent (``linger.ms``).

librdkafka sends one produce request per partition, and each one costs the broker the same fixed
work (request handling, and the per-request latency histograms it keeps) however few messages it
carries. One process publishing 5,000 events/s over the 12 raw partitions with 10 ms sent ~1,000
requests/s, and each append also completed the worker's waiting fetch: the broker took half a core
of a 2-core machine. With 50 ms it sent ~210-240 requests/s, and the broker's request threads
used 18-33% of a core together with the worker's fewer fetches (docs/performance.md); the events
wait at most 50 ms longer, against a freshness target of a second."""

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

SPOOL_MESSAGE_TIMEOUT_MS = 15_000
"""``message.timeout.ms`` when a spool is present (librdkafka's default is 300 s): a message the
broker has not confirmed by then goes to the spool, so an outage surfaces in seconds."""
SPOOL_RECONNECT_BACKOFF_MAX_MS = 1_000
"""``reconnect.backoff.max.ms`` when a spool is present (default 10 s): a returning broker is
noticed within about a second."""
DRAIN_WINDOW = 5_000
"""Spooled messages resent and not yet confirmed at any one time."""
_MAX_TOPIC_CACHE = 1_000  # event types whose topic is remembered (the catalog has a dozen)
_DRAIN_BATCH = 500  # read per step: the spool's lock is never held long enough to slow a sender
_PROBE_INTERVAL_S = 0.5
_PROBE_TIMEOUT_S = 0.5
_ADOPT_INTERVAL_S = 30.0
_RELEASE_JOIN_S = 5.0
_SETTLE_POLL_S = 0.005  # flush with a spool: how often it checks whether everything was confirmed
QUEUE_STALL_S = 1.0
"""With a spool, how long a full local send queue may go without a single delivery confirmed before the message
goes to the spool (an outage signal from librdkafka sends it there at once). Until then ``send`` waits for room
as a bare producer does: a burst larger than librdkafka's queue (``queue.buffering.max.messages``, 100,000 by
default) is paced by the broker instead of detouring through the disk, which made a healthy 300,000-event burst
3-5 times slower and, under a sustained overload, would fill the spool until it refused messages."""
_ROOM_POLL_S = 0.005  # waiting for room: serve delivery reports for at most this long, then try again
_PURGE_SERVE_S = 0.5  # how long flush waits for purged messages to reach the spool

# Delivery failures that say "Kafka is away or slow", not "this message is wrong": with a spool
# the message goes to disk and is resent later instead of being reported as failed.
_SPOOLABLE = frozenset(
    {
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._RESOLVE,
        KafkaError._QUEUE_FULL,
        KafkaError._PURGE_QUEUE,
        KafkaError._PURGE_INFLIGHT,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.BROKER_NOT_AVAILABLE,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError.KAFKA_STORAGE_ERROR,
    }
)
# A topic that does not exist will not appear by waiting: a configuration error, reported.
_NOT_SPOOLED = frozenset({KafkaError._UNKNOWN_TOPIC, KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION})
_PURGED = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})
# Client errors (error_cb) that mean the cluster cannot be reached right now. A lone _TRANSPORT
# (one broker of several dropping a connection) is not an outage; when every broker is gone
# librdkafka follows it with _ALL_BROKERS_DOWN at once.
_UNREACHABLE = frozenset({KafkaError._ALL_BROKERS_DOWN})
SPOOL_REFUSED = "SPOOL_REFUSED"
"""``DeliveryFailure.code`` of a message the full spool refused while Kafka was unreachable."""

_with_spool: weakref.WeakSet[EventProducer] = weakref.WeakSet()
_Outgoing = tuple[str, bytes, bytes | str | None, list[tuple[str, str | bytes | None]] | None]
"""One message of ``send_raw``: topic, value, key, headers."""


def producer_config(
    config: Mapping[str, object],
    *,
    linger_ms: int = DEFAULT_LINGER_MS,
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
    """Counts of one producer's messages: accepted by ``send``, confirmed, refused, not yet reported.

    ``sent = delivered + failed + pending``; with a spool, ``pending`` includes this producer's
    messages waiting on disk. The spool fields stay 0 without one.
    """

    sent: int
    delivered: int
    failed: int
    pending: int
    spooled: int = 0
    """This producer's messages that went to the spool (each counted once) because Kafka was away."""
    spool_pending: int = 0
    """Messages on disk not yet confirmed, including those adopted from an earlier process."""
    spool_refused: int = 0
    """This producer's messages the full spool refused: lost, and also counted in ``failed``."""
    recovered: int = 0
    """Messages spooled by an earlier process that this producer delivered."""

    def __str__(self) -> str:
        text = f"sent={self.sent} delivered={self.delivered} failed={self.failed} pending={self.pending}"
        if self.spooled or self.spool_pending or self.spool_refused or self.recovered:
            text += (
                f" spooled={self.spooled} spool_pending={self.spool_pending}"
                f" spool_refused={self.spool_refused} recovered={self.recovered}"
            )
        return text


class EventProducer:
    """Sends catalog events (or raw bytes) to Kafka and accounts for every delivery report.

    ``send`` never blocks on the network; ``flush``/``close`` (or leaving the ``with`` block)
    raise ``DeliveryError`` when anything was not confirmed by the broker.

    With ``spool``, Kafka being unreachable is not a failure: messages it does not confirm, and
    every message sent while it is known to be away (or while the local queue stays full without a
    delivery confirmed, ``QUEUE_STALL_S``), go to the spool without blocking, and a background
    thread resends them, oldest first, once the broker answers. A full queue otherwise is a
    burst: ``send`` waits for room as deliveries come in. ``flush``/``close`` then raise
    ``DeliveryError`` only for messages that are lost: refused by the broker as invalid, or refused
    by a full spool. The producer owns the spool from then on and closes it in ``close``.
    """

    buffer_full_timeout_s: float = 30.0
    """How long ``send`` waits for room in a full local queue before raising ``ProducerQueueFull``."""

    def __init__(
        self,
        *,
        config: dict[str, str],
        topics: TopicNames,
        linger_ms: int = DEFAULT_LINGER_MS,
        compression: str = "lz4",
        extra: dict[str, object] | None = None,
        spool: Spool | None = None,
    ) -> None:
        self._topics = topics
        self._topic_by_type: dict[str, str] = {}
        try:
            self._config = producer_config(config, linger_ms=linger_ms, compression=compression, extra=extra)
        except BaseException:
            if spool is not None:
                spool.close()
            raise
        if spool is not None:
            if "message.timeout.ms" not in self._config and "delivery.timeout.ms" not in self._config:
                self._config["message.timeout.ms"] = SPOOL_MESSAGE_TIMEOUT_MS
            self._config.setdefault("reconnect.backoff.max.ms", SPOOL_RECONNECT_BACKOFF_MAX_MS)
        self._secrets = tuple(str(v) for k, v in self._config.items() if k in _SECRET_KEYS and v)
        self._lock = threading.Lock()
        # Bumped without the lock: once per message on the sending thread and in delivery reports.
        self._sent = Tally()
        self._delivered = Tally()
        self._withdrawn = 0  # sends counted, then refused by produce() (under the lock)
        self._failed = 0
        self._unreported_failed = 0
        self._unreported_errors: list[DeliveryFailure] = []
        self._fatal: KafkaError | None = None
        self._error_logged_at: dict[str, float] = {}
        self._closed = False
        self._spool = spool
        self._spooled = 0
        self._refused = 0
        self._recovered = 0
        self._spooling = False
        self._spooling_since = 0.0
        self._resent = 0
        self._confirmed = 0
        # None until something shows whether the cluster answers; False from an outage signal
        # until a metadata probe succeeds.
        self._reachable: bool | None = None
        self._drain_inflight = 0
        self._carry: deque[SpooledMessage] = deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        client_conf: dict[str, Any] = {
            "logger": _librdkafka_log,
            **self._config,
            "on_delivery": self._on_delivery,
            "error_cb": self._on_error,
        }
        try:
            self._producer: Producer | None = Producer(client_conf)
        except KafkaException as exc:
            if spool is not None:
                spool.close()
            raise ProducerConfigError(
                f"Kafka producer configuration refused: {self._redact(_reason(exc))}", code=_code(exc)
            ) from exc
        except (TypeError, ValueError) as exc:
            if spool is not None:
                spool.close()
            reason = self._redact(str(exc))
            raise ProducerConfigError(f"Kafka producer configuration refused: {reason}") from exc
        if spool is not None:
            _with_spool.add(self)
            self._thread = threading.Thread(target=self._run, name="rollout-spool", daemon=True)
            self._thread.start()

    @classmethod
    def from_settings(cls, settings: Settings, *, spool: Spool | bool = True, **kwargs: Any) -> Self:
        """A producer for the platform's topics, connected as the settings say.

        ``spool=True`` (the default) uses the spool the settings describe (``ROLLOUT_SPOOL_DIR``,
        ``ROLLOUT_SPOOL_MAX_BYTES``; a bound of 0 turns it off), ``False`` none, or pass a ``Spool``.
        """
        chosen: Spool | None
        if spool is True:
            chosen = Spool.from_settings(settings) if settings.spool_max_bytes > 0 else None
        elif spool is False:
            chosen = None
        else:
            chosen = spool
        try:
            return cls(
                config=settings.kafka_client_config(), topics=TopicNames(settings.topic_prefix), spool=chosen, **kwargs
            )
        except BaseException:
            if chosen is not None:
                chosen.close()
            raise

    @property
    def topics(self) -> TopicNames:
        """The topic names events are sent to."""
        return self._topics

    @property
    def config(self) -> dict[str, object]:
        """The effective client configuration, secrets masked."""
        return redact_config(self._config)

    @property
    def spool(self) -> Spool | None:
        """Where messages wait while Kafka is unreachable (None: no spool)."""
        return self._spool

    @property
    def stats(self) -> ProducerStats:
        """A consistent snapshot of the message counts."""
        spool_pending = self._spool.pending if self._spool is not None else 0
        with self._lock:
            # Delivered and failed first: every message they count was counted as sent before.
            delivered = self._delivered.value()
            failed = self._failed
            sent = self._sent.value() - self._withdrawn
            return ProducerStats(
                sent,
                delivered,
                failed,
                sent - delivered - failed,
                spooled=self._spooled,
                spool_pending=spool_pending,
                spool_refused=self._refused,
                recovered=self._recovered,
            )

    def send(self, event: Envelope) -> None:
        """Queue one event on its raw topic, keyed by trajectory_id or run_id; does not wait."""
        event_type = getattr(event, "event_type", None)
        topic = self._topic_by_type.get(event_type) if isinstance(event_type, str) else None
        if topic is None:
            topic = self._topic_for(event, event_type)
        self._send(topic, encode_event(event), event_key(event), None)

    def send_raw(
        self,
        topic: str,
        value: bytes,
        key: bytes | str | None = None,
        headers: dict[str, bytes] | None = None,
    ) -> None:
        """Queue pre-encoded bytes on any topic, unchecked; delivery is still accounted for."""
        self._send(topic, value, key, None if headers is None else list(headers.items()))

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

        With a spool it returns early when Kafka is known to be unreachable; messages still queued
        in memory then go to the spool, which is made durable (fsync), and are not errors.
        """
        producer = self._producer
        if self._spool is not None:
            if producer is not None:
                self._settle(producer, timeout)
            self._raise_if_fatal()
            self._raise_undelivered(0)
            return
        if producer is not None:
            producer.flush(timeout)
        # flush() returns librdkafka's queue length, which also counts client events not yet
        # served (a "broker down" error raised just before the deadline): count messages instead.
        with self._lock:
            remaining = self._pending()
        self._raise_if_fatal()
        self._raise_undelivered(remaining)

    def close(self, timeout: float = 30.0) -> None:
        """Flush, then release the client; messages still queued after ``timeout`` are dropped.

        With a spool nothing is dropped: what is still queued or in flight goes to the spool,
        which the next producer on the same directory resends.
        """
        if self._closed:
            return
        if self._spool is not None:
            producer = self._producer
            try:
                if producer is not None:
                    self._settle(producer, timeout)
            finally:
                self._release()
            self._raise_if_fatal()
            self._raise_undelivered(0)
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

    def _topic_for(self, event: Envelope, event_type: object) -> str:
        """The topic of an event type not seen before (remembered), or ``ProduceRejected``."""
        if not isinstance(event_type, str):
            raise ProduceRejected(f"{type(event).__name__} is not a catalog event (it has no event_type)")
        try:
            topic = self._topics.for_event_type(event_type)
        except ValueError as exc:
            raise ProduceRejected(str(exc)) from exc
        if len(self._topic_by_type) < _MAX_TOPIC_CACHE:
            self._topic_by_type[event_type] = topic
        return topic

    def _send(
        self,
        topic: str,
        value: bytes,
        key: bytes | str | None,
        headers: list[tuple[str, str | bytes | None]] | None,
    ) -> None:
        """Queue one message of ``send`` or ``send_raw`` (the spool's way when there is one)."""
        producer = self._producer
        if producer is None or self._fatal is not None:
            producer = self._live()
        if self._spool is not None:
            self._send_or_spool(producer, topic, value, key, headers)
            return
        # Counted before produce() so a delivery report served by another thread's poll() can
        # never make ``pending`` negative.
        self._sent.bump()
        try:
            self._produce(producer, topic, value, key, headers)
        except BaseException:
            with self._lock:
                self._withdrawn += 1
            raise
        # Serving delivery reports as we go keeps the queue short and surfaces fatal errors early.
        producer.poll(0)
        if self._fatal is not None:
            self._raise_if_fatal()

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
        if err is None:  # the common case, inline: this runs once per message
            self._delivered.bump()
            if self._reachable is None:
                self._answered()
            return
        self._report(None, err, msg)

    def _answered(self) -> None:
        """The first delivery report: the cluster answers."""
        with self._lock:
            if self._reachable is None:
                self._reachable = True

    def _report(
        self, headers: list[tuple[str, str | bytes | None]] | None, err: KafkaError | None, msg: Message
    ) -> None:
        if err is None:
            self._delivered.bump()
            if self._reachable is None:
                self._answered()
            return
        if self._spool is not None and _spoolable(err):
            if err.code() not in _PURGED:
                self._mark_unreachable(f"{err.name()}: {self._redact(err.str())}")
            self._to_spool(msg.topic() or "", msg.value(), msg.key(), headers)
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
        if self._spool is not None and err.code() in _UNREACHABLE:
            self._mark_unreachable(f"{err.name()}: {self._redact(err.str())}")
        # librdkafka reports passing trouble (a broker away, a timeout) here and recovers by
        # itself; one line per kind a minute says so without flooding the log.
        now = time.monotonic()
        name = err.name()
        last = self._error_logged_at.get(name)
        if last is None or now - last >= _ERROR_LOG_INTERVAL_S:
            self._error_logged_at[name] = now
            log.warning("Kafka client error %s: %s (retrying)", name, self._redact(err.str()))

    def _pending(self) -> int:
        """Messages sent and neither delivered nor failed yet (the caller holds the lock)."""
        delivered = self._delivered.value()
        failed = self._failed
        return self._sent.value() - self._withdrawn - delivered - failed

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
            delivered = self._delivered.value()
            self._unreported_failed = 0
            self._unreported_errors.clear()
        if not remaining and not failed:
            return
        hint = ""
        if remaining and not delivered:
            bootstrap = self._config.get("bootstrap.servers")
            hint = f"nothing was delivered yet: is Kafka reachable at {bootstrap}?"
        elif any(e.code == SPOOL_REFUSED for e in errors) and self._spool is not None:
            hint = (
                f"the spool at {self._spool.directory} was full while Kafka was unreachable "
                "(raise ROLLOUT_SPOOL_MAX_BYTES or free disk space)"
            )
        raise DeliveryError(undelivered=remaining + failed, failed=failed, errors=errors, hint=hint)

    def _release(self) -> None:
        producer, self._producer = self._producer, None
        self._closed = True
        if self._spool is not None:
            self._release_spooled(producer, self._spool)
            return
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

    # -- the spool -------------------------------------------------------------------------------

    def _send_or_spool(
        self,
        producer: Producer,
        topic: str,
        value: bytes,
        key: bytes | str | None,
        headers: list[tuple[str, str | bytes | None]] | None,
    ) -> None:
        """``send_raw`` with a spool: never fails because Kafka is away, and waits for queue space only while
        Kafka is not known to be away and confirms deliveries (``_wait_for_room``)."""
        self._sent.bump()
        if self._spooling:
            self._to_spool(topic, value, key, headers)
            return
        try:
            try:
                if headers is None:
                    producer.produce(topic, value, key)
                else:
                    # Delivery reports do not carry headers, so the report of this one keeps them.
                    producer.produce(topic, value, key, headers=headers, on_delivery=partial(self._report, headers))
            except BufferError:
                if not self._wait_for_room(producer, (topic, value, key, headers)):
                    raise
        except BufferError:
            # On disk first: the spool's thread ends spooling once nothing waits to be resent, and must not find
            # the spool empty between the two steps (the next sends would then wait for the stall again).
            self._to_spool(topic, value, key, headers)
            self._start_spooling(f"is not keeping up (the local send queue stayed full for {QUEUE_STALL_S:g} s "
                                 "without a delivery confirmed)")
            return
        except KafkaException as exc:
            wrapped = self._wrap(exc, f"cannot send to {topic}")
            if isinstance(wrapped, ProduceFailed):
                self._to_spool(topic, value, key, headers)
                return
            with self._lock:
                self._withdrawn += 1
            raise wrapped from exc
        except BaseException:
            with self._lock:
                self._withdrawn += 1
            raise
        # No poll here: the background thread serves reports, so a sender never runs a backlog
        # of callbacks (thousands of resent messages' reports after an outage) on its own time.
        if self._fatal is not None:
            self._raise_if_fatal()

    def _wait_for_room(self, producer: Producer, message: _Outgoing) -> bool:
        """The local queue is full: produce ``message`` once there is room, waiting while deliveries are confirmed.
        False (the caller spools it) when an outage signal started spooling meanwhile (or before), or when no
        delivery was confirmed for ``QUEUE_STALL_S``.

        A producer whose first messages are not confirmed yet waits too: a burst sent at start-up fills the
        queue before the broker has answered (a new idempotent producer first asks for its id, which a broker
        just started answers only once its coordinator has loaded), and an unreachable cluster says so
        (``_ALL_BROKERS_DOWN``) sooner than the stall limit."""
        topic, value, key, headers = message
        with self._lock:
            delivered = self._delivered.value()
        since = time.monotonic()
        while not self._spooling and self._fatal is None:
            # Serving reports here too frees the queue sooner than waiting for the spool's thread to.
            producer.poll(_ROOM_POLL_S)
            try:  # the produce of _send_or_spool, which keeps it inline: it runs once per message sent
                if headers is None:
                    producer.produce(topic, value, key)
                else:
                    producer.produce(topic, value, key, headers=headers, on_delivery=partial(self._report, headers))
                return True
            except BufferError:
                pass
            now = time.monotonic()
            with self._lock:
                confirmed = self._delivered.value()
            if confirmed != delivered:
                delivered, since = confirmed, now
            elif now - since >= QUEUE_STALL_S:
                return False
        return False

    def _to_spool(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | str | None,
        headers: list[tuple[str, str | bytes | None]] | None,
    ) -> None:
        """Put one of this producer's messages on disk; a refusal (full spool) is counted as a failure."""
        spool = self._spool
        assert spool is not None
        if spool.append(topic, value, key, headers):
            with self._lock:
                self._spooled += 1
            return
        shown = key.decode("utf-8", errors="replace") if isinstance(key, bytes) else key
        failure = DeliveryFailure(
            topic=topic,
            partition=None,
            key=None if shown is None else shown[:200],
            code=SPOOL_REFUSED,
            reason=f"Kafka was unreachable and the spool at {spool.directory} refused the message (full)",
            retriable=False,
            fatal=False,
        )
        with self._lock:
            self._failed += 1
            self._refused += 1
            self._unreported_failed += 1
            if len(self._unreported_errors) < MAX_KEPT_ERRORS:
                self._unreported_errors.append(failure)

    def _mark_unreachable(self, reason: str) -> None:
        # What librdkafka already holds stays with it: it retries those messages with their
        # idempotent sequence numbers, so a broker back within message.timeout.ms stores each
        # exactly once. Moving them to the spool now would resend possibly written ones as new.
        with self._lock:
            self._reachable = False
        self._start_spooling(f"is unreachable ({reason})")

    def _start_spooling(self, why: str) -> None:
        with self._lock:
            if self._spooling:
                return
            self._spooling = True
            self._spooling_since = time.monotonic()
            self._resent = 0
            self._confirmed = 0
        spool = self._spool
        assert spool is not None
        log.warning(
            "Kafka at %s %s: spooling events to %s (bound %s bytes) and resending them once it answers",
            self._config.get("bootstrap.servers"),
            why,
            spool.directory,
            f"{spool.max_bytes:,}",
        )

    def _stop_spooling(self) -> None:
        with self._lock:
            if not self._spooling:
                return
            self._spooling = False
            took = time.monotonic() - self._spooling_since
            resent, confirmed = self._resent, self._confirmed
        log.warning(
            "Kafka at %s answers again after %.1f s: %d spooled event(s) resent (%d confirmed so far); "
            "sending directly",
            self._config.get("bootstrap.servers"),
            took,
            resent,
            confirmed,
        )

    def _run(self) -> None:
        """The background thread: serves reports, probes an absent cluster, resends the spool."""
        spool = self._spool
        assert spool is not None
        last_probe = float("-inf")
        last_adopt = time.monotonic()
        failures_logged_at = float("-inf")
        while not self._stop.is_set():
            producer = self._producer
            if producer is None:
                return
            try:
                busy = self._drain_step(producer, spool)
                now = time.monotonic()
                waiting = bool(self._carry) or spool.unread > 0
                if self._reachable is not True and (waiting or self._spooling) and now - last_probe >= (
                    _PROBE_INTERVAL_S
                ):
                    last_probe = now
                    self._probe(producer)
                elif self._spooling and self._reachable is True and not waiting:
                    self._stop_spooling()
                if now - last_adopt >= _ADOPT_INTERVAL_S:
                    last_adopt = now
                    spool.adopt()
                spool.maintain()
                producer.poll(0 if busy else 0.05)
            except Exception:  # a bug here must not stop resending, nor flood the log
                now = time.monotonic()
                if now - failures_logged_at >= _ERROR_LOG_INTERVAL_S:
                    failures_logged_at = now
                    log.exception("the spool's background thread hit an error; carrying on")
                self._stop.wait(0.5)

    def _probe(self, producer: Producer) -> None:
        try:
            metadata = producer.list_topics(timeout=_PROBE_TIMEOUT_S)
        except KafkaException:
            return
        if metadata.brokers:
            with self._lock:
                self._reachable = True

    def _drain_step(self, producer: Producer, spool: Spool) -> bool:
        """Resend what the spool holds while the cluster answers; True when it did something."""
        if self._reachable is not True:
            return False
        room = DRAIN_WINDOW - self._drain_inflight - len(self._carry)
        if room > 0 and spool.unread > 0:
            self._carry.extend(spool.read(min(room, _DRAIN_BATCH)))
        sent = 0
        while self._carry and self._reachable is True:
            message = self._carry[0]
            try:
                if message.headers is None:
                    producer.produce(
                        message.topic, message.value, message.key, on_delivery=partial(self._on_resent, message)
                    )
                else:
                    producer.produce(
                        message.topic,
                        message.value,
                        message.key,
                        headers=list(message.headers),
                        on_delivery=partial(self._on_resent, message),
                    )
            except BufferError:
                break  # the queue is full: resend the rest once reports have freed it
            except KafkaException as exc:
                self._carry.popleft()
                err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                if err is not None and _spoolable(err):
                    spool.nack(message)
                    self._mark_unreachable(f"{err.name()}: {self._redact(err.str())}")
                else:
                    self._drop_resent(message, err, str(exc))
                continue
            self._carry.popleft()
            with self._lock:
                self._drain_inflight += 1
                self._resent += 1
            sent += 1
        return sent > 0

    def _on_resent(self, message: SpooledMessage, err: KafkaError | None, msg: Message) -> None:
        spool = self._spool
        assert spool is not None
        with self._lock:
            self._drain_inflight -= 1
        if err is None:
            spool.ack(message)
            with self._lock:
                if message.recovered:
                    self._recovered += 1
                else:
                    self._delivered.bump()
                self._confirmed += 1
            return
        if _spoolable(err):
            spool.nack(message)
            if err.code() not in _PURGED:
                self._mark_unreachable(f"{err.name()}: {self._redact(err.str())}")
            return
        self._drop_resent(message, err, err.str())

    def _drop_resent(self, message: SpooledMessage, err: KafkaError | None, reason: str) -> None:
        """A spooled message the broker refuses as invalid: it can never be delivered, so it leaves the spool."""
        spool = self._spool
        assert spool is not None
        spool.ack(message)
        failure = DeliveryFailure(
            topic=message.topic,
            partition=None,
            key=_show_key(message.key),
            code=err.name() if err is not None else "?",
            reason=self._redact(reason),
            retriable=False,
            fatal=bool(err is not None and err.fatal()),
        )
        if message.recovered:
            log.error("Kafka refused a message spooled by an earlier process; it is dropped: %s", failure)
            return
        with self._lock:
            self._failed += 1
            self._unreported_failed += 1
            kept = len(self._unreported_errors) < MAX_KEPT_ERRORS
            if kept:
                self._unreported_errors.append(failure)
        if kept:
            log.warning("Kafka delivery failed: %s", failure)

    def _settle(self, producer: Producer, timeout: float) -> None:
        """Wait (at most ``timeout``) for this producer's messages, then move what is queued to disk."""
        spool = self._spool
        assert spool is not None
        deadline = time.monotonic() + max(timeout, 0.0)
        while True:
            with self._lock:
                pending = self._pending()
                reachable = self._reachable
            now = time.monotonic()
            # Waiting for an absent cluster helps nobody: the spool keeps the messages.
            if not pending or reachable is False or now >= deadline:
                break
            # The background thread serves most reports, so this wait often sees none of them:
            # short, so the last one is noticed within milliseconds.
            producer.poll(min(_SETTLE_POLL_S, deadline - now))
            self._raise_if_fatal()
        if pending and len(producer):
            # Messages queued in memory go to the spool now; those in flight resolve by themselves
            # (purging them could duplicate what the broker already wrote). A message leaves
            # len(producer) only once its report was handled, so this waits for them to be on disk.
            producer.purge(in_queue=True, in_flight=False, blocking=True)
            until = time.monotonic() + _PURGE_SERVE_S
            while len(producer) and time.monotonic() < until:
                producer.poll(0.01)
        spool.sync()

    def _release_spooled(self, producer: Producer | None, spool: Spool) -> None:
        """Stop resending, move everything still in memory to the spool, make it durable, close it."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(_RELEASE_JOIN_S)
        _with_spool.discard(self)
        try:
            if producer is not None:
                try:
                    if len(producer):
                        producer.purge()
                        deadline = time.monotonic() + 1.0
                        while len(producer) and time.monotonic() < deadline:
                            producer.poll(0.01)
                    producer.close()
                except (KafkaException, RuntimeError) as exc:
                    log.warning("closing the Kafka producer: %s", self._redact(str(exc)))
            while self._carry:
                spool.nack(self._carry.popleft())
            self._stop_spooling_quietly()
        finally:
            spool.close()

    def _stop_spooling_quietly(self) -> None:
        with self._lock:
            self._spooling = False

    def _release_at_exit(self) -> None:
        try:
            self._release()
        except Exception:  # the interpreter is going away: never raise from here
            log.exception("moving unsent Kafka messages to the spool at exit failed")

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


def _spoolable(err: KafkaError) -> bool:
    """True for a delivery failure that waiting can fix (the broker away or slow), with a spool to wait in."""
    if err.fatal() or err.code() in _NOT_SPOOLED:
        return False
    return err.code() in _SPOOLABLE or err.retriable()


@atexit.register
def _release_at_exit() -> None:
    # A process that exits without closing its producer still keeps what was not yet delivered.
    for producer in list(_with_spool):
        producer._release_at_exit()


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
