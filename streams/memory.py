"""Giving freed heap memory back to the system between batches.

A batch allocates tens of MiB for a moment (decoded events, rows, the engine's insert blocks) on the
event loop's, the owner's and the engine's threads. glibc keeps what they free in each thread's
arena and returns it to the system only when the free memory sits at the top of an arena, so a
worker's RSS stays near the largest batch it ever held. ``malloc_trim(0)`` returns every free page of
every arena. Measured on a 1,000,000-event replay (``python -m bench.memory_run --events 1000000``):
median anonymous RSS 568 -> 530 MiB, peak 964 -> 947 MiB, at the same rate (docs/performance.md).
Elsewhere (another C library, another system) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from collections.abc import Callable

TRIM_INTERVAL_S = 1.0
"""Trim at most this often: a trim walks every arena (a few milliseconds on a worker's heap)."""


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


class HeapTrimmer:
    """Calls ``malloc_trim(0)`` at most once per ``interval_s`` (where the C library has it)."""

    def __init__(self, interval_s: float = TRIM_INTERVAL_S,
                 trim: Callable[[int], int] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._trim = trim if trim is not None else _malloc_trim()
        self._interval_s = interval_s
        self._clock = clock
        self._last = clock()
        self.trims = 0

    @property
    def available(self) -> bool:
        """Whether this C library can give free heap memory back."""
        return self._trim is not None

    def maybe_trim(self) -> bool:
        """Trim if the interval passed since the last trim; True if it trimmed."""
        if self._trim is None:
            return False
        now = self._clock()
        if now - self._last < self._interval_s:
            return False
        self._last = now
        self._trim(0)
        self.trims += 1
        return True
