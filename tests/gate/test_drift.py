"""Noise calibration and the stored-baseline gate: a baseline stores its runs' medians
and the runner's drift between runs of the same code, the report states the smallest
detectable slowdown, and the gate compares runs, not samples, so process drift is not
blamed on a PR."""

from __future__ import annotations

import math

import pytest
from support.factories import make_baseline, make_result

from gatekeeper.config import GateConfig
from gatekeeper.gate import drift
from gatekeeper.gate import rules as gate
from gatekeeper.gate.drift import merge_latency, normalised_latency, run_medians

TARGET = "m/b1/default"
RULES = GateConfig()


def runs_of(levels: list[float], code_hash: str = "c0de1234", first: int = 0) -> list:
    """Earlier published runs whose whole process ran ``level`` times slower."""
    out = []
    for i, f in enumerate(levels):
        r = make_result(
            TARGET,
            seed=first + i,
            noise=0.005,
            n=100,
            compiled_s=1e-3 * f,
            eager_s=2e-3 * f,
            code_hash=code_hash,
        )
        r.measured_at = f"2026-01-{first + i + 1:02d}T00:00:00.000+00:00"
        out.append(r)
    return out


def with_history(result, history):
    """``result`` published as the baseline after ``history``."""
    result.measured_at = "2026-02-01T00:00:00.000+00:00"
    base = make_baseline(result)
    base.noise = drift.measure_noise(result, history)
    return base


def test_noise_within_one_run_only():
    r = make_result(TARGET, noise=0.03, n=200)
    noise = drift.measure_noise(r, [])
    assert 0.02 < noise.within < 0.04
    assert noise.between is None and noise.df == 0 and len(noise.runs) == 1
    # nothing measured between runs: the assumed drift sets what can be detected
    assert noise.detectable > drift.DEFAULT_DRIFT


def test_noise_between_runs_of_the_same_code():
    history = runs_of([1.0, 1.04, 0.97, 1.02, 0.95])
    now = make_result(TARGET, seed=9, noise=0.005, n=100)
    noise = drift.measure_noise(now, history)
    assert len(noise.runs) == 6 and noise.df == 5
    levels = [math.log(f) for f in [1.0, 1.04, 0.97, 1.02, 0.95, 1.0]]
    mean = sum(levels) / 6
    expected = math.sqrt(sum((x - mean) ** 2 for x in levels) / 5)
    assert noise.between == pytest.approx(expected, rel=0.15)
    assert noise.vs_eager_between < 0.01  # the whole process moved: compiled/eager did not
    quiet = drift.measure_noise(now, runs_of([1.0, 1.001, 0.999, 1.0, 1.0]))
    assert noise.detectable > quiet.detectable  # drift makes small changes undetectable


def test_a_change_of_code_on_main_is_not_counted_as_drift():
    # three runs of the old code, then a merged 30% speed-up measured three times
    history = runs_of([1.0, 1.01, 0.99]) + runs_of([0.7, 0.71, 0.69], "fa57c0de", first=3)
    now = make_result(
        TARGET, seed=9, noise=0.005, n=100, compiled_s=0.7e-3, eager_s=1.4e-3, code_hash="fa57c0de"
    )
    noise = drift.measure_noise(now, history)
    assert noise.df == 5 and noise.between < 0.02


def test_history_keeps_the_last_ten_runs():
    noise = drift.measure_noise(make_result(TARGET, seed=99), runs_of([1.0] * 14))
    assert len(noise.runs) == drift.HISTORY_FOR_NOISE
    assert noise.runs[-1].measured_at == "2025-01-01T00:00:00Z"  # this run, last


def test_gate_does_not_blame_process_drift_on_the_pr():
    # the PR's whole model is 7% slower, main's runs wander by about 4%
    pr = make_result(TARGET, seed=2, noise=0.005, n=200, compiled_s=1.07e-3, eager_s=2.14e-3)
    drifting = with_history(
        make_result(TARGET, seed=1, noise=0.005, n=200),
        runs_of([1.0, 1.05, 0.96, 1.03, 0.94, 1.02, 0.98, 1.04, 0.97]),
    )
    v = gate.gate_target(pr, drifting, RULES)
    # past the 5% threshold, but within what this runner's drift can produce: not a
    # regression, not a silent pass either
    assert v.verdict == "inconclusive" and v.latency.test == "t-test on run medians"
    assert v.latency.n_base == 10 and v.latency.n_pr == 1
    assert v.borderline and any("cannot tell it from drift" in r for r in v.reasons)
    assert any("pair with the base commit" in r for r in v.reasons)
    # the same PR against a runner whose runs agree to 0.3%: a real 7% slowdown
    steady = with_history(
        make_result(TARGET, seed=1, noise=0.005, n=200),
        runs_of([1.0, 1.003, 0.997, 1.002, 0.998, 1.0, 1.001, 0.999, 1.0]),
    )
    assert gate.gate_target(pr, steady, RULES).verdict == "regressed"
    # and a change far beyond the drift fails on the drifting runner too
    big = make_result(TARGET, seed=3, noise=0.005, n=200, compiled_s=1.4e-3, eager_s=2.8e-3)
    assert gate.gate_target(big, drifting, RULES).verdict == "regressed"


def test_without_history_the_gate_assumes_drift_and_says_so():
    pr = make_result(TARGET, seed=2, noise=0.005, n=200, compiled_s=1.1e-3, eager_s=2.2e-3)
    lone = with_history(make_result(TARGET, seed=1, noise=0.005, n=200), [])
    v = gate.gate_target(pr, lone, RULES)
    assert v.verdict == "inconclusive" and v.latency.test == "z-test on run medians"
    assert any("assumed" in note for note in v.notes)
    # the same run measured within the threshold passes
    same = make_result(TARGET, seed=2, noise=0.005, n=200)
    assert gate.gate_target(same, lone, RULES).verdict == "pass"
    triple = make_result(TARGET, seed=3, noise=0.005, n=200, compiled_s=3e-3, eager_s=6e-3)
    assert gate.gate_target(triple, lone, RULES).verdict == "regressed"


def test_a_compiler_regression_shows_in_compiled_vs_eager():
    # eager unchanged, compiled 10% slower: the ratio barely drifts, so it is caught
    # even though the latency itself is within this runner's drift
    drifting = with_history(
        make_result(TARGET, seed=1, noise=0.005, n=200),
        runs_of([1.0, 1.05, 0.96, 1.03, 0.94, 1.02, 0.98, 1.04, 0.97]),
    )
    pr = make_result(TARGET, seed=2, noise=0.005, n=200, compiled_s=1.1e-3, eager_s=2e-3)
    v = gate.gate_target(pr, drifting, RULES)
    assert v.verdict == "regressed"
    assert v.speedup.verdict == "regressed" and v.latency.verdict != "regressed"


def test_a_remeasured_result_counts_as_two_runs():
    a = make_result(TARGET, seed=1, n=30)
    b = make_result(TARGET, seed=2, n=20, compiled_s=1.2e-3)
    a.latency = merge_latency(a.latency, b.latency)
    assert a.latency.runs == [30, 20]
    (lat_a, _), (lat_b, _) = run_medians(a)
    assert lat_b / lat_a == pytest.approx(1.2, rel=0.05)
    c = make_result(TARGET, seed=3, n=10)
    a.latency = merge_latency(a.latency, c.latency)
    assert a.latency.runs == [30, 20, 10] and len(run_medians(a)) == 3


def test_normalised_latency_divides_by_reference():
    r = make_result(TARGET, n=10)
    s = r.latency.samples
    assert normalised_latency(r) == [
        c / x for c, x in zip(s["compiled"], s["reference"], strict=True)
    ]
    assert normalised_latency(r, use_reference=False) == s["compiled"]


def test_a_baseline_published_before_run_medians_still_gates():
    from gatekeeper.results import Baseline

    base = make_baseline(make_result(TARGET, seed=1, n=100))
    doc = base.model_dump(by_alias=True)
    doc["noise"] = {"within": 0.01, "between": 0.02, "runs": 6, "detectable": 0.05}
    old = Baseline.model_validate(doc)
    assert old.noise.runs == []
    pr = make_result(TARGET, seed=2, n=100, compiled_s=3e-3, eager_s=6e-3)
    assert gate.gate_target(pr, old, RULES).verdict == "regressed"
