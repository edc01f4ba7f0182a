"""Giving memory back to the system between batches: freed heap (``HeapTrimmer``) and the embedded
engine's library pages the worker does not use (``LibraryPager``).

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


class _Every:
    """Says when ``interval_s`` has passed since it last said so (the first time: ``first_after_s`` from now)."""

    def __init__(self, interval_s: float, clock: Callable[[], float], first_after_s: float | None = None) -> None:
        self._interval_s = interval_s
        self._clock = clock
        self._last = clock() - interval_s + (interval_s if first_after_s is None else first_after_s)

    def due(self) -> bool:
        now = self._clock()
        if now - self._last < self._interval_s:
            return False
        self._last = now
        return True


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
        self._every = _Every(interval_s, clock)
        self.trims = 0

    @property
    def available(self) -> bool:
        """Whether this C library can give free heap memory back."""
        return self._trim is not None

    def maybe_trim(self) -> bool:
        """Trim if the interval passed since the last trim; True if it trimmed."""
        if self._trim is None or not self._every.due():
            return False
        self._trim(0)
        self.trims += 1
        return True


ENGINE_LIBRARY = "_chdb.abi3.so"
"""The embedded ClickHouse engine's shared library (chdb): ~530 MiB of code and data mapped from disk."""
PAGE_OUT_INTERVAL_S = 60.0
"""Hand the engine library's pages back at most this often (the working set comes back in ~0.1 s)."""
FIRST_PAGE_OUT_S = 5.0
"""The first time: soon after start, when what loading the engine touched is no longer used."""
MADV_PAGEOUT = 21
"""Linux 5.4 and later: reclaim these pages now (clean file pages are dropped, to be read again when used)."""


def _madvise() -> Callable[[int, int, int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        call = libc.madvise
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    call.restype = ctypes.c_int
    advise: Callable[[int, int, int], int] = call
    return advise


def library_mappings(maps: str, suffix: str) -> list[tuple[int, int]]:
    """(start, length) of every mapping in a ``/proc/<pid>/maps`` text whose file name ends with ``suffix``."""
    found: list[tuple[int, int]] = []
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].strip().endswith(suffix):
            start, end = (int(bound, 16) for bound in fields[0].split("-"))
            found.append((start, end - start))
    return found


class LibraryPager:
    """Hands the pages of the engine's library that the worker does not use back to the kernel: ``first_after_s``
    after it is created, then at most once per ``interval_s``.

    Loading chdb maps its 530 MiB library and touches much of it once (relocations, static set-up); the
    kernel counts every touched page in the process's RSS until memory runs short, and how many it maps
    per fault depends on the kernel (fault-around, large folios): over the same 10,000,000-event replay
    one host's kernel kept 263 MiB of the library resident, another's 397 MiB, the worker's own memory the
    same. ``madvise(MADV_PAGEOUT)`` on the library's mappings drops its clean pages now, as memory pressure
    would; the pages the worker runs fault back in from the page cache or disk the next time they are
    used (a workload of inserts and queries: 36 MiB of the library resident right after, 95 MiB once it
    ran again, ~0.1 s of faults). Nothing is written (the pages are clean), nothing changes but residency.
    The kernel drops only pages no other process maps: where two processes on one host load chdb (two
    embedded workers, a worker started by a process that queried chdb itself), the pages both touched
    stay (measured: a probe's 176 MiB stayed with its parent holding chdb, fell to 12 MiB alone).
    Without the call (another system, a kernel before 5.4) it does nothing.
    """

    def __init__(self, interval_s: float = PAGE_OUT_INTERVAL_S, *, first_after_s: float = FIRST_PAGE_OUT_S,
                 suffix: str = ENGINE_LIBRARY,
                 madvise: Callable[[int, int, int], int] | None = None, maps_path: str = "/proc/self/maps",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._madvise = madvise if madvise is not None else _madvise()
        self._suffix = suffix
        self._maps_path = maps_path
        self._every = _Every(interval_s, clock, first_after_s)
        self.page_outs = 0
        self.seconds = 0.0

    @property
    def available(self) -> bool:
        """Whether the pager can still ask the kernel (it stops at the first refusal)."""
        return self._madvise is not None

    def stop(self) -> None:
        """Never page out from now on (``ROLLOUT_ENGINE_PAGE_OUT_SECONDS=0``)."""
        self._madvise = None

    def maybe_page_out(self) -> bool:
        """Page the library out if the interval passed since the last time; True if it did."""
        if self._madvise is None or not self._every.due():
            return False
        began = time.perf_counter()
        try:
            with open(self._maps_path, encoding="utf-8", errors="replace") as maps:
                mappings = library_mappings(maps.read(), self._suffix)
        except OSError:
            self._madvise = None
            return False
        if not mappings:  # the engine is not loaded (a ClickHouse server)
            return False
        for start, length in mappings:
            if self._madvise(start, length, MADV_PAGEOUT) != 0:
                self._madvise = None  # not supported here: the pages stay until memory runs short
                return False
        self.seconds += time.perf_counter() - began
        self.page_outs += 1
        return True
