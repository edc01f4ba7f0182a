"""A bounded on-disk queue of Kafka messages: where the producer keeps events while Kafka is unreachable.

Layout under the spool directory (``ROLLOUT_SPOOL_DIR``, by default ``<data_dir>/spool``)::

    lane-<utc time>-<pid>-<random>/     one per Spool object (one per producing process)
        lock                            flock'ed by the owner for its whole life
        lane.json                       format version, scope (the Kafka cluster), host, pid
        000000000001.seg ...            append-only segments of records
        cursor                          how far the records are delivered (JSON, atomically replaced)

A record is ``magic (2 bytes) | body length (u32) | CRC-32 of the body (u32) | body``; a record
torn by a crash, or damaged on disk, fails its length or CRC check and is skipped with a warning,
never raising and never hiding the records before it (the reader resynchronises on the next
valid record). Each process appends to its own lane, so processes never write the same file; a
lane whose owner is gone (its lock is free) is adopted and drained by the next Spool opened on
the directory for the same scope. See docs/reliability.md for the guarantees.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import secrets
import shutil
import socket
import struct
import threading
import time
import zlib
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Self

from producers.exceptions import SpoolUnavailable

if TYPE_CHECKING:
    from rollout.settings import Settings

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 256 * 1024 * 1024
"""Default bound of a spool directory (``ROLLOUT_SPOOL_MAX_BYTES``)."""

FORMAT_VERSION = 1
MAGIC = b"\xa7\x5c"
_HEADER = struct.Struct(">2sII")  # magic, body length, CRC-32 of the body
_BODY_START = struct.Struct(">BH")  # flags (reserved, 0), topic length
_LEN32 = struct.Struct(">i")  # -1 stands for None
_LEN16 = struct.Struct(">H")
_NO_HEADERS = 0xFFFF
_MAX_BODY = 1 << 30
_READ_CHUNK = 1 << 20
_MIN_SEGMENT = 4096
_MAX_SEGMENT = 16 * 1024 * 1024
_LANE_PREFIX = "lane-"
_TMP_PREFIX = ".lane-tmp-"
_SEGMENT_SUFFIX = ".seg"
_FOREIGN_REFRESH_S = 1.0
_CURSOR_WRITE_INTERVAL_S = 0.5
_FSYNC_INTERVAL_S = 1.0

Headers = tuple[tuple[str, bytes | None], ...]


@dataclass(frozen=True, slots=True)
class SpooledMessage:
    """A message handed out by ``Spool.read``: resend it, then ``ack`` it (or ``nack`` to get it again)."""

    topic: str
    value: bytes | None
    key: bytes | None
    headers: Headers | None
    recovered: bool
    """Written by an earlier Spool on the directory (a producing process that is gone)."""
    ticket: tuple[int, int] = field(repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class SpoolStats:
    """A snapshot of one Spool: what waits on disk and what was refused."""

    pending: int
    """Messages on disk not yet acknowledged (handed out or not), including adopted ones."""
    unread: int
    """Of those, messages ``read`` has not handed out (or that were given back with ``nack``)."""
    bytes: int
    """Disk used by this Spool's lanes (acknowledged records count until their segment is deleted)."""
    max_bytes: int
    appended: int
    """Messages accepted by ``append`` since this Spool was opened."""
    refused: int
    """Messages ``append`` refused: the bound was reached, or the disk failed."""
    skipped_bytes: int
    """Bytes of torn or damaged records skipped while reading."""


class Spool:
    """An append-only, size-bounded, crash-safe queue of Kafka messages in a directory.

    Thread-safe. ``append`` never raises for a full or failing disk: it returns False, counts the
    message in ``refused`` and logs an ERROR at most once per ``refusal_log_interval_s`` with the
    count and what to do. Delivery is at-least-once across crashes: ``ack`` is made durable a
    little later (at most ``0.5 s``, and at ``close``), so a crash in between resends.
    """

    def __init__(
        self,
        directory: Path,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        scope: str = "",
        segment_bytes: int | None = None,
        refusal_log_interval_s: float = 60.0,
    ) -> None:
        if max_bytes < 1:
            raise SpoolUnavailable(f"the spool bound must be at least 1 byte, got {max_bytes}")
        self.directory = Path(directory).expanduser().resolve()
        self.max_bytes = max_bytes
        self.scope = scope
        self.segment_bytes = segment_bytes or max(_MIN_SEGMENT, min(_MAX_SEGMENT, max_bytes // 8))
        self.refusal_log_interval_s = refusal_log_interval_s
        self._lock = threading.RLock()
        self._own: _Lane | None = None
        self._adopted: list[_Lane] = []
        self._lanes_by_id: dict[int, _Lane] = {}
        self._next_lane_id = 0
        self._appended = 0
        self._refused = 0
        self._skipped = 0
        self._unlogged_refusals = 0
        self._refusal_logged_at: float | None = None
        self._refusal_reason = ""
        self._foreign_bytes = 0
        self._foreign_checked_at = -_FOREIGN_REFRESH_S
        self._closed = False
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            probe = self.directory / f".probe-{os.getpid()}-{secrets.token_hex(4)}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise SpoolUnavailable(f"the spool directory {self.directory} cannot be used: {exc}") from exc
        self.adopt()

    @classmethod
    def from_settings(cls, settings: Settings) -> Self:
        """The spool the settings describe; its scope is the Kafka cluster, so lanes never cross clusters."""
        return cls(settings.spool_dir, max_bytes=settings.spool_max_bytes, scope=settings.kafka_bootstrap_servers)

    # -- public ---------------------------------------------------------------------------------

    @property
    def stats(self) -> SpoolStats:
        """A consistent snapshot of the counts."""
        with self._lock:
            lanes = self._lanes()
            return SpoolStats(
                pending=sum(lane.pending for lane in lanes),
                unread=sum(lane.unread for lane in lanes),
                bytes=sum(lane.size for lane in lanes),
                max_bytes=self.max_bytes,
                appended=self._appended,
                refused=self._refused,
                skipped_bytes=self._skipped,
            )

    @property
    def pending(self) -> int:
        """Messages on disk not yet acknowledged."""
        with self._lock:
            return sum(lane.pending for lane in self._lanes())

    @property
    def unread(self) -> int:
        """Messages waiting to be handed out by ``read``."""
        with self._lock:
            return sum(lane.unread for lane in self._lanes())

    @property
    def closed(self) -> bool:
        """True once ``close`` ran."""
        return self._closed

    def append(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | str | None = None,
        headers: Sequence[tuple[str, str | bytes | None]] | Mapping[str, bytes] | None = None,
    ) -> bool:
        """Write one message at the tail; False (counted, logged) when the bound or the disk refuses it."""
        data = _encode(topic, value, key, headers)
        with self._lock:
            if self._closed:
                return self._refuse("the spool is closed")
            used = self._used_bytes()
            if used + len(data) > self.max_bytes:
                return self._refuse(f"it is full ({used:,} of {self.max_bytes:,} bytes)")
            try:
                own = self._own_lane()
                own.write(data, self.segment_bytes)
            except OSError as exc:
                return self._refuse(f"writing to it failed ({exc})")
            self._appended += 1
            return True

    def read(self, limit: int) -> list[SpooledMessage]:
        """Hand out up to ``limit`` messages, oldest lanes first; each must later be ``ack``ed or ``nack``ed."""
        out: list[SpooledMessage] = []
        with self._lock:
            for lane in self._lanes():
                if len(out) >= limit:
                    break
                try:
                    out.extend(lane.read(limit - len(out)))
                except OSError as exc:
                    now = time.monotonic()
                    if now - lane.error_logged_at >= self.refusal_log_interval_s:
                        lane.error_logged_at = now
                        log.error("reading the spool lane %s failed: %s (retrying)", lane.path, exc)
                self._skipped += lane.take_skipped()
                self._tidy(lane)
        return out

    def ack(self, message: SpooledMessage) -> None:
        """The message was delivered: it is not handed out again (durable within 0.5 s or at ``close``)."""
        with self._lock:
            lane = self._lanes_by_id.get(message.ticket[0])
            if lane is None:
                return
            lane.ack(message.ticket[1])
            self._tidy(lane)

    def nack(self, message: SpooledMessage) -> None:
        """The message was not delivered: ``read`` hands it out again (before newer ones of its lane)."""
        with self._lock:
            lane = self._lanes_by_id.get(message.ticket[0])
            if lane is not None:
                lane.nack(message)

    def sync(self) -> None:
        """Make everything appended and acknowledged so far durable (fsync), and log pending refusals."""
        self._sync(force=True)

    def maintain(self) -> None:
        """Periodic upkeep, cheap when idle: fsync at most every second, cursors every 0.5 s, refusal report."""
        self._sync(force=False)

    def adopt(self) -> int:
        """Take over lanes of this scope whose process is gone; returns how many messages they hold."""
        with self._lock:
            if self._closed:
                return 0
            found = 0
            taken = {lane.path for lane in self._lanes()}
            for path in sorted(self.directory.glob(f"{_LANE_PREFIX}*")):
                if path in taken or not path.is_dir():
                    continue
                lane = self._try_adopt(path)
                if lane is None:
                    continue
                self._skipped += lane.take_skipped()
                if lane.pending == 0:
                    lane.remove()
                    continue
                self._adopted.append(lane)
                self._register(lane)
                found += lane.pending
                log.warning(
                    "spool: adopted %d undelivered message(s) left in %s by an earlier process; resending them",
                    lane.pending,
                    path,
                )
            self._clean_temporaries()
            return found

    def close(self) -> None:
        """Make everything durable and release the directory; undelivered messages stay for the next Spool."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for lane in self._lanes():
                try:
                    if lane.pending == 0:
                        lane.remove()
                    else:
                        lane.sync_now()
                        lane.release()
                except OSError as exc:
                    log.error("closing the spool lane %s failed: %s", lane.path, exc)
                    lane.release()
            self._report_refusals(force=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        s = self.stats
        return f"Spool({str(self.directory)!r}, pending={s.pending}, bytes={s.bytes}, max_bytes={self.max_bytes})"

    # -- internals ------------------------------------------------------------------------------

    def _lanes(self) -> list[_Lane]:
        lanes = [lane for lane in self._adopted if not lane.removed]
        if self._own is not None and not self._own.removed:
            lanes.append(self._own)
        return lanes

    def _register(self, lane: _Lane) -> None:
        lane_id = self._next_lane_id
        self._next_lane_id += 1
        lane.lane_id = lane_id
        self._lanes_by_id[lane_id] = lane

    def _own_lane(self) -> _Lane:
        if self._own is None or self._own.removed:
            self._own = _Lane.create(self.directory, self.scope)
            self._register(self._own)
        return self._own

    def _used_bytes(self) -> int:
        now = time.monotonic()
        if now - self._foreign_checked_at >= _FOREIGN_REFRESH_S:
            self._foreign_checked_at = now
            mine = {lane.path for lane in self._lanes()}
            self._foreign_bytes = _directory_bytes(self.directory, exclude=mine)
        return self._foreign_bytes + sum(lane.size for lane in self._lanes())

    def _sync(self, *, force: bool) -> None:
        fds: list[int] = []
        directories: list[Path] = []
        with self._lock:
            for lane in self._lanes():
                try:
                    lane.sync(force=force, fds=fds, directories=directories)
                except OSError as exc:
                    log.error("syncing the spool lane %s failed: %s", lane.path, exc)
            self._report_refusals(force=False)
        # fsync outside the lock: a sender appending meanwhile never waits for the disk.
        for fd in fds:
            try:
                os.fsync(fd)
            except OSError as exc:
                log.error("fsync of a spool segment failed: %s", exc)
            finally:
                os.close(fd)
        for directory in directories:
            try:
                _fsync_dir(directory)
            except OSError as exc:
                log.error("fsync of the spool lane %s failed: %s", directory, exc)

    def _refuse(self, reason: str) -> bool:
        self._refused += 1
        self._unlogged_refusals += 1
        self._refusal_reason = reason
        self._report_refusals(force=False)
        return False

    def _report_refusals(self, *, force: bool) -> None:
        count = self._unlogged_refusals
        if not count:
            return
        now = time.monotonic()
        last = self._refusal_logged_at
        if not force and last is not None and now - last < self.refusal_log_interval_s:
            return
        self._refusal_logged_at = now
        self._unlogged_refusals = 0
        log.error(
            "spool %s refused %d message(s)%s (%d in all), last because %s; those events are lost. "
            "Bring Kafka back so the spool drains, free disk space, or raise ROLLOUT_SPOOL_MAX_BYTES.",
            self.directory,
            count,
            "" if last is None else f" in the last {now - last:.0f} s",
            self._refused,
            self._refusal_reason,
        )

    def _tidy(self, lane: _Lane) -> None:
        """Delete what is fully delivered: old segments, an adopted lane once drained."""
        try:
            lane.trim()
            if lane is not self._own and lane.pending == 0:
                lane.remove()
        except OSError as exc:
            log.error("tidying the spool lane %s failed: %s", lane.path, exc)

    def _try_adopt(self, path: Path) -> _Lane | None:
        fd = _try_lock(path / "lock")
        if fd is None:
            return None
        try:
            meta = json.loads((path / "lane.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            os.close(fd)
            log.warning("spool: ignoring %s, its lane.json is unreadable (%s)", path, exc)
            return None
        if meta.get("format") != FORMAT_VERSION or meta.get("scope") != self.scope:
            os.close(fd)
            log.debug("spool: %s belongs to another scope or format (%s); left alone", path, meta)
            return None
        try:
            return _Lane.load(path, fd)
        except OSError as exc:
            os.close(fd)
            log.error("spool: cannot read %s: %s; left alone", path, exc)
            return None

    def _clean_temporaries(self) -> None:
        cutoff = time.time() - 3600
        for path in self.directory.glob(f"{_TMP_PREFIX}*"):
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < cutoff:
                    shutil.rmtree(path, ignore_errors=True)


class _Lane:
    """One process's segments and cursor; all methods run under the Spool's lock."""

    def __init__(self, path: Path, lock_fd: int, *, recovered: bool) -> None:
        self.path = path
        self.lock_fd = lock_fd
        self.recovered = recovered
        self.lane_id = -1
        self.removed = False
        self.segments: dict[int, int] = {}  # sequence number -> size in bytes
        self.cursor: tuple[int, int] = (1, 0)  # first byte not known to be delivered
        self.read_pos: tuple[int, int] = (1, 0)  # next record to hand out
        self.unscanned = 0  # records after read_pos (known for adopted lanes, counted on write for own)
        self.entries: deque[tuple[int, tuple[int, int], tuple[int, int]]] = deque()  # (index, start, end)
        self.acked: set[int] = set()
        self.retry: deque[SpooledMessage] = deque()
        self.pre_acked: set[tuple[int, int]] = set()  # starts of records delivered beyond the cursor
        self.next_index = 0
        self.writer_fd: int | None = None
        self.writer_seq: int | None = None
        self.writer_dirty = False
        self.unsynced: dict[int, int] = {}  # finished segments awaiting their fsync: sequence number -> fd
        self.synced_at = 0.0
        self.dir_dirty = False
        self.parent_dirty = False
        self.cursor_dirty = False
        self.cursor_written_at = 0.0
        self.skipped = 0
        self.reported: set[tuple[int, int]] = set()  # damaged spots already logged
        self.error_logged_at = float("-inf")
        self._reader: tuple[int, int] | None = None  # (sequence number, fd)

    # -- opening --------------------------------------------------------------------------------

    @classmethod
    def create(cls, directory: Path, scope: str) -> _Lane:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
        name = f"{stamp}-{os.getpid()}-{secrets.token_hex(3)}"
        tmp = directory / f"{_TMP_PREFIX}{name}"
        tmp.mkdir()
        fd = os.open(tmp / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            meta = {
                "format": FORMAT_VERSION,
                "scope": scope,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "created": datetime.now(UTC).isoformat(),
            }
            _write_atomic(tmp / "lane.json", json.dumps(meta, sort_keys=True).encode())
            path = directory / f"{_LANE_PREFIX}{name}"
            # Renamed only once complete, so a lane directory always has its lock and metadata.
            tmp.rename(path)
        except BaseException:
            os.close(fd)
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        lane = cls(path, fd, recovered=False)
        lane.parent_dirty = True  # the new name is made durable by the next sync, not on the sender's time
        return lane

    @classmethod
    def load(cls, path: Path, lock_fd: int) -> _Lane:
        lane = cls(path, lock_fd, recovered=True)
        for entry in path.glob(f"*{_SEGMENT_SUFFIX}"):
            stem = entry.name[: -len(_SEGMENT_SUFFIX)]
            if stem.isdigit():
                lane.segments[int(stem)] = entry.stat().st_size
        lane.cursor = lane._load_cursor()
        # Segments wholly before the cursor are delivered; a crash may have left them behind.
        for seq in [s for s in lane.segments if s < lane.cursor[0]]:
            lane._delete_segment(seq)
        if lane.segments and lane.cursor[0] not in lane.segments:
            lane.cursor = (min(s for s in lane.segments if s > lane.cursor[0]), 0)
        lane.read_pos = lane.cursor
        # Counting reads every record once, so damage is reported here, when the lane is opened.
        records = lane._records(lane.read_pos)
        lane.unscanned = sum(1 for seq, start, _end, _msg in records if (seq, start) not in lane.pre_acked)
        return lane

    def _load_cursor(self) -> tuple[int, int]:
        first = min(self.segments, default=1)
        try:
            data = json.loads((self.path / "cursor").read_text(encoding="utf-8"))
        except FileNotFoundError:
            return (first, 0)
        except (OSError, ValueError) as exc:
            log.warning("spool: cursor of %s unreadable (%s); resending the lane from its start", self.path, exc)
            return (first, 0)
        try:
            self.pre_acked = {(int(s), int(o)) for s, o in data.get("acked", [])}
            return (int(data["segment"]), int(data["offset"]))
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("spool: cursor of %s malformed (%s); resending the lane from its start", self.path, exc)
            self.pre_acked = set()
            return (first, 0)

    # -- counts ---------------------------------------------------------------------------------

    @property
    def unread(self) -> int:
        return self.unscanned + len(self.retry)

    @property
    def pending(self) -> int:
        return self.unscanned + len(self.entries) - len(self.acked)

    @property
    def size(self) -> int:
        return sum(self.segments.values())

    def take_skipped(self) -> int:
        skipped, self.skipped = self.skipped, 0
        return skipped

    # -- writing --------------------------------------------------------------------------------

    def write(self, data: bytes, segment_bytes: int) -> None:
        if self.writer_fd is None or self.segments.get(self.writer_seq or 0, 0) >= segment_bytes:
            self._rotate()
        fd, seq = self.writer_fd, self.writer_seq
        assert fd is not None and seq is not None
        size = self.segments[seq]
        try:
            # One write per record: a crash tears at most this record, which the CRC then reveals.
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(errno.ENOSPC, f"short write ({written} of {len(data)} bytes)")
        except OSError:
            # Leave no partial record behind for the reader to trip over.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise
        self.segments[seq] = size + len(data)
        self.unscanned += 1
        self.writer_dirty = True

    def _rotate(self) -> None:
        if self.writer_fd is not None and self.writer_seq is not None:
            # fsync'ed by the next sync (within a second, from the producer's background thread),
            # so a sender never waits for a whole segment to reach the disk.
            if self.writer_dirty:
                self.unsynced[self.writer_seq] = self.writer_fd
            else:
                os.close(self.writer_fd)
            self.writer_fd = None
            self.writer_dirty = False
        seq = max([*self.segments, self.cursor[0] - 1, 0]) + 1
        fd = os.open(self._segment_path(seq), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self.writer_fd, self.writer_seq = fd, seq
        self.segments[seq] = 0
        if not self.segments.keys() - {seq}:
            # The lane was empty: reading starts at the new segment.
            self.read_pos = max(self.read_pos, (seq, 0))
            self.cursor = max(self.cursor, (seq, 0))
        # The new name is made durable by the next sync, off the sending thread's path.
        self.dir_dirty = True

    # -- reading --------------------------------------------------------------------------------

    def read(self, limit: int) -> list[SpooledMessage]:
        out: list[SpooledMessage] = []
        while self.retry and len(out) < limit:
            out.append(self.retry.popleft())
        if len(out) >= limit or self.unscanned == 0:
            return out
        for seq, start, end, message in self._records(self.read_pos):
            index = self.next_index
            self.next_index += 1
            self.entries.append((index, (seq, start), (seq, end)))
            self.read_pos = (seq, end)
            if (seq, start) in self.pre_acked:
                self.pre_acked.discard((seq, start))
                self.acked.add(index)
                continue
            self.unscanned -= 1
            topic, value, key, headers = message
            out.append(SpooledMessage(topic, value, key, headers, self.recovered, (self.lane_id, index)))
            if len(out) >= limit or self.unscanned == 0:
                break
        else:
            # Everything on disk was read: whatever the count says, nothing more is unread.
            self.unscanned = 0
            self.read_pos = self._end()
        self._advance()
        return out

    def _end(self) -> tuple[int, int]:
        if not self.segments:
            return self.read_pos
        last = max(self.segments)
        return (last, self.segments[last])

    def _records(self, start: tuple[int, int]) -> Iterator[tuple[int, int, int, _Decoded]]:
        """Valid records from ``start`` on, as (segment, start, end, message); damage is skipped."""
        first_seq, offset = start
        for seq in sorted(s for s in self.segments if s >= first_seq):
            size = self.segments[seq]
            pos = offset if seq == first_seq else 0
            if pos >= size:
                continue
            fd = self._reader_fd(seq)
            yield from self._segment_records(fd, seq, pos, size)

    def _segment_records(self, fd: int, seq: int, pos: int, size: int) -> Iterator[tuple[int, int, int, _Decoded]]:
        chunk = b""
        chunk_at = pos
        while pos < size:
            rel = pos - chunk_at
            if rel + _HEADER.size > len(chunk):
                chunk_at, chunk = pos, os.pread(fd, min(max(_READ_CHUNK, _HEADER.size), size - pos), pos)
                rel = 0
                if len(chunk) < _HEADER.size:
                    pos = self._skip(fd, seq, pos, size, why="torn record header at the end")
                    continue
            magic, length, crc = _HEADER.unpack_from(chunk, rel)
            end = pos + _HEADER.size + length
            if magic != MAGIC or length > _MAX_BODY or end > size:
                why = "torn record at the end" if magic == MAGIC and end > size else "damaged record"
                pos = self._skip(fd, seq, pos, size, why=why)
                chunk = b""
                continue
            if rel + _HEADER.size + length > len(chunk):
                chunk_at, chunk = pos, os.pread(fd, max(_READ_CHUNK, _HEADER.size + length), pos)
                rel = 0
            body = chunk[rel + _HEADER.size : rel + _HEADER.size + length]
            decoded = _decode(body) if zlib.crc32(body) == crc else None
            if decoded is None:
                pos = self._skip(fd, seq, pos, size, why="record failing its checksum")
                chunk = b""
                continue
            yield seq, pos, end, decoded
            pos = end

    def _skip(self, fd: int, seq: int, pos: int, size: int, *, why: str) -> int:
        """The next position after ``pos`` where a valid record starts (or the segment's end)."""
        rest = os.pread(fd, size - pos, pos)
        found = len(rest)
        at = rest.find(MAGIC, 1)
        while at != -1:
            if _valid_at(rest, at):
                found = at
                break
            at = rest.find(MAGIC, at + 1)
        if (seq, pos) not in self.reported:
            self.reported.add((seq, pos))
            self.skipped += found
            log.warning(
                "spool: skipped %d byte(s) at offset %d of %s (%s; a write torn by a crash, or disk damage)",
                found,
                pos,
                self._segment_path(seq),
                why,
            )
        return pos + found

    def _reader_fd(self, seq: int) -> int:
        if self._reader is not None:
            if self._reader[0] == seq:
                return self._reader[1]
            os.close(self._reader[1])
            self._reader = None
        fd = os.open(self._segment_path(seq), os.O_RDONLY)
        self._reader = (seq, fd)
        return fd

    # -- acknowledging ----------------------------------------------------------------------------

    def ack(self, index: int) -> None:
        if self.entries and self.entries[0][0] <= index <= self.entries[-1][0]:
            self.acked.add(index)
            self._advance()

    def nack(self, message: SpooledMessage) -> None:
        index = message.ticket[1]
        if self.entries and self.entries[0][0] <= index <= self.entries[-1][0] and index not in self.acked:
            self.retry.append(message)

    def _advance(self) -> None:
        moved = False
        while self.entries and self.entries[0][0] in self.acked:
            index, _start, end = self.entries.popleft()
            self.acked.discard(index)
            self.cursor = end
            moved = True
        if moved:
            self.cursor_dirty = True

    def trim(self) -> None:
        """Delete segments that are wholly delivered (the cursor is written first)."""
        if self.pending == 0 and self.segments:
            # Everything delivered: drop every segment, the one being written included.
            last = max(self.segments)
            self.cursor = self.read_pos = (last + 1, 0)
            self.pre_acked.clear()
            self.cursor_dirty = True
            self._close_writer(sync=False)
            self._write_cursor()
            for seq in list(self.segments):
                self._delete_segment(seq)
            return
        done = [seq for seq in self.segments if seq < self.cursor[0]]
        if done:
            self._write_cursor()
            for seq in done:
                self._delete_segment(seq)

    def _delete_segment(self, seq: int) -> None:
        if self._reader is not None and self._reader[0] == seq:
            os.close(self._reader[1])
            self._reader = None
        if seq == self.writer_seq:
            self._close_writer(sync=False)
        unsynced = self.unsynced.pop(seq, None)
        if unsynced is not None:
            os.close(unsynced)
        with contextlib.suppress(FileNotFoundError):
            self._segment_path(seq).unlink()
        self.segments.pop(seq, None)

    def _close_writer(self, *, sync: bool) -> None:
        if self.writer_fd is not None:
            if sync and self.writer_dirty:
                os.fsync(self.writer_fd)
            os.close(self.writer_fd)
        self.writer_fd = None
        self.writer_seq = None
        self.writer_dirty = False

    # -- durability -----------------------------------------------------------------------------

    def sync(self, *, force: bool, fds: list[int], directories: list[Path]) -> None:
        """Write the cursor if due; add the fds to fsync (the caller's to close) and directories to sync."""
        if self.removed:
            return
        now = time.monotonic()
        fds.extend(self.unsynced.values())
        self.unsynced.clear()
        if self.writer_fd is not None and self.writer_dirty and (force or now - self.synced_at >= _FSYNC_INTERVAL_S):
            # A duplicate, so the segment can be rotated or deleted while the fsync runs.
            fds.append(os.dup(self.writer_fd))
            self.writer_dirty = False
            self.synced_at = now
        if self.dir_dirty:
            directories.append(self.path)
            self.dir_dirty = False
        if self.parent_dirty:
            directories.append(self.path.parent)
            self.parent_dirty = False
        if self.cursor_dirty and (force or now - self.cursor_written_at >= _CURSOR_WRITE_INTERVAL_S):
            self._write_cursor()

    def sync_now(self) -> None:
        """Everything durable now, under the caller's lock (used when closing)."""
        fds: list[int] = []
        directories: list[Path] = []
        self.sync(force=True, fds=fds, directories=directories)
        for fd in fds:
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        for directory in directories:
            _fsync_dir(directory)

    def _write_cursor(self) -> None:
        # Records delivered out of order beyond the cursor are listed, so a restart skips them.
        beyond = sorted(start for index, start, _end in self.entries if index in self.acked)
        beyond.extend(sorted(p for p in self.pre_acked if p[0] in self.segments and p >= self.cursor))
        data = {"segment": self.cursor[0], "offset": self.cursor[1], "acked": [list(p) for p in beyond]}
        _write_atomic(self.path / "cursor", json.dumps(data).encode())
        self.cursor_dirty = False
        self.cursor_written_at = time.monotonic()

    # -- releasing ------------------------------------------------------------------------------

    def release(self) -> None:
        for fd in self.unsynced.values():
            with contextlib.suppress(OSError):
                os.fsync(fd)
            os.close(fd)
        self.unsynced.clear()
        self._close_writer(sync=True)
        if self._reader is not None:
            os.close(self._reader[1])
            self._reader = None
        if self.lock_fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = -1
        self.removed = True

    def remove(self) -> None:
        """Delete the lane (it holds nothing undelivered); the lock file goes last."""
        self._close_writer(sync=False)
        for seq in list(self.segments):
            self._delete_segment(seq)
        for name in ("cursor", "lane.json"):
            with contextlib.suppress(FileNotFoundError):
                (self.path / name).unlink()
        for leftover in self.path.iterdir():
            if leftover.name != "lock":
                with contextlib.suppress(OSError):
                    leftover.unlink()
        with contextlib.suppress(FileNotFoundError):
            (self.path / "lock").unlink()
        with contextlib.suppress(OSError):
            self.path.rmdir()
        self.release()

    def _segment_path(self, seq: int) -> Path:
        return self.path / f"{seq:012d}{_SEGMENT_SUFFIX}"


_Decoded = tuple[str, bytes | None, bytes | None, Headers | None]


def _encode(
    topic: str,
    value: bytes | None,
    key: bytes | str | None,
    headers: Sequence[tuple[str, str | bytes | None]] | Mapping[str, bytes] | None,
) -> bytes:
    topic_bytes = topic.encode()
    key_bytes = key.encode() if isinstance(key, str) else key
    parts = [_BODY_START.pack(0, len(topic_bytes)), topic_bytes]
    for blob in (key_bytes, value):
        parts.append(_LEN32.pack(-1 if blob is None else len(blob)))
        if blob is not None:
            parts.append(bytes(blob))
    if headers is None:
        parts.append(_LEN16.pack(_NO_HEADERS))
    else:
        items = list(headers.items()) if isinstance(headers, Mapping) else list(headers)
        parts.append(_LEN16.pack(len(items)))
        for name, raw in items:
            name_bytes = name.encode()
            blob = raw.encode() if isinstance(raw, str) else raw
            parts.append(_LEN16.pack(len(name_bytes)))
            parts.append(name_bytes)
            parts.append(_LEN32.pack(-1 if blob is None else len(blob)))
            if blob is not None:
                parts.append(blob)
    body = b"".join(parts)
    return _HEADER.pack(MAGIC, len(body), zlib.crc32(body)) + body


def _decode(body: bytes) -> _Decoded | None:
    try:
        _flags, topic_len = _BODY_START.unpack_from(body, 0)
        pos = _BODY_START.size
        topic = body[pos : pos + topic_len].decode()
        pos += topic_len
        blobs: list[bytes | None] = []
        for _ in range(2):
            (length,) = _LEN32.unpack_from(body, pos)
            pos += _LEN32.size
            if length < 0:
                blobs.append(None)
            else:
                blobs.append(body[pos : pos + length])
                pos += length
        (count,) = _LEN16.unpack_from(body, pos)
        pos += _LEN16.size
        headers: Headers | None = None
        if count != _NO_HEADERS:
            items: list[tuple[str, bytes | None]] = []
            for _ in range(count):
                (name_len,) = _LEN16.unpack_from(body, pos)
                pos += _LEN16.size
                name = body[pos : pos + name_len].decode()
                pos += name_len
                (length,) = _LEN32.unpack_from(body, pos)
                pos += _LEN32.size
                if length < 0:
                    items.append((name, None))
                else:
                    items.append((name, body[pos : pos + length]))
                    pos += length
            headers = tuple(items)
        if pos != len(body):
            return None
        return topic, blobs[1], blobs[0], headers
    except (struct.error, UnicodeDecodeError):
        return None


def _valid_at(data: bytes, at: int) -> bool:
    if at + _HEADER.size > len(data):
        return False
    magic, length, crc = _HEADER.unpack_from(data, at)
    end = at + _HEADER.size + length
    if magic != MAGIC or end > len(data):
        return False
    body = data[at + _HEADER.size : end]
    return zlib.crc32(body) == crc and _decode(body) is not None


def _try_lock(path: Path) -> int | None:
    """An fd holding an exclusive lock on ``path``, or None when another process holds it (or it is gone)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # The owner may have deleted the lane between our open and our lock.
        if os.fstat(fd).st_ino != os.stat(path).st_ino:
            raise FileNotFoundError(path)
    except OSError:
        os.close(fd)
        return None
    return fd


def _directory_bytes(directory: Path, *, exclude: set[Path]) -> int:
    total = 0
    with contextlib.suppress(OSError):
        for lane in directory.glob(f"{_LANE_PREFIX}*"):
            if lane in exclude:
                continue
            for segment in lane.glob(f"*{_SEGMENT_SUFFIX}"):
                with contextlib.suppress(OSError):
                    total += segment.stat().st_size
    return total


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
