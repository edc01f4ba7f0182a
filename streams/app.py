"""The Faust app: validate raw events, dead-letter the bad ones, store the good ones in ClickHouse.

Agents are thin: they batch (``take_events``), call the pure core (``streams.records``) and the
sink, and only let Faust ack a batch after ClickHouse holds it. Offsets are therefore committed
only for written data; a crash re-delivers at most the uncommitted tail, which the sink's
idempotent write turns into no new rows.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import faust
import orjson
from faust.web import Request, Response, View

from infra.clickhouse.reader import QueryRejected, live_owner, owner_file
from rollout.errors import RolloutError
from rollout.settings import Settings
from schemas import TopicNames
from schemas.topics import DEADLETTER_MAX_BYTES
from streams.derive import DeriveConfig, Deriver, DeriveResult, alert_message, record_message, store_and_derive
from streams.direct import DirectIngest
from streams.faults import fault_file
from streams.forward import FORWARD_MAX_BODY, ForwardFailed, RawMessage, decode_forwarded, forward_all
from streams.memory import HeapTrimmer, LibraryPager
from streams.owner import ClickHouseOwner
from streams.progress import CatchUpProgress
from streams.publish import DerivedPublisher
from streams.records import Accepted, DeadLetter, SourceRef, classify
from streams.regression import RegressionConfig
from streams.sink_clickhouse import ClickHouseSink, InsertGate, WriteResult, retry_until_done
from streams.state import CacheLimits, OwnerState
from streams.trajectory import AssemblyConfig

log = logging.getLogger("rollout.worker")


@dataclass
class SinkStats:
    """Running totals of the sink, served on /stats."""

    consumed: int = 0
    stored: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    trajectories: int = 0
    windows: int = 0
    alerts_fired: int = 0
    batches: int = 0
    last_batch_at: float = 0.0
    started_at: float = field(default_factory=time.time)
    read_back: dict[str, int] = field(default_factory=dict)
    """Rows the owner read back from ClickHouse by kind (what its caches did not hold), this process."""
    held: int = 0
    """Direct ingestion: messages read and held back by the event-time merge (not stored yet)."""
    paused_partitions: int = 0
    """Direct ingestion: partitions paused at the consumer because the merge holds too many of theirs."""
    behind: int | None = None
    """Direct ingestion: messages of this worker's partitions not stored yet (not read, held, or being stored),
    after the last read; None until every partition's end is known and with the Faust agent (``streams.direct``)."""
    lookups_skipped: int = 0
    """Trajectories whose stored events the owner did not read, as they certainly had none (new ones of a
    run whose stored trajectories the owner knows; embedded ClickHouse only)."""
    lookup_filter_restarts: int = 0
    """How often the owner's filter of looked-up trajectories filled up and started over (each run is then
    begun again from its stored trajectory ids, or read in full if they are too many)."""

    def merge(self, held: int, paused: int, behind: int | None) -> None:
        """What the event-time merge holds after a read, and how far behind the worker is (from the consumer's
        thread)."""
        self.held = held
        self.paused_partitions = paused
        self.behind = behind

    def add(self, consumed: int, result: WriteResult) -> None:
        """Count one batch this worker consumed and saw stored (here or by the owning worker)."""
        self.consumed += consumed
        self.stored += result.stored
        self.duplicates += result.duplicates
        self.dead_lettered += result.dead_lettered
        self.batches += 1
        self.last_batch_at = time.time()

    def derived(self, derived: DeriveResult) -> None:
        """Count what a derivation run in this process changed."""
        self.trajectories += len(derived.records)
        self.windows += derived.windows
        self.alerts_fired += len(derived.fired)


def faust_broker_url(bootstrap_servers: str) -> str:
    """Faust's broker URL for a comma-separated bootstrap list."""
    return ";".join(f"kafka://{h.strip()}" for h in bootstrap_servers.split(",") if h.strip())


def faust_credentials(settings: Settings) -> Any:
    """Faust/aiokafka credentials for the configured security protocol (None for PLAINTEXT)."""
    import ssl

    protocol = settings.kafka_security_protocol
    if protocol == "PLAINTEXT":
        return None
    context = ssl.create_default_context(cafile=str(settings.kafka_ssl_cafile) if settings.kafka_ssl_cafile else None)
    if protocol == "SSL":
        return faust.SSLCredentials(context)
    password = settings.kafka_sasl_password.get_secret_value() if settings.kafka_sasl_password else ""
    mechanism = settings.kafka_sasl_mechanism or "PLAIN"
    ssl_context = context if protocol == "SASL_SSL" else None
    if mechanism == "PLAIN":
        return faust.SASLCredentials(username=settings.kafka_sasl_username, password=password,
                                     mechanism="PLAIN", ssl_context=ssl_context)
    return faust.SASLCredentials(username=settings.kafka_sasl_username, password=password,
                                 mechanism=mechanism, ssl_context=ssl_context)


def derive_config(settings: Settings) -> DeriveConfig:
    """The metric knobs from settings."""
    return DeriveConfig(
        window_s=settings.metrics_window_seconds,
        assembly=AssemblyConfig(verdict_timeout_s=settings.verdict_timeout_seconds),
        regression=RegressionConfig(min_decided=settings.regression_min_decided,
                                    min_drop=settings.regression_min_drop, alpha=settings.regression_alpha),
        default_staleness_bound=settings.default_staleness_bound,
    )


def create_app(settings: Settings) -> faust.App:
    """Build the worker's Faust app from settings (nothing connects until the worker starts)."""
    topics = TopicNames(settings.topic_prefix)
    max_future = timedelta(seconds=settings.max_future_seconds)
    app = faust.App(
        # With direct ingestion the raw topics' group belongs to the librdkafka consumer; the Faust app
        # (which then consumes nothing) gets an id of its own so the two never meet in one group.
        settings.consumer_group if settings.ingest == "faust" else f"{settings.consumer_group}-app",
        broker=faust_broker_url(settings.kafka_bootstrap_servers),
        broker_credentials=faust_credentials(settings),
        store="memory://",
        datadir=str(settings.data_dir / "faust"),
        topic_partitions=settings.topic_partitions,
        topic_allow_declare=False,
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=1.0,
        # A crashed worker's partitions move to the others after the session timeout; faust's
        # default (60 s) would stall recovery for a minute.
        broker_session_timeout=10.0,
        broker_heartbeat_interval=3.0,
        producer_acks=-1,
        web_enabled=True,
        web_bind="127.0.0.1",
        web_host="127.0.0.1",
        web_port=settings.worker_web_port,
        web_in_thread=False,
        # A dead letter carries its raw message in base64: up to DEADLETTER_MAX_BYTES.
        producer_max_request_size=DEADLETTER_MAX_BYTES + 65536,
        # Forwarded batches (streams.forward) are larger than aiohttp's 1 MiB default body.
        web_application_options={"client_max_size": FORWARD_MAX_BODY},
    )
    owner = ClickHouseOwner(
        url=settings.clickhouse_url,
        database=settings.clickhouse_database,
        fault_file=fault_file(settings.data_dir) if settings.fault_injection else None,
    )
    client: Any = _LazyClient(owner)
    # The derivation and the owner's cache call ClickHouse only once a batch's raw events are stored.
    gate = InsertGate(client)
    config = derive_config(settings)
    # One writer (the embedded engine's owner) may keep what it wrote in memory; with a server,
    # several workers may write at once, so every batch reads what it needs from ClickHouse.
    state = OwnerState(client=gate, database=settings.clickhouse_database, window_s=config.window_s,
                       default_staleness_bound=config.default_staleness_bound,
                       limits=CacheLimits() if settings.clickhouse_embedded else CacheLimits.disabled())
    sink = ClickHouseSink(client=client, database=settings.clickhouse_database, state=state)
    deriver = Deriver(client=gate, database=settings.clickhouse_database, config=config, state=state)
    stats = SinkStats()
    raw_topic = app.topic(*topics.raw, key_serializer="raw", value_serializer="raw")
    dlq_topic = app.topic(topics.deadletter, key_serializer="raw", value_serializer="raw")
    trimmer = HeapTrimmer()
    pager = LibraryPager(settings.engine_page_out_seconds)
    if settings.engine_page_out_seconds == 0:
        pager.stop()
    publisher = DerivedPublisher(settings.kafka_client_config(), max_request_size=DEADLETTER_MAX_BYTES + 65536)
    # One thread: batches' derived messages go out in batch order, and so are their offsets acked.
    publishing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="derived-publish")

    def persist(accepted: list[Accepted], dead: list[DeadLetter]) -> tuple[WriteResult, DeriveResult]:
        return store_and_derive(sink, deriver, gate, accepted, dead)

    def store(accepted: list[Accepted], dead: list[DeadLetter]) -> tuple[WriteResult, DeriveResult] | None:
        """On the owner thread: store and derive, retried until done (None: stopping first)."""
        # The batches before the previous one are gone by now: give what they freed back to the system.
        trimmer.maybe_trim()
        pager.maybe_page_out()  # and the engine library's pages it does not use, once a minute
        return retry_until_done(lambda: persist(accepted, dead), should_stop=owner.stopping.is_set)

    def publish(derived: DeriveResult) -> bool:
        """On the publishing thread: deliver a stored batch's derived messages (False: stopping first)."""
        # Serialised as they are produced: a batch's encoded messages are never all alive at once in Python.
        messages = itertools.chain(
            ((topics.trajectories, r.trajectory_id.encode(), record_message(r)) for r in derived.records),
            ((topics.alerts, a.alert_id.encode(), alert_message(a, "firing")) for a in derived.fired),
            ((topics.alerts, a.alert_id.encode(), alert_message(a, "resolved")) for a in derived.resolved))
        return publisher.publish(messages, should_stop=owner.stopping.is_set)

    async def process(messages: list[RawMessage], released: Callable[[], None] | None = None) -> WriteResult | None:
        """Validate, dead-letter, store and derive one batch here, in the process that owns ClickHouse.

        The derived messages are delivered on a thread of their own, one batch after the other, while the
        owner thread goes on with the next batch (``released`` is called when it may). Returns once they
        are delivered, or None when stopping before that (nothing may be acked then).
        """
        accepted: list[Accepted] = []
        dead: list[DeadLetter] = []
        now = datetime.now(UTC)  # one clock reading per batch, not per event
        for m in messages:
            item = classify(m.value, m.key, SourceRef(m.topic, m.partition, m.offset), topics, now=now,
                            max_future=max_future)
            (accepted if isinstance(item, Accepted) else dead).append(item)  # type: ignore[arg-type]
        if dead:
            # Sent together and awaited together: one round trip per batch, not per letter.
            letters = [await dlq_topic.send(key=letter.key, value=letter.to_message(),
                                            headers={"reason": letter.reason.encode()}) for letter in dead]
            for letter in dead:
                log.debug("dead-lettered %s:%d@%d: %s (%s)", letter.source.topic, letter.source.partition,
                          letter.source.offset, letter.reason, letter.detail[:200])
            for fut in letters:
                await fut
            reasons = Counter(letter.reason for letter in dead)
            log.warning("dead-lettered %d message(s): %s", len(dead),
                        ", ".join(f"{reason} {n}" for reason, n in reasons.most_common()))
        outcome = await owner.run(lambda _c: store(accepted, dead))
        if released is not None:
            released()
        if outcome is None:
            return None
        written, derived = outcome
        if not await asyncio.get_running_loop().run_in_executor(publishing, publish, derived):
            return None
        for alert in derived.fired:
            log.warning("regression alert: run %s domain %s version %d: pass rate %.3f -> %.3f (p=%.2g)",
                        alert.run_id, alert.domain, alert.policy_version, alert.baseline_pass_rate,
                        alert.candidate_pass_rate, alert.p_value)
        stats.derived(derived)
        stats.read_back = dict(state.loads)
        stats.lookups_skipped = state.lookups_skipped
        stats.lookup_filter_restarts = state.looked_up.rotations
        return written

    async def become_owner() -> bool:
        """Own the embedded ClickHouse if it is free (always true with a server); announce it when won."""
        if owner.owns:
            return True
        if not await owner.run_unowned(owner.try_own):
            return False
        if settings.clickhouse_embedded:
            owner.publish_owner_file(owner_file(settings), f"http://127.0.0.1:{settings.worker_web_port}")
        log.info("this worker owns ClickHouse %s", settings.describe()["clickhouse_url"])
        return True

    async def handle(messages: list[RawMessage], released: Callable[[], None] | None = None) -> WriteResult | None:
        """Store a batch: here when this process owns ClickHouse, else through the owning worker.

        ``released`` (see ``streams.direct.Handle``) is called once the batch no longer holds the owner
        thread here; a forwarded batch does not call it (the caller's own end of the batch stands for it).
        """
        backoff = 0.2
        while not owner.stopping.is_set():
            try:
                owned = await become_owner()
            except RolloutError as exc:
                log.warning("ClickHouse not available (retry in %.1fs): %s", backoff, exc)
                owned = False
            if owned:
                return await process(messages, released)
            target = live_owner(settings)
            if target is not None:
                try:
                    return await forward_all(str(target["url"]), messages)
                except ForwardFailed as exc:
                    log.warning("forwarding to the owning worker failed (retry in %.1fs): %s", backoff, exc)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)
        return None

    if settings.ingest == "direct":
        direct = DirectIngest(settings, handle, on_stored=stats.add, stopping=owner.stopping.is_set,
                              on_read=stats.merge)

        @app.task  # type: ignore[untyped-decorator]
        async def direct_ingest() -> None:
            await direct.run()
    else:
        @app.agent(raw_topic, concurrency=1, name="rollout-sink")
        async def sink_agent(stream: faust.StreamT[bytes]) -> None:
            # take_events is on faust's Stream, not on the StreamT protocol the agent is typed with.
            # Two batches in flight: the next one is validated (on the event loop) while the owner thread
            # stores the previous one. Each batch settles itself (acks, counts) as soon as it is stored.
            previous: asyncio.Future[bool] | None = None
            async for batch in stream.take_events(  # type: ignore[attr-defined]
                    settings.sink_batch_size, within=settings.sink_batch_seconds):
                # Hold a reference on every message: take_events acks the batch in a `finally`, even when
                # the body is cancelled mid-write; the extra reference keeps those offsets uncommitted.
                for event in batch:
                    event.message.incref()
                current = asyncio.ensure_future(store_batch(list(batch)))
                if previous is not None and not await previous:
                    return  # stopping before that batch was stored: leave it (and this one) uncommitted
                previous = current

    async def store_batch(batch: list[Any]) -> bool:
        """Store one batch and ack it; False (nothing acked) when stopping before it was stored."""
        messages = [RawMessage(e.message.topic, e.message.partition, e.message.offset, e.key, e.value) for e in batch]
        written = await handle(messages)
        if written is None:
            return False
        # Drop this batch's extra reference. Whichever of this and take_events' own ack comes last
        # marks the offset safe to commit (a bare decref would leave it unacked forever).
        for event in batch:
            event.ack()
        stats.add(len(batch), written)
        return True

    @app.page("/ingest")
    class IngestView(View):
        """Store a batch forwarded by a worker that does not own the embedded ClickHouse (loopback only)."""

        async def post(self, request: Request) -> Response:
            if not owner.owns:
                return self.bytes(b'{"error": "not the owner"}', content_type="application/json", status=409)
            try:
                messages = decode_forwarded(await request.read())
            except ValueError as exc:
                return self.bytes(orjson.dumps({"error": str(exc)}), content_type="application/json", status=400)
            written = await process(messages)
            if written is None:
                return self.bytes(b'{"error": "stopping"}', content_type="application/json", status=503)
            return self.bytes(orjson.dumps(asdict(written)), content_type="application/json")

    @app.page("/stats")
    class StatsView(View):
        """Sink totals as JSON (for the demo's progress and for operators)."""

        async def get(self, request: Request) -> Response:
            return self.bytes(orjson.dumps(asdict(stats)), content_type="application/json")

    @app.page("/sql")
    class SqlView(View):
        """Read-only SQL on the owned ClickHouse, for processes that cannot open it themselves."""

        async def post(self, request: Request) -> Response:
            if not owner.owns:
                return self.bytes(b'{"error": "this worker does not own ClickHouse; read through the owner"}',
                                  content_type="application/json", status=409)
            try:
                body = await request.json()
                sql = body["query"]
                parameters = body.get("parameters") or {}
                if not isinstance(sql, str) or not isinstance(parameters, dict):
                    raise QueryRejected("expected {\"query\": str, \"parameters\": object}")
                result = await owner.read(sql, parameters)
            except (QueryRejected, KeyError, ValueError) as exc:
                return self.bytes(orjson.dumps({"error": str(exc)}), content_type="application/json", status=400)
            payload = {"columns": result.columns, "types": result.types, "rows": result.rows}
            return self.bytes(orjson.dumps(payload, default=str), content_type="application/json")

    @app.task  # type: ignore[untyped-decorator]
    async def announce() -> None:
        try:
            owned = await become_owner()
        except RolloutError as exc:  # the sink agent keeps trying; a worker never dies of it
            log.warning("ClickHouse not available yet (%s); batches wait for it", exc)
            return
        if not owned:
            log.info("another worker owns the embedded ClickHouse; batches are forwarded to it")

    progress = CatchUpProgress()

    @app.timer(interval=settings.worker_report_seconds)  # type: ignore[untyped-decorator]
    async def report() -> None:
        log.info("sink totals: %s", asdict(stats))
        for line in progress.update(time.monotonic(), stats.consumed, stats.behind):
            log.info("%s", line)

    @app.on_before_shutdown.connect  # type: ignore[arg-type]  # faust's stub expects a sync callback type
    async def _stop_retrying(sender: Any, **_: Any) -> None:
        owner.stopping.set()

    app.rollout_owner = owner  # type: ignore[attr-defined]
    app.rollout_stats = stats  # type: ignore[attr-defined]
    return app


class _LazyClient:
    """Forward attribute access to the owner's client (created on the owner thread at first use)."""

    def __init__(self, owner: ClickHouseOwner) -> None:
        self._owner = owner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._owner.client(), name)
