"""``python -m bench.event_ids``: the replay's set of event ids against a Python set, in time and memory.

Each side runs in a process of its own (so RSS is its own): random 16-byte ids in batches of the
replay's size, a few repeated within and across batches as a log's duplicate deliveries are; the
time is the deduplication's alone (making the ids is not counted), the memory the rise of RSS from
before the first batch (``VmRSS`` after the last, and the peak from ``VmHWM``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from streams.event_ids import EventIdSet

BATCH = 50_000
"""Ids per batch: the replay's read batch (streams.replay.READ_BATCH)."""
SIDES = ("python set", "EventIdSet")


def _status_kib(name: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {name} in /proc/self/status")


def _batches(ids: int) -> Any:
    previous: list[bytes] = []
    for start in range(0, ids, BATCH):
        batch = [os.urandom(16) for _ in range(min(BATCH, ids - start))]
        batch[1::1000] = batch[0:len(batch) - 1:1000]  # repeated within the batch
        batch[2::1000] = previous[:len(batch[2::1000])] or batch[2::1000]  # and from the batch before
        previous = batch[::1000]
        yield batch


def measure(side: str, ids: int) -> dict[str, Any]:
    """Deduplicate ``ids`` random ids on ``side``: seconds, ids kept, RSS rise at the end and at the peak (MiB)."""
    before = _status_kib("VmRSS")
    seconds = 0.0
    kept = 0
    if side == "python set":
        seen: set[int] = set()
        for batch in _batches(ids):
            values = [int.from_bytes(key, "big") for key in batch]  # made while validating, before: not timed
            began = time.perf_counter()
            for value in values:
                if value not in seen:
                    seen.add(value)
                    kept += 1
            seconds += time.perf_counter() - began
    else:
        store = EventIdSet()
        for batch in _batches(ids):
            began = time.perf_counter()
            kept += sum(store.add_new(batch))
            seconds += time.perf_counter() - began
    return {"side": side, "seconds": seconds, "kept": kept,
            "rss_mib": (_status_kib("VmRSS") - before) / 1024, "peak_mib": (_status_kib("VmHWM") - before) / 1024}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.event_ids", description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=10_000_000, help="ids to deduplicate (default 10,000,000)")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # one side, in a child process
    args = parser.parse_args(argv)
    if args.ids < 1:
        parser.error("--ids must be at least 1")
    if args.side:
        print(json.dumps(measure(args.side, args.ids)))
        return 0
    print(f"{args.ids:,} ids in batches of {BATCH:,}")
    print("| side | seconds | ids kept | RSS rise at the end (MiB) | peak RSS rise (MiB) |")
    print("| --- | --- | --- | --- | --- |")
    for side in SIDES:
        child = subprocess.run([sys.executable, "-m", "bench.event_ids", "--ids", str(args.ids), "--side", side],
                               capture_output=True, text=True, check=False)
        if child.returncode != 0:
            print(f"{side} failed:\n{child.stderr[-2000:]}", file=sys.stderr)
            return 1
        r = json.loads(child.stdout)
        print(f"| {side} | {r['seconds']:.2f} | {r['kept']:,} | {r['rss_mib']:,.0f} | {r['peak_mib']:,.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
