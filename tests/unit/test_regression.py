"""Per-domain pass-rate regression between policy versions (pure logic)."""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import Mapping, Sequence

import pytest

from rollout.errors import PermanentError
from streams.regression import (
    ALERT_NAMESPACE,
    InvalidCounts,
    RegressionAlert,
    RegressionConfig,
    VersionCounts,
    alert_id,
    detect_regressions,
    look_level,
    two_proportion_p_value,
)

RUN = "run-7"
CONFIG = RegressionConfig()


def counts(*rows: tuple[int, int, int]) -> list[VersionCounts]:
    """Per-version counts from (policy_version, decided, passed) triples."""
    return [VersionCounts(v, d, p) for v, d, p in rows]


def upper_tail_by_simpson(z: float, width: float = 12.0, steps: int = 20_000) -> float:
    """P(Z > z) for a standard normal, by Simpson integration of its density (independent of erfc)."""
    h = width / steps
    total = 0.0
    for i in range(steps + 1):
        weight = 1 if i in (0, steps) else (4 if i % 2 else 2)
        x = z + i * h
        total += weight * math.exp(-x * x / 2)
    return total * h / 3 / math.sqrt(2 * math.pi)


def detect(by_domain: Mapping[str, Sequence[VersionCounts]], overall: Sequence[VersionCounts] = (),
           config: RegressionConfig = CONFIG) -> list[RegressionAlert]:
    """Run the check for the test run."""
    return detect_regressions(RUN, by_domain, overall, config)


# --- the test statistic -------------------------------------------------------------------------


def test_z_and_p_match_a_hand_computation_and_an_independent_formula() -> None:
    z, p = two_proportion_p_value(300, 500, 120, 300)

    # By hand: rates 0.6 and 0.4, pooled 420/800 = 0.525.
    se = math.sqrt(0.525 * 0.475 * (1 / 500 + 1 / 300))
    assert z == pytest.approx(0.2 / se, rel=1e-12)
    assert p == pytest.approx(0.5 * math.erfc((0.2 / se) / math.sqrt(2)), rel=1e-12)

    # Independently: z from integer counts only, z = (x1 n2 - x2 n1) sqrt(n) / sqrt(n1 n2 x (n - x)),
    # and the tail by numerical integration of the normal density rather than erfc.
    x1, n1, x2, n2 = 300, 500, 120, 300
    x, n = x1 + x2, n1 + n2
    z_integer = (x1 * n2 - x2 * n1) * math.sqrt(n) / math.sqrt(n1 * n2 * x * (n - x))
    assert z == pytest.approx(z_integer, abs=1e-9)
    assert p == pytest.approx(upper_tail_by_simpson(z_integer), rel=1e-9, abs=1e-12)

    # Reference values (50-digit arithmetic): z = 5.48408497107081775..., p = 2.07807490934758220...e-8.
    assert z == pytest.approx(5.484084971070817757, abs=1e-9)
    assert p == pytest.approx(2.078074909347582202e-8, rel=1e-9)


def test_a_moderate_drop_gives_a_textbook_p_value() -> None:
    # 60% vs 45% on 100 each: z = 2.1240, one-sided p = 0.01684 (a classic two-proportion exercise).
    z, p = two_proportion_p_value(60, 100, 45, 100)
    assert z == pytest.approx(2.123976976214366078, abs=1e-9)
    assert p == pytest.approx(0.016836034428172917, abs=1e-9)
    assert p == pytest.approx(upper_tail_by_simpson(z), abs=1e-9)


@pytest.mark.parametrize(
    ("base_passed", "base_n", "cand_passed", "cand_n"),
    [(50, 50, 40, 40), (0, 50, 0, 40), (1, 1, 1, 1), (0, 1, 0, 1)],
    ids=["all-pass", "all-fail", "single-pass", "single-fail"],
)
def test_no_variance_gives_no_evidence(base_passed: int, base_n: int, cand_passed: int, cand_n: int) -> None:
    assert two_proportion_p_value(base_passed, base_n, cand_passed, cand_n) == (0.0, 1.0)


@pytest.mark.parametrize(("a", "n1", "b", "n2"), [(300, 500, 120, 300), (60, 100, 45, 100), (3, 40, 35, 41)])
def test_the_statistic_is_symmetric(a: int, n1: int, b: int, n2: int) -> None:
    z, p = two_proportion_p_value(a, n1, b, n2)
    z_swapped, p_swapped = two_proportion_p_value(b, n2, a, n1)
    z_mirrored, _ = two_proportion_p_value(n1 - a, n1, n2 - b, n2)  # count failures instead of passes
    assert z_swapped == pytest.approx(-z, rel=1e-12)
    assert z_mirrored == pytest.approx(-z, rel=1e-12)
    assert p + p_swapped == pytest.approx(1.0, abs=1e-12)


def test_equal_rates_give_z_zero_and_p_one_half() -> None:
    assert two_proportion_p_value(30, 60, 20, 40) == (0.0, 0.5)


# --- when an alert fires ------------------------------------------------------------------------


def test_a_domain_that_drops_while_the_run_rises_is_flagged_alone() -> None:
    by_domain = {
        "math": counts((1, 200, 160), (2, 200, 100)),  # 80% -> 50%
        "code": counts((1, 800, 200), (2, 800, 600)),  # 25% -> 75%
    }
    overall = counts((1, 1000, 360), (2, 1000, 700))  # 36% -> 70%

    alerts = detect(by_domain, overall)

    z, p = two_proportion_p_value(160, 200, 100, 200)
    assert alerts == [
        RegressionAlert(
            alert_id=alert_id(RUN, "math", 2),
            run_id=RUN,
            domain="math",
            policy_version=2,
            baseline_versions=(1,),
            baseline_decided=200,
            baseline_passed=160,
            baseline_pass_rate=0.8,
            candidate_decided=200,
            candidate_passed=100,
            candidate_pass_rate=0.5,
            drop=0.8 - 0.5,
            z=z,
            p_value=p,
            overall_baseline_pass_rate=0.36,
            overall_candidate_pass_rate=0.7,
            overall_rose=True,
        )
    ]
    assert p < 1e-9


def test_overall_rose_is_false_when_the_run_fell_too() -> None:
    by_domain = {"math": counts((1, 200, 160), (2, 200, 100))}
    [alert] = detect(by_domain, counts((1, 400, 300), (2, 400, 200)))
    assert (alert.overall_baseline_pass_rate, alert.overall_candidate_pass_rate) == (0.75, 0.5)
    assert alert.overall_rose is False


@pytest.mark.parametrize(
    "overall",
    [[], counts((2, 400, 300)), counts((1, 400, 100)), counts((1, 0, 0), (2, 400, 300))],
    ids=["no-overall", "no-overall-baseline", "no-overall-candidate", "overall-baseline-undecided"],
)
def test_overall_rates_are_none_when_undefined(overall: list[VersionCounts]) -> None:
    [alert] = detect({"math": counts((1, 200, 160), (2, 200, 100))}, overall)
    assert None in (alert.overall_baseline_pass_rate, alert.overall_candidate_pass_rate)
    assert alert.overall_rose is False


@pytest.mark.parametrize(
    ("baseline", "candidate"),
    [((29, 29), (200, 0)), ((200, 200), (29, 0)), ((29, 29), (29, 0))],
    ids=["baseline-too-small", "candidate-too-small", "both-too-small"],
)
def test_no_alert_below_min_decided(baseline: tuple[int, int], candidate: tuple[int, int]) -> None:
    by_domain = {"math": counts((1, *baseline), (2, *candidate))}
    assert detect(by_domain) == []
    assert len(detect(by_domain, config=RegressionConfig(min_decided=29))) == 1


def test_no_alert_when_the_drop_is_small_even_if_significant() -> None:
    by_domain = {"math": counts((1, 10_000, 5_000), (2, 10_000, 4_600))}  # 50% -> 46%
    _, p = two_proportion_p_value(5_000, 10_000, 4_600, 10_000)
    assert p < 1e-8
    assert detect(by_domain) == []
    assert len(detect(by_domain, config=RegressionConfig(min_drop=0.04))) == 1


def test_no_alert_when_the_drop_is_large_but_not_significant() -> None:
    by_domain = {"math": counts((1, 100, 60), (2, 100, 45))}  # p = 0.0168
    assert detect(by_domain) == []
    loose = RegressionConfig(alpha=0.5)
    assert look_level(100, loose) > 0.0168
    assert len(detect(by_domain, config=loose)) == 1


def test_a_drop_of_exactly_min_drop_counts() -> None:
    # 0.6 - 0.5 is 0.09999999999999998 in floating point; it is still a drop of 0.10.
    [alert] = detect({"math": counts((1, 1000, 600), (2, 1000, 500))})
    assert alert.drop == pytest.approx(0.1)


def test_no_alert_on_improvement_or_equal_rates() -> None:
    by_domain = {
        "up": counts((1, 100, 10), (2, 100, 90)),
        "flat": counts((1, 100, 50), (2, 100, 50)),
        "all-pass": counts((1, 100, 100), (2, 100, 100)),
        "all-fail": counts((1, 100, 0), (2, 100, 0)),
    }
    assert detect(by_domain) == []


def test_a_candidate_failing_everything_after_a_baseline_passing_everything_is_flagged() -> None:
    [alert] = detect({"math": counts((1, 50, 50), (2, 50, 0))})
    assert alert.drop == 1.0
    assert alert.z == pytest.approx(10.0)
    assert detect({"math": counts((1, 50, 0), (2, 50, 50))}) == []


# --- repeated looks -----------------------------------------------------------------------------


def test_the_level_is_constant_within_a_doubling_and_falls_from_one_to_the_next() -> None:
    levels = [look_level(n, CONFIG) for n in (30, 59, 60, 119, 120, 239, 240, 10_000)]
    assert levels[0] == levels[1] and levels[2] == levels[3] and levels[4] == levels[5]
    assert levels[0] > levels[2] > levels[4] > levels[6] > levels[7] > 0.0
    # Doublings start at min_decided, whatever it is.
    assert look_level(50, RegressionConfig(min_decided=50)) == look_level(30, CONFIG)
    assert look_level(99, RegressionConfig(min_decided=50)) == look_level(30, CONFIG)


@pytest.mark.parametrize("block", [1, 2, 3, 7])
def test_each_doubling_spends_its_share_of_alpha(block: int) -> None:
    """The level's z solves Siegmund's crossing approximation for alpha * 6 / (pi^2 k^2), checked by Simpson."""
    level = look_level(30 * 2 ** (block - 1), CONFIG)
    assert look_level(30 * 2 ** block - 1, CONFIG) == level
    # The z whose upper tail is the level, found by bisection on the independent tail integral.
    low, high = 0.0, 10.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if upper_tail_by_simpson(mid) > level else (low, mid)
    c = (low + high) / 2
    crossing = upper_tail_by_simpson(c) + math.log(2) * c * math.exp(-c * c / 2) / math.sqrt(2 * math.pi) / 2
    assert crossing == pytest.approx(CONFIG.alpha * 6 / (math.pi ** 2 * block ** 2), rel=1e-6)


def test_a_look_below_min_decided_is_rejected() -> None:
    with pytest.raises(InvalidCounts, match="at least 30 decided"):
        look_level(29, CONFIG)


def test_a_stable_version_watched_after_every_trajectory_alerts_at_most_about_alpha() -> None:
    """Every look at alpha would alert on ~6% of stable versions; the look levels keep it near alpha."""
    rng = random.Random(20261130)
    runs, rate = 2000, 0.6
    alerted = alerted_without_correction = 0
    for _ in range(runs):
        base_passed = sum(rng.random() < rate for _ in range(600))
        passed = 0
        corrected = uncorrected = False
        for decided in range(1, 501):
            passed += rng.random() < rate
            if decided < CONFIG.min_decided or (base_passed / 600 - passed / decided) < CONFIG.min_drop:
                continue
            # The uncorrected test, written out; the check itself only where that one alerts (it alerts
            # on less evidence), so the 2,000 runs stay fast.
            _, p = two_proportion_p_value(base_passed, 600, passed, decided)
            if p < CONFIG.alpha:
                uncorrected = True
                corrected = corrected or bool(detect({"math": counts((1, 600, base_passed), (2, decided, passed))}))
        alerted += corrected
        alerted_without_correction += uncorrected
    assert alerted / runs <= 0.015  # alpha 0.01 and the Monte Carlo error of 2,000 runs
    assert alerted_without_correction / runs > 3 * CONFIG.alpha


def test_a_healthy_version_at_an_early_look_does_not_alert() -> None:
    # Seen in a healthy end-to-end scenario: p = 0.0045 at 38 decided is not evidence at that look.
    by_domain = {"math": counts((1, 641, 390), (2, 38, 15))}
    _, p = two_proportion_p_value(390, 641, 15, 38)
    assert p < CONFIG.alpha
    assert detect(by_domain) == []


# --- baselines and ordering ---------------------------------------------------------------------


def test_the_baseline_pools_every_earlier_decided_version() -> None:
    by_domain = {
        # v2 is too small to be a candidate but still joins the baseline; v3 decided nothing; v4 is absent.
        "math": counts((5, 100, 40), (3, 0, 0), (2, 20, 10), (1, 100, 90)),
    }
    overall = counts((1, 300, 150), (2, 50, 25), (3, 0, 0), (5, 300, 180))

    [alert] = detect(by_domain, overall)

    assert alert.policy_version == 5
    assert alert.baseline_versions == (1, 2)
    assert (alert.baseline_decided, alert.baseline_passed) == (120, 100)
    assert alert.baseline_pass_rate == pytest.approx(100 / 120)
    assert alert.overall_baseline_pass_rate == pytest.approx(175 / 350)
    assert alert.overall_candidate_pass_rate == pytest.approx(0.6)
    assert alert.overall_rose is True


def test_alerts_are_sorted_by_domain_then_version() -> None:
    by_domain = {
        "zeta": counts((2, 100, 20), (1, 100, 90)),
        "alpha": counts((4, 100, 5), (1, 100, 95), (3, 100, 94), (2, 100, 50)),
    }
    alerts = detect(by_domain)
    assert [(a.domain, a.policy_version, a.baseline_versions) for a in alerts] == [
        ("alpha", 2, (1,)),
        ("alpha", 4, (1, 3)),
        ("zeta", 2, (1,)),
    ]


def test_a_sustained_drop_is_one_alert_and_stays_out_of_the_baseline() -> None:
    by_domain = {"cad": counts((1, 200, 160), (2, 200, 158), (3, 200, 80), (4, 200, 82), (5, 200, 79))}
    alerts = detect(by_domain)
    assert [(a.policy_version, a.baseline_versions) for a in alerts] == [(3, (1, 2))]


def test_recovery_ends_an_episode_so_a_later_drop_alerts_again() -> None:
    by_domain = {"cad": counts((1, 200, 160), (2, 200, 80), (3, 200, 161), (4, 200, 81))}
    alerts = detect(by_domain)
    assert [(a.policy_version, a.baseline_versions) for a in alerts] == [(2, (1,)), (4, (1, 3))]


def test_a_domain_with_a_single_version_has_no_baseline() -> None:
    assert detect({"math": counts((1, 500, 0))}) == []
    assert detect({}) == []


# --- ids ----------------------------------------------------------------------------------------


def test_alert_ids_are_deterministic() -> None:
    expected = str(uuid.uuid5(ALERT_NAMESPACE, "run-7|math|2"))
    assert alert_id("run-7", "math", 2) == expected
    assert alert_id("run-7", "math", 2) == alert_id("run-7", "math", 2)
    assert len({alert_id("run-7", "math", 2), alert_id("run-8", "math", 2),
                alert_id("run-7", "code", 2), alert_id("run-7", "math", 3)}) == 4

    by_domain = {"math": counts((1, 200, 160), (2, 200, 100))}
    first, second = detect(by_domain), detect(by_domain)
    assert first == second
    assert first[0].alert_id == expected


def test_the_alert_namespace_is_fixed() -> None:
    # Changing it would give every stored alert a new id and break idempotent re-emission.
    assert str(ALERT_NAMESPACE) == "a793a749-482f-42a0-8140-01a152827af5"


# --- input validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (counts((1, 10, 11)), r"domain 'math', policy version 1: passed \(11\) exceeds decided \(10\)"),
        (counts((1, -1, 0)), r"domain 'math', policy version 1: decided must not be negative, got -1"),
        (counts((1, 10, -2)), r"domain 'math', policy version 1: passed must not be negative, got -2"),
        (counts((1, 10, 5), (1, 20, 5)), r"domain 'math': policy version 1 is given more than once"),
    ],
    ids=["passed-exceeds-decided", "negative-decided", "negative-passed", "duplicate-version"],
)
def test_bad_domain_counts_are_rejected(rows: list[VersionCounts], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        detect({"math": rows})


def test_bad_overall_counts_are_rejected() -> None:
    with pytest.raises(ValueError, match=r"overall, policy version 2: passed \(3\) exceeds decided \(2\)"):
        detect({}, counts((2, 2, 3)))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((5, 4, 1, 10), r"baseline: passed \(5\) exceeds decided \(4\)"),
        ((1, 10, -1, 10), "candidate: passed must not be negative"),
        ((0, 0, 1, 10), "at least one decided trajectory, got 0 and 10"),
        ((1, 10, 0, 0), "at least one decided trajectory, got 10 and 0"),
    ],
)
def test_bad_test_inputs_are_rejected(args: tuple[int, int, int, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        two_proportion_p_value(*args)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_decided": 0}, "min_decided must be at least 1, got 0"),
        ({"min_drop": -0.1}, "min_drop must be between 0 and 1"),
        ({"min_drop": 1.5}, "min_drop must be between 0 and 1"),
        ({"alpha": 0.0}, "alpha must be strictly between 0 and 1"),
        ({"alpha": 1.0}, "alpha must be strictly between 0 and 1"),
    ],
)
def test_bad_config_is_rejected(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RegressionConfig(**kwargs)  # type: ignore[arg-type]


def test_invalid_counts_is_a_permanent_platform_error() -> None:
    assert issubclass(InvalidCounts, PermanentError)
    assert issubclass(InvalidCounts, ValueError)
