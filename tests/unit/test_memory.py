"""Giving memory back between batches: pure logic, and the C library's and the kernel's calls on this system."""

from __future__ import annotations

import json
import mmap
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from streams.memory import ENGINE_LIBRARY, MADV_PAGEOUT, HeapTrimmer, LibraryPager, library_mappings


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_trims_at_most_once_per_interval() -> None:
    calls: list[int] = []
    clock = Clock()
    trimmer = HeapTrimmer(interval_s=1.0, trim=lambda pad: calls.append(pad) or 1, clock=clock)
    assert not trimmer.maybe_trim()  # just created: the interval has not passed
    clock.now += 0.4
    assert not trimmer.maybe_trim()
    clock.now += 0.7
    assert trimmer.maybe_trim()
    assert not trimmer.maybe_trim()
    clock.now += 1.0
    assert trimmer.maybe_trim()
    assert calls == [0, 0]
    assert trimmer.trims == 2


def test_without_the_call_nothing_happens() -> None:
    clock = Clock()
    trimmer = HeapTrimmer(interval_s=0.0, clock=clock)
    trimmer._trim = None  # a C library without malloc_trim
    clock.now += 5
    assert not trimmer.available
    assert not trimmer.maybe_trim()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc",
                    reason="malloc_trim is a glibc call; other C libraries keep their heap")
def test_on_glibc_the_trim_is_there_and_runs() -> None:
    trimmer = HeapTrimmer(interval_s=0.0)
    assert trimmer.available
    blocks = [bytearray(100_000) for _ in range(200)]
    del blocks
    assert trimmer.maybe_trim()
    assert trimmer.trims == 1


MAPS = """\
7f0000000000-7f0000400000 r--p 00000000 fd:01 123 /venv/site-packages/chdb/_chdb.abi3.so
7f0000400000-7f0010000000 r-xp 00400000 fd:01 123 /venv/site-packages/chdb/_chdb.abi3.so
7f0010000000-7f0010001000 rw-p 00000000 00:00 0
7f0020000000-7f0020100000 r-xp 00000000 fd:01 456 /usr/lib/libc.so.6
7f0030000000-7f0030001000 r--p 00000000 fd:01 789 /tmp/a path with spaces/_chdb.abi3.so
"""


def test_library_mappings_are_the_named_files_ranges() -> None:
    assert library_mappings(MAPS, "_chdb.abi3.so") == [
        (0x7F0000000000, 0x400000), (0x7F0000400000, 0x10000000 - 0x400000), (0x7F0030000000, 0x1000)]
    assert library_mappings(MAPS, "libzzz.so") == []


def test_pages_out_soon_after_start_then_once_per_interval(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(MAPS)
    calls: list[tuple[int, int, int]] = []
    clock = Clock()
    pager = LibraryPager(interval_s=60.0, first_after_s=5.0, maps_path=str(maps), clock=clock,
                         madvise=lambda start, length, advice: calls.append((start, length, advice)) or 0)
    assert not pager.maybe_page_out()
    clock.now += 5.0
    assert pager.maybe_page_out()
    assert calls == [(start, length, MADV_PAGEOUT) for start, length in library_mappings(MAPS, ENGINE_LIBRARY)]
    clock.now += 59.0
    assert not pager.maybe_page_out()
    clock.now += 1.0
    assert pager.maybe_page_out()
    assert pager.page_outs == 2 and len(calls) == 6


def test_a_refusal_stops_the_pager_and_no_library_means_nothing_to_do(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(MAPS)
    calls: list[int] = []
    pager = LibraryPager(interval_s=0.0, first_after_s=0.0, maps_path=str(maps),
                         madvise=lambda start, length, advice: calls.append(start) or -1)
    assert not pager.maybe_page_out()  # EINVAL on a kernel before 5.4
    assert not pager.available and calls == [0x7F0000000000]
    assert not pager.maybe_page_out() and calls == [0x7F0000000000]
    maps.write_text("7f0020000000-7f0020100000 r-xp 00000000 fd:01 456 /usr/lib/libc.so.6\n")
    idle = LibraryPager(interval_s=0.0, first_after_s=0.0, maps_path=str(maps), madvise=lambda *a: 0)
    assert not idle.maybe_page_out() and idle.available and idle.page_outs == 0


def _resident_kib(suffix: str) -> int:
    """Resident KiB of this process's mappings of the file whose name ends with ``suffix`` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and ":" not in head[0] and len(head) >= 5:
            inside = len(head) == 6 and head[5].endswith(suffix)
        elif inside and line.startswith("Rss:"):
            total += int(head[1])
    return total


def _read_every_page(mapped: mmap.mmap) -> int:
    """Touch every page of the mapping (so it is resident); the sum of the bytes read."""
    return sum(mapped[offset] for offset in range(0, len(mapped), mmap.PAGESIZE))


@pytest.mark.skipif(platform.system() != "Linux", reason="MADV_PAGEOUT and /proc/self/maps are Linux's")
def test_on_linux_a_mapped_files_pages_leave_the_resident_set() -> None:
    # A file only this process maps: the kernel reclaims a page only where no other process maps it, so
    # chdb's own library is no probe inside a suite whose integration tests (in this process) hold it too.
    # On disk, not tmpfs: tmpfs pages need swap to leave. The project's data folder is on the checkout's disk.
    data = Path(__file__).resolve().parents[2] / ".data"
    data.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=data) as folder:
        path = Path(folder) / "pageout-probe.bin"
        with open(path, "wb") as out:
            out.write(os.urandom(8 << 20))
            out.flush()
            os.fsync(out.fileno())  # clean pages: a dirty page would wait for writeback instead of leaving
        with open(path, "rb") as source, mmap.mmap(source.fileno(), 0, prot=mmap.PROT_READ) as mapped:
            checksum = _read_every_page(mapped)
            before = _resident_kib(path.name)
            pager = LibraryPager(interval_s=0.0, first_after_s=0.0, suffix=path.name)
            paged = pager.maybe_page_out()
            after = _resident_kib(path.name)
            again = _read_every_page(mapped)
    if not paged and not pager.available:
        pytest.skip("this kernel refuses MADV_PAGEOUT (Linux 5.4 or later has it): nothing to measure")
    assert paged and pager.page_outs == 1
    assert before >= 6 << 10, before  # the 8 MiB were read through the mapping
    assert after <= before // 4, (before, after)
    assert again == checksum  # the pages come back from the file when read again


_ENGINE_PROBE = """
import json

import chdb

from streams.memory import LibraryPager

answer = lambda: chdb.query("SELECT sum(number) FROM numbers(1000)", "CSV").bytes().strip().decode()
first = answer()
pager = LibraryPager(interval_s=0.0, first_after_s=0.0)
paged = pager.maybe_page_out()
print(json.dumps({"first": first, "paged": paged, "available": pager.available, "again": answer()}))
"""


@pytest.mark.skipif(platform.system() != "Linux", reason="MADV_PAGEOUT and /proc/self/maps are Linux's")
def test_on_linux_the_engine_library_is_found_and_the_engine_runs_after_the_page_out() -> None:
    # A process of its own: chdb opens one engine per process, and the suite's tests hold theirs.
    done = subprocess.run([sys.executable, "-c", _ENGINE_PROBE], capture_output=True, text=True, timeout=120,
                          check=True, cwd=Path(__file__).resolve().parents[2])
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    if not probe["paged"] and not probe["available"]:
        pytest.skip("this kernel refuses MADV_PAGEOUT (Linux 5.4 or later has it): nothing to measure")
    assert probe["paged"]  # the library's mappings were found and advised
    assert probe["first"] == probe["again"] == "499500"


def test_a_stopped_pager_never_asks(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(MAPS)
    calls: list[int] = []
    clock = Clock()

    def advise(start: int, length: int, advice: int) -> int:
        calls.append(start)
        return 0

    pager = LibraryPager(interval_s=0.0, first_after_s=0.0, maps_path=str(maps), clock=clock, madvise=advise)
    pager.stop()  # ROLLOUT_ENGINE_PAGE_OUT_SECONDS=0
    clock.now += 3600
    assert not pager.maybe_page_out() and not pager.available and calls == []
