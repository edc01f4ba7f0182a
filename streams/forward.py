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


class ForwardFailed(TransientError):
    """The owning worker did not confirm a forwarded batch (retry; nothing was acked)."""


@dataclass(frozen=True, slots=True)
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
