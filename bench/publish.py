"""SDK publish: ``EventProducer.send`` of pre-built typed events + ``flush``, against raw confluent-kafka.

Both sides send the same events to the same topics with the same librdkafka configuration (the
SDK's effective one), after one warm-up message that opens the connections, in pairs whose order
alternates, after a full-size warm-up pair. The SDK encodes each
event (JSON), picks its topic and key and accounts for every delivery report; the baseline
produces the already encoded bytes, polls every 1,000 messages and counts delivery reports.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Producer

from bench.measure import median_of, paired_ratio
from bench.workload import Encoded
from producers.kafka import EventProducer
from rollout.settings import Settings
from schemas import Envelope


@dataclass(frozen=True, slots=True)
class PublishResult:
    """Rates (events/s) of every repeat, and the configuration used."""

    events: int
    sdk_rates: list[float]
    raw_rates: list[float]
    config: dict[str, object]
    spool: bool

    @property
    def sdk(self) -> float:
        """Median SDK rate."""
        return median_of(self.sdk_rates)

    @property
    def raw(self) -> float:
        """Median raw confluent-kafka rate."""
        return median_of(self.raw_rates)

    @property
    def ratio(self) -> float:
        """The median of the runs' SDK / raw ratios (each SDK run took turns with a raw run)."""
        return paired_ratio(self.sdk_rates, self.raw_rates)


def sdk_once(settings: Settings, events: list[Envelope]) -> float:
    """One SDK run (default configuration): events/s from the first send to a flush that confirmed every event."""
    with EventProducer.from_settings(settings) as producer:
        producer.send(events[0])  # warm-up: connections, metadata, producer id
        producer.flush(60)
        began = time.perf_counter()
        for event in events:
            producer.send(event)
        producer.flush(120)
        seconds = time.perf_counter() - began
        stats = producer.stats
        if stats.delivered != len(events) + 1 or stats.failed:
            raise RuntimeError(f"SDK run did not deliver everything: {stats}")
    return len(events) / seconds


def raw_once(config: dict[str, object], encoded: Encoded, *, warm_up: bool = True) -> float:
    """One raw run: events/s from the first produce to a flush with every delivery report served.

    With ``warm_up`` the first message is sent once more before the clock starts (the log then holds it twice)."""
    counts = {"delivered": 0, "failed": 0}

    def on_delivery(err: Any, _msg: Any) -> None:
        counts["failed" if err is not None else "delivered"] += 1

    producer = Producer({**config, "on_delivery": on_delivery})
    if warm_up:
        producer.produce(encoded.topics[0], encoded.values[0], encoded.keys[0])
        producer.flush(60)
    produce = producer.produce
    poll = producer.poll
    began = time.perf_counter()
    for i, (topic, key, value) in enumerate(zip(encoded.topics, encoded.keys, encoded.values, strict=True)):
        while True:
            try:
                produce(topic, value, key)
                break
            except BufferError:
                poll(0.05)
        if i % 1000 == 0:
            poll(0)
    remaining = producer.flush(120)
    seconds = time.perf_counter() - began
    if remaining or counts["failed"] or counts["delivered"] != len(encoded) + warm_up:
        raise RuntimeError(f"raw run did not deliver everything: {counts}, {remaining} still queued")
    return len(encoded) / seconds


def effective_config(settings: Settings) -> tuple[dict[str, object], bool]:
    """The SDK's default librdkafka configuration (the raw baseline uses it too), and whether it spools."""
    with EventProducer.from_settings(settings) as producer:
        config = {k: v for k, v in producer.config.items() if k != "logger"}
        return config, getattr(producer, "spool", None) is not None


def sdk_goes_first(pair: int) -> bool:
    """Whether the SDK runs before raw produce in the ``pair``-th measured pair (0-based): every other one.

    The order can matter on this machine: in two full runs the SDK's ratio was higher in every pair it
    ran first (0.61 / 0.50 / 0.66x and 0.54 / 0.56 / 0.49x) than in those it ran second (0.54 / 0.44x
    and 0.43 / 0.43x), though not in a third (first 0.52 / 0.37 / 0.48x, second 0.38 / 0.56x).
    Alternating keeps either order from deciding the median.
    """
    return pair % 2 == 0


def run_publish(settings: Settings, events: list[Envelope], encoded: Encoded, *, repeats: int,
                log: Any = print) -> PublishResult:
    """A full-size warm-up pair, then ``repeats`` pairs of SDK and raw runs over the same events, in
    alternating order (``sdk_goes_first``)."""
    config, spool = effective_config(settings)
    sdk_once(settings, events)
    raw_once(config, encoded)
    sdk_rates: list[float] = []
    raw_rates: list[float] = []
    for i in range(repeats):
        if sdk_goes_first(i):
            sdk_rates.append(sdk_once(settings, events))
            raw_rates.append(raw_once(config, encoded))
        else:
            raw_rates.append(raw_once(config, encoded))
            sdk_rates.append(sdk_once(settings, events))
        first = "SDK first" if sdk_goes_first(i) else "raw first"
        log(f"  run {i + 1} ({first}): SDK {sdk_rates[-1]:,.0f} events/s, raw {raw_rates[-1]:,.0f} events/s")
    return PublishResult(len(events), sdk_rates, raw_rates, config, spool)
