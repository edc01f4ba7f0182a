"""The worker with its derivation left out, to measure what deriving costs.

``python -m bench.without_derivation worker`` runs ``rollout worker`` unchanged but for ``Deriver.derive``,
which here derives nothing: every batch is still read, validated, dead-lettered, deduplicated against the
owner's cache (which still keeps copies of the stored events), stored as raw rows and committed, but no
trajectory record, metric window, consumption or alert is written and no derived message is sent.
``bench.pipeline`` replays the log with it once, after the full worker's replays: the difference in CPU per
event between the two is what the derivation costs inside the worker, in CPU time (a sampling profiler's busy
time also counts a thread's waits for the interpreter lock). A measuring tool only: the ClickHouse it fills
has raw rows and nothing derived from them.
"""

from __future__ import annotations

from collections.abc import Sequence

from streams.derive import Deriver, DeriveResult
from streams.records import Accepted


def derive_nothing(_deriver: Deriver, _batch: Sequence[Accepted]) -> DeriveResult:
    """``Deriver.derive`` of this variant: no ClickHouse call, nothing changed."""
    return DeriveResult([], 0, [], [])


def main() -> None:
    """``rollout`` with the derivation left out (``streams.derive.store_and_derive`` still waits for the raw rows)."""
    Deriver.derive = derive_nothing  # type: ignore[method-assign]
    from rollout.cli import main as rollout_main

    rollout_main()


if __name__ == "__main__":
    main()
