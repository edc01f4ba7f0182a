"""Nothing lost, nothing counted twice: worker crashes, rebalances and ClickHouse outages, injected for real."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest

from producers.kafka import EventProducer
from producers.scenario import load_scenario
from producers.simulator import generate, publish
from rollout.settings import Settings
from streams.faults import fault_file
from tests.support.play import audit_differences, domain_totals, expected_totals, play, scenario
from tests.support.worker import WorkerProcess, committed_offsets, free_port

pytestmark = pytest.mark.reliability
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _stored(worker: WorkerProcess, run_id: str) -> tuple[int, int]:
    rows = worker.query("SELECT count(), uniqExact(event_id) FROM events_raw WHERE run_id = {run:String}",
                        {"run": run_id}).rows
    return int(rows[0][0]), int(rows[0][1])


def _wait_stored(worker: WorkerProcess, run_id: str, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if _stored(worker, run_id)[0] >= count:
                return
        except Exception:  # the owner may be restarting; the read is retried
            pass
        time.sleep(1.0)
    raise AssertionError(f"{run_id}: fewer than {count} events stored after {timeout}s")


def _distinct_ids(events: list) -> int:  # type: ignore[type-arg]
    return len({e.event_id for e in events})


def _settings_with(settings: Settings, **changes: object) -> Settings:
    return Settings(**{**settings.model_dump(), **changes})


def test_clickhouse_outage_commits_nothing_and_loses_nothing(stack_settings: Settings, tmp_path: Path) -> None:
    settings = _settings_with(stack_settings, fault_injection=True)
    worker = WorkerProcess(settings, tmp_path / "worker.log").start()
    try:
        first = scenario("golden")
        report = play(settings, first)
        worker.wait_consumed(report.published)
        time.sleep(2.5)  # one commit interval: the offsets of stored batches are committed
        committed_before = committed_offsets(settings)
        consumed_before = worker.stats()["consumed"]

        outage = fault_file(settings.data_dir)
        outage.parent.mkdir(parents=True, exist_ok=True)
        outage.touch()
        second = first.with_overrides(run_id="golden-during-outage")
        second_report = play(settings, second)
        held = time.monotonic()
        while time.monotonic() - held < 30:  # the outage lasts 30 s
            assert committed_offsets(settings) == committed_before, "offsets were committed for unwritten data"
            assert worker.stats()["consumed"] == consumed_before
            assert worker.process is not None and worker.process.poll() is None, "the worker died"
            time.sleep(3)
        outage.unlink()

        worker.wait_consumed(consumed_before + second_report.published, timeout=180)
        for run in (first, second):
            assert domain_totals(worker, run.run_id) == expected_totals(run)
            assert audit_differences(worker, settings, run.run_id) == []
        assert _stored(worker, second.run_id) == (len(list(generate(second))),) * 2
        time.sleep(2.5)
        assert committed_offsets(settings) > committed_before
        assert "write failed" in worker.tail(400), "the outage was retried with a logged warning"
    finally:
        worker.stop()


def test_adding_and_removing_worker_processes_changes_no_result(stack_settings: Settings, tmp_path: Path) -> None:
    golden = scenario("golden")
    events = list(generate(golden))
    thirds = [events[: len(events) // 3], events[len(events) // 3: 2 * len(events) // 3],
              events[2 * len(events) // 3:]]

    def another(name: str) -> WorkerProcess:
        return WorkerProcess(_settings_with(stack_settings, worker_web_port=free_port()), tmp_path / f"{name}.log")

    first = WorkerProcess(stack_settings, tmp_path / "a.log").start()
    second = third = None
    try:
        with EventProducer.from_settings(stack_settings) as producer:
            publish(thirds[0], producer)
            second = another("b").start()   # joins the group: partitions rebalance, it forwards to the owner
            publish(thirds[1], producer)
            first.stop()                      # the owner leaves: the other takes the engine over
            third = another("c").start()
            publish(thirds[2], producer)
        reader = third if third is not None else second
        _wait_stored(reader, golden.run_id, _distinct_ids(events), timeout=240)
        time.sleep(3)  # let the last derivations land
        assert _stored(reader, golden.run_id) == (_distinct_ids(events),) * 2
        assert domain_totals(reader, golden.run_id) == expected_totals(golden)
        assert audit_differences(reader, stack_settings, golden.run_id) == []
    finally:
        for process in (third, second, first):
            if process is not None:
                process.stop()


@pytest.mark.timeout(2400)
def test_repeated_sigkill_of_every_worker_process_loses_and_doubles_nothing(stack_settings: Settings,
                                                                           tmp_path: Path) -> None:
    crash = load_scenario(FIXTURES / "scenarios" / "crash.yaml")
    events = list(generate(crash))
    assert len(events) >= 200_000
    base = _settings_with(stack_settings, sink_batch_size=5000, sink_batch_seconds=0.5)
    settings = [base, _settings_with(base, worker_web_port=free_port())]
    workers = [WorkerProcess(s, tmp_path / f"worker-{i}.log") for i, s in enumerate(settings)]
    for w in workers:
        w.start()
    done = threading.Event()
    failure: list[BaseException] = []

    def produce() -> None:
        try:
            with EventProducer.from_settings(stack_settings) as producer:
                publish(events, producer, rate=6000)
        except BaseException as exc:  # reported below
            failure.append(exc)
        finally:
            done.set()

    publisher = threading.Thread(target=produce, daemon=True)
    publisher.start()
    rng = random.Random(20261130)
    kills = 0
    try:
        while kills < 10:
            time.sleep(rng.uniform(2.0, 9.0))
            for w in workers:
                w.kill()
            kills += 1
            for w in workers:
                w.start(timeout=120)
        publisher.join(timeout=600)
        assert done.is_set() and not failure, failure
        _wait_stored(workers[0], crash.run_id, _distinct_ids(events), timeout=1800)
        time.sleep(5)
        assert _stored(workers[0], crash.run_id) == (_distinct_ids(events),) * 2
        assert domain_totals(workers[0], crash.run_id) == expected_totals(crash)
        assert audit_differences(workers[0], stack_settings, crash.run_id) == []
    finally:
        for w in workers:
            w.stop()
    assert kills == 10
