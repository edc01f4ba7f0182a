"""Freshness: from an event's occurrence to the metric row that counts it being visible in ClickHouse.

A fresh worker consumes while the SDK publishes at a steady rate, every event stamped with the wall
clock as it is sent (the scenario's events in their order, so each trajectory's events stay in
order). A poller reads ``v_effective_throughput`` (the newest row of each window of
``m_window_metrics``) through the worker every ``poll_interval`` seconds. The k-th finish of a window (by
event time) is visible at the first poll whose ``finished`` count for that window reaches k; its
latency is that poll's return time minus its occurrence. Finishes of the warm-up seconds are left
out; finishes still not visible when the measurement stops count as never visible (infinite).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.measure import INF, percentile, visibility_latencies
from bench.stack import Worker, deliver_all, stack_settings
from producers.kafka import EventProducer
from schemas import Envelope

FINISHED = "sandbox.rollout_finished"


@dataclass
class FreshnessResult:
    """Latencies of the measured finishes and what the publisher and the worker achieved."""

    rate: float
    seconds: float
    published: int
    achieved_rate: float
    latencies: list[float]
    warmup_s: float
    drain_limit_s: float
    poll_interval_s: float
    polls: int
    consumed_samples: list[tuple[float, int]] = field(default_factory=list)

    @property
    def measured(self) -> int:
        """Finishes measured (after the warm-up)."""
        return len(self.latencies)

    @property
    def never_visible(self) -> int:
        """Finishes not visible when the measurement stopped."""
        return sum(1 for v in self.latencies if v == INF)

    def p(self, q: float) -> float:
        """The q-th percentile latency in seconds (inf when it falls on never-visible finishes)."""
        return percentile(self.latencies, q)

    @property
    def worker_rate(self) -> float:
        """Events/s the worker stored while publishing went on, after the warm-up (from its consumed count).

        The first seconds are left out like the latencies are: the worker stores its first events about one
        latency after publishing starts, and counting that flat start took ~5% off a 15 s run's rate.
        """
        inside = [(t, n) for t, n in self.consumed_samples if self.warmup_s <= t <= self.seconds]
        if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
            return 0.0
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


class _Poller(threading.Thread):
    def __init__(self, worker: Worker, run_id: str, interval: float, began: float) -> None:
        super().__init__(daemon=True, name="freshness-poller")
        self.worker = worker
        self.run_id = run_id
        self.interval = interval
        self.polls: list[tuple[float, dict[tuple[str, int], int]]] = []
        self.consumed: list[tuple[float, int]] = []
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.began = began

    def run(self) -> None:
        sql = ("SELECT domain, toUnixTimestamp(window_start), finished FROM v_effective_throughput "
               "WHERE run_id = {run:String}")
        try:
            while not self.stop_event.is_set():
                issued = time.monotonic()
                rows = self.worker.query(sql, {"run": self.run_id}).rows
                self.polls.append((time.time(), {(str(d), int(w)): int(f) for d, w, f in rows}))
                self.consumed.append((time.monotonic() - self.began, int(self.worker.stats()["consumed"])))
                self.stop_event.wait(max(0.0, self.interval - (time.monotonic() - issued)))
        except BaseException as exc:  # reported by the caller
            self.error = exc


def run_freshness(bootstrap: str, work: Path, events: list[Envelope], warmup_events: list[Envelope], *,
                  rate: float, seconds: float, warmup_s: float, drain_s: float, poll_interval: float,
                  batch_size: int, window_s: int = 60, tag: str = "fresh", log: Any = print) -> FreshnessResult:
    """Publish ``rate * seconds`` of ``events`` at a steady pace with wall-clock times and measure visibility."""
    settings = stack_settings(bootstrap, work / tag, tag, batch_size=batch_size)
    worker = Worker(settings, work / f"{tag}.log").start()
    try:
        with EventProducer.from_settings(settings) as producer:
            # Warm-up: the group has joined and the engine answered once before the clock starts.
            now = datetime.now(UTC)
            for event in warmup_events:
                producer.send(event.model_copy(update={"occurred_at": now}))
            producer.flush(60)
            worker.watch(len(warmup_events), timeout=300)
            run_id = events[0].run_id
            finishes: list[tuple[tuple[str, int], float]] = []
            count = int(rate * seconds)
            began = time.monotonic()
            began_epoch = time.time()
            poller = _Poller(worker, run_id, poll_interval, began)
            poller.start()
            sent = 0
            while sent < count:
                due = int((time.monotonic() - began) * rate) + 1
                while sent < min(due, count):
                    stamp = datetime.now(UTC)
                    event = events[sent].model_copy(update={"occurred_at": stamp})
                    producer.send(event)
                    if event.event_type == FINISHED:  # type: ignore[attr-defined]
                        epoch = stamp.timestamp()
                        window = int(epoch // window_s * window_s)
                        finishes.append(((str(event.domain), window), epoch))  # type: ignore[attr-defined]
                    sent += 1
                producer.poll(0)
                time.sleep(0.002)
            deliver_all(producer, 60)
            elapsed = time.monotonic() - began
        log(f"  published {sent:,} events in {elapsed:.1f}s ({sent / elapsed:,.0f} events/s); waiting for the "
            f"worker (at most {drain_s:.0f}s)")
        deadline = time.monotonic() + drain_s
        expected: dict[tuple[str, int], int] = {}
        for key, _ in finishes:
            expected[key] = expected.get(key, 0) + 1
        while time.monotonic() < deadline:
            if poller.error is not None:
                raise RuntimeError(f"polling failed: {poller.error}")
            if poller.polls and all(poller.polls[-1][1].get(k, 0) >= n for k, n in expected.items()):
                break
            time.sleep(poll_interval)
        poller.stop_event.set()
        poller.join(60)
        all_latencies = visibility_latencies(finishes, poller.polls)
        measured = [lat for (_, occurred), lat in zip(finishes, all_latencies, strict=True)
                    if occurred - began_epoch >= warmup_s]
        return FreshnessResult(
            rate=rate, seconds=elapsed, published=sent, achieved_rate=sent / elapsed, latencies=measured,
            warmup_s=warmup_s, drain_limit_s=drain_s, poll_interval_s=poll_interval, polls=len(poller.polls),
            consumed_samples=poller.consumed,
        )
    finally:
        worker.stop()
