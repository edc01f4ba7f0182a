"""The worker's garbage-collector policy."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from streams.collector import FULL_THRESHOLD, MIDDLE_THRESHOLD, YOUNG_THRESHOLD, tune_collector


@pytest.fixture
def restored() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_full_collections_rare_and_start_up_objects_frozen(restored: None) -> None:
    gc.unfreeze()
    tune_collector()
    assert gc.get_threshold() == (YOUNG_THRESHOLD, MIDDLE_THRESHOLD, FULL_THRESHOLD)
    assert FULL_THRESHOLD > 10 * MIDDLE_THRESHOLD
    assert gc.get_freeze_count() > 0
    assert gc.isenabled()
