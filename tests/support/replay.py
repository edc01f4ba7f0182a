"""``rollout replay`` in a process of its own, and the ``v_*`` views of a database as the benchmark compares them."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from bench.pipeline import comparable_rows
from rollout.settings import Settings
from tests.support.worker import WorkerProcess, settings_env


def views(worker: WorkerProcess, database: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every ``v_*`` view of ``database`` as the benchmark compares them, read through the worker."""
    names = [str(r[0]) for r in worker.query(
        "SELECT name FROM system.tables WHERE database = {db:String} AND name LIKE 'v\\_%' ORDER BY name",
        {"db": database}).rows]
    out = {}
    for name in names:
        result = worker.query(f"SELECT * FROM `{database}`.{name}")
        out[name] = comparable_rows(result.columns, result.rows)
    return out


def run_replay(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    """``rollout replay`` in a process of its own (the embedded engine takes one data folder per process)."""
    return subprocess.run([sys.executable, "-m", "rollout.cli", "replay", *args], capture_output=True, text=True,
                          env={**os.environ, **settings_env(settings)}, timeout=300, check=False)
