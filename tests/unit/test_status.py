"""``rollout status``: the worker's state judged from its /stats totals, the lines printed, the exit status."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from typer.testing import CliRunner

from rollout.cli import _register, app
from rollout.commands.status import fetch_stats, health, summary, watch_line
from rollout.errors import ServiceUnavailable
from streams.progress import Sample
from tests.support.worker import free_port

NOW = 1_800_000_000.0


def _stats(**changes: Any) -> dict[str, Any]:
    stats: dict[str, Any] = {
        "consumed": 3500, "stored": 3000, "duplicates": 500, "dead_lettered": 0, "trajectories": 3000,
        "windows": 12, "alerts_fired": 1, "batches": 4, "last_batch_at": NOW - 5, "started_at": NOW - 125,
        "read_back": {"events": 0, "records": 7}, "held": 0, "paused_partitions": 0, "behind": 0,
    }
    return {**stats, **changes}


def test_a_worker_with_nothing_waiting_is_caught_up() -> None:
    judged = health(_stats(), NOW)
    assert (judged.state, judged.exit_code) == ("caught up", 0)
    assert "last batch stored 5 s ago" in judged.detail


def test_a_worker_with_messages_waiting_and_recent_batches_is_catching_up() -> None:
    judged = health(_stats(behind=12_345), NOW)
    assert (judged.state, judged.exit_code) == ("catching up", 0)
    assert "12,345 message(s)" in judged.detail


def test_messages_waiting_with_no_batch_for_a_minute_is_stalled() -> None:
    judged = health(_stats(behind=10, last_batch_at=NOW - 61), NOW)
    assert (judged.state, judged.exit_code) == ("stalled", 2)
    assert "nothing was stored for 1 min 01 s since its last batch" in judged.detail
    # The same quiet minute with nothing waiting is an idle worker, not a stalled one.
    assert health(_stats(behind=0, last_batch_at=NOW - 600), NOW).state == "caught up"


def test_a_worker_that_never_stored_counts_from_its_start() -> None:
    assert health(_stats(behind=10, last_batch_at=0.0, started_at=NOW - 30), NOW).state == "catching up"
    judged = health(_stats(behind=10, last_batch_at=0.0, started_at=NOW - 90), NOW)
    assert judged.state == "stalled"
    assert "since it started" in judged.detail


def test_an_unknown_backlog_is_said_so_and_never_called_stalled() -> None:
    judged = health(_stats(behind=None, last_batch_at=NOW - 3600), NOW)
    assert (judged.state, judged.exit_code) == ("running", 0)
    assert "unknown" in judged.detail


def test_summary_gives_the_totals_and_only_what_is_not_zero() -> None:
    lines = summary(_stats(held=2_000, paused_partitions=1), NOW, "http://127.0.0.1:1/stats")
    assert lines[0] == "worker at http://127.0.0.1:1/stats: caught up, up 2 min 05 s"
    text = "\n".join(lines)
    assert "consumed 3,500 messages in 4 batches: stored 3,000 events, ignored 500 duplicates" in text
    assert "held back by the event-time merge: 2,000 messages, 1 partition(s) paused" in text
    assert "read back from ClickHouse (not in its caches): 7 records" in text
    plain = "\n".join(summary(_stats(read_back={"events": 0}), NOW, "u"))
    assert "held back" not in plain and "read back" not in plain


def test_watch_lines_give_rates_and_time_left_from_two_samples() -> None:
    first = Sample(at=100.0, stored=10_000, behind=50_000)
    assert watch_line(None, first, _stats(behind=50_000), NOW).endswith("consumed 10,000  behind 50,000")
    second = Sample(at=105.0, stored=60_000, behind=25_000)
    line = watch_line(first, second, _stats(behind=25_000), NOW)
    assert "catching up" in line
    assert "(10,000/s stored, backlog shrinking 5,000/s: about 5 s left)" in line
    growing = watch_line(second, Sample(at=110.0, stored=60_000, behind=30_000), _stats(behind=30_000), NOW)
    assert growing.endswith("(0/s stored, backlog not shrinking)")
    unknown = watch_line(first, Sample(at=105.0, stored=60_000, behind=None), _stats(behind=None), NOW)
    assert "behind unknown" in unknown and unknown.endswith("(10,000/s stored)")


@pytest.fixture
def serving() -> Iterator[tuple[int, dict[str, Any]]]:
    """A loopback HTTP server answering /stats with whatever the test puts in the dict's ``body``."""
    answer: dict[str, Any] = {"body": b"{}"}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = answer["body"]
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], answer
    finally:
        server.shutdown()
        server.server_close()


def test_no_worker_on_the_port_says_what_to_start() -> None:
    with pytest.raises(ServiceUnavailable, match="start one with `rollout worker`"):
        fetch_stats(free_port(), timeout=1.0)


def test_something_else_on_the_port_is_not_taken_for_a_worker(serving: tuple[int, dict[str, Any]]) -> None:
    port, answer = serving
    answer["body"] = b"<html>hello</html>"
    with pytest.raises(ServiceUnavailable, match="did not answer with the worker's totals"):
        fetch_stats(port)
    answer["body"] = b'{"status": "ok"}'
    with pytest.raises(ServiceUnavailable, match="did not answer with the worker's totals"):
        fetch_stats(port)


@pytest.mark.parametrize(("changes", "code", "state"), [
    ({}, 0, "caught up"),
    ({"behind": 4_000, "last_batch_at": 0.0, "started_at": 1.0}, 2, "stalled"),
])
def test_the_command_prints_the_state_and_exits_by_it(serving: tuple[int, dict[str, Any]],
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      changes: dict[str, Any], code: int, state: str) -> None:
    port, answer = serving
    answer["body"] = json.dumps({**_stats(last_batch_at=time.time(), started_at=time.time() - 10),
                                 **changes}).encode()
    monkeypatch.setenv("ROLLOUT_WORKER_WEB_PORT", str(port))
    _register()
    result = CliRunner().invoke(app, ["status"])
    assert result.exit_code == code, result.output
    assert f"worker at http://127.0.0.1:{port}/stats: {state}" in result.output
    as_json = CliRunner().invoke(app, ["status", "--json"])
    assert json.loads(as_json.output)["consumed"] == 3500


def test_bad_options_get_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    _register()
    result = CliRunner().invoke(app, ["status", "--json", "--watch", "2"])
    assert result.exit_code == 1
    assert "--json prints one reading" in result.output
    assert CliRunner().invoke(app, ["status", "--watch", "0"]).exit_code == 2
