"""The machine a run measured: cores, memory, load, versions; and waiting for it to be quiet."""

from __future__ import annotations

import math
import os
import platform
import resource
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("chdb", "clickhouse-connect", "confluent-kafka", "faust-streaming", "aiokafka", "pydantic", "py-spy")


@dataclass
class Machine:
    """What the document says about the machine."""

    cores: int
    cpu: str
    memory_bytes: int
    load_at_start: tuple[float, float, float]
    kernel: str
    python: str
    packages: dict[str, str] = field(default_factory=dict)
    commit: str = ""
    uncommitted: bool = False
    loop_seconds: tuple[float, float] | None = None
    """``python_loop_seconds`` at the start and at the end of the run (None: not measured)."""


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


REPORTS = ("docs/performance.md", "docs/memory-run.md")
"""What ``python -m bench`` and ``python -m bench.memory_run`` write."""


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10, check=False)
    except OSError:
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def describe_machine() -> Machine:
    """Cores, CPU, memory, the load average now, versions, and the code's commit."""
    packages = {}
    for name in PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = "not installed"
    return Machine(
        cores=os.cpu_count() or 0,
        cpu=_cpu_model(),
        memory_bytes=_memory(),
        load_at_start=os.getloadavg(),
        kernel=platform.release(),
        python=platform.python_version(),
        packages=packages,
        commit=_git("rev-parse", "--short", "HEAD"),
        # The reports the benchmarks write are not the code that was measured.
        uncommitted=bool(_git("status", "--porcelain", "--", ".", *(f":!{report}" for report in REPORTS))),
    )


LOOP_ITERATIONS = 10_000_000


def python_loop_seconds(repeats: int = 3) -> float:
    """Seconds a fixed pure-Python loop of LOOP_ITERATIONS additions takes here, best of ``repeats``.

    The host's speed for the interpreter, which shared machines change from hour to hour: the absolute rates
    of a run move with it (more for the Python-bound sides than for the C-bound baselines)."""
    best = math.inf
    for _ in range(repeats):
        began = time.perf_counter()
        total = 0
        for i in range(LOOP_ITERATIONS):
            total += i
        best = min(best, time.perf_counter() - began)
    return best


@dataclass(frozen=True, slots=True)
class QuietWait:
    """How waiting for a quiet machine went: quiet or not, seconds waited, the 1-minute loads seen."""

    quiet: bool
    waited_s: float
    loads: tuple[float, ...]


def engine_library() -> str:
    """The embedded ClickHouse engine's shared library, with its size on disk (for memory reports)."""
    try:
        import chdb

        found = sorted(Path(chdb.__file__).parent.glob("_chdb*.so"))
    except ImportError:
        found = []
    if not found:
        return "library (chdb)"
    return f"library (`{found[0].name}`, {found[0].stat().st_size / 2**20:,.0f} MiB on disk)"


def wait_until_quiet(*, max_load: float = 1.5, interval: float = 30.0, timeout: float = 600.0,
                     load: Callable[[], float] = lambda: os.getloadavg()[0],
                     sleep: Callable[[float], None] = time.sleep,
                     log: Callable[[str], None] = print) -> QuietWait:
    """Check the 1-minute load average every ``interval`` s until it is below ``max_load`` or ``timeout`` passed."""
    waited = 0.0
    loads: list[float] = []
    while True:
        current = load()
        loads.append(current)
        if current < max_load:
            return QuietWait(True, waited, tuple(loads))
        if waited + interval > timeout:
            return QuietWait(False, waited, tuple(loads))
        log(f"load average {current:.2f} >= {max_load}; checking again in {interval:.0f}s")
        sleep(interval)
        waited += interval


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has spent in processes since boot (all cores): user, nice, system and
    steal time. Idle, iowait and interrupt time are left out: interrupts are mostly this run's own network
    and disk traffic, which no process is charged for."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, _irq, _softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + steal) / _TICK


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()  # fields from the state on; the name may hold spaces


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (children, their children, ...)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def process_cpu_seconds(pid: int) -> float:
    """CPU seconds (user and system, every thread) a running process has used; 0.0 when it is gone."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / _TICK if fields is not None else 0.0


def own_cpu_seconds() -> float:
    """CPU seconds used by this process and every process it started (running, or exited and reaped)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = me.ru_utime + me.ru_stime + reaped.ru_utime + reaped.ru_stime
    return total + sum(process_cpu_seconds(pid) for pid in descendants(os.getpid()))


@dataclass(frozen=True, slots=True)
class CpuMark:
    """Machine-wide busy CPU and this run's own CPU at one moment."""

    at: float
    machine: float
    own: float

    @classmethod
    def now(cls) -> CpuMark:
        """A mark taken now."""
        return cls(time.monotonic(), machine_busy_seconds(), own_cpu_seconds())


def busy_share(before: CpuMark, after: CpuMark, cores: int) -> float:
    """Share of the machine's CPU capacity in use between two marks, by any process (steal time included)."""
    capacity = _capacity(before, after, cores)
    return min(1.0, max(0.0, after.machine - before.machine) / capacity) if capacity > 0 else 0.0


def other_share(before: CpuMark, after: CpuMark, cores: int) -> float:
    """Share of the machine's CPU capacity used by processes outside this run between two marks."""
    capacity = _capacity(before, after, cores)
    other = (after.machine - before.machine) - (after.own - before.own)
    return max(0.0, other) / capacity if capacity > 0 else 0.0


def _capacity(before: CpuMark, after: CpuMark, cores: int) -> float:
    """CPU seconds the machine could give between two marks (0 for an empty span or no cores)."""
    elapsed = after.at - before.at
    return elapsed * cores if elapsed > 0 and cores > 0 else 0.0
