"""The one process that owns ClickHouse: a single thread runs every call (sink writes and reads)."""

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

T = TypeVar("T")


class ClickHouseOwner:
    """Holds the ClickHouse client; all calls run on one thread so the embedded engine sees one caller."""

    def __init__(self, *, url: str, database: str) -> None:
        self._url = url
        self._database = database
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clickhouse")
        self._client: Client | None = None
        self._owner_file: Path | None = None
        self.stopping = threading.Event()

    @property
    def database(self) -> str:
        """The database the platform's tables live in."""
        return self._database

    def client(self) -> Client:
        """The client (connected and migrated on first use); call only from the owner thread."""
        if self._client is None:
            client = connect(self._url, database=self._database)
            migrate(client, self._database)
            self._client = client
        return self._client

    async def run(self, fn: Callable[[Client], T]) -> T:
        """Run ``fn(client)`` on the owner thread without blocking the event loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(self.client()))

    async def read(self, sql: str, parameters: dict[str, Any] | None) -> QueryResult:
        """A read-only query on the owner thread."""
        return await self.run(lambda c: run_read(c, sql, parameters))

    def publish_owner_file(self, path: Path, sql_url: str) -> None:
        """Tell other processes (rollout sql, the demo) where to send reads."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "sql_url": sql_url, "clickhouse_url": self._url}))
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
