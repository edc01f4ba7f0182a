"""Forwarding batches to the worker that owns the embedded ClickHouse (loopback HTTP).

chdb lets one process open a data folder. Several worker processes can still share the topics'
partitions: the one that owns the engine stores batches; the others forward their raw messages
to its ``/ingest`` endpoint and ack their offsets only after it answered that the batch is stored.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from rollout.errors import TransientError
from streams.sink_clickhouse import WriteResult

FORWARD_MAX_BODY = 256 * 1024 * 1024
"""Largest /ingest request the owner accepts (bytes)."""
FORWARD_CHUNK_BYTES = 16 * 1024 * 1024
"""Batches are forwarded in requests of about this size (raw bytes before base64)."""


class ForwardFailed(TransientError):
    """The owning worker did not confirm a forwarded batch (retry; nothing was acked)."""


@dataclass(slots=True, unsafe_hash=True)  # not frozen, for speed (see streams.records.SourceRef): never changed
class RawMessage:
    """A message as consumed from a raw topic: its position, key and value bytes."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


def _b64(data: bytes | None) -> str | None:
    return base64.b64encode(data).decode() if data is not None else None


def _unb64(text: Any) -> bytes | None:
    if text is None:
        return None
    if not isinstance(text, str):
        raise ValueError("key and value must be base64 strings or null")
    return base64.b64decode(text, validate=True)


def encode_forwarded(messages: list[RawMessage]) -> bytes:
    """The /ingest request body: the raw messages with their source positions."""
    return orjson.dumps([
        {"topic": m.topic, "partition": m.partition, "offset": m.offset, "key": _b64(m.key), "value": _b64(m.value)}
        for m in messages
    ])


def decode_forwarded(body: bytes) -> list[RawMessage]:
    """Parse an /ingest request body; ValueError when it is not one."""
    try:
        items = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from exc
    if not isinstance(items, list):
        raise ValueError("expected a JSON list of messages")
    messages: list[RawMessage] = []
    for item in items:
        if not isinstance(item, dict):
            raise ValueError("each message must be an object")
        try:
            messages.append(RawMessage(str(item["topic"]), int(item["partition"]), int(item["offset"]),
                                       _unb64(item.get("key")), _unb64(item.get("value"))))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"bad message: {exc}") from exc
    return messages


async def forward(base_url: str, messages: list[RawMessage], *, timeout: float = 300.0) -> WriteResult:
    """Send a batch to the owning worker and return what it stored; ForwardFailed when it did not confirm."""
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session, \
                session.post(f"{base_url}/ingest", data=encode_forwarded(messages),
                             headers={"Content-Type": "application/json"}) as response:
            body = await response.read()
            if response.status != 200:
                raise ForwardFailed(f"owner answered {response.status}: {body[:200]!r}")
            data = orjson.loads(body)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise ForwardFailed(f"owner at {base_url} unreachable: {exc!r}") from exc
    return WriteResult(stored=int(data["stored"]), duplicates=int(data["duplicates"]),
                       dead_lettered=int(data["dead_lettered"]))


def chunks(messages: list[RawMessage], limit: int = FORWARD_CHUNK_BYTES) -> list[list[RawMessage]]:
    """Split a batch into consecutive chunks of at most ``limit`` key+value bytes (at least one message each)."""
    out: list[list[RawMessage]] = []
    current: list[RawMessage] = []
    size = 0
    for message in messages:
        weight = len(message.key or b"") + len(message.value or b"") + 64
        if current and size + weight > limit:
            out.append(current)
            current, size = [], 0
        current.append(message)
        size += weight
    if current:
        out.append(current)
    return out


async def forward_all(base_url: str, messages: list[RawMessage]) -> WriteResult:
    """Forward a batch in chunks; the batch counts as stored only when every chunk was confirmed.

    A failure part-way raises ForwardFailed and the whole batch is forwarded again later: the
    owner's writes are idempotent, so the chunks it already stored add nothing the second time.
    """
    stored = duplicates = dead = 0
    for part in chunks(messages):
        result = await forward(base_url, part)
        stored += result.stored
        duplicates += result.duplicates
        dead += result.dead_lettered
    return WriteResult(stored=stored, duplicates=duplicates, dead_lettered=dead)
