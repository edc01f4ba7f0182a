"""How far behind its topics a worker is, and when it will have caught up: the worker's catch-up lines.

A worker started on a backlog (a new deployment on a long history, a restart after downtime) otherwise
says only what it has stored so far. Direct ingestion knows, after every read, how many messages of its
partitions it has not stored yet (``streams.direct``, ``/stats`` ``behind``); the worker's report timer
hands that figure here with its stored count, and logs the line this returns, if any:

- while ``behind`` is at least ``threshold``: how many messages, the rate they were stored at and the rate
  the backlog shrank at over the last report's span (less than the stored rate while the topics grow),
  and at that pace the time left;
- once it falls below: that the worker caught up, after how long;
- once per catch-up, when the backlog is at least ``hint_at`` messages and would take more than
  ``hint_after_s`` at that pace: that a replay with ``--hand-off`` rebuilds a database faster when the
  backlog is most of the log (docs/architecture.md, *Handing the log back to the worker*).

Pure logic: the caller supplies the clock.
"""

from __future__ import annotations

from dataclasses import dataclass

CATCH_UP_MESSAGES = 10_000
"""A worker this many messages behind is catching up (as ``streams.direct.BACKLOG_MESSAGES`` per partition)."""

HAND_OFF_HINT_MESSAGES = 1_000_000
HAND_OFF_HINT_SECONDS = 300.0


@dataclass(frozen=True, slots=True)
class Sample:
    """One reading of a worker: when (monotonic seconds), messages stored so far, messages behind (None: unknown)."""

    at: float
    stored: int
    behind: int | None


@dataclass(frozen=True, slots=True)
class Pace:
    """What two samples say: span in seconds, messages stored per second, and how fast the backlog shrank
    (None when either sample's ``behind`` is unknown; negative when it grew)."""

    span: float
    stored_per_s: float
    shrink_per_s: float | None

    def left(self, behind: int) -> float | None:
        """Seconds until ``behind`` is gone at this pace (None when it is not shrinking)."""
        return behind / self.shrink_per_s if self.shrink_per_s and self.shrink_per_s > 0 else None


def pace(last: Sample, now: Sample) -> Pace | None:
    """The pace between two samples; None unless ``now`` is later than ``last`` (pure)."""
    span = now.at - last.at
    if span <= 0:
        return None
    shrink = None if last.behind is None or now.behind is None else (last.behind - now.behind) / span
    return Pace(span, max(0, now.stored - last.stored) / span, shrink)


def duration(seconds: float) -> str:
    """``seconds`` for a log line: ``0.5 s``, ``45 s``, ``3 min 20 s``, ``2 h 05 min`` (tenths below 10 s)."""
    if seconds < 9.95:
        tenths = f"{max(0.0, seconds):.1f}"
        return f"{tenths.removesuffix('.0')} s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


class CatchUpProgress:
    """Turns (time, messages stored, messages behind) samples into the worker's catch-up lines."""

    def __init__(self, threshold: int = CATCH_UP_MESSAGES, hint_at: int = HAND_OFF_HINT_MESSAGES,
                 hint_after_s: float = HAND_OFF_HINT_SECONDS) -> None:
        self._threshold = threshold
        self._hint_at = hint_at
        self._hint_after_s = hint_after_s
        self._last: Sample | None = None
        self._since: float | None = None  # when the current catch-up began (None: not catching up)
        self._hinted = False

    def update(self, at: float, stored: int, behind: int | None) -> list[str]:
        """The lines to log for this sample (none while the worker keeps up, or when ``behind`` is unknown)."""
        if behind is None:
            return []
        last, sample = self._last, Sample(at, stored, behind)
        self._last = sample
        if behind < self._threshold:
            if self._since is None:
                return []
            began, self._since = self._since, None
            return [f"caught up: {behind:,} message(s) behind after {duration(at - began)} of catching up"]
        moved = None if last is None else pace(last, sample)
        if self._since is None or moved is None:
            # Begun now: rates come from the next sample (the last one was from before the backlog).
            if self._since is None:
                self._since, self._hinted = at, False
            return [f"catching up: {behind:,} messages behind"]
        if moved.stored_per_s == 0:
            # No pace to tell (a first batch, or a batch longer than a report's span, or one being retried):
            # no time left and no hint either.
            return [f"catching up: {behind:,} messages behind; nothing stored over the last {duration(moved.span)} "
                    "(a batch takes longer than that, or is being retried: the log says why if a write fails)"]
        line = (f"catching up: {behind:,} messages behind; over the last {duration(moved.span)} "
                f"{moved.stored_per_s:,.0f} messages/s stored")
        left = moved.left(behind)
        if left is not None:
            line += f", the backlog shrinking by {moved.shrink_per_s:,.0f}/s: about {duration(left)} to go"
        else:
            line += ", the backlog not shrinking (the topics grow as fast as they are stored, or faster)"
        lines = [line]
        if not self._hinted and behind >= self._hint_at and (left is None or left > self._hint_after_s):
            self._hinted = True
            lines.append("a backlog that is most of the log is rebuilt faster by `rollout replay --hand-off` into a "
                         "database without the log's runs: stop this worker, replay, then start it on that "
                         "database (docs/architecture.md, 'Handing the log back to the worker')")
        return lines
