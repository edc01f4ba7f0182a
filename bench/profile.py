"""Where the worker's time goes: py-spy samples of a running worker, attributed to pipeline steps.

py-spy (``pip install py-spy``, in the ``dev`` extra) samples every thread of the worker process
from outside (``--idle --threads --nonblocking``: idle threads are sampled too and the worker is
never paused). Each sample's stack is attributed to

* a **thread role**: the event loop (Faust, Kafka, validation) or the ClickHouse owner thread
  (every sink and derivation call runs there), or another thread;
* a **step**: the innermost pipeline function on the stack (``Deriver._write_windows``, ...);
* a **kind of work**: the innermost frame that says what the CPU is doing (the ClickHouse engine,
  the ClickHouse client library, event decoding, trajectory assembly, ...).

Time is the share of a thread's samples times the wall-clock length of the recording. py-spy
counts a thread that waits for the interpreter lock as busy on its current line, so each thread's
CPU time over the same recording is read from ``/proc`` as well (``task_cpu_seconds``): busy but
not on a CPU is, for a Python thread, mostly waiting for the lock.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

IDLE = "idle (waiting)"

# Innermost match wins. Qualified names as py-spy prints them (``Class.method``).
STEPS: tuple[tuple[str, str], ...] = (
    ("classify", "validate messages (records.classify)"),
    ("record_message", "derived messages: serialise"),
    ("alert_message", "derived messages: serialise"),
    ("DerivedPublisher.publish", "derived messages: send and wait for delivery"),
    ("create_app.<locals>.store_batch", "take batches from the stream"),
    ("create_app.<locals>.sink_agent", "take batches from the stream"),
    ("ClickHouseSink._drop_stored_by_query", "sink: duplicate check (query)"),
    ("ClickHouseSink._drop_stored", "sink: duplicate check (cached trajectories)"),
    ("ClickHouseSink._drop_stored_dead", "sink: dead-letter duplicate check"),
    ("ClickHouseSink.write", "sink: insert raw rows"),
    ("OwnerState._load_events", "load: stored events of trajectories"),
    ("OwnerState._load_records", "load: stored trajectory records"),
    ("OwnerState._load_consumed", "load: consumptions of trajectories"),
    ("OwnerState._load_run_extent", "load: run extent (once per run)"),
    ("OwnerState._run_facts", "load: run facts (policy versions, config)"),
    ("OwnerState.window_members", "load: window members"),
    ("OwnerState.consumption_windows", "load: window consumptions"),
    ("OwnerState.window_quality", "load: window quality counts"),
    ("OwnerState.quality_totals", "load: run quality totals"),
    ("Deriver._insert_consumptions", "derive: store consumptions"),
    ("Deriver._finished_since", "derive: trajectories finished since a new version"),
    ("Deriver._all_windows", "derive: all windows of a reconfigured run"),
    ("Deriver._write_windows", "derive: write window metrics"),
    ("Deriver._write_records", "derive: write trajectory records"),
    ("Deriver._regressions", "derive: regression check and alerts"),
    ("Deriver._derive_run", "derive: assemble and compute windows"),
    ("Deriver.derive", "derive: other"),
)

# (substring of a frame, kind); the innermost frame matching any entry decides.
KINDS: tuple[tuple[str, str], ...] = (
    ("chdb/", "ClickHouse engine (chdb: query execution)"),
    ("clickhouse_connect/", "ClickHouse client (bind, encode, parse)"),
    ("decode_event (schemas/", "decode events (pydantic)"),
    ("pydantic", "decode events (pydantic)"),
    ("streams/trajectory.py", "trajectory assembly"),
    ("streams/metrics.py", "window metrics"),
    ("streams/window_store.py", "window metrics"),
    ("streams/regression.py", "regression test"),
    ("aiokafka/", "Kafka client (aiokafka)"),
    ("confluent_kafka/", "Kafka client (confluent-kafka)"),
    ("streams/publish.py", "Kafka client (confluent-kafka)"),
    ("faust/", "Faust"),
    ("mode/", "Faust"),
    ("aiohttp/", "web endpoint (/stats, /sql)"),
    ("asyncio/", "asyncio"),
)


@dataclass(frozen=True, slots=True)
class Sample:
    """One stack of one thread, seen ``count`` times."""

    thread: str
    frames: tuple[str, ...]
    count: int


def parse_raw(text: str) -> list[Sample]:
    """py-spy's ``--format raw`` output (``thread (tid): name;frame;...;frame count`` per line)."""
    samples: list[Sample] = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        thread = frames[0]
        name = thread.split(": ", 1)[1] if thread.startswith("thread (") and ": " in thread else thread
        samples.append(Sample(name, tuple(frames[1:]), int(count)))
    return samples


def role(thread: str) -> str:
    """The role of a worker thread by its name."""
    if thread == "MainThread":
        return "event loop"
    if thread.startswith("clickhouse"):
        return "ClickHouse owner"
    if thread.startswith("ingest"):
        return "direct ingest (consumer)"
    return "other threads"


NATIVE = "engine and librdkafka threads (no Python)"
"""The role of the threads py-spy does not list: the embedded engine's and librdkafka's own."""


def thread_names(text: str) -> dict[int, str]:
    """Native thread id -> thread name, from py-spy's ``--format raw`` output (``thread (tid): name;...``)."""
    names: dict[int, str] = {}
    for line in text.splitlines():
        if not line.startswith("thread ("):
            continue
        tid, _, rest = line[len("thread ("):].partition("): ")
        if tid.isdigit():  # "name;frame;...;frame count", or "name count" for a sample without frames
            names[int(tid)] = rest.split(";", 1)[0] if ";" in rest else rest.rsplit(" ", 1)[0]
    return names


def task_cpu_seconds(pid: int) -> dict[int, float]:
    """CPU seconds (user and system) each thread of ``pid`` used so far, by native thread id (Linux ``/proc``)."""
    ticks = os.sysconf("SC_CLK_TCK")
    seconds: dict[int, float] = {}
    for entry in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{entry}/stat").read_text()
        except OSError:
            continue  # the thread ended meanwhile
        fields = stat.rsplit(")", 1)[1].split()
        seconds[int(entry)] = (int(fields[11]) + int(fields[12])) / ticks
    return seconds


def cpu_by_role(before: dict[int, float], after: dict[int, float], names: dict[int, str]) -> dict[str, float]:
    """CPU seconds each role's threads used between two ``task_cpu_seconds`` readings (threads py-spy did not
    name: ``NATIVE``)."""
    return _cpu_by(before, after, names, role)


def cpu_of_other_threads(before: dict[int, float], after: dict[int, float], names: dict[int, str]
                         ) -> dict[str, float]:
    """The same for the threads of the role ``other threads``, by thread name; the threads of one pool
    (``sink-insert_0``, ``sink-insert_1``: a ``ThreadPoolExecutor``'s) are added up under its prefix."""
    used = _cpu_by(before, after, names, _pool)
    return {name: cpu for name, cpu in used.items() if name != NATIVE and role(name) == "other threads"}


def _pool(thread: str) -> str:
    prefix, _, number = thread.rpartition("_")
    return prefix if prefix and number.isdigit() else thread


def _cpu_by(before: dict[int, float], after: dict[int, float], names: dict[int, str],
            key_of: Callable[[str], str]) -> dict[str, float]:
    used: dict[str, float] = {}
    for tid, cpu in after.items():
        name = names.get(tid)
        key = key_of(name) if name is not None else NATIVE
        used[key] = used.get(key, 0.0) + cpu - before.get(tid, 0.0)
    return used


def _function(frame: str) -> str:
    return frame.split(" (", 1)[0]


def is_idle(frames: tuple[str, ...]) -> bool:
    """A stack that waits: the loop's selector, a thread pool worker waiting for work, the direct consumer
    waiting for messages (librdkafka, GIL released), the collector's timer thread between ticks, or a bare
    wait."""
    if not frames:
        return True
    leaf = frames[-1]
    if leaf.startswith(("EpollSelector.select", "select (", "_worker (concurrent/futures/thread.py",
                        "DirectIngest._fetch (")):
        return True
    if leaf.startswith(("Condition.wait", "Event.wait", "_wait_for_tstate_lock")):
        if any(f.startswith("Freezer._run (") for f in frames):  # the collector's timer between ticks
            return True
        return not any("streams/" in f or "chdb/" in f or "clickhouse_connect/" in f for f in frames)
    return False


def step(frames: tuple[str, ...]) -> str:
    """The innermost pipeline step on the stack, or ``other``."""
    for frame in reversed(frames):
        name = _function(frame)
        for key, label in STEPS:
            if name == key or name.endswith("." + key):
                return label
    return "other"


def leaf(frames: tuple[str, ...]) -> str:
    """The innermost frame without its line number: ``function (file)``."""
    if not frames:
        return "-"
    name, _, where = frames[-1].partition(" (")
    return f"{name} ({where.rsplit(':', 1)[0]})" if where else name


def kind(frames: tuple[str, ...]) -> str:
    """What the innermost recognisable frame is doing."""
    for frame in reversed(frames):
        for marker, label in KINDS:
            if marker in frame:
                return label
    return "other Python"


@dataclass
class ThreadProfile:
    """One role's samples: busy and idle counts, busy by step and by kind."""

    samples: int = 0
    idle: int = 0
    steps: Counter[str] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    leaves: Counter[str] = field(default_factory=Counter)

    @property
    def busy(self) -> int:
        """Samples doing something."""
        return self.samples - self.idle


@dataclass
class Profile:
    """Per-role profiles of one recording and its length in seconds."""

    seconds: float
    roles: dict[str, ThreadProfile]

    def seconds_of(self, role_name: str, samples: int) -> float:
        """Wall-clock seconds that ``samples`` of one role stand for."""
        total = self.roles[role_name].samples if role_name in self.roles else 0
        return self.seconds * samples / total if total else 0.0


ROLES = ("ClickHouse owner", "event loop", "direct ingest (consumer)", "other threads")


def analyse(samples: list[Sample], seconds: float) -> Profile:
    """Attribute every sample to role, idle/busy, step and kind."""
    roles: dict[str, ThreadProfile] = {name: ThreadProfile() for name in ROLES}
    for sample in samples:
        profile = roles.setdefault(role(sample.thread), ThreadProfile())
        profile.samples += sample.count
        if is_idle(sample.frames):
            profile.idle += sample.count
            continue
        profile.steps[step(sample.frames)] += sample.count
        profile.kinds[kind(sample.frames)] += sample.count
        profile.leaves[leaf(sample.frames)] += sample.count
    return Profile(seconds, {name: profile for name, profile in roles.items() if profile.samples})


def py_spy() -> str | None:
    """The py-spy executable next to this interpreter or on PATH, if installed."""
    local = Path(sys.executable).with_name("py-spy")
    if local.exists():
        return str(local)
    return shutil.which("py-spy")


def start_recording(pid: int, out: Path, *, seconds: float, rate: int, gil: bool = False) -> subprocess.Popen[bytes]:
    """Start py-spy on ``pid`` for ``seconds``; wait for the returned process to finish.

    Default: every thread at every tick, idle or not (``--idle``). ``gil=True``: only the thread
    holding the GIL at a tick (``--gil``), so the samples count how long Python held it and where.
    """
    executable = py_spy()
    if executable is None:
        raise FileNotFoundError("py-spy is not installed (pip install py-spy, or the dev extra)")
    return subprocess.Popen(
        [executable, "record", "--pid", str(pid), "--rate", str(rate), "--duration", str(int(seconds)),
         "--gil" if gil else "--idle", "--threads", "--nonblocking", "--format", "raw", "--output", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
