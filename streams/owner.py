"""The one process that owns ClickHouse: a single thread runs every call (sink writes and reads).

The one exception is a batch's raw-event insert, which the sink runs on a thread of its own while
this thread derives from the batch; the derivation's next call waits for it
(``streams.sink_clickhouse.InsertGate``), so the client still sees one call at a time.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from clickhouse_connect.driver.client import Client

from infra.clickhouse.client import connect
from infra.clickhouse.migrate import migrate
from infra.clickhouse.reader import QueryResult, run_read
from rollout.errors import ServiceUnavailable
from streams.faults import FaultInjectingClient

T = TypeVar("T")


class ClickHouseOwner:
    """Holds the ClickHouse client; calls run on one thread (see the module) so the engine sees one caller at a time."""

    def __init__(self, *, url: str, database: str, fault_file: Path | None = None) -> None:
        self._url = url
        self._database = database
        self._fault_file = fault_file
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clickhouse")
        self._client: Client | None = None
        self._owner_file: Path | None = None
        self.stopping = threading.Event()

    @property
    def database(self) -> str:
        """The database the platform's tables live in."""
        return self._database

    @property
    def owns(self) -> bool:
        """True once this process holds the ClickHouse client."""
        return self._client is not None

    def try_own(self) -> bool:
        """Open ClickHouse if no other process holds the embedded engine; call only from the owner thread."""
        if self._client is not None:
            return True
        try:
            self.client()
        except ServiceUnavailable as exc:
            if "owned by another process" in str(exc):
                return False
            raise
        return True

    def client(self) -> Client:
        """The client (connected and migrated on first use); call only from the owner thread."""
        if self._client is None:
            client = connect(self._url, database=self._database)
            migrate(client, self._database)
            if self._fault_file is not None:
                client = FaultInjectingClient(client, self._fault_file)  # type: ignore[assignment]
            self._client = client
        return self._client

    async def run_unowned(self, fn: Callable[[], T]) -> T:
        """Run ``fn()`` on the owner thread without opening ClickHouse first (used to try to own it)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn)

    async def run(self, fn: Callable[[Client], T]) -> T:
        """Run ``fn(client)`` on the owner thread without blocking the event loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(self.client()))

    async def read(self, sql: str, parameters: dict[str, Any] | None) -> QueryResult:
        """A read-only query on the owner thread."""
        return await self.run(lambda c: run_read(c, sql, parameters))

    def publish_owner_file(self, path: Path, base_url: str) -> None:
        """Tell other processes where to send reads (``/sql``) and forwarded batches (``/ingest``)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        record = {"pid": os.getpid(), "url": base_url, "sql_url": f"{base_url}/sql", "clickhouse_url": self._url}
        tmp.write_text(json.dumps(record))
        tmp.replace(path)
        self._owner_file = path

    def close(self) -> None:
        """Stop retries, remove the owner file, close the client."""
        self.stopping.set()
        if self._owner_file is not None:
            try:
                record = json.loads(self._owner_file.read_text())
                if record.get("pid") == os.getpid():
                    self._owner_file.unlink()
            except (OSError, ValueError):
                pass
        client, self._client = self._client, None
        if client is not None:
            self._executor.submit(client.close).result(timeout=30)
        self._executor.shutdown(wait=True)
