"""Per-domain pass-rate regressions between policy versions (pure logic, no I/O)."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

from rollout.errors import PermanentError

ALERT_NAMESPACE = uuid.UUID("a793a749-482f-42a0-8140-01a152827af5")

# Rates are ratios of integers, so a drop of exactly ``min_drop`` (0.6 - 0.5 against 0.1) can land a
# hair below it in floating point; this tolerance keeps such boundary cases on the alerting side.
_DROP_TOLERANCE = 1e-9


class InvalidCounts(PermanentError, ValueError):
    """Counts or settings given to the regression check are impossible; the message says which."""


@dataclass(frozen=True, slots=True)
class RegressionConfig:
    """Thresholds of the regression check: sample size, size of the drop and significance level."""

    min_decided: int = 30
    min_drop: float = 0.10
    alpha: float = 0.01

    def __post_init__(self) -> None:
        if self.min_decided < 1:
            raise InvalidCounts(f"min_decided must be at least 1, got {self.min_decided}")
        if not 0.0 <= self.min_drop <= 1.0:
            raise InvalidCounts(f"min_drop must be between 0 and 1, got {self.min_drop}")
        if not 0.0 < self.alpha < 1.0:
            raise InvalidCounts(f"alpha must be strictly between 0 and 1, got {self.alpha}")


def look_level(candidate_decided: int, config: RegressionConfig) -> float:
    """The one-look p-value a candidate of this many decided trajectories must stay under to alert.

    The check runs again after every batch on growing counts, and each look is another chance of a
    false alarm (at ``alpha`` per look, a stable version watched from 30 to 1,000 decided
    trajectories after every one alerts about 6% of the time). So ``alpha`` is spent over doublings
    of the candidate's decided count: block k (``min_decided * 2**(k-1)`` up to twice that) gets
    ``alpha * 6 / (pi**2 * k**2)`` (the blocks sum to ``alpha``), and within a block the one-look
    threshold ``c`` solves ``1 - Phi(c) + ln(2) * c * phi(c) / 2 = alpha_k``: Siegmund's
    approximation of the chance that the z-statistic of a continuously watched stable version
    crosses ``c`` anywhere in the block (the z-statistic in log-sample-size is an Ornstein-Uhlenbeck
    process; checks after batches look less often, so this errs on the safe side). The level depends
    on the counts alone, so results still do not depend on batching.
    """
    if candidate_decided < config.min_decided:
        raise InvalidCounts(f"a look needs at least {config.min_decided} decided trajectories, "
                            f"got {candidate_decided}")
    block = (candidate_decided // config.min_decided).bit_length()
    return _block_level(config.alpha, block)


@lru_cache(maxsize=256)
def _block_level(alpha: float, block: int) -> float:
    spent = alpha * 6.0 / (math.pi ** 2 * block * block)
    normal = NormalDist()
    low, high = 0.0, 40.0  # crossing chance falls from about 1 to below any float alpha_k
    for _ in range(100):
        c = (low + high) / 2.0
        crossing = _upper_tail(c) + math.log(2.0) * c * normal.pdf(c) / 2.0
        if crossing > spent:
            low = c
        else:
            high = c
    return _upper_tail(high)


def _upper_tail(z: float) -> float:
    """P(Z > z) for a standard normal Z, accurate far into the tail."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


@dataclass(frozen=True, slots=True)
class VersionCounts:
    """Decided and passed trajectories of one policy version (in one domain, or in the whole run)."""

    policy_version: int
    decided: int
    passed: int


@dataclass(frozen=True, slots=True)
class RegressionAlert:
    """A domain whose pass rate dropped on a policy version, with the evidence for it."""

    alert_id: str
    run_id: str
    domain: str
    policy_version: int
    baseline_versions: tuple[int, ...]
    baseline_decided: int
    baseline_passed: int
    baseline_pass_rate: float
    candidate_decided: int
    candidate_passed: int
    candidate_pass_rate: float
    drop: float
    z: float
    p_value: float
    overall_baseline_pass_rate: float | None
    overall_candidate_pass_rate: float | None
    overall_rose: bool


def alert_id(run_id: str, domain: str, policy_version: int) -> str:
    """The stable id of the alert for one run, domain and candidate version, so re-emission is idempotent."""
    return str(uuid.uuid5(ALERT_NAMESPACE, f"{run_id}|{domain}|{policy_version}"))


def two_proportion_p_value(base_passed: int, base_n: int, cand_passed: int, cand_n: int) -> tuple[float, float]:
    """One-sided pooled two-proportion z-test of "candidate rate < baseline rate"; returns (z, p_value)."""
    _check_counts("baseline", base_n, base_passed)
    _check_counts("candidate", cand_n, cand_passed)
    if base_n == 0 or cand_n == 0:
        raise InvalidCounts(f"both samples need at least one decided trajectory, got {base_n} and {cand_n}")
    pooled = (base_passed + cand_passed) / (base_n + cand_n)
    variance = pooled * (1.0 - pooled) * (1.0 / base_n + 1.0 / cand_n)
    if variance <= 0.0:
        return 0.0, 1.0
    z = (base_passed / base_n - cand_passed / cand_n) / math.sqrt(variance)
    return z, _upper_tail(z)


def detect_regressions(
    run_id: str,
    by_domain: Mapping[str, Sequence[VersionCounts]],
    overall: Sequence[VersionCounts],
    config: RegressionConfig,
) -> list[RegressionAlert]:
    """Compare each version of each domain with its earlier healthy versions pooled; alerts by (domain, version).

    A version that regressed against the baseline stays out of later baselines (so the regression
    does not become the new normal), and consecutive regressed versions are one episode: only
    its first version raises an alert. A version that is fine again ends the episode.
    """
    overall_by_version = _index("overall", overall)
    alerts: list[RegressionAlert] = []
    for domain in sorted(by_domain):
        versions = sorted(_index(f"domain {domain!r}", by_domain[domain]).values(), key=lambda c: c.policy_version)
        baseline: list[VersionCounts] = []
        in_episode = False
        for candidate in versions:
            if candidate.decided == 0:
                continue
            alert = _compare(run_id, domain, baseline, candidate, overall_by_version, config)
            if alert is None:
                baseline.append(candidate)
                in_episode = False
                continue
            if not in_episode:
                alerts.append(alert)
            in_episode = True
    return alerts


def _compare(
    run_id: str,
    domain: str,
    baseline: Sequence[VersionCounts],
    candidate: VersionCounts,
    overall_by_version: Mapping[int, VersionCounts],
    config: RegressionConfig,
) -> RegressionAlert | None:
    """The alert for one candidate version against its pooled baseline, or None when there is none."""
    base_decided = sum(c.decided for c in baseline)
    base_passed = sum(c.passed for c in baseline)
    if candidate.decided < config.min_decided or base_decided < config.min_decided:
        return None
    base_rate = base_passed / base_decided
    cand_rate = candidate.passed / candidate.decided
    drop = base_rate - cand_rate
    if drop < config.min_drop - _DROP_TOLERANCE:
        return None
    z, p_value = two_proportion_p_value(base_passed, base_decided, candidate.passed, candidate.decided)
    if p_value >= look_level(candidate.decided, config):
        return None
    baseline_versions = tuple(c.policy_version for c in baseline)
    overall_base = _pass_rate(overall_by_version[v] for v in baseline_versions if v in overall_by_version)
    overall_cand = _pass_rate([overall_by_version[candidate.policy_version]]
                              if candidate.policy_version in overall_by_version else [])
    return RegressionAlert(
        alert_id=alert_id(run_id, domain, candidate.policy_version),
        run_id=run_id,
        domain=domain,
        policy_version=candidate.policy_version,
        baseline_versions=baseline_versions,
        baseline_decided=base_decided,
        baseline_passed=base_passed,
        baseline_pass_rate=base_rate,
        candidate_decided=candidate.decided,
        candidate_passed=candidate.passed,
        candidate_pass_rate=cand_rate,
        drop=drop,
        z=z,
        p_value=p_value,
        overall_baseline_pass_rate=overall_base,
        overall_candidate_pass_rate=overall_cand,
        overall_rose=overall_base is not None and overall_cand is not None and overall_cand > overall_base,
    )


def _pass_rate(counts: Iterable[VersionCounts]) -> float | None:
    """The pooled pass rate of some versions, or None when they hold no decided trajectory."""
    decided = passed = 0
    for c in counts:
        decided += c.decided
        passed += c.passed
    return passed / decided if decided else None


def _index(where: str, counts: Sequence[VersionCounts]) -> dict[int, VersionCounts]:
    """Validate a list of per-version counts and key it by policy version."""
    indexed: dict[int, VersionCounts] = {}
    for c in counts:
        _check_counts(f"{where}, policy version {c.policy_version}", c.decided, c.passed)
        if c.policy_version in indexed:
            raise InvalidCounts(f"{where}: policy version {c.policy_version} is given more than once")
        indexed[c.policy_version] = c
    return indexed


def _check_counts(where: str, decided: int, passed: int) -> None:
    """Reject negative counts and more passes than decided trajectories."""
    if decided < 0:
        raise InvalidCounts(f"{where}: decided must not be negative, got {decided}")
    if passed < 0:
        raise InvalidCounts(f"{where}: passed must not be negative, got {passed}")
    if passed > decided:
        raise InvalidCounts(f"{where}: passed ({passed}) exceeds decided ({decided})")
