"""Heap trimming between batches (pure logic, and the C library's call on this system)."""

from __future__ import annotations

import platform

import pytest

from streams.memory import HeapTrimmer


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
