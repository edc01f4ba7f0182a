"""streams.event_ids.EventIdSet against a plain Python set, on ids built to share high halves."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams import event_ids
from streams.event_ids import EventIdSet


def _id(high: int, low: int) -> bytes:
    return high.to_bytes(8, "big") + low.to_bytes(8, "big")


def _reference(batches: list[list[bytes]]) -> list[list[bool]]:
    seen: set[bytes] = set()
    out = []
    for batch in batches:
        kept = []
        for key in batch:
            kept.append(key not in seen)
            seen.add(key)
        out.append(kept)
    return out


# Few distinct halves, including 0 and 2**64 - 1 (a byte order or sign mistake shows there), so ids share
# high halves within a batch, across batches and with ids already in levels and in the overflow set.
_HALF = st.sampled_from([0, 1, 2, 7, 2**63, 2**64 - 1])
_IDS = st.lists(st.lists(st.builds(_id, _HALF, _HALF), max_size=12), max_size=12)


@given(_IDS)
@settings(max_examples=300, deadline=None)
def test_matches_a_plain_set_when_ids_share_high_halves(batches: list[list[bytes]]) -> None:
    ids = EventIdSet()
    assert [ids.add_new(batch) for batch in batches] == _reference(batches)
    assert len(ids) == len({key for batch in batches for key in batch})


@pytest.mark.parametrize("level_max", [event_ids.LEVEL_MAX, 120])
def test_random_ids_over_many_merged_levels(monkeypatch: pytest.MonkeyPatch, level_max: int) -> None:
    monkeypatch.setattr(event_ids, "MERGE_FACTOR", 1)
    monkeypatch.setattr(event_ids, "LEVEL_MAX", level_max)
    fresh = [[uuid.uuid4().bytes for _ in range(50)] for _ in range(40)]
    # Each batch repeats ids of itself (first one kept) and of earlier batches, held by merged levels by then.
    batches = [batch + batch[:3] + [key for earlier in fresh[:i:7] for key in earlier[:2]]
               for i, batch in enumerate(fresh)]
    ids = EventIdSet()
    assert [ids.add_new(batch) for batch in batches] == _reference(batches)
    assert len(ids) == 40 * 50
    sizes = [len(high) for high, _ in ids._levels]
    assert len(sizes) < 40 and sum(sizes) == 40 * 50  # merged, every id once
    assert max(sizes) <= max(level_max, 50)


def test_first_of_equal_ids_in_a_batch_is_the_new_one() -> None:
    a, b = _id(5, 1), _id(5, 2)
    assert EventIdSet().add_new([b, a, b, a, _id(4, 1)]) == [True, True, False, False, True]


def test_empty_batch_and_wrong_length() -> None:
    ids = EventIdSet()
    assert ids.add_new([]) == []
    with pytest.raises(ValueError, match="16 bytes"):
        ids.add_new([b"short"])


@given(_IDS)
@settings(max_examples=100, deadline=None)
def test_packed_ids_are_added_as_the_same_ids_one_by_one(batches: list[list[bytes]]) -> None:
    packed, listed = EventIdSet(), EventIdSet()
    for batch in batches:
        assert packed.add_packed(b"".join(batch)) == sum(listed.add_new(batch))
    assert len(packed) == len(listed)
    every = [key for batch in batches for key in batch]
    assert packed.add_new(every) == listed.add_new(every)  # the same ids held, the overflow set's included


def test_row_binary_uuids_become_the_ids_bytes() -> None:
    # ClickHouse's RowBinary writes a UUID as its high then its low 64-bit half, each little-endian.
    ids = [uuid.UUID("00112233-4455-6677-8899-aabbccddeeff"), uuid.uuid4(), uuid.UUID(int=2**128 - 1)]
    row_binary = b"".join(u.bytes[7::-1] + u.bytes[:7:-1] for u in ids)
    assert row_binary[:16].hex() == "7766554433221100ffeeddccbbaa9988"
    assert event_ids.packed_from_row_binary(row_binary) == b"".join(u.bytes for u in ids)
    with pytest.raises(ValueError, match="whole UUIDs"):
        event_ids.packed_from_row_binary(row_binary[:-1])
    with pytest.raises(ValueError, match="16 bytes"):
        EventIdSet().add_packed(b"x" * 17)
    assert EventIdSet().add_packed(b"") == 0
