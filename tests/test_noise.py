"""Noise calibration: a baseline stores its runner's noise, the report states the
smallest detectable slowdown, and the gate does not blame process drift on a PR."""
from __future__ import annotations

from gatekeeper import baseline, gate
from gatekeeper.config import GateConfig
from gatekeeper.results import normalised_latency
from test_report import make_baseline, make_result

TARGET = "m/b1/default"


def test_noise_within_one_run_only():
    r = make_result(TARGET, noise=0.03, n=200)
    noise = baseline.measure_noise(r, [])
    assert 0.02 < noise.within < 0.04
    assert noise.between is None and noise.runs == 1
    assert 0 < noise.detectable < 0.03


def test_noise_between_runs_from_history():
    # five earlier runs whose medians wander by a few percent
    history = [make_result(TARGET, seed=s, noise=0.01, n=100, compiled_s=1e-3 * f)
               for s, f in enumerate([1.0, 1.04, 0.97, 1.02, 0.95])]
    for n, r in enumerate(history):
        r.measured_at = f"2026-01-0{n + 1}T00:00:00.000+00:00"
    now = make_result(TARGET, seed=9, noise=0.01, n=100)
    now.measured_at = "2026-02-01T00:00:00.000+00:00"
    noise = baseline.measure_noise(now, history)
    assert noise.runs == 6
    assert 0.01 < noise.between < 0.08
    quiet = baseline.measure_noise(now, [])
    assert noise.detectable > quiet.detectable  # drift makes small changes undetectable


def test_gate_does_not_blame_process_drift_on_the_pr():
    rules = GateConfig()
    base_result = make_result(TARGET, seed=1, noise=0.005, n=200)
    pr = make_result(TARGET, seed=2, noise=0.005, n=200, compiled_s=1.07e-3,
                     eager_s=2.14e-3)  # the whole model +7%: speedup unchanged
    base = make_baseline(base_result)
    assert gate.gate_target(pr, base, rules).verdict == "regressed"  # tight samples
    drifting = base.model_copy(update={"noise": baseline.Noise(
        within=0.005, between=0.04, runs=8, detectable=0.12)})
    v = gate.gate_target(pr, drifting, rules)
    assert v.verdict == "pass" and v.borderline
    assert any("drift" in note for note in v.notes)
    # a change far beyond the drift still fails
    big = make_result(TARGET, seed=3, noise=0.005, n=200, compiled_s=1.3e-3, eager_s=2.6e-3)
    assert gate.gate_target(big, drifting, rules).verdict == "regressed"


def test_normalised_latency_divides_by_reference():
    r = make_result(TARGET, n=10)
    s = r.latency.samples
    assert normalised_latency(r) == [c / x for c, x in zip(s["compiled"], s["reference"])]
    assert normalised_latency(r, use_reference=False) == s["compiled"]
