"""A set of event ids at about 16 bytes each, for deduplicating a replay of tens of millions of events.

A Python ``set`` of the ids' 128-bit values takes ~75 bytes per id (a 48-byte int object and the table's
slots): 722 MiB of RSS for 10,000,000 ids, against 237 MiB here, in 3.3 against 6.2 s
(``python -m bench.event_ids``; ~0.3 µs per id more, under 1% of a replay's time). Here the ids live in
sorted numpy arrays of their high and low 64-bit halves (``EventIdSet``): 16 bytes per id, and a batch is
checked with one binary search per level instead of one Python lookup per id.

Layout: *levels*, each a pair of arrays (high halves sorted, low halves in the same order), every high half
in at most one level and once in it, so a search by the high half finds at most one candidate and the low
half decides. A new batch's ids become a level of their own; a level is merged into the one before it
while that one is at most ``MERGE_FACTOR`` times its size and the two hold at most ``LEVEL_MAX`` ids, so
there are about log2(LEVEL_MAX / batch) small levels and one per LEVEL_MAX ids.
Ids whose high half is already taken (by an id in a level or another id of the batch: for random UUIDs
the chance that any two of 10,000,000 share one is about 4 in 100,000, but a producer may send anything)
go to a Python set of whole ids instead. Of ids sharing a high half the first goes into a level, so the
high half of every id in that set is in a level too: an id whose high half a level holds but whose low
half differs is looked up in the set. Exact for any input; tests/unit/test_event_ids.py compares it with a
plain set on batches full of shared high halves.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MERGE_FACTOR = 2
"""A level is merged into the previous one while that one holds at most this many times as many ids."""

LEVEL_MAX = 1 << 22
"""Largest level made by merging (4,194,304 ids, 64 MiB): merging copies both levels, so larger ones would
cost more memory at their merge than they save; beyond it the levels stay side by side (one more binary
search per batch each)."""

_U64 = np.dtype(np.uint64)


class EventIdSet:
    """Event ids (16 bytes each, as ``uuid.UUID.bytes``) added so far."""

    def __init__(self) -> None:
        self._levels: list[tuple[np.ndarray, np.ndarray]] = []
        self._overflow: set[bytes] = set()
        """Whole ids whose high half another id (in a level) has: checked by value."""
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def add_new(self, ids: Sequence[bytes]) -> list[bool]:
        """Add ``ids``; for each, whether it is new: neither added before nor equal to an earlier one of ``ids``."""
        if not ids:
            return []
        if set(map(len, ids)) != {16}:
            raise ValueError("event ids are 16 bytes each")
        result: list[bool] = self._add(b"".join(ids)).tolist()
        return result

    def add_packed(self, packed: bytes) -> int:
        """Add the ids of ``packed`` (16 bytes each, end to end, as ``packed_from_row_binary`` gives them);
        how many were new. For loading many ids without a Python object per id."""
        if len(packed) % 16:
            raise ValueError("event ids are 16 bytes each")
        return int(self._add(packed).sum()) if packed else 0

    def _add(self, joined: bytes) -> np.ndarray:
        n = len(joined) // 16
        halves = np.frombuffer(joined, dtype=">u8")
        high = halves[0::2].astype(_U64)
        low = halves[1::2].astype(_U64)
        order = np.lexsort((low, high))  # by high half, then low; stable: equal ids keep the batch's order
        high = high[order]
        low = low[order]
        copy = np.zeros(n, dtype=bool)  # equal to the id before it in the batch: not new
        copy[1:] = (high[1:] == high[:-1]) & (low[1:] == low[:-1])

        known_high = np.zeros(n, dtype=bool)  # a level has the id's high half
        seen = np.zeros(n, dtype=bool)  # ... and it is this id
        for level_high, level_low in self._levels:
            at = np.searchsorted(level_high, high)
            at[at == len(level_high)] = 0
            same_high = level_high[at] == high
            known_high |= same_high
            seen |= same_high & (level_low[at] == low)
        # Another id of the batch sorted before it has this high half (the first of them may go into a level).
        shared = np.zeros(n, dtype=bool)
        firsts = np.flatnonzero(~copy)
        shared[firsts[1:][high[firsts[1:]] == high[firsts[:-1]]]] = True
        seen |= copy

        leveled = ~known_high & ~shared & ~seen  # a high half nobody has: new, and it goes into a level
        new = leveled.copy()
        overflow = self._overflow
        for i in np.flatnonzero(~leveled & ~seen).tolist():  # a high half taken by another id
            start = 16 * int(order[i])
            key = joined[start:start + 16]
            if key not in overflow:
                overflow.add(key)
                new[i] = True
        if leveled.any():
            self._push(high[leveled], low[leveled])
        kept = np.empty(n, dtype=bool)
        kept[order] = new
        self._size += int(new.sum())
        return kept

    def _push(self, high: np.ndarray, low: np.ndarray) -> None:
        levels = self._levels
        levels.append((high, low))
        del high, low
        while (len(levels) > 1 and len(levels[-2][0]) <= MERGE_FACTOR * len(levels[-1][0])
               and len(levels[-2][0]) + len(levels[-1][0]) <= LEVEL_MAX):
            newer = levels.pop()
            older = levels.pop()
            merged_high = np.concatenate((older[0], newer[0]))
            merged_low = np.concatenate((older[1], newer[1]))
            del older, newer  # freed as soon as the merged copies exist
            order = np.argsort(merged_high, kind="stable")  # two sorted runs: a linear merge
            merged_high = merged_high[order]
            merged_low = merged_low[order]
            del order
            levels.append((merged_high, merged_low))


def packed_from_row_binary(data: bytes) -> bytes:
    """UUIDs as ClickHouse's RowBinary format writes them (each the high then the low 64-bit half, little-endian)
    packed as ``EventIdSet.add_packed`` takes them (``uuid.UUID.bytes`` end to end)."""
    if len(data) % 16:
        raise ValueError(f"{len(data)} bytes are not whole UUIDs (16 bytes each)")
    return np.frombuffer(data, dtype="<u8").astype(">u8").tobytes()
