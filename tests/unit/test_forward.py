"""Forwarding batches to the owning worker: the wire form round-trips and chunks keep every message once."""

from __future__ import annotations

import pytest

from streams.forward import RawMessage, chunks, decode_forwarded, encode_forwarded


def test_the_wire_form_round_trips_bytes_and_positions() -> None:
    messages = [RawMessage("t.raw.sandbox", 3, 17, b"\x00key", b"\xff\xfe not utf-8"),
                RawMessage("t.raw.policy", 0, 0, None, None)]
    assert decode_forwarded(encode_forwarded(messages)) == messages


@pytest.mark.parametrize("body", [b"{", b'{"a": 1}', b'[{"topic": "t"}]', b'[{"topic": "t", "partition": 0, '
                                  b'"offset": 1, "value": "***"}]'])
def test_a_malformed_body_is_refused(body: bytes) -> None:
    with pytest.raises(ValueError):
        decode_forwarded(body)


def test_chunks_keep_order_and_every_message_once() -> None:
    messages = [RawMessage("t", 0, i, b"k", b"x" * (i % 700)) for i in range(1000)]
    parts = chunks(messages, limit=20_000)
    assert len(parts) > 1
    assert [m for part in parts for m in part] == messages
    assert all(sum(len(m.value or b"") for m in part) <= 20_000 for part in parts if len(part) > 1)


def test_a_message_larger_than_the_limit_travels_alone() -> None:
    big = RawMessage("t", 0, 0, None, b"x" * 100)
    assert chunks([big, big], limit=10) == [[big], [big]]
