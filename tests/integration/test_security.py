"""Security of the read path and of filters: loopback only, reads only, parameters bound, secrets hidden."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from infra.clickhouse.reader import QueryRejected
from producers.kafka import EventProducer
from rollout.settings import Settings
from tests.support.events import queued
from tests.support.worker import WorkerProcess, settings_env

pytestmark = pytest.mark.integration

NOT_READS = [
    "INSERT INTO events_raw (event_id) VALUES (generateUUIDv4())",
    "ALTER TABLE events_raw DELETE WHERE 1 SETTINGS mutations_sync = 1",
    "DROP TABLE events_raw",
    "CREATE TABLE evil (x UInt8) ENGINE = Memory",
    "TRUNCATE TABLE events_raw",
    "SELECT 1; DROP TABLE events_raw",
    "SELECT count() FROM events_raw; INSERT INTO events_raw (event_id) VALUES (generateUUIDv4())",
    "SET readonly = 0",
    "SELECT 1 SETTINGS readonly = 0",
    "SELECT * FROM file('/etc/passwd', 'LineAsString')",
    "SELECT * FROM url('http://127.0.0.1:1/', 'LineAsString')",
    "SYSTEM STOP MERGES",
]


@pytest.fixture
def stocked(stack_settings: Settings, worker: WorkerProcess) -> WorkerProcess:
    with EventProducer.from_settings(stack_settings) as producer:
        for i in range(50):
            producer.send(queued(i))
    worker.wait_consumed(50)
    return worker


@pytest.mark.parametrize("statement", NOT_READS)
def test_the_read_path_refuses_anything_but_reads(stocked: WorkerProcess, statement: str) -> None:
    with pytest.raises(QueryRejected):
        stocked.query(statement)
    assert stocked.scalar("SELECT count() FROM events_raw") == 50


def test_the_read_path_listens_on_loopback_only(stocked: WorkerProcess) -> None:
    port = stocked.settings.worker_web_port
    listening = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, local_port = local.rsplit(":", 1)
            if state == "0A" and int(local_port, 16) == port:  # 0A = LISTEN
                listening.append(address)
    assert listening, "the worker's port is not listening"
    assert set(listening) <= {"0100007F", "00000000000000000000000001000000"}, listening  # 127.0.0.1 / ::1


@pytest.mark.parametrize("hostile", ["run-test' OR 1=1 --", "'; DROP TABLE events_raw; --", "\\' OR ''='",
                                     "run-test\n; SELECT 1", "{run:String}", "ＲＵＮ—テスト"])
def test_cli_filters_are_bound_never_pasted(stocked: WorkerProcess, hostile: str) -> None:
    env = {**settings_env(stocked.settings), "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-m", "rollout.cli", "sql", "--format", "csv", "-p", f"run={hostile}",
         "SELECT count() AS n FROM events_raw WHERE run_id = {run:String}"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["n", "0"]
    assert stocked.scalar("SELECT count() FROM events_raw") == 50


def test_secrets_are_never_printed(tmp_path: object) -> None:
    secret = "s3cr3t-Pa55word"
    env = {"KAFKA_SASL_PASSWORD": secret, "KAFKA_SASL_USERNAME": "svc", "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
           "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1",
           "CLICKHOUSE_URL": f"http://reader:{secret}@127.0.0.1:1", "PATH": "/usr/bin:/bin"}
    for args in (["--help"], ["sql", "--help"], ["infra", "status", "--timeout", "2"],
                 ["sql", "SELECT 1"]):
        result = subprocess.run([sys.executable, "-m", "rollout.cli", *args], capture_output=True, text=True,
                                env=env, timeout=120)
        assert secret not in result.stdout + result.stderr, args
        assert "Traceback" not in result.stderr, (args, result.stderr[-2000:])
    settings = Settings(kafka_sasl_password=secret, clickhouse_url_setting=f"http://u:{secret}@h:8123")
    assert secret not in repr(settings) and secret not in str(settings.describe())
