"""SDK publish: ``EventProducer.send`` of pre-built typed events + ``flush``, against raw confluent-kafka.

Both sides send the same events to the same topics with the same librdkafka configuration (the
SDK's effective one), after one warm-up message that opens the connections, in pairs whose order
alternates, after a full-size warm-up pair. The SDK encodes each
event (JSON), picks its topic and key and accounts for every delivery report; the baseline
produces the already encoded bytes, polls every 1,000 messages and counts delivery reports.

After each pair a third publisher runs, outside the target's ratio: the baseline's loop, but encoding
each typed event as it goes (``encode_event``, ``event_key``, the topic of its type), which is the
least any publisher of typed events does. The SDK's rate against it is what the SDK itself costs;
the loop's rate against the baseline is what encoding costs.

Last, outside the row, the SDK sends the events three times over in one run (``burst_once``): more than
librdkafka's send queue holds, which the pairs' runs fit in, so a burst's cost (and anything it sends to
the spool) shows.

Every run also records the CPU it used over its timed span, per event: the sending thread's
(``time.thread_time``) and the whole process's (``time.process_time``: librdkafka's threads and the
SDK's spool thread included, the broker not). The rates say how fast; these say where the difference
is spent.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Producer

from bench.measure import median_of, paired_ratio
from bench.workload import Encoded
from producers.kafka import EventProducer, ProducerStats
from rollout.settings import Settings
from schemas import Envelope
from schemas.parse import encode_event, event_key
from schemas.topics import TopicNames


@dataclass(frozen=True, slots=True)
class Run:
    """One publisher run: its rate and the CPU it used from the first message to the confirmed flush."""

    rate: float
    """Events/s."""
    thread_us: float
    """CPU of the thread that sent, µs per event."""
    process_us: float
    """CPU of the whole process (every thread but the broker's), µs per event."""


class _Span:
    """The wall clock and CPU clocks of one timed span."""

    __slots__ = ("began", "thread", "process")

    def __init__(self) -> None:
        self.began = time.perf_counter()
        self.thread = time.thread_time()
        self.process = time.process_time()

    def run(self, count: int) -> Run:
        """The span's rate and CPU per event for ``count`` events, ended now (call on the thread that began it)."""
        seconds = time.perf_counter() - self.began
        thread = time.thread_time() - self.thread
        process = time.process_time() - self.process
        return Run(count / seconds, thread / count * 1e6, process / count * 1e6)


BURST_TIMES = 3
"""The burst run sends the events this many times over: 300,000 messages in the full suite, three times what
librdkafka's send queue holds (``queue.buffering.max.messages``, 100,000), which the pairs' runs fit in."""


@dataclass(frozen=True, slots=True)
class Burst:
    """The SDK sending more than its send queue holds, in one go."""

    events: int
    run: Run
    spooled: int
    """Messages that went to the on-disk spool on the way (a healthy broker: none)."""


@dataclass(frozen=True, slots=True)
class PublishResult:
    """Every measured run of each side, and the configuration used."""

    events: int
    runs: dict[str, list[Run]]
    """The measured runs of each side in order: ``"SDK"``, ``"raw"`` and, when it ran, ``"loop"`` (``loop_once``,
    one after each pair)."""
    config: dict[str, object]
    spool: bool
    burst: Burst | None = None
    """The burst run after the pairs (``burst_once``); None when not run."""

    @property
    def sdk_rates(self) -> list[float]:
        """The SDK runs' rates (events/s)."""
        return [r.rate for r in self.runs["SDK"]]

    @property
    def raw_rates(self) -> list[float]:
        """The raw confluent-kafka runs' rates (events/s)."""
        return [r.rate for r in self.runs["raw"]]

    @property
    def loop_rates(self) -> list[float]:
        """The encode-and-produce loop's rates (events/s); empty when it did not run."""
        return [r.rate for r in self.runs.get("loop", [])]

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

    def cpu_medians(self, side: str) -> tuple[float, float] | None:
        """The median sending-thread and whole-process CPU per event (µs) of ``side``'s runs; None without them."""
        runs = self.runs.get(side)
        if not runs:
            return None
        return median_of([r.thread_us for r in runs]), median_of([r.process_us for r in runs])

    @property
    def sdk_to_loop(self) -> float | None:
        """The median of each pair's SDK rate / the loop run right after it: the SDK's own cost."""
        return paired_ratio(self.sdk_rates, self.loop_rates) if self.loop_rates else None


def sdk_once(settings: Settings, events: list[Envelope]) -> Run:
    """One SDK run (default configuration), from the first send to a flush that confirmed every event."""
    return _sdk_run(settings, events, 1)[0]


def burst_once(settings: Settings, events: list[Envelope], times: int = BURST_TIMES) -> Burst:
    """One SDK run that sends ``events`` ``times`` over without a pause (the same messages again each time)."""
    run, stats = _sdk_run(settings, events, times)
    return Burst(len(events) * times, run, stats.spooled)


def _sdk_run(settings: Settings, events: list[Envelope], times: int) -> tuple[Run, ProducerStats]:
    count = len(events) * times
    with EventProducer.from_settings(settings) as producer:
        producer.send(events[0])  # warm-up: connections, metadata, producer id
        producer.flush(60)
        span = _Span()
        for _ in range(times):
            for event in events:
                producer.send(event)
        producer.flush(120)
        run = span.run(count)
        stats = producer.stats
        if stats.delivered != count + 1 or stats.failed:
            raise RuntimeError(f"SDK run did not deliver everything: {stats}")
    return run, stats


Message = tuple[str, bytes | str, bytes]
"""What a bare producer sends: topic, key, value."""


def produce_all(config: dict[str, object], messages: Iterable[Message], count: int, *, warm_up: Message | None,
                what: str) -> Run:
    """Produce ``count`` messages with a bare confluent-kafka ``Producer``, timed from the first message to a
    flush with every delivery report served (``poll(0)`` every 1,000 messages, delivery reports counted).

    ``warm_up`` is sent and flushed before the clock starts. RuntimeError unless every message was delivered."""
    counts = {"delivered": 0, "failed": 0}

    def on_delivery(err: Any, _msg: Any) -> None:
        counts["failed" if err is not None else "delivered"] += 1

    producer = Producer({**config, "on_delivery": on_delivery})
    if warm_up is not None:
        topic, key, value = warm_up
        producer.produce(topic, value, key)
        producer.flush(60)
    produce = producer.produce
    poll = producer.poll
    span = _Span()
    for i, (topic, key, value) in enumerate(messages):
        while True:
            try:
                produce(topic, value, key)
                break
            except BufferError:
                poll(0.05)
        if i % 1000 == 0:
            poll(0)
    remaining = producer.flush(120)
    run = span.run(count)
    if remaining or counts["failed"] or counts["delivered"] != count + (warm_up is not None):
        raise RuntimeError(f"{what} run did not deliver everything: {counts}, {remaining} still queued")
    return run


def raw_once(config: dict[str, object], encoded: Encoded, *, warm_up: bool = True) -> Run:
    """One raw run: the pre-encoded messages through ``produce_all``.

    With ``warm_up`` the first message is sent once more before the clock starts (the log then holds it twice)."""
    first = (encoded.topics[0], encoded.keys[0], encoded.values[0])
    return produce_all(config, zip(encoded.topics, encoded.keys, encoded.values, strict=True), len(encoded),
                       warm_up=first if warm_up else None, what="raw")


def loop_once(config: dict[str, object], events: list[Envelope], prefix: str) -> Run:
    """One hand-written publisher of typed events: the baseline's ``produce_all``, fed by a generator that does per
    event what any publisher of typed events must and no more: ``encode_event``, ``event_key`` and the topic of its
    type (looked up once per type). The first event is sent once more as the warm-up, as the other two sides do.
    """
    names = TopicNames(prefix)
    topic_of: dict[str, str] = {}

    def encoded(event: Envelope) -> Message:
        event_type = event.event_type  # type: ignore[attr-defined]
        topic = topic_of.get(event_type)
        if topic is None:
            topic = topic_of[event_type] = names.for_event_type(event_type)
        return topic, event_key(event), encode_event(event)

    return produce_all(config, map(encoded, events), len(events), warm_up=encoded(events[0]),
                       what="encode-and-produce")


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
    """A full-size warm-up of each side, then ``repeats`` pairs of SDK and raw runs over the same events, in
    alternating order (``sdk_goes_first``), each pair followed by a run of the encode-and-produce loop; last,
    outside the row, one burst run of the SDK (``burst_once``)."""
    config, spool = effective_config(settings)
    prefix = settings.topic_prefix
    sdk_once(settings, events)
    raw_once(config, encoded)
    loop_once(config, events, prefix)
    runs: dict[str, list[Run]] = {"SDK": [], "raw": [], "loop": []}
    for i in range(repeats):
        if sdk_goes_first(i):
            runs["SDK"].append(sdk_once(settings, events))
            runs["raw"].append(raw_once(config, encoded))
        else:
            runs["raw"].append(raw_once(config, encoded))
            runs["SDK"].append(sdk_once(settings, events))
        runs["loop"].append(loop_once(config, events, prefix))
        first = "SDK first" if sdk_goes_first(i) else "raw first"
        sdk, raw, loop = runs["SDK"][-1], runs["raw"][-1], runs["loop"][-1]
        log(f"  run {i + 1} ({first}): SDK {sdk.rate:,.0f} events/s, raw {raw.rate:,.0f} events/s, "
            f"then encode-and-produce loop {loop.rate:,.0f} events/s; CPU per event (sending thread / process) "
            f"{sdk.thread_us:.1f} / {sdk.process_us:.1f}, {raw.thread_us:.1f} / {raw.process_us:.1f}, "
            f"{loop.thread_us:.1f} / {loop.process_us:.1f} us")
    burst = burst_once(settings, events)
    log(f"  burst: SDK {burst.run.rate:,.0f} events/s over {burst.events:,} events sent in one go, "
        f"{burst.spooled:,} spooled")
    return PublishResult(len(events), runs, config, spool, burst)
