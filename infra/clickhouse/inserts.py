"""Inserts with column types looked up once per table.

clickhouse-connect asks the server for a table's columns (``DESCRIBE TABLE``) before every insert
unless it is given their types; the worker inserts into the same few tables every batch, so it
looks them up once and passes them along.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from clickhouse_connect.datatypes.registry import get_from_name


class Inserter:
    """Row inserts into tables of one database, with their column types remembered."""

    def __init__(self, client: Any, database: str) -> None:
        self._client = client
        self._db = database
        self._types: dict[str, dict[str, Any]] = {}

    def insert(self, table: str, rows: Sequence[Sequence[Any]], columns: Sequence[str]) -> None:
        """Insert ``rows`` (values in ``columns`` order) into ``table``."""
        types = self._types.get(table)
        if types is None:
            described = self._client.query(f"DESCRIBE TABLE `{self._db}`.`{table}`")
            types = {str(row[0]): get_from_name(str(row[1])) for row in described.result_rows}
            self._types[table] = types
        self._client.insert(table, rows, column_names=list(columns), database=self._db,
                            column_types=[types[c] for c in columns])
