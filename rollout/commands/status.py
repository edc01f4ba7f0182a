"""``rollout status``: is the worker running, keeping up or stuck? Read from its ``/stats``, said in words."""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from rollout.cli_support import console, fail, load_settings
from rollout.errors import ServiceUnavailable
from streams.progress import Sample, duration, pace

STALL_SECONDS = 60.0
"""A worker with messages waiting that stored no batch for this long is stalled (exit status 2)."""

_HELP_PARAGRAPHS = (
    "Say whether the worker on this machine is running, what it has stored, how far behind its topics it is"
    " and whether it is stuck, from its running totals (http://127.0.0.1:ROLLOUT_WORKER_WEB_PORT/stats, the"
    " port of the settings).",
    "Exit status: 0 when the worker answers and is not stalled; 1 when no worker answers (start one with"
    " `rollout worker`); 2 when it is stalled: messages wait (not read yet, held back or being stored) but"
    f" it stored no batch for {STALL_SECONDS:.0f} s; its log says why (ClickHouse or Kafka away, a failing"
    " write retried). Use it in a health check.",
    "How far behind (`behind`) is known with direct ingestion (ROLLOUT_INGEST=direct, the default) once every"
    " partition of the worker has been fetched from; the Faust agent reports none.",
    "With --watch N it samples every N seconds until interrupted, one line per sample with the rate it"
    " stored at and the rate the backlog shrank at since the previous one, and at that pace the time left.",
    "Examples:",
    "rollout status",
    "rollout status --watch 5",
    "rollout status --json   (the totals as the worker serves them)",
)
HELP = "\n\n".join(_HELP_PARAGRAPHS)


def register(app: typer.Typer) -> None:
    """Add the status command."""
    app.command("status", help=HELP)(status)


@dataclass(frozen=True)
class Health:
    """What the totals say about the worker: ``state`` is ``caught up``, ``catching up``, ``stalled`` or
    ``running`` (how far behind unknown); ``detail`` says it in a sentence."""

    state: str
    detail: str

    @property
    def exit_code(self) -> int:
        return 2 if self.state == "stalled" else 0


def health(stats: dict[str, Any], now: float, stall_after: float = STALL_SECONDS) -> Health:
    """Judge a worker by its ``/stats`` totals at wall-clock time ``now`` (pure)."""
    behind = stats.get("behind")
    last = float(stats.get("last_batch_at") or 0.0)
    since = now - (last if last else float(stats.get("started_at") or now))
    quiet = duration(since)
    what = "no batch stored yet" if not last else f"last batch stored {quiet} ago"
    if behind is None:
        return Health("running", f"how far behind is unknown (the Faust agent reports none; direct ingestion"
                                 f" once it has fetched from every partition); {what}")
    waiting = int(behind)
    if waiting > 0 and since > stall_after:
        started = "since it started" if not last else "since its last batch"
        return Health("stalled", f"{waiting:,} message(s) wait but nothing was stored for {quiet} {started};"
                                 " see the worker's log (ClickHouse or Kafka away, a write being retried)")
    if waiting == 0:
        return Health("caught up", f"every message of its partitions is stored; {what}")
    return Health("catching up", f"{waiting:,} message(s) of its partitions not stored yet; {what}")


def summary(stats: dict[str, Any], now: float, url: str) -> list[str]:
    """The lines ``rollout status`` prints for one reading of the totals (pure)."""
    judged = health(stats, now)
    started = float(stats.get("started_at") or now)
    read_back = {kind: count for kind, count in (stats.get("read_back") or {}).items() if count}
    lines = [
        f"worker at {url}: {judged.state}, up {duration(now - started)}",
        f"  {judged.detail}",
        f"  consumed {stats.get('consumed', 0):,} messages in {stats.get('batches', 0):,} batches: stored"
        f" {stats.get('stored', 0):,} events, ignored {stats.get('duplicates', 0):,} duplicates, dead-lettered"
        f" {stats.get('dead_lettered', 0):,}",
        f"  derived {stats.get('trajectories', 0):,} trajectory versions and {stats.get('windows', 0):,} window"
        f" updates; {stats.get('alerts_fired', 0):,} alert(s) fired",
    ]
    if stats.get("held") or stats.get("paused_partitions"):
        lines.append(f"  held back by the event-time merge: {stats.get('held', 0):,} messages,"
                     f" {stats.get('paused_partitions', 0):,} partition(s) paused")
    if read_back:
        parts = ", ".join(f"{count:,} {kind}" for kind, count in sorted(read_back.items()))
        lines.append(f"  read back from ClickHouse (not in its caches): {parts}")
    return lines


def watch_line(previous: Sample | None, sample: Sample, stats: dict[str, Any], now: float) -> str:
    """One line of ``--watch``: the totals (``sample.stored`` is the worker's ``consumed``: it counts a batch once
    stored), and the rates since the previous sample (pure)."""
    clock = datetime.fromtimestamp(now, UTC).strftime("%H:%M:%S")
    judged = health(stats, now)
    behind = "behind unknown" if sample.behind is None else f"behind {sample.behind:,}"
    line = f"{clock}  {judged.state:<11}  consumed {sample.stored:,}  {behind}"
    moved = None if previous is None else pace(previous, sample)
    if moved is None:
        return line
    line += f"  ({moved.stored_per_s:,.0f}/s stored"
    if moved.shrink_per_s is not None and sample.behind:
        left = moved.left(sample.behind)
        if left is not None:
            line += f", backlog shrinking {moved.shrink_per_s:,.0f}/s: about {duration(left)} left"
        else:
            line += ", backlog not shrinking"
    return line + ")"


def stats_url(port: int) -> str:
    """Where a worker on this machine serves its totals."""
    return f"http://127.0.0.1:{port}/stats"


def fetch_stats(port: int, timeout: float = 3.0) -> dict[str, Any]:
    """The worker's ``/stats``; a clear error when no worker answers on ``port``."""
    url = stats_url(port)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            data: dict[str, Any] = json.loads(response.read())
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ServiceUnavailable(f"no worker answers at {url} ({reason}): start one with `rollout worker`"
                                 " (ROLLOUT_WORKER_WEB_PORT sets the port)") from exc
    except ValueError as exc:
        raise ServiceUnavailable(f"{url} did not answer with the worker's totals ({exc}); is something else"
                                 " listening on ROLLOUT_WORKER_WEB_PORT?") from exc
    if not isinstance(data, dict) or "consumed" not in data:
        raise ServiceUnavailable(f"{url} did not answer with the worker's totals; is something else listening"
                                 " on ROLLOUT_WORKER_WEB_PORT?")
    return data


def _positive_seconds(value: float | None) -> float | None:
    if value is not None and not value > 0:
        raise typer.BadParameter(f"takes a number of seconds above 0, got {value:g}")
    return value


def status(
    as_json: Annotated[bool, typer.Option("--json", help="Print the totals as the worker serves them.")] = False,
    watch: Annotated[float | None, typer.Option(
        "--watch", "-w", metavar="SECONDS", callback=_positive_seconds, show_default=False,
        help="Sample every SECONDS until interrupted, one line each.")] = None,
) -> None:
    """Print the worker's state (the command's help: ``HELP``)."""
    if as_json and watch is not None:
        fail("--json prints one reading; leave out --watch")
    port = load_settings().worker_web_port
    stats = fetch_stats(port)
    if watch is None:
        now = time.time()
        if as_json:
            sys.stdout.write(json.dumps(stats, indent=2) + "\n")
        else:
            for line in summary(stats, now, stats_url(port)):
                console.print(line, highlight=False, soft_wrap=True)
        raise typer.Exit(health(stats, now).exit_code)
    previous: Sample | None = None
    try:
        while True:
            sample = Sample(time.monotonic(), int(stats.get("consumed", 0)), stats.get("behind"))
            console.print(watch_line(previous, sample, stats, time.time()), highlight=False, soft_wrap=True)
            previous = sample
            time.sleep(watch)
            stats = fetch_stats(port)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
