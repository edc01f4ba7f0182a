"""The embedded ClickHouse engine shared by the integration tests of one process."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.clickhouse.client import Client, connect
from infra.clickhouse.migrate import migrate

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def engine() -> Iterator[Client]:
    """One embedded engine per test process (chdb allows one data folder per process)."""
    path = ROOT / ".data" / f"test-chdb-{uuid.uuid4().hex[:8]}"
    client = connect(f"chdb://{path}")
    yield client
    client.close()
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def database(engine: Client) -> str:
    """A fresh database with every migration applied."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    migrate(engine, name)
    return name
