"""Fault injection at the sink's ClickHouse client boundary, for reliability tests of the embedded engine.

Enabled only with ``ROLLOUT_FAULT_INJECTION=1``: while the fault file exists, every ClickHouse
call fails the way an unreachable server would, so tests can hold an "outage" for as long as
they like and check that nothing is committed, lost or doubled.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rollout.errors import TransientError


class InjectedFault(TransientError):
    """A ClickHouse call refused on purpose (the fault file exists)."""


class FaultInjectingClient:
    """Proxy of a ClickHouse client whose calls fail while ``fault_file`` exists."""

    _GUARDED = frozenset({"query", "insert", "command", "raw_query", "query_arrow", "query_df", "insert_df"})

    def __init__(self, client: Any, fault_file: Path) -> None:
        self._client = client
        self._fault_file = fault_file

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if name not in self._GUARDED:
            return attribute

        def guarded(*args: Any, **kwargs: Any) -> Any:
            if self._fault_file.exists():
                raise InjectedFault(f"injected ClickHouse outage ({self._fault_file} exists)")
            return attribute(*args, **kwargs)

        return guarded


def fault_file(data_dir: Path) -> Path:
    """The file whose presence makes ClickHouse calls fail (when fault injection is enabled)."""
    return data_dir / "faults" / "clickhouse"
