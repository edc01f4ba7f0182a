"""What trajectory assembly would cost in native code, beside the worker's Python ``assemble``.

The worker's derivation is Python on one interpreter lock (docs/performance.md, *Where the time goes*);
native code is the path named there to cut its cost per event. This probe measures the first piece
such code would take over, ``streams.trajectory.assemble``, written in Rust (``src/lib.rs`` beside this
file, built here with cargo and loaded as a Python extension), two ways:

* **over the owner's cached events**: it reads the Python objects the worker's cache holds (as a native
  function called from the present derivation would have to), folds them, and builds the
  ``TrajectoryRecord`` the rest of the derivation uses;
* **from a native store**: the canonical payloads (what the sink stores) are parsed into events the
  extension keeps itself, so assembling reads no Python object; only the record is built in Python.

Every record of both is checked against Python's ``assemble`` over the same events (the cached events
shuffled, a fifth of the trajectories with an event twice), then each is timed by the process's CPU, per
step: reading the events (objects only), folding them, building the record's values, building the record.
The bench's events of one run (``bench.workload``), grouped by trajectory, as a batch's derivation assembles
every trajectory it touches once.

Usage::

    python -m bench.native_probe [--events 150000] [--repeats 5]

Needs Rust's ``cargo`` (on PATH or in ``~/.cargo/bin``) and the crates pyo3, serde and serde_json from
crates.io; the build goes to ``.data/native_probe`` (``--target-dir``).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.util
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

from bench.cli import at_least, log
from bench.workload import events_for
from schemas import (
    EnvironmentFailed,
    PolicyVersionPublished,
    RolloutFinished,
    RolloutInterrupted,
    RolloutQueued,
    RolloutResumed,
    RolloutStarted,
    SnapshotTaken,
    VerificationFinished,
)
from schemas.parse import encode_event
from streams.derive import DeriveConfig, _finish_window, _record_row, record_message
from streams.trajectory import (
    EPOCH,
    AssemblyConfig,
    CachedEvent,
    TrajectoryRecord,
    VersionTimeline,
    assemble,
    cached_copy,
)

CRATE = Path(__file__).resolve().parent
MODULE = "native_assembly_probe"
DEFAULT_TARGET = CRATE.parents[1] / ".data" / "native_probe"
KINDS = (RolloutQueued, RolloutStarted, RolloutFinished, EnvironmentFailed, VerificationFinished, SnapshotTaken,
         RolloutResumed, RolloutInterrupted)
"""Event classes in the extension's kind order (``src/lib.rs``: QUEUED 0 ... INTERRUPTED 7)."""
MICROSECOND = timedelta(microseconds=1)


class ProbeUnavailable(RuntimeError):
    """The extension cannot be built here (no cargo, or the build failed); the message says what to do."""


def find_cargo() -> str | None:
    """Rust's cargo: on PATH, else where rustup installs it."""
    found = shutil.which("cargo")
    if found:
        return found
    home = Path.home() / ".cargo" / "bin" / "cargo"
    return str(home) if home.is_file() else None


def build(target_dir: Path = DEFAULT_TARGET, *, progress: Callable[[str], None] = log) -> ModuleType:
    """Build the extension in release mode for this interpreter and import it (``ProbeUnavailable`` if it cannot).

    An extension module initialises once per process: a later call returns the module the first one loaded."""
    loaded = sys.modules.get(MODULE)
    if loaded is not None:
        return loaded
    cargo = find_cargo()
    if cargo is None:
        raise ProbeUnavailable("the native probe needs Rust's cargo (rustup installs it in ~/.cargo/bin)")
    target_dir = target_dir.resolve()
    progress(f"  building {CRATE.name} with cargo (release; crates from crates.io on the first build)")
    began = time.perf_counter()
    done = subprocess.run(
        [cargo, "build", "--release", "--quiet", "--manifest-path", str(CRATE / "Cargo.toml")],
        env={**os.environ, "CARGO_TARGET_DIR": str(target_dir / "target"), "PYO3_PYTHON": sys.executable},
        capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise ProbeUnavailable(f"cargo could not build the native probe (exit {done.returncode}):\n{tail}")
    progress(f"  built in {time.perf_counter() - began:.1f} s")
    library = target_dir / "target" / "release" / f"lib{MODULE}.so"
    if not library.is_file():
        raise ProbeUnavailable(f"cargo built no {library.name} in {library.parent} (the probe expects Linux)")
    # A copy under the module's own name, so that the import system takes it as the extension it is; renamed
    # into place, so that a process that mapped an earlier build keeps its own file.
    loadable = target_dir / f"{MODULE}.so"
    partial = loadable.with_name(f"{loadable.name}.{os.getpid()}.part")
    shutil.copyfile(library, partial)
    os.replace(partial, loadable)
    spec = importlib.util.spec_from_file_location(MODULE, loadable)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[MODULE] = module
    return module


def micros(value: Any) -> int:
    """A UTC datetime as microseconds since the epoch (exact)."""
    return int((value - EPOCH) // MICROSECOND)


def make_probe(module: ModuleType, timeline: VersionTimeline, config: AssemblyConfig,
               copy_classes: dict[type, type]) -> Any:
    """The extension's ``Probe`` for one run: the event classes and their cached copies' (``copy_classes``: copy
    class -> event class) with their kinds, the record class, the verdict timeout and the run's timeline."""
    classes = [(model, kind) for kind, model in enumerate(KINDS)]
    classes += [(copy, KINDS.index(model)) for copy, model in copy_classes.items() if model in KINDS]
    step = timedelta(seconds=config.verdict_timeout_s)
    # The timeline's derived arrays are what its own lookups bisect: the extension bisects the same ones.
    return module.Probe(
        classes, TrajectoryRecord, UTC, step // MICROSECOND, config.verdict_timeout_s,
        ([micros(t) for t in timeline.times], list(timeline._newest_so_far), list(timeline._by_version),
         [micros(t) for t in timeline._earliest_from]),
    )


@dataclass
class Corpus:
    """One run's bench events, as the probe gives them to both sides."""

    events: int
    timeline: VersionTimeline
    groups: list[list[CachedEvent]]
    """Each trajectory's cached events (the owner's copies), in arrival order."""
    trajectory_ids: list[str]
    payloads: list[str]
    """The canonical payloads of every trajectory event (what the sink stores)."""
    originals: list[Any]
    """The decoded events those payloads are of (what ``cached_copy`` copies)."""
    copy_classes: dict[type, type] = field(default_factory=dict)


def corpus(events: int, run_id: str = "native-probe") -> Corpus:
    """The bench's first ``events`` events of one run, grouped by trajectory."""
    decoded = events_for(events, run_id=run_id)
    timeline = VersionTimeline.from_events([e for e in decoded if isinstance(e, PolicyVersionPublished)])
    groups: dict[str, list[CachedEvent]] = defaultdict(list)
    copy_classes: dict[type, type] = {}
    payloads: list[str] = []
    originals: list[Any] = []
    for event in decoded:
        trajectory_id = getattr(event, "trajectory_id", None)
        if not trajectory_id:
            continue
        copy = cached_copy(event)
        copy_classes[type(copy)] = type(event)
        groups[str(trajectory_id)].append(copy)
        payloads.append(encode_event(event).decode())
        originals.append(event)
    return Corpus(len(decoded), timeline, list(groups.values()), list(groups), payloads, originals, copy_classes)


def scrambled(groups: Sequence[list[CachedEvent]], seed: int = 7) -> list[list[CachedEvent]]:
    """Each group shuffled, a fifth of them with one event given twice (assembly takes any order and duplicates)."""
    rng = random.Random(seed)
    out = []
    for group in groups:
        mixed = rng.sample(group, len(group))
        if rng.random() < 0.2:
            mixed.append(rng.choice(group))
        out.append(mixed)
    return out


@dataclass
class Check:
    """Records compared with Python's ``assemble``: how many, how many differed, and the first few of those."""

    compared: int
    differing: int
    examples: list[str] = field(default_factory=list)


def check(probe: Any, store: Any, data: Corpus, config: AssemblyConfig) -> tuple[Check, Check]:
    """Every record of both native ways against Python's, over the same events (scrambled for the objects)."""
    objects_differ, store_differ = [], []
    for trajectory_id, group in zip(data.trajectory_ids, scrambled(data.groups), strict=True):
        expected = assemble(group, data.timeline, config)
        if probe.assemble(group) != expected:
            objects_differ.append(trajectory_id)
        if store.assemble(probe, trajectory_id) != expected:
            store_differ.append(trajectory_id)
    n = len(data.groups)
    return Check(n, len(objects_differ), objects_differ[:5]), Check(n, len(store_differ), store_differ[:5])


STEPS = (
    ("python: assemble (cached events)", "trajectory"),
    ("native over the cached events: read", "trajectory"),
    ("native over the cached events: read, fold", "trajectory"),
    ("native over the cached events: read, fold, values", "trajectory"),
    ("native over the cached events: assemble (the record)", "trajectory"),
    ("native store: fold", "trajectory"),
    ("native store: fold, values", "trajectory"),
    ("native store: assemble (the record)", "trajectory"),
    ("python: cached_copy (the owner's copy of an event)", "event"),
    ("native store: parse the payload", "event"),
    ("python, after assembly: compare with the stored record", "trajectory"),
    ("python, after assembly: its finish window and insert row", "trajectory"),
    ("python, after assembly: its derived message", "trajectory"),
)
"""Each step and what it is timed per. The last three are the derivation's other Python steps for each record it
writes (``streams.derive``), which native assembly handing back a ``TrajectoryRecord`` leaves in Python."""


@dataclass
class Result:
    """The probe's measurements: microseconds of CPU per trajectory or event, one list of repeats per step."""

    events: int
    trajectory_events: int
    trajectories: int
    objects: Check
    store: Check
    timings: dict[str, list[float]] = field(default_factory=dict)

    def median(self, step: str) -> float:
        return statistics.median(self.timings[step])


def _each(step: Callable[[Any], object], items: Sequence[Any]) -> None:
    """``step`` of every item, its results let go at once (kept, tens of thousands of them are memory the timing
    then pays for: records' messages took 11 µs each kept in a list against about 2 let go)."""
    for item in items:
        step(item)


def _cpu_us(call: Callable[[], object], count: int) -> float:
    began = time.process_time()
    call()
    return (time.process_time() - began) / count * 1e6


def measure(module: ModuleType, data: Corpus, config: AssemblyConfig, *, repeats: int,
            progress: Callable[[str], None] = log) -> Result:
    """Check both native ways, then time every step ``repeats`` times (alternated, the collector off, as timeit)."""
    probe = make_probe(module, data.timeline, config, data.copy_classes)
    store = module.Store()
    store.add(data.payloads)
    objects_check, store_check = check(probe, store, data, config)
    result = Result(data.events, len(data.payloads), len(data.groups), objects_check, store_check,
                    {step: [] for step, _ in STEPS})
    groups, ids, timeline = data.groups, data.trajectory_ids, data.timeline
    records = [r for r in (assemble(g, timeline, config) for g in groups) if r is not None]
    # The stored version each record is compared with: equal but for its revision, the last field compared.
    stored = [dataclasses.replace(r, revision=r.revision - 1) for r in records]
    window_s = DeriveConfig().window_s
    n, m = len(groups), len(data.payloads)
    calls: dict[str, tuple[Callable[[], object], int]] = {
        STEPS[0][0]: (lambda: _each(lambda g: assemble(g, timeline, config), groups), n),
        STEPS[1][0]: (lambda: _each(probe.read, groups), n),
        STEPS[2][0]: (lambda: _each(probe.fold, groups), n),
        STEPS[3][0]: (lambda: _each(probe.values, groups), n),
        STEPS[4][0]: (lambda: _each(probe.assemble, groups), n),
        STEPS[5][0]: (lambda: _each(lambda t: store.fold(probe, t), ids), n),
        STEPS[6][0]: (lambda: _each(lambda t: store.values(probe, t), ids), n),
        STEPS[7][0]: (lambda: _each(lambda t: store.assemble(probe, t), ids), n),
        STEPS[8][0]: (lambda: _each(cached_copy, data.originals), m),
        STEPS[9][0]: (lambda: module.Store().add(data.payloads), m),
        STEPS[10][0]: (lambda: _each(lambda pair: pair[0] != pair[1], list(zip(records, stored, strict=True))), n),
        STEPS[11][0]: (lambda: _each(lambda r: _record_row(r, _finish_window(r, window_s), 1), records), n),
        STEPS[12][0]: (lambda: _each(record_message, records), n),
    }
    enabled = gc.isenabled()
    try:
        for repeat in range(repeats):
            progress(f"  round {repeat + 1} of {repeats}")
            for step, (call, count) in calls.items():
                gc.collect()
                gc.disable()
                result.timings[step].append(_cpu_us(call, count))
                gc.enable()
    finally:
        if not enabled:
            gc.disable()
    return result


def report(result: Result) -> list[str]:
    """The probe's table and what it means per event of the worker."""
    per_trajectory = result.trajectory_events / result.trajectories
    lines = [
        f"{result.events:,} bench events, {result.trajectory_events:,} of them of {result.trajectories:,} "
        f"trajectories ({per_trajectory:.2f} events each); CPU per trajectory or event, median of "
        f"{len(next(iter(result.timings.values())))} rounds:",
        "",
        "| step | per | median µs | rounds (µs) |",
        "| --- | --- | --- | --- |",
    ]
    for step, unit in STEPS:
        rounds = " / ".join(f"{v:.2f}" for v in result.timings[step])
        lines.append(f"| {step} | {unit} | {result.median(step):.2f} | {rounds} |")
    python = result.median(STEPS[0][0])
    objects = result.median(STEPS[4][0])
    stored = result.median(STEPS[7][0])
    read = result.median(STEPS[1][0])
    values = result.median(STEPS[3][0]) - result.median(STEPS[2][0])
    record = objects - result.median(STEPS[3][0])
    after = sum(result.median(step) for step, _ in STEPS[10:])
    lines += [
        "",
        f"Records equal to Python's: over the cached events {result.objects.compared - result.objects.differing:,} "
        f"of {result.objects.compared:,}, from the store {result.store.compared - result.store.differing:,} of "
        f"{result.store.compared:,}" + (f" (differing, first few: {result.objects.examples} / {result.store.examples})"
                                        if result.objects.differing or result.store.differing else "") + ".",
        f"Over the cached events native assembly takes {objects:.2f} µs per trajectory against Python's {python:.2f} "
        f"({python / objects:.1f}x): reading the Python objects {read:.2f}, building the record's Python values "
        f"{values:.2f} and the record {record:.2f} of it. From the native store {stored:.2f} ({python / stored:.1f}x).",
        f"Per event of the run (a batch assembles each trajectory it touches once; {per_trajectory:.2f} events per "
        f"trajectory): Python {python / per_trajectory:.2f} µs, native over the cached events "
        f"{objects / per_trajectory:.2f}, from the store {stored / per_trajectory:.2f} (its parse "
        f"{result.median(STEPS[9][0]):.2f} µs per event in place of cached_copy's {result.median(STEPS[8][0]):.2f}).",
        f"After assembly the derivation's Python spends, per record it writes, {after:.2f} µs more (comparing it with "
        f"the stored record {result.median(STEPS[10][0]):.2f}, its finish window and insert row "
        f"{result.median(STEPS[11][0]):.2f}, its derived message {result.median(STEPS[12][0]):.2f}), "
        f"before the ClickHouse client encodes the row.",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.native_probe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=at_least(1000), default=150_000,
                        help="bench events of one run (default 150,000, the suite's replay log)")
    parser.add_argument("--repeats", type=at_least(1), default=5, help="timed rounds of every step (default 5)")
    parser.add_argument("--target-dir", type=Path, default=DEFAULT_TARGET,
                        help="where cargo builds the extension (default .data/native_probe)")
    args = parser.parse_args(argv)
    try:
        module = build(args.target_dir)
    except ProbeUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    log(f"  {args.events:,} bench events")
    data = corpus(args.events)
    result = measure(module, data, AssemblyConfig(), repeats=args.repeats)
    print("\n".join(report(result)))
    return 1 if result.objects.differing or result.store.differing else 0  # a differing record fails the run
