"""Traffic simulator: deterministic event generation from a scenario, and a paced publisher.

``generate(scenario)`` is pure: the same scenario and seed give the same events in the same
order, event ids included (every id, digest and draw comes from ``random.Random`` streams seeded
by the scenario; no wall clock, no ``uuid4``). ``publish`` sends any event iterable through a
producer, paced by wall clock (events/s) or by event time (an acceleration factor).

Exact allocation (``allocation: exact``) — ``expected_counts`` and ``generate`` share this plan,
so stored metrics can be checked against arithmetic:

1. Domains: ``n_d = LR(trajectories, domain weights)`` in the order the domains are listed.
2. Finish times: a domain's trajectory *j* (0-based) finishes at
   ``start + floor((2j+1) * span_us / (2 n_d))`` microseconds; version *v* is published at
   ``start + floor((v-1) * span_us / V)``. ``k`` = the newest version published at or before the
   finish. With ``V`` dividing ``n_d``, each finish slot ``k`` holds ``n_d / V`` trajectories.
3. Policy lag: within a domain's slot ``k`` (in finish order) the lags cycle ``a, a+1, …, b``
   (``async_lag: [a, b]``); the trajectory ran on version ``p = max(1, k - lag)``. So a slot of
   ``c`` trajectories gives each lag ``c // m`` trajectories plus one to the first ``c % m`` lags
   (``m = b - a + 1``); the realised lag is ``k - p``.
4. Outcomes, for each cell (domain, policy version p) of ``n`` finished trajectories:
   ``[env_failed, env_valid] = LR(n, [env_failure_rate, 1 - env_failure_rate])``;
   env failures by class ``= LR(env_failed, class weights)`` in the order written;
   ``[undecidable, digest_mismatch, decided] = LR(env_valid, [u, m, 1 - u - m])``;
   ``[passed, failed] = LR(decided, [pass_rate(p), 1 - pass_rate(p)])``;
   ``[model_errors, other] = LR(failed, [model_error_rate, 1 - model_error_rate])``.
   A domain's counts are the sums over its cells. Which trajectories of a cell get which outcome
   is a seeded shuffle; the counts do not depend on the seed.

``LR`` is the largest-remainder (Hamilton) method: with quotas ``q_i = total * w_i / sum(w)``
computed exactly in rational arithmetic (a rate written 0.3 is exactly 3/10), every category gets
``floor(q_i)``; the units left over go one each to the categories with the largest fractional
parts ``q_i - floor(q_i)``; equal fractional parts are served in list order (earlier first).

A domain's totals are sums over its cells, so with rates that do not divide a cell evenly they
can differ by rounding from one split of the whole domain (``golden.yaml`` has round cells).

Sample allocation (``allocation: sample``): finish times uniform over the span, domain drawn by
weight, lag uniform in ``[a, b]``, then the outcome drawn with the same rates;
``expected_counts`` returns the means.

Every trajectory: ``rollout_queued`` → ``rollout_started`` (policy version ``p``) → snapshots and
at most one ``interrupted``/``resumed`` pair → ``environment_failed`` for environment failures
(origin environment) and model errors (origin model, ``invalid_tool_call``) → ``rollout_finished``
(``oldest_policy_version = p``) → ``verification_finished`` ``verify_time`` later unless the environment
failed. Run events: ``run_configured`` at the start (normalised domain weights), versions 1..V
``version_published``, and ``batch_consumed`` when the trainer is on: decided trajectories are
consumed in verdict order, a batch ``delay`` after its last verdict, with ``trainer_version`` =
newest version published then. Delivery faults touch sandbox and verifier events only.

Times: a trajectory never starts before its policy version was published nor is queued before the
run's start, so run and wait times shorter than drawn occur for trajectories that finish soon
after their version's publication (lag 0) or in the run's first minutes. The simulator models no
mid-run policy update except after a ``stale_policy`` interruption: ``newest_policy_version`` is
the started version, or the newest version published at the resume of such an interruption.

Memory stays bounded by the events in flight (those within the longest wait + run time of the
newest finish), so runs of millions of events can be streamed.
"""

from __future__ import annotations

import heapq
import time
import uuid
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from fractions import Fraction
from itertools import accumulate
from random import Random
from typing import Any, Protocol, TypedDict

from producers.scenario import DomainSpec, Scenario
from schemas.base import Envelope, Origin, Producer, ProducerKind
from schemas.events import (
    BatchConsumed,
    EnvironmentFailed,
    InterruptReason,
    PolicyVersionPublished,
    RolloutFinished,
    RolloutInterrupted,
    RolloutQueued,
    RolloutResumed,
    RolloutStarted,
    RunConfigured,
    SnapshotTaken,
    Termination,
    Verdict,
    VerificationCheck,
    VerificationFinished,
)

__all__ = [
    "DomainCounts",
    "ExpectedCounts",
    "OutcomeCounts",
    "ProducerLike",
    "PublishReport",
    "expected_counts",
    "generate",
    "largest_remainder",
    "publish",
]

SIMULATOR_VERSION = "simulator-1"
"""Producer version stamped on every simulated event."""

_US = 1_000_000


def _exact(value: Fraction | int | float) -> Fraction:
    """A weight as an exact rational; a float counts as the decimal it was written as (0.3 -> 3/10)."""
    if isinstance(value, Fraction):
        return value
    if isinstance(value, int):
        return Fraction(value)
    return Fraction(repr(float(value)))


def largest_remainder(total: int, weights: Sequence[Fraction | int | float]) -> list[int]:
    """Split ``total`` into integer parts proportional to ``weights`` (Hamilton method, ties in list order).

    Quotas are exact rationals; each part gets the floor of its quota, and the units left over go
    to the largest fractional parts, the earlier category first when they are equal. Zero weights
    get nothing; ``total`` 0 gives zeros.
    """
    if total < 0:
        raise ValueError(f"total must be >= 0, got {total}")
    exact = [_exact(w) for w in weights]
    if any(w < 0 for w in exact):
        raise ValueError("weights must be >= 0")
    whole = sum(exact, Fraction(0))
    if whole == 0:
        if total == 0:
            return [0] * len(exact)
        raise ValueError("weights sum to zero")
    quotas = [total * w / whole for w in exact]
    counts = [q.numerator // q.denominator for q in quotas]
    left = total - sum(counts)
    order = sorted(range(len(exact)), key=lambda i: (counts[i] - quotas[i], i))
    for i in order[:left]:
        counts[i] += 1
    return counts


class OutcomeCounts(TypedDict):
    """Outcome counts of a set of finished trajectories (ints for exact allocation, means for sample)."""

    finished: float
    env_valid: float
    env_failed: float
    env_failures: dict[str, float]
    undecidable: float
    digest_mismatch: float
    decided: float
    passed: float
    failed: float
    model_errors: float


class DomainCounts(OutcomeCounts):
    """A domain's (or the run's) outcome counts, per policy version the trajectories ran on, and lags."""

    by_version: dict[int, OutcomeCounts]
    lag_versions: dict[int, float]


class ExpectedCounts(TypedDict):
    """What ``generate`` produces for a scenario, computed by arithmetic (see the module docstring)."""

    allocation: str
    trajectories: int
    domains: dict[str, DomainCounts]
    total: DomainCounts


_Split = Callable[[Fraction, Sequence[Fraction]], list[Fraction]]


def _split_exact(total: Fraction, weights: Sequence[Fraction]) -> list[Fraction]:
    return [Fraction(c) for c in largest_remainder(int(total), weights)]


def _split_mean(total: Fraction, weights: Sequence[Fraction]) -> list[Fraction]:
    whole = sum(weights, Fraction(0))
    return [total * w / whole if whole else Fraction(0) for w in weights]


@dataclass(slots=True)
class _Cell:
    """Outcome counts of one (domain, policy version) cell, in rationals until the end."""

    finished: Fraction = Fraction(0)
    env_valid: Fraction = Fraction(0)
    env_failed: Fraction = Fraction(0)
    env_failures: dict[str, Fraction] = field(default_factory=dict)
    undecidable: Fraction = Fraction(0)
    digest_mismatch: Fraction = Fraction(0)
    decided: Fraction = Fraction(0)
    passed: Fraction = Fraction(0)
    failed: Fraction = Fraction(0)
    model_errors: Fraction = Fraction(0)

    def add(self, other: _Cell) -> None:
        self.finished += other.finished
        self.env_valid += other.env_valid
        self.env_failed += other.env_failed
        for name, count in other.env_failures.items():
            self.env_failures[name] = self.env_failures.get(name, Fraction(0)) + count
        self.undecidable += other.undecidable
        self.digest_mismatch += other.digest_mismatch
        self.decided += other.decided
        self.passed += other.passed
        self.failed += other.failed
        self.model_errors += other.model_errors

    def render(self, exact: bool) -> OutcomeCounts:
        def num(x: Fraction) -> float:
            return int(x) if exact else float(x)

        return OutcomeCounts(
            finished=num(self.finished),
            env_valid=num(self.env_valid),
            env_failed=num(self.env_failed),
            env_failures={k: num(v) for k, v in self.env_failures.items()},
            undecidable=num(self.undecidable),
            digest_mismatch=num(self.digest_mismatch),
            decided=num(self.decided),
            passed=num(self.passed),
            failed=num(self.failed),
            model_errors=num(self.model_errors),
        )


def _cell(n: Fraction, domain: DomainSpec, version: int, split: _Split) -> _Cell:
    """Outcomes of ``n`` finished trajectories of a domain that ran on ``version`` (rule 4)."""
    one = Fraction(1)
    env_rate = _exact(domain.env_failure_rate)
    env_failed, env_valid = split(n, [env_rate, one - env_rate])
    names = list(domain.env_failure_classes)
    by_class = split(env_failed, [_exact(w) for w in domain.env_failure_classes.values()])
    undecidable_rate, mismatch_rate = _exact(domain.undecidable_rate), _exact(domain.digest_mismatch_rate)
    undecidable, mismatch, decided = split(
        env_valid, [undecidable_rate, mismatch_rate, one - undecidable_rate - mismatch_rate]
    )
    pass_rate = _exact(domain.pass_rate_for(version))
    passed, failed = split(decided, [pass_rate, one - pass_rate])
    model_rate = _exact(domain.model_error_rate)
    model_errors, _ = split(failed, [model_rate, one - model_rate])
    return _Cell(
        finished=n,
        env_valid=env_valid,
        env_failed=env_failed,
        env_failures={name: count for name, count in zip(names, by_class, strict=True) if count},
        undecidable=undecidable,
        digest_mismatch=mismatch,
        decided=decided,
        passed=passed,
        failed=failed,
        model_errors=model_errors,
    )


def _span_us(scenario: Scenario) -> int:
    return max(1, round(scenario.duration * _US))


def _publication_offsets(scenario: Scenario) -> list[int]:
    """Microseconds after the start at which versions 1..V are published (index v-1)."""
    span, versions = _span_us(scenario), scenario.policy.versions
    return [(v * span) // versions for v in range(versions)]


def _finished_before(offset: int, n: int, span: int) -> int:
    """How many of a domain's ``n`` evenly spread trajectories finish strictly before ``offset``."""
    # finish_j = floor((2j+1)·span / 2n) < offset  <=>  2j+1 <= (2n·offset - 1) // span
    largest_odd = (2 * n * offset - 1) // span
    return min(n, max(0, (largest_odd + 1) // 2))


@dataclass(frozen=True, slots=True)
class _DomainPlan:
    """Exact allocation of one domain: trajectories per finish slot and per (version, lag)."""

    trajectories: int
    slots: tuple[int, ...]  # trajectories whose newest version at finish is k (index k-1)
    cells: dict[int, int]  # policy version -> finished trajectories that ran on it
    lags: dict[int, int]  # realised policy lag in versions -> trajectories


def _domain_plan(scenario: Scenario, n: int) -> _DomainPlan:
    span = _span_us(scenario)
    offsets = _publication_offsets(scenario)
    versions = scenario.policy.versions
    low, high = scenario.policy.async_lag
    width = high - low + 1
    bounds = [_finished_before(o, n, span) for o in offsets] + [n]
    slots = tuple(bounds[k] - bounds[k - 1] for k in range(1, versions + 1))
    cells: dict[int, int] = {}
    lags: dict[int, int] = {}
    for k, count in enumerate(slots, start=1):
        for offset in range(width):
            share = count // width + (1 if offset < count % width else 0)
            if not share:
                continue
            version = max(1, k - (low + offset))
            cells[version] = cells.get(version, 0) + share
            lags[k - version] = lags.get(k - version, 0) + share
    return _DomainPlan(n, slots, dict(sorted(cells.items())), dict(sorted(lags.items())))


def _exact_plans(scenario: Scenario) -> list[_DomainPlan]:
    sizes = largest_remainder(scenario.trajectories, [d.weight for d in scenario.domains])
    return [_domain_plan(scenario, n) for n in sizes]


def expected_counts(scenario: Scenario) -> ExpectedCounts:
    """Outcome counts per domain and per domain × policy version, by arithmetic from the scenario.

    With ``allocation: exact`` these are the exact counts ``generate`` produces (ints); with
    ``sample`` they are the expected values (floats) of the random draws. Structure::

        {"allocation": "exact", "trajectories": 1000,
         "domains": {"code": {finished, env_valid, env_failed, env_failures: {class: n},
                              undecidable, digest_mismatch, decided, passed, failed, model_errors,
                              by_version: {1: {finished, ..., model_errors}, ...},
                              lag_versions: {0: n, 1: n, ...}}, ...},
         "total": {same keys as a domain, summed over domains}}

    ``decided`` excludes undecidable and digest-mismatch trajectories; ``failed`` includes
    ``model_errors``; ``env_failed`` = sum of ``env_failures``; ``lag_versions`` counts the
    realised policy lag (newest version at finish − version the trajectory ran on).
    """
    exact = scenario.allocation == "exact"
    cells_by_domain: list[dict[int, _Cell]] = []
    lags_by_domain: list[dict[int, Fraction]] = []
    if exact:
        for domain, plan in zip(scenario.domains, _exact_plans(scenario), strict=True):
            cells_by_domain.append({v: _cell(Fraction(n), domain, v, _split_exact) for v, n in plan.cells.items()})
            lags_by_domain.append({lag: Fraction(n) for lag, n in plan.lags.items()})
    else:
        shares, lag_shares = _version_shares(scenario)
        weights = [_exact(d.weight) for d in scenario.domains]
        whole = sum(weights, Fraction(0))
        for domain, weight in zip(scenario.domains, weights, strict=True):
            n = scenario.trajectories * weight / whole
            cells_by_domain.append({v: _cell(n * share, domain, v, _split_mean) for v, share in shares.items()})
            lags_by_domain.append({lag: n * share for lag, share in lag_shares.items()})

    domains: dict[str, DomainCounts] = {}
    run_total = _Cell()
    run_versions: dict[int, _Cell] = {}
    run_lags: dict[int, Fraction] = {}
    for domain, cells, lags in zip(scenario.domains, cells_by_domain, lags_by_domain, strict=True):
        total = _Cell()
        for version, cell in cells.items():
            total.add(cell)
            run_versions.setdefault(version, _Cell()).add(cell)
        run_total.add(total)
        for lag, n in lags.items():
            run_lags[lag] = run_lags.get(lag, Fraction(0)) + n
        domains[domain.name] = _domain_counts(total, cells, lags, exact)
    return ExpectedCounts(
        allocation=scenario.allocation,
        trajectories=scenario.trajectories,
        domains=domains,
        total=_domain_counts(run_total, run_versions, run_lags, exact),
    )


def _domain_counts(total: _Cell, cells: dict[int, _Cell], lags: dict[int, Fraction], exact: bool) -> DomainCounts:
    rendered = total.render(exact)
    return DomainCounts(
        finished=rendered["finished"],
        env_valid=rendered["env_valid"],
        env_failed=rendered["env_failed"],
        env_failures=rendered["env_failures"],
        undecidable=rendered["undecidable"],
        digest_mismatch=rendered["digest_mismatch"],
        decided=rendered["decided"],
        passed=rendered["passed"],
        failed=rendered["failed"],
        model_errors=rendered["model_errors"],
        by_version={v: cells[v].render(exact) for v in sorted(cells)},
        lag_versions={lag: (int(n) if exact else float(n)) for lag, n in sorted(lags.items())},
    )


def _version_shares(scenario: Scenario) -> tuple[dict[int, Fraction], dict[int, Fraction]]:
    """Share of trajectories per policy version and per realised lag when finish times are uniform."""
    versions = scenario.policy.versions
    low, high = scenario.policy.async_lag
    unit = Fraction(1, versions * (high - low + 1))
    shares: dict[int, Fraction] = {}
    lags: dict[int, Fraction] = {}
    for k in range(1, versions + 1):
        for lag in range(low, high + 1):
            version = max(1, k - lag)
            shares[version] = shares.get(version, Fraction(0)) + unit
            lags[k - version] = lags.get(k - version, Fraction(0)) + unit
    return dict(sorted(shares.items())), dict(sorted(lags.items()))


# Outcome codes of one trajectory; environment failure classes follow from _ENV on.
_PASSED, _FAILED, _MODEL_ERROR, _UNDECIDABLE, _MISMATCH, _ENV = range(6)

_RETRYABLE = frozenset({"dependency_unreachable", "sandbox_crash", "timeout", "resource_exhausted"})
_DETAILS = {
    "dependency_unreachable": "package index unreachable: connection timed out",
    "license_prompt": "tool blocked on an interactive licence prompt",
    "data_missing": "fixture file the task needs is missing",
    "sandbox_crash": "sandbox process exited unexpectedly",
    "timeout": "environment did not answer in time",
    "resource_exhausted": "out of memory",
}
_MODEL_ERROR_CLASS = "invalid_tool_call"
_MODEL_ERROR_DETAIL = "tool called with arguments that do not match its schema"
_CHECKS: dict[str, tuple[VerificationCheck, ...]] = {
    Verdict.PASSED.value: (VerificationCheck(name="build", passed=True), VerificationCheck(name="tests", passed=True)),
    Verdict.FAILED.value: (VerificationCheck(name="build", passed=True), VerificationCheck(name="tests", passed=False)),
    Verdict.UNDECIDABLE.value: (VerificationCheck(name="build", passed=True),),
}
_REWARDS: dict[str, float | None] = {Verdict.PASSED.value: 1.0, Verdict.FAILED.value: 0.0}

# Kinds of pending events. A pending event is a tuple of plain values (ints, strings, floats),
# and its model is built only when the event is released: the in-flight window then holds no
# container the cyclic garbage collector keeps re-scanning, which keeps large runs fast.
(_QUEUED, _STARTED, _SNAPSHOT, _INTERRUPTED, _RESUMED, _FAILURE, _FINISHED, _VERIFIED, _RUN, _VERSION, _BATCH) = range(
    11
)
_Pending = tuple[int, int, int, int, int, tuple[Any, ...]]
"""(publish at, priority, sequence, kind, occurred at, arguments); offsets in µs after the start."""

_BUCKET_US = 1_000_000
"""Pending events wait in one-second buckets of publish time, each sorted once when released:
cheaper than one large heap when hundreds of thousands of events are in flight."""


@dataclass(slots=True)
class _Domain:
    """A domain's settings turned into the integers and objects the hot loop needs."""

    spec: DomainSpec
    name: str
    run_us: tuple[int, int]
    wait_us: tuple[int, int]
    verify_us: tuple[int, int]
    tasks: int
    classes: tuple[str, ...]
    sandbox: Producer
    verifier: Producer
    verifier_id: str
    reasons: tuple[str, ...]
    reason_weights: tuple[float, ...]  # cumulative
    class_weights: tuple[float, ...]  # cumulative, for sampled failure classes


def _us_range(value: tuple[float, float]) -> tuple[int, int]:
    return round(value[0] * _US), round(value[1] * _US)


class _Generator:
    """Builds one scenario's events; trajectories are made in finish order and released by watermark."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        seed = scenario.seed
        # Independent streams, so that e.g. turning on delivery faults changes nothing else.
        self.draw = Random(f"{seed}:draw")
        self.ids = Random(f"{seed}:ids")
        self.shuffle = Random(f"{seed}:shuffle")
        self.faults = Random(f"{seed}:delivery")
        self.t0 = scenario.start
        self.run_id = scenario.run_id
        self.span = _span_us(scenario)
        self.pub = _publication_offsets(scenario)
        self.buckets: dict[int, list[_Pending]] = {}
        self.bucket_numbers: list[int] = []  # heap of the buckets not yet released
        self.seq = 0
        whole = sum(d.weight for d in scenario.domains)
        self.domains = [self._domain(spec, spec.weight / whole) for spec in scenario.domains]
        self.backlog = max(d.wait_us[1] + d.run_us[1] for d in self.domains) + 1
        delivery = scenario.delivery
        self.late_rate = delivery.late_rate
        self.duplicate_rate = delivery.duplicate_rate
        self.late_by = max(1, round(delivery.late_by * _US))
        self.faulty = delivery.late_rate > 0 or delivery.duplicate_rate > 0
        training = scenario.training
        self.batch_size = training.batch_size if training else 0
        self.batch_delay = round(training.delay * _US) if training else 0
        self.verdicts: list[tuple[int, int, str]] = []  # (verdict time, seq, trajectory) to consume
        self.batch: list[str] = []
        self.batch_ready = 0
        self.trainer = Producer(kind=ProducerKind.TRAINER, id="simulated-trainer", version=SIMULATOR_VERSION)
        self.policy = Producer(kind=ProducerKind.POLICY, id="simulated-policy", version=SIMULATOR_VERSION)
        self.builders: tuple[Callable[[int, tuple[Any, ...]], Envelope], ...] = (
            self._queued,
            self._started,
            self._snapshot,
            self._interrupted,
            self._resumed,
            self._failure,
            self._finished,
            self._verified,
            self._run,
            self._version,
            self._batch,
        )

    def _domain(self, spec: DomainSpec, share: float) -> _Domain:
        sandbox_id, verifier_id = f"sandbox-{spec.name}"[:200], f"verifier-{spec.name}"[:200]
        return _Domain(
            spec=spec,
            name=spec.name,
            run_us=_us_range(spec.run_time),
            wait_us=_us_range(spec.wait_time),
            verify_us=_us_range(spec.verify_time),
            tasks=max(1, int(self.scenario.trajectories * share // 4)),
            classes=tuple(spec.env_failure_classes),
            sandbox=Producer(kind=ProducerKind.SANDBOX, id=sandbox_id, version=SIMULATOR_VERSION),
            verifier=Producer(kind=ProducerKind.VERIFIER, id=verifier_id, version=spec.verifier_version),
            verifier_id=verifier_id,
            reasons=tuple(reason.value for reason in spec.interrupt_reasons),
            reason_weights=tuple(accumulate(spec.interrupt_reasons.values())),
            class_weights=tuple(accumulate(spec.env_failure_classes.values())),
        )

    def _digest(self) -> str:
        return f"sha256:{self.ids.getrandbits(256):064x}"

    def _put(self, entry: _Pending) -> None:
        number = entry[0] // _BUCKET_US
        bucket = self.buckets.get(number)
        if bucket is None:
            self.buckets[number] = bucket = []
            heapq.heappush(self.bucket_numbers, number)
        bucket.append(entry)

    def _hold(self, offset: int, kind: int, args: tuple[Any, ...], priority: int = 1) -> None:
        """Queue a run, policy or trainer event: delivered once, in event-time order."""
        self.seq += 1
        self._put((offset, priority, self.seq, kind, offset, args))

    def _emit(self, offset: int, kind: int, args: tuple[Any, ...]) -> None:
        """Queue a sandbox or verifier event, applying the scenario's delivery faults."""
        self.seq += 1
        if not self.faulty:
            number = offset // _BUCKET_US
            bucket = self.buckets.get(number)
            if bucket is None:
                self.buckets[number] = bucket = []
                heapq.heappush(self.bucket_numbers, number)
            bucket.append((offset, 1, self.seq, kind, offset, args))
            return
        faults = self.faults
        publish_at = offset
        if faults.random() < self.late_rate:
            publish_at = offset + 1 + int(faults.random() * self.late_by)
        self._put((publish_at, 1, self.seq, kind, offset, args))
        if faults.random() < self.duplicate_rate:
            self.seq += 1
            again = offset + 1 + int(faults.random() * self.late_by)
            self._put((again, 1, self.seq, kind, offset, args))

    def _release(self, before: int | None) -> Iterator[Envelope]:
        """Build and yield, in publish order, the events of every bucket wholly before ``before`` (all: None)."""
        numbers, buckets, build = self.bucket_numbers, self.buckets, self.builders
        limit = None if before is None else before // _BUCKET_US
        while numbers and (limit is None or numbers[0] < limit):
            bucket = buckets.pop(heapq.heappop(numbers))
            bucket.sort()
            for _, _, _, kind, occurred, args in bucket:
                yield build[kind](occurred, args)

    # -- the run ----------------------------------------------------------------------------

    def events(self) -> Iterator[Envelope]:
        scenario = self.scenario
        whole = sum(d.weight for d in scenario.domains)
        weights = {d.name: d.weight / whole for d in scenario.domains}
        self._hold(0, _RUN, (self.ids.getrandbits(128), weights), priority=0)
        for version, offset in enumerate(self.pub, start=1):
            self._hold(offset, _VERSION, (self.ids.getrandbits(128), version, self._digest()), priority=0)
        numbers = self.bucket_numbers
        backlog = self.backlog
        previous = -1
        for finish, domain, version, outcome in self._trajectories():
            # Everything still to come happens at or after min(finish - backlog, previous + 1).
            watermark = min(finish - backlog, previous + 1)
            if numbers and numbers[0] < watermark // _BUCKET_US:
                yield from self._release(watermark)
            if self.batch_size:
                self._consume_until(finish)
            self._trajectory(domain, finish, version, outcome)
            previous = finish
        if self.batch_size:
            self._consume_until(None)
            if self.batch:
                self._emit_batch()
        yield from self._release(None)

    def _trajectories(self) -> Iterator[tuple[int, int, int, int]]:
        """(finish offset, domain index, policy version, outcome code) in finish order."""
        if self.scenario.allocation == "exact":
            yield from self._exact_trajectories()
        else:
            yield from self._sampled_trajectories()

    def _exact_trajectories(self) -> Iterator[tuple[int, int, int, int]]:
        scenario = self.scenario
        plans = _exact_plans(scenario)
        # Outcome codes per (domain, version) cell with exact counts, in seeded random order.
        pools: list[dict[int, list[int]]] = []
        for spec, plan in zip(scenario.domains, plans, strict=True):
            pools_of_domain: dict[int, list[int]] = {}
            for version, n in plan.cells.items():
                cell = _cell(Fraction(n), spec, version, _split_exact)
                codes = [_PASSED] * int(cell.passed)
                codes += [_MODEL_ERROR] * int(cell.model_errors)
                codes += [_FAILED] * int(cell.failed - cell.model_errors)
                codes += [_UNDECIDABLE] * int(cell.undecidable)
                codes += [_MISMATCH] * int(cell.digest_mismatch)
                for index, name in enumerate(spec.env_failure_classes):
                    codes += [_ENV + index] * int(cell.env_failures.get(name, 0))
                self.shuffle.shuffle(codes)
                pools_of_domain[version] = codes
            pools.append(pools_of_domain)
        streams = [self._exact_finishes(index, plan.trajectories) for index, plan in enumerate(plans)]
        for finish, index, _, version in heapq.merge(*streams):
            yield finish, index, version, pools[index][version].pop()

    def _exact_finishes(self, index: int, n: int) -> Iterator[tuple[int, int, int, int]]:
        """(finish offset, domain index, j, policy version) of a domain's evenly spread trajectories."""
        span, pub = self.span, self.pub
        versions = len(pub)
        low, high = self.scenario.policy.async_lag
        width = high - low + 1
        slot, slot_first = 1, 0
        next_publication = pub[1] if versions > 1 else None
        for j in range(n):
            finish = ((2 * j + 1) * span) // (2 * n)
            while next_publication is not None and finish >= next_publication:
                slot += 1
                slot_first = j
                next_publication = pub[slot] if slot < versions else None
            lag = low + (j - slot_first) % width
            yield finish, index, j, max(1, slot - lag)

    def _sampled_trajectories(self) -> Iterator[tuple[int, int, int, int]]:
        scenario = self.scenario
        draw = self.draw
        span, pub = self.span, self.pub
        low, high = scenario.policy.async_lag
        cumulative = list(accumulate(d.weight for d in scenario.domains))
        whole, last = cumulative[-1], len(cumulative) - 1
        finishes = sorted(draw.randrange(span) for _ in range(scenario.trajectories))
        for finish in finishes:
            index = min(bisect_right(cumulative, draw.random() * whole), last)
            version = max(1, bisect_right(pub, finish) - draw.randint(low, high))
            yield finish, index, version, self._sampled_outcome(self.domains[index], version)

    def _sampled_outcome(self, domain: _Domain, version: int) -> int:
        spec, draw = domain.spec, self.draw
        if draw.random() < spec.env_failure_rate:
            weights = domain.class_weights
            return _ENV + min(bisect_right(weights, draw.random() * weights[-1]), len(weights) - 1)
        u = draw.random()
        if u < spec.undecidable_rate:
            return _UNDECIDABLE
        if u < spec.undecidable_rate + spec.digest_mismatch_rate:
            return _MISMATCH
        if draw.random() < spec.pass_rate_for(version):
            return _PASSED
        return _MODEL_ERROR if draw.random() < spec.model_error_rate else _FAILED

    def _trajectory(self, index: int, finish: int, version: int, outcome: int) -> None:
        """Queue every event of one trajectory, from queued to verdict."""
        domain = self.domains[index]
        draw, bits, spec, emit = self.draw, self.ids.getrandbits, domain.spec, self._emit
        # Never start before the version was published (nor queue before the run started).
        available = finish - self.pub[version - 1]
        low, high = domain.run_us
        if available >= low:
            run = low + int(draw.random() * ((high if high < available else available) - low))
        else:
            run = available
        started = finish - run
        low, high = domain.wait_us
        queued = max(0, started - low - int(draw.random() * (high - low)))
        trajectory = f"tr-{bits(64):016x}"
        low, high = spec.steps
        # low + int(random() * n) rather than randint(): a third of the cost, and as uniform here.
        steps = low + int(draw.random() * (high - low + 1))
        low, high = spec.tokens_per_step
        tokens = steps * (low + int(draw.random() * (high - low + 1)))

        emit(
            queued,
            _QUEUED,
            (bits(128), index, trajectory, f"{domain.name}-task-{int(draw.random() * domain.tasks):05d}"),
        )
        emit(started, _STARTED, (bits(128), index, trajectory, version, f"sbx-{bits(48):012x}"))
        newest = version
        snapshots = spec.snapshot_rate > 0 and draw.random() < spec.snapshot_rate
        interrupted = spec.interrupt_rate > 0 and draw.random() < spec.interrupt_rate
        if snapshots or interrupted:
            newest = self._snapshots(index, trajectory, started, run, steps, version, snapshots, interrupted)

        if outcome >= _ENV:
            failure_class = domain.classes[outcome - _ENV]
            emit(started + (run * 24) // 25, _FAILURE, (bits(128), index, trajectory, failure_class, False))
            termination = Termination.ENVIRONMENT_FAILURE.value
        elif outcome == _MODEL_ERROR:
            emit(started + (run * 24) // 25, _FAILURE, (bits(128), index, trajectory, _MODEL_ERROR_CLASS, True))
            termination = Termination.AGENT_ERROR.value
        elif outcome == _FAILED:
            termination = (Termination.MAX_STEPS if draw.random() < 0.25 else Termination.COMPLETED).value
        elif outcome == _UNDECIDABLE:
            termination = (Termination.MAX_TOKENS if draw.random() < 0.3 else Termination.COMPLETED).value
        else:
            termination = Termination.COMPLETED.value
        artifact = self._digest() if outcome < _ENV else None
        emit(
            finish,
            _FINISHED,
            (bits(128), index, trajectory, termination, steps, tokens, artifact, version, newest),
        )
        if artifact is None:
            return

        low, high = domain.verify_us
        delay = low + int(draw.random() * (high - low))
        verified_at = finish + delay
        checked = artifact
        if outcome == _PASSED:
            verdict = Verdict.PASSED.value
        elif outcome in (_FAILED, _MODEL_ERROR):
            verdict = Verdict.FAILED.value
        elif outcome == _UNDECIDABLE:
            verdict = Verdict.UNDECIDABLE.value
        else:
            # The verifier looked at another artifact than the one the sandbox finished with.
            passed = draw.random() < spec.pass_rate_for(version)
            verdict = (Verdict.PASSED if passed else Verdict.FAILED).value
            checked = self._digest()
        emit(verified_at, _VERIFIED, (bits(128), index, trajectory, verdict, checked, round(delay * 0.8 / _US, 3)))
        if self.batch_size and outcome <= _MODEL_ERROR:
            self.seq += 1
            heapq.heappush(self.verdicts, (verified_at, self.seq, trajectory))

    def _snapshots(
        self,
        index: int,
        trajectory: str,
        started: int,
        run: int,
        steps: int,
        version: int,
        snapshots: bool,
        interrupted: bool,
    ) -> int:
        """Queue snapshots, and an interruption with its resume; returns the newest policy version used."""
        domain = self.domains[index]
        draw, bits, spec, emit = self.draw, self.ids.getrandbits, domain.spec, self._emit
        count = draw.randint(*spec.snapshots_per_trajectory) if snapshots else 1
        positions = sorted(0.05 + 0.85 * draw.random() for _ in range(count))
        cut = draw.randrange(count) if interrupted else -1
        newest = version
        for position_index, position in enumerate(positions):
            snapshot_id = f"snap-{bits(64):016x}"
            step = int(position * steps)
            emit(
                started + int(position * run),
                _SNAPSHOT,
                (
                    bits(128),
                    index,
                    trajectory,
                    snapshot_id,
                    step,
                    self._digest(),
                    self._digest(),
                    draw.randint(5_000_000, 800_000_000),
                    round(0.2 + 10 * draw.random(), 3),
                ),
            )
            if position_index != cut:
                continue
            following = positions[position_index + 1] if position_index + 1 < count else 0.92
            interrupted_at = started + int((position + (following - position) * 0.3) * run)
            resumed_at = started + int((position + (following - position) * 0.6) * run)
            reason = draw.choices(domain.reasons, cum_weights=domain.reason_weights)[0]
            succeeded = draw.random() >= spec.resume_failure_rate
            emit(interrupted_at, _INTERRUPTED, (bits(128), index, trajectory, reason, min(steps, step + 1)))
            restored = step if succeeded else 0
            emit(resumed_at, _RESUMED, (bits(128), index, trajectory, snapshot_id, restored, succeeded))
            if reason == InterruptReason.STALE_POLICY.value:
                newest = max(version, bisect_right(self.pub, resumed_at))
        return newest

    def _consume_until(self, until: int | None) -> None:
        """Hand verdicts given at or before ``until`` (all when None) to the trainer, in verdict order."""
        verdicts = self.verdicts
        while verdicts and (until is None or verdicts[0][0] <= until):
            verified_at, _, trajectory = heapq.heappop(verdicts)
            self.batch.append(trajectory)
            self.batch_ready = verified_at
            if len(self.batch) >= self.batch_size:
                self._emit_batch()

    def _emit_batch(self) -> None:
        consumed_at = self.batch_ready + self.batch_delay
        args = (
            self.ids.getrandbits(128),
            f"batch-{self.ids.getrandbits(64):016x}",
            bisect_right(self.pub, consumed_at),
            tuple(self.batch),
        )
        self._hold(consumed_at, _BATCH, args)
        self.batch = []

    # -- building the models when events are released ---------------------------------------

    def _at(self, offset: int) -> datetime:
        return self.t0 + timedelta(microseconds=offset)

    def _shared(self, occurred: int, event_id: int, index: int, trajectory: str,
                    verifier: bool = False) -> dict[str, Any]:
        """The envelope and trajectory fields every sandbox or verifier event of one trajectory shares."""
        domain = self.domains[index]
        return {
            "event_id": uuid.UUID(int=event_id, version=4),
            "occurred_at": self._at(occurred),
            "run_id": self.run_id,
            "producer": domain.verifier if verifier else domain.sandbox,
            "trajectory_id": trajectory,
            "domain": domain.name,
        }

    def _run_level(self, occurred: int, event_id: int) -> dict[str, Any]:
        """The envelope fields of a policy or trainer event."""
        return {"event_id": uuid.UUID(int=event_id, version=4), "occurred_at": self._at(occurred),
                "run_id": self.run_id, "producer": self.policy}

    def _queued(self, occurred: int, args: tuple[Any, ...]) -> Envelope:
        event_id, index, trajectory, task_id = args
        return RolloutQueued(
            **self._shared(occurred, event_id, index, trajectory),
            task_id=task_id,
            environment_version=self.domains[index].spec.environment_version,
        )

    def _started(self, occurred: int, args: tuple[Any, ...]) -> Envelope:
        event_id, index, trajectory, version, sandbox_id = args
        return RolloutStarted(
            **self._shared(occurred, event_id, index, trajectory),
            policy_version=version,
            sandbox_id=sandbox_id,
            sandbox_pool="default",
        )

    def _snapshot(self, occurred: int, args: tuple[Any, ...]) -> Envelope:
        event_id, index, trajectory, snapshot_id, step, filesystem, context, size, seconds = args
        return SnapshotTaken(
            **self._shared(occurred, event_id, index, trajectory),
            snapshot_id=snapshot_id,
            step=step,
            filesystem_digest=filesystem,
            context_digest=context,
            bytes=size,
            duration_s=seconds,
        )

    def _interrupted(self, occurred: int, args: tuple[Any, ...]) -> Envelope:
        event_id, index, trajectory, reason, step = args
        return RolloutInterrupted(
            **self._shared(occurred, event_id, index, trajectory),
            reason=reason,
            step=step,
        )

    def _resumed(self, occurred: int, args: tuple[Any, ...]) -> Envelope:
        event_id, index, trajectory, snapshot_id, restored, succeeded = args
        return RolloutResumed(
            **self._shared(occurred, event_id, index, trajectory),
            snapshot_id=snapshot_id,
            steps_restored=restored,
            succeeded=succeeded,
        )

    def _failure(self, occurred: int, args: tuple[Any, ...]) -> Envelope:
        event_id, index, trajectory, failure_class, by_model = args
        domain = self.domains[index]
        environment = domain.spec.environment_version
        if by_model:
            origin, detail = Origin.MODEL, _MODEL_ERROR_DETAIL
        else:
            origin, detail = Origin.ENVIRONMENT, _DETAILS.get(failure_class, f"{failure_class} in {environment}")
        return EnvironmentFailed(
            **self._shared(occurred, event_id, index, trajectory),
            failure_class=failure_class,
            origin=origin,
            detail=detail,
            retryable=failure_class in _RETRYABLE,
            environment_version=environment,
        )

    def _finished(self, occurred: int, args: tuple[Any, ...]) -> Envelope:
        event_id, index, trajectory, termination, steps, tokens, artifact, oldest, newest = args
        return RolloutFinished(
            **self._shared(occurred, event_id, index, trajectory),
            termination=termination,
            steps=steps,
            tokens=tokens,
            artifact_digest=artifact,
            oldest_policy_version=oldest,
            newest_policy_version=newest,
        )

    def _verified(self, occurred: int, args: tuple[Any, ...]) -> Envelope:
        event_id, index, trajectory, verdict, checked, seconds = args
        return VerificationFinished(
            **self._shared(occurred, event_id, index, trajectory, verifier=True),
            verifier_id=self.domains[index].verifier_id,
            verifier_version=self.domains[index].spec.verifier_version,
            verdict=verdict,
            reward=_REWARDS.get(verdict),
            artifact_digest=checked,
            checks=_CHECKS[verdict],
            duration_s=seconds,
        )

    def _run(self, occurred: int, args: tuple[Any, ...]) -> Envelope:
        event_id, weights = args
        return RunConfigured(
            **self._run_level(occurred, event_id),
            domain_weights=weights,
            staleness_bound=self.scenario.staleness_bound,
        )

    def _version(self, occurred: int, args: tuple[Any, ...]) -> Envelope:
        event_id, version, checkpoint = args
        return PolicyVersionPublished(
            **self._run_level(occurred, event_id),
            version=version,
            checkpoint_digest=checkpoint,
        )

    def _batch(self, occurred: int, args: tuple[Any, ...]) -> Envelope:
        event_id, batch_id, trainer_version, trajectories = args
        return BatchConsumed(
            event_id=uuid.UUID(int=event_id, version=4),
            occurred_at=self._at(occurred),
            run_id=self.run_id,
            producer=self.trainer,
            batch_id=batch_id,
            trainer_version=trainer_version,
            trajectory_ids=trajectories,
        )


def generate(scenario: Scenario) -> Iterator[Envelope]:
    """The scenario's events in publish order (event time, except injected late and duplicate events).

    Deterministic for a scenario and seed, event ids included. Lazy: memory stays bounded by the
    events of the trajectories in flight, so very large scenarios can be streamed; ``list()`` it
    for small ones.
    """
    return _Generator(scenario).events()


class ProducerLike(Protocol):
    """What ``publish`` needs from a producer (``producers.kafka.EventProducer`` fits)."""

    def send(self, event: Envelope) -> None:
        """Queue one event for delivery without blocking."""

    def poll(self, timeout: float = 0.0) -> int:
        """Serve delivery callbacks."""

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until everything queued is delivered."""


@dataclass(frozen=True, slots=True)
class PublishReport:
    """What ``publish`` sent: messages (duplicates included), per event type, and how long it took."""

    published: int
    seconds: float
    by_type: dict[str, int]

    @property
    def events_per_second(self) -> float:
        """Mean publishing rate over the whole call, flush included."""
        return self.published / self.seconds if self.seconds > 0 else float("inf")


def publish(
    events: Iterable[Envelope],
    producer: ProducerLike,
    *,
    rate: float | None = None,
    speed: float | None = None,
    progress: Callable[[int, int], None] | None = None,
    total: int | None = None,
    poll_every: int = 500,
    flush_timeout: float = 60.0,
) -> PublishReport:
    """Send events through ``producer``, then flush (which raises when anything was not delivered).

    ``rate`` paces by wall clock (events per second); ``speed`` paces by event time (60 plays one
    hour of events in one minute; late events go out at once); neither sends as fast as possible.
    ``progress(published, total)`` is called every ``poll_every`` events and at the end; ``total``
    defaults to ``len(events)`` when known, else 0 (unknown).
    """
    if rate is not None and speed is not None:
        raise ValueError("pace by rate or by speed, not both")
    if rate is not None and not rate > 0:
        raise ValueError(f"rate must be > 0 events/s, got {rate}")
    if speed is not None and not speed > 0:
        raise ValueError(f"speed must be > 0, got {speed}")
    if total is None:
        total = len(events) if isinstance(events, Sized) else 0
    clock = time.monotonic
    began = clock()
    by_type: Counter[str] = Counter()
    first_time: datetime | None = None
    newest_time: datetime | None = None
    published = 0
    for event in events:
        due: float | None = None
        if rate is not None:
            due = began + published / rate
        elif speed is not None:
            occurred = event.occurred_at
            if first_time is None or newest_time is None:
                first_time = newest_time = occurred
            elif occurred > newest_time:
                newest_time = occurred
            due = began + (newest_time - first_time).total_seconds() / speed
        if due is not None:
            _wait_until(due, producer, clock)
        _send(producer, event)
        published += 1
        by_type[event.event_type] += 1  # type: ignore[attr-defined]
        if published % poll_every == 0:
            producer.poll(0)
            if progress is not None:
                progress(published, total)
    producer.flush(flush_timeout)
    if progress is not None:
        progress(published, total)
    return PublishReport(published=published, seconds=clock() - began, by_type=dict(by_type))


def _send(producer: ProducerLike, event: Envelope) -> None:
    """Send, waiting for room when the client's local queue is full."""
    while True:
        try:
            producer.send(event)
            return
        except BufferError:
            producer.poll(0.1)


def _wait_until(due: float, producer: ProducerLike, clock: Callable[[], float]) -> None:
    """Sleep until ``due`` while serving delivery callbacks."""
    remaining = due - clock()
    while remaining > 0.001:
        producer.poll(0)
        time.sleep(min(remaining, 0.05))
        remaining = due - clock()
