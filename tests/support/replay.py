"""``rollout replay`` in a process of its own."""

from __future__ import annotations

import os
import subprocess
import sys

from rollout.settings import Settings
from tests.support.worker import settings_env


def run_replay(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    """``rollout replay`` in a process of its own (the embedded engine takes one data folder per process)."""
    return subprocess.run([sys.executable, "-m", "rollout.cli", "replay", *args], capture_output=True, text=True,
                          env={**os.environ, **settings_env(settings)}, timeout=300, check=False)
