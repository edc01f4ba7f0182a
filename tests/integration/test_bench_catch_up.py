"""``python -m bench.catch_up`` on the real broker and engine: both ways over one small backlog, the hand-off's
worker reading nothing afterwards and every view equal to the worker's that read the backlog alone."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from bench.catch_up import run

pytestmark = pytest.mark.integration


def test_a_hand_off_catches_up_to_the_same_views_as_the_worker(kafka_bootstrap: str, tmp_path: Path) -> None:
    result = run(kafka_bootstrap, tmp_path, 3_000, 1, prefix=f"cu{uuid.uuid4().hex[:8]}")
    assert result.differences == {}
    assert result.read_after == [0]
    assert len(result.compared) == 14 and result.compared["v_trajectories"] > 500
    assert len(result.alone) == len(result.handed) == len(result.replays) == 1
    assert 0 < result.replays[0] < result.handed[0]
