"""Hand a catching-up worker its raw partitions in about the order they happened (direct ingestion).

A worker that reads a backlog (a replay, or a restart after downtime) gets the same number of bytes
from every partition per fetch, but the raw topics do not carry the same number of bytes per hour
of event time: the sandbox topic has about three events per trajectory, the verifier topic one and
the policy topic (training batches) a few per hour. Read at the same byte rate, a whole policy
partition arrives with the first fetch and the verifier partitions run hours ahead of the sandbox
ones, so the derivation sees consumptions and verdicts of trajectories it will only see run much
later. By the time their sandbox events arrive the owner's cache has let them go, and they are read
back from ClickHouse; metrics and regression checks of the partly read log see states a live worker
never sees.

The merge holds back messages that are more than ``slack_s`` of event time ahead of every other
partition that may still deliver earlier events, and releases them as those catch up, always in
each partition's own order (so committing the released messages' offsets never skips a held one),
the partition furthest behind first. A partition that has delivered nothing for ``idle_s``, holds
nothing and has no backlog at the broker (caught up with its producers, or unreachable) holds
nobody back (one with a backlog is only between fetches: treating it as idle let the others run
hours ahead in a 2,000,000-event replay, and 12,084 events were read back; none since), and no message is
held longer than ``max_hold_s`` (a partition far behind, such as a producer resending what it
spooled during an outage, or an event stamped in the future, delays the others by at most that),
except while the partition it waits for

- holds messages here already: they go first, and the wait is the worker's own pace, not a silent
  partition. In a replay every message waits longer than ``max_hold_s`` for its turn; timing out
  there released 188,070 of a 300,000-event log's messages hours ahead of the partition behind, and
  the owner read 120,626 trajectory records and 79,778 events back from ClickHouse (none with this
  rule, and the replay ran 5,735 -> 7,888 events/s);
- or still has a backlog at the broker: it is being read and will get there, and a replay must not
  release the policy topic's days of training batches after ten seconds (measured on a
  10,000,000-event log: one batch then named two million trajectories the worker had not read yet,
  and the derivation stalled for minutes loading them).

Partitions holding more than ``hold_limit`` messages are paused at the consumer (and resumed below
half of it), so memory stays bounded. Every message is released eventually; the results are the
same in any order, only the work and the intermediate states differ.

Event time is the event's ``occurred_at``, read from the message without decoding it; a message
where it cannot be found is released as soon as the messages before it in its partition are.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Generic, TypeVar

Partition = tuple[str, int]
M = TypeVar("M")

_FIELD = b'"occurred_at":"'
_MAX_VALUE_LENGTH = 40


def event_time(value: bytes | None) -> float | None:
    """The ``occurred_at`` of a JSON event as epoch seconds, or None when it is not found or not a time."""
    if not value:
        return None
    at = value.find(_FIELD)
    if at < 0:
        return None
    start = at + len(_FIELD)
    end = value.find(b'"', start, start + _MAX_VALUE_LENGTH)
    if end < 0:
        return None
    try:
        when = datetime.fromisoformat(value[start:end].decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return when.timestamp()


@dataclass(slots=True)
class _Queue(Generic[M]):
    held: deque[tuple[float | None, float, M]] = field(default_factory=deque)
    """(event time, when it was read, message) in the partition's order."""
    latest: float | None = None
    """Largest event time read from the partition (None: none yet)."""
    active_at: float = float("-inf")
    """When (monotonic) the partition last delivered a message (or was assigned)."""
    delivered: bool = False
    """Whether it delivered any message yet."""


class EventTimeMerge(Generic[M]):
    """Per-partition queues released in event-time order; pure logic (the clock is injectable)."""

    def __init__(self, *, slack_s: float, idle_s: float = 2.0, max_hold_s: float = 10.0, hold_limit: int = 5_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.slack_s = slack_s
        self.idle_s = idle_s
        self.max_hold_s = max_hold_s
        self.hold_limit = hold_limit
        self._clock = clock
        self._queues: dict[Partition, _Queue[M]] = {}
        self.paused: set[Partition] = set()
        self.backlogged: frozenset[Partition] = frozenset()
        """Partitions with a backlog at the broker (set by the reader): waiting for them has no time limit."""

    @property
    def held(self) -> int:
        """Messages read and not released yet."""
        return sum(len(q.held) for q in self._queues.values())

    def revoked(self, partitions: Iterable[Partition]) -> None:
        """Partitions taken away: their held messages are dropped (uncommitted, their next reader reads them)."""
        for p in partitions:
            self._queues.pop(p, None)
            self.paused.discard(p)

    def expect(self, partitions: Iterable[Partition]) -> None:
        """Partitions just assigned: until one delivers or stays silent for ``idle_s``, it holds everyone.

        Without this, a partition whose first fetch comes back first (the small policy topic, read to
        its end at once) would be released whole before the others were known to exist.
        """
        now = self._clock()
        for p in partitions:
            if p not in self._queues:
                self._queues[p] = _Queue(active_at=now)

    def add(self, partition: Partition, when: float | None, message: M) -> None:
        """A message read from ``partition`` (in the partition's order) with event time ``when``."""
        queue = self._queues.get(partition)
        if queue is None:
            queue = self._queues[partition] = _Queue()
        now = self._clock()
        queue.active_at = now
        queue.delivered = True
        if when is not None and (queue.latest is None or when > queue.latest):
            queue.latest = when
        queue.held.append((when, now, message))

    def _positions(self) -> dict[Partition, float]:
        """Event time up to which each partition that may still deliver earlier events has got."""
        now = self._clock()
        positions: dict[Partition, float] = {}
        for p, queue in self._queues.items():
            if queue.held:
                position = next((w for w, _, _ in queue.held if w is not None), queue.latest)
            elif now - queue.active_at <= self.idle_s or p in self.backlogged:
                # Expected but silent so far, or silent for a moment while the broker still has a backlog
                # of it (being read, it will deliver): it may deliver anything, so it holds everyone back.
                position = queue.latest if queue.latest is not None or queue.delivered else float("-inf")
            else:
                continue  # idle and empty: holds nobody back
            if position is not None:
                positions[p] = position
        return positions

    def release(self, limit: int) -> list[M]:
        """Up to ``limit`` messages that may go now, each partition's in its order.

        A message may go when it is at most ``slack_s`` ahead of every *other* partition's position,
        or was read ``max_hold_s`` ago while the partition furthest behind neither is ``backlogged``
        nor holds messages here (its own partition's order is kept by its queue). Partitions go
        lowest position first.
        """
        out: list[M] = []
        expired = self._clock() - self.max_hold_s
        # Releasing a partition's head moves its position, which may free the others: repeat until
        # nothing moves (or the limit is reached), so one call releases all that may go now.
        while len(out) < limit:
            before = len(out)
            positions = self._positions() if self.slack_s > 0 else {}
            ranked = sorted(positions.items(), key=lambda kv: kv[1])
            lowest = ranked[:2]
            # No time limit while the partition waited for is still being read, or holds messages
            # here already (they go first; the wait is this worker's own pace, not a silent partition).
            # Decided once per pass, like the positions it goes with.
            waiting = {q: q in self.backlogged or bool(self._queues[q].held) for q, _ in lowest}
            # Lowest first: when the limit cuts a release short, what is furthest behind has gone.
            order = [p for p, _ in ranked] + [p for p in self._queues if p not in positions]
            for p in order:
                queue = self._queues[p]
                others = [(q, t) for q, t in lowest if q != p]
                bound = others[0][1] + self.slack_s if others else None
                patient = bool(others) and waiting[others[0][0]]
                held = queue.held
                while held and len(out) < limit:
                    when, read_at, _ = held[0]
                    if bound is not None and when is not None and when > bound and (patient or read_at > expired):
                        break
                    out.append(held.popleft()[2])
            if len(out) == before:
                break
        return out

    def flow(self) -> tuple[list[Partition], list[Partition]]:
        """(to pause, to resume) at the consumer, by how much each partition holds."""
        pause: list[Partition] = []
        resume: list[Partition] = []
        for p, queue in self._queues.items():
            if p not in self.paused and len(queue.held) > self.hold_limit:
                pause.append(p)
            elif p in self.paused and len(queue.held) <= self.hold_limit // 2:
                resume.append(p)
        self.paused.update(pause)
        self.paused.difference_update(resume)
        return sorted(pause), sorted(resume)
