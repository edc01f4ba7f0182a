"""The native assembly probe's plumbing (bench/native_probe): its errors, its scrambling, its report."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

import bench.native_probe as probe
from bench.native_probe import STEPS, Check, Result, report, scrambled


def test_without_cargo_the_probe_says_what_to_install(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delitem(sys.modules, probe.MODULE, raising=False)  # as in a process that has not loaded it
    monkeypatch.setattr(probe, "find_cargo", lambda: None)
    assert probe.main(["--events", "1000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the native probe needs Rust's cargo") and "Traceback" not in err


def test_a_failed_build_shows_cargos_message(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    if probe.find_cargo() is None:
        pytest.skip("needs Rust's cargo, to see it refuse a broken crate")
    crate = tmp_path / "crate"
    crate.mkdir()
    (crate / "Cargo.toml").write_text("[package]\nname = \n")
    monkeypatch.setattr(probe, "CRATE", crate)
    monkeypatch.delitem(sys.modules, probe.MODULE, raising=False)
    with pytest.raises(probe.ProbeUnavailable, match="cargo could not build the native probe") as caught:
        probe.build(tmp_path / "target", progress=lambda _line: None)
    assert "Cargo.toml" in str(caught.value)


@pytest.mark.parametrize("argv", [["--events", "10"], ["--repeats", "0"], ["--events", "many"]])
def test_bad_arguments_get_a_usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        probe.main(argv)
    assert caught.value.code == 2
    assert "Traceback" not in capsys.readouterr().err


def test_scrambled_groups_keep_their_events_with_at_most_one_twice() -> None:
    groups: list[list[object]] = [[f"g{g}e{e}" for e in range(5)] for g in range(200)]
    mixed = scrambled(groups)  # type: ignore[arg-type]
    assert mixed == scrambled(groups)  # type: ignore[arg-type]  # seeded
    twice = 0
    for group, out in zip(groups, mixed, strict=True):
        counts = Counter(out)
        assert set(counts) == set(group) and len(out) in (5, 6)
        twice += len(out) == 6
    assert 20 < twice < 70  # about a fifth
    assert any(out[:5] != group for group, out in zip(groups, mixed, strict=True))


def test_report_gives_the_ratios_and_the_cost_per_event() -> None:
    timings = {step: [1.0] for step, _ in STEPS}
    timings[STEPS[0][0]] = [12.0, 14.0, 13.0]  # python assemble: median 13
    timings[STEPS[1][0]] = [4.0]  # read
    timings[STEPS[2][0]] = [5.0]  # read, fold
    timings[STEPS[3][0]] = [7.0]  # read, fold, values
    timings[STEPS[4][0]] = [8.0]  # assemble over the cached events
    timings[STEPS[7][0]] = [4.0]  # assemble from the store
    result = Result(events=1_000, trajectory_events=900, trajectories=200, objects=Check(200, 0),
                    store=Check(200, 1, ["t-1"]), timings=timings)
    text = "\n".join(report(result))
    assert "| python: assemble (cached events) | trajectory | 13.00 | 12.00 / 14.00 / 13.00 |" in text
    assert "over the cached events 200 of 200, from the store 199 of 200 (differing, first few: [] / ['t-1'])" in text
    assert "takes 8.00 µs per trajectory against Python's 13.00 (1.6x)" in text
    assert "reading the Python objects 4.00, building the record's Python values 2.00 and the record 1.00" in text
    assert "From the native store 4.00 (3.2x)" in text
    assert "4.50 events per trajectory): Python 2.89 µs, native over the cached events 1.78, from the store 0.89" \
        in text
    assert "per record it writes, 3.00 µs more (comparing it with the stored record 1.00, its finish window and " \
        "insert row 1.00, its derived message 1.00)" in text
