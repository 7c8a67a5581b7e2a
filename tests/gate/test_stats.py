"""Tests of gatekeeper.gate.stats: the statistics themselves, on synthetic latency samples.

Rates over seeds are deterministic (every generator is seeded); the observed values
quoted in the comments are what this numpy produced, the asserts leave room for
another numpy's streams. scipy's distributions are not re-tested here; what is pinned
is our own use of them: the formulas, the decision rule and the rates they give.
"""

from __future__ import annotations

import math
import statistics
import subprocess
import sys

import numpy as np
import pytest

from gatekeeper.gate.stats import (
    Comparison,
    compare,
    compare_runs,
    decide,
    noise,
    pooled_sd,
    runs_detectable_change,
    summarize,
)

SEEDS = range(200)
LATENCY = 0.010  # 10 ms: the scale is irrelevant to every statistic here


def lognormal(rng: np.random.Generator, n: int, sigma: float, factor: float = 1.0) -> np.ndarray:
    """Latency samples whose median is LATENCY * factor, multiplicative noise ``sigma``."""
    return LATENCY * factor * np.exp(rng.normal(0.0, sigma, n))


def drifting_pairs(
    rng: np.random.Generator, n: int, factor: float, drift: float = 0.10, sigma: float = 0.02
) -> tuple[np.ndarray, np.ndarray]:
    """Back-to-back pairs sharing a per-pair machine-state factor (10% drift, 2% noise)."""
    common = np.exp(rng.normal(0.0, drift, n))
    return lognormal(rng, n, sigma) * common, lognormal(rng, n, sigma, factor) * common


def verdict_rates(make_pair, seeds=SEEDS, **kwargs) -> dict[str, float]:
    """Fraction of seeds giving each verdict (plus 'significant') of paired compare."""
    counts = {"regressed": 0, "improved": 0, "unchanged": 0, "borderline": 0, "significant": 0}
    for seed in seeds:
        base, pr = make_pair(np.random.default_rng(seed))
        result = compare(base, pr, paired=True, **kwargs)
        counts[result.verdict] += 1
        counts["significant"] += result.significant
    return {k: v / len(seeds) for k, v in counts.items()}


def test_importing_stats_does_not_import_scipy():
    # every gatekeeper process imports stats (a service calling warm_start() included);
    # scipy is loaded only by the functions that compare
    code = "import gatekeeper, gatekeeper.gate.stats, sys; assert 'scipy' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------------ summarize


def test_summarize_known_values():
    x = np.random.default_rng(0).permutation(np.arange(1.0, 101.0))
    s = summarize(x)
    assert s.n == 100
    assert s.min == 1.0 and s.max == 100.0
    assert s.mean == pytest.approx(50.5)
    assert s.median == pytest.approx(50.5)
    # linear interpolation between order statistics: rank 1 + 0.95 * 99 = 95.05
    assert s.p95 == pytest.approx(95.05)
    assert s.p99 == pytest.approx(99.01)
    assert s.iqr == pytest.approx(75.25 - 25.75)
    assert s.stdev == pytest.approx(statistics.stdev(x.tolist()))
    assert s.mad == pytest.approx(25.0)  # |x - 50.5| = 0.5 .. 49.5, twice each


def test_summarize_matches_numpy_and_is_robust_to_outliers():
    rng = np.random.default_rng(1)
    x = lognormal(rng, 1000, 0.05)
    s = summarize(x.tolist())
    assert s.p95 == pytest.approx(np.percentile(x, 95))
    assert s.p99 == pytest.approx(np.percentile(x, 99))
    assert s.median == pytest.approx(np.median(x))
    assert s.mad == pytest.approx(np.median(np.abs(x - np.median(x))))
    assert s.noise == pytest.approx(noise(x))
    assert s.to_dict()["n"] == 1000
    mad = summarize([1.0, 2.0, 3.0, 4.0, 100.0]).mad
    assert mad == 1.0  # deviations 2, 1, 0, 1, 97


def test_summarize_single_sample():
    s = summarize([0.5])
    assert (s.n, s.median, s.p95, s.p99, s.stdev, s.mad, s.iqr) == (1, 0.5, 0.5, 0.5, 0.0, 0.0, 0.0)


def test_noise_estimates_lognormal_sigma_and_ignores_outliers():
    rng = np.random.default_rng(2)
    x = lognormal(rng, 20000, 0.03)
    assert noise(x) == pytest.approx(0.03, rel=0.03)
    # 5% of samples hit by a 2-3x stall: the robust spread barely moves, the CV explodes
    y = x.copy()
    y[:1000] *= rng.uniform(2, 3, 1000)
    assert noise(y) < 0.034
    assert np.std(y) / np.mean(y) > 0.2


# ------------------------------------------------------------------ input validation

SAMPLE_FUNCS = {
    "summarize": lambda x: summarize(x),
    "noise": lambda x: noise(x),
    "compare/pr": lambda x: compare([1.0] * max(len(x), 2), x, paired=True, threshold=0.05),
    "compare/base": lambda x: compare(x, [1.0] * max(len(x), 2), paired=True, threshold=0.05),
    "runs/base": lambda x: compare_runs(x, [1.0], sd=0.03, df=5, threshold=0.05),
    "runs/pr": lambda x: compare_runs([1.0], x, sd=0.03, df=5, threshold=0.05),
    "pooled_sd": lambda x: pooled_sd([[1.0, 1.1], x]),
}
BAD_SAMPLES = {
    "empty": ([], "no samples"),
    "zero": ([1.0, 0.0], "zero or negative"),
    "negative": ([0.01, -0.02], "zero or negative"),
    "nan": ([0.01, float("nan")], "NaN or infinite"),
    "inf": ([0.01, float("inf")], "NaN or infinite"),
    "2d": ([[0.01, 0.02]], "flat sequence"),
    "text": (["fast"], "must be numbers"),
}


@pytest.mark.parametrize("func", SAMPLE_FUNCS, ids=list(SAMPLE_FUNCS))
@pytest.mark.parametrize("bad", BAD_SAMPLES, ids=list(BAD_SAMPLES))
def test_bad_samples_raise_clear_value_error(func, bad):
    samples, message = BAD_SAMPLES[bad]
    with pytest.raises(ValueError, match=message):
        SAMPLE_FUNCS[func](samples)


def test_error_names_the_offending_side():
    with pytest.raises(ValueError, match=r"^pr: 1 of 2 samples are zero or negative"):
        compare([0.01, 0.02], [0.01, 0.0], paired=True, threshold=0.05)
    with pytest.raises(ValueError, match=r"^base: no samples"):
        compare([], [0.01], paired=True, threshold=0.05)


def test_bad_parameters_raise_value_error():
    a, b = [0.01, 0.011, 0.012], [0.012, 0.013, 0.014]
    with pytest.raises(ValueError, match="compare_runs"):  # samples of two processes
        compare(a, b, paired=False, threshold=0.05)
    with pytest.raises(ValueError, match="equal lengths"):
        compare(a, b[:2], paired=True, threshold=0.05)
    with pytest.raises(ValueError, match="at least 2 pairs"):
        compare([0.01], [0.02], paired=True, threshold=0.05)
    with pytest.raises(ValueError, match="confidence"):
        compare(a, b, paired=True, threshold=0.05, confidence=95)
    with pytest.raises(ValueError, match="threshold"):
        compare(a, b, paired=True, threshold=5)
    with pytest.raises(ValueError, match="threshold"):
        compare(a, b, paired=True, threshold=-0.01)
    with pytest.raises(ValueError, match="alpha"):
        compare(a, b, paired=True, threshold=0.05, alpha=0)
    for bad in (
        dict(sd=0.0, df=3),
        dict(sd=float("nan"), df=3),
        dict(sd=0.1, df=0),
        dict(sd=0.1, df=3, confidence=1.0),
    ):
        with pytest.raises(ValueError):
            compare_runs([1.0], [1.0], threshold=0.05, **bad)
    with pytest.raises(ValueError, match="power"):
        runs_detectable_change(0.03, 9, 10, power=1.0)
    with pytest.raises(ValueError, match="alpha"):
        runs_detectable_change(0.03, 9, 10, alpha=0.0)


# ------------------------------------------------------------ paired: the formulas


def test_paired_ratio_is_the_t_interval_of_the_mean_log_ratio():
    rng = np.random.default_rng(10)
    base = lognormal(rng, 25, 0.05)
    pr = base * np.exp(rng.normal(0.04, 0.02, 25))
    c = compare(base, pr, paired=True, threshold=0.05, confidence=0.9)
    d = np.log(pr / base)
    half = 1.710882079909428 * d.std(ddof=1) / math.sqrt(25)  # t quantile 0.95, 24 df
    assert c.ratio == pytest.approx(math.exp(d.mean()), rel=1e-12)
    assert (c.ci_lo, c.ci_hi) == pytest.approx(
        (math.exp(d.mean() - half), math.exp(d.mean() + half)), rel=1e-10
    )
    # identical pairs: a zero-width interval at 1 and no evidence either way
    same = compare(base, base, paired=True, threshold=0.05)
    assert (same.ratio, same.ci_lo, same.ci_hi, same.p_value) == (1.0, 1.0, 1.0, 1.0)
    assert (same.verdict, same.significant) == ("unchanged", False)


def test_signed_rank_exact_without_ties_normal_approximation_with_them():
    base = np.full(5, 0.01)
    # five distinct slowdowns: exact null, all 2**5 sign patterns, one as extreme
    assert compare(
        base, base * np.exp([0.01, 0.02, 0.03, 0.04, 0.05]), paired=True, threshold=0.05
    ).p_value == pytest.approx(1 / 32, rel=1e-12)
    # a tie in |d|: average ranks 1.5, 1.5, 3, 4, 5 (T+ = 15), tie-corrected variance
    # 5*6*11/24 - (2^3 - 2)/48, continuity correction 0.5
    c = compare(base, base * np.exp([0.01, 0.01, 0.02, 0.03, 0.04]), paired=True, threshold=0.05)
    z = (15 - 7.5 - 0.5) / math.sqrt(5 * 6 * 11 / 24 - 6 / 48)
    assert c.p_value == pytest.approx(1 - statistics.NormalDist().cdf(z), rel=1e-9)


def test_paired_interval_covers_under_shared_drift():
    covered = 0
    for seed in SEEDS:
        base, pr = drifting_pairs(np.random.default_rng(seed), 50, 1.08)
        c = compare(base, pr, paired=True, threshold=0.05)
        covered += c.ci_lo <= 1.08 <= c.ci_hi
    print(f"paired coverage {covered / 200:.3f}")  # observed: 0.950
    assert 0.90 <= covered / 200 <= 0.99


# ----------------------------------------------------------------- the decision rule


@pytest.mark.parametrize(
    "ratio,lo,hi,p_slower,p_faster,expected,significant",
    [
        (1.10, 1.08, 1.12, 1e-6, 1.0, "regressed", True),
        (1.10, 1.03, 1.17, 1e-6, 1.0, "borderline", True),  # significant, CI straddles 1.05
        (1.10, 0.98, 1.22, 0.20, 0.8, "borderline", False),  # beyond threshold, not significant
        (1.10, 1.08, 1.12, 0.20, 0.8, "borderline", False),  # CI clear but rank test is not
        (1.03, 1.01, 1.06, 1e-6, 1.0, "borderline", True),  # within, but CI reaches beyond
        (1.02, 1.01, 1.03, 1e-6, 1.0, "unchanged", True),  # real but below the threshold
        (1.03, 0.97, 1.09, 0.30, 0.7, "unchanged", False),  # noisy, nothing shown
        (1.00, 0.99, 1.01, 0.50, 0.5, "unchanged", False),
        (0.90, 0.88, 0.92, 1.0, 1e-6, "improved", True),
        (0.90, 0.85, 0.97, 1.0, 1e-6, "borderline", True),
        (0.90, 0.80, 1.02, 0.9, 0.10, "borderline", False),
        (0.97, 0.94, 0.99, 1.0, 1e-6, "borderline", True),
        (0.98, 0.97, 0.99, 1.0, 1e-6, "unchanged", True),
    ],
)
def test_decision_rule_table(ratio, lo, hi, p_slower, p_faster, expected, significant):
    assert decide(ratio, lo, hi, p_slower, p_faster, threshold=0.05) == (expected, significant)


def test_decision_rule_zero_threshold_and_alpha():
    assert decide(1.001, 1.0005, 1.0015, 1e-6, 1.0, threshold=0.0) == ("regressed", True)
    assert decide(1.10, 1.08, 1.12, 0.03, 0.97, threshold=0.05, alpha=0.01) == ("borderline", False)


# ------------------------------------------------- paired compare over many seeds


def test_paired_detects_8_percent_despite_drift_and_rarely_flags_no_change():
    # 8% slower, pairs share a 10% drift factor, 50 pairs, 5% threshold
    slower = verdict_rates(lambda rng: drifting_pairs(rng, 50, 1.08), threshold=0.05)
    null = verdict_rates(lambda rng: drifting_pairs(rng, 50, 1.0), threshold=0.05)
    print("paired 8% slower:", slower, "paired null:", null)
    # observed: regressed 1.0; null regressed 0.0, improved 0.0, significant 0.045
    assert slower["regressed"] >= 0.95 and slower["improved"] == 0.0
    assert null["regressed"] <= 0.02 and null["improved"] <= 0.02
    assert null["significant"] <= 0.07


def test_paired_detects_15_percent_improvement():
    rates = verdict_rates(lambda rng: drifting_pairs(rng, 50, 1 / 1.15), threshold=0.05)
    print("paired 15% faster:", rates)  # observed: improved 1.0
    assert rates["improved"] >= 0.95 and rates["regressed"] == 0.0


def test_paired_no_change_with_stalls_and_few_pairs_rarely_flagged():
    # harder: 5% noise, 20 pairs, 5% of samples hit by a 1.5-3x stall
    def make(rng):
        base, pr = drifting_pairs(rng, 20, 1.0, sigma=0.05)
        hit = rng.random((2, 20)) < 0.05
        stall = rng.uniform(1.5, 3.0, (2, 20))
        return np.where(hit[0], base * stall[0], base), np.where(hit[1], pr * stall[1], pr)

    rates = verdict_rates(make, threshold=0.05)
    print(
        "paired no change, stalls:", rates
    )  # observed: regressed 0.0, improved 0.0, borderline 0.32
    assert rates["regressed"] <= 0.02 and rates["improved"] <= 0.02


def test_paired_change_at_the_threshold_is_borderline():
    # true slowdown exactly at the 5% threshold: neither pass nor fail, re-measure
    rates = verdict_rates(
        lambda rng: drifting_pairs(rng, 50, 1.05), seeds=range(100), threshold=0.05
    )
    print("paired 5% slower, 5% threshold:", rates)  # observed: borderline 0.95, regressed 0.03
    assert rates["borderline"] >= 0.85
    assert rates["regressed"] <= 0.06 and rates["improved"] == 0.0


def test_paired_small_real_change_below_threshold_is_unchanged_but_significant():
    rates = verdict_rates(
        lambda rng: drifting_pairs(rng, 50, 1.01, sigma=0.003), seeds=range(50), threshold=0.05
    )
    assert rates["unchanged"] == 1.0 and rates["significant"] == 1.0


def test_paired_beyond_threshold_but_not_significant_is_borderline():
    base = [0.0100, 0.0130, 0.0080, 0.0110, 0.0090, 0.0120]
    pr = [0.0100 * 1.5, 0.0130 * 0.9, 0.0080 * 1.3, 0.0110 * 0.95, 0.0090 * 1.2, 0.0120 * 0.9]
    result = compare(base, pr, paired=True, threshold=0.05)
    assert result.ratio > 1.05
    assert not result.significant and result.p_value > 0.05
    assert result.verdict == "borderline"


def test_paired_handles_quantized_timer_ties():
    rng = np.random.default_rng(11)
    base, pr = drifting_pairs(rng, 100, 1.15)
    base, pr = np.round(base, 4), np.round(pr, 4)  # 0.1 ms resolution: ties and zeros
    assert compare(base, pr, paired=True, threshold=0.05).verdict == "regressed"
    constant = compare([0.01] * 20, [0.01] * 20, paired=True, threshold=0.05)
    assert (constant.verdict, constant.ci_lo, constant.ci_hi, constant.p_value) == (
        "unchanged",
        1.0,
        1.0,
        1.0,
    )


def test_compare_fields_and_determinism():
    base, pr = drifting_pairs(np.random.default_rng(12), 60, 1.2)
    result = compare(base, pr, paired=True, threshold=0.05)
    assert isinstance(result, Comparison)
    assert result == compare(base, pr, paired=True, threshold=0.05)
    assert result.delta == pytest.approx(result.ratio - 1)
    assert result.ratio == pytest.approx(math.exp(np.mean(np.log(pr / base))))
    assert result.ci_lo < result.ratio < result.ci_hi
    assert (result.n_base, result.n_pr, result.paired, result.test, result.unit) == (
        60,
        60,
        True,
        "wilcoxon-signed-rank",
        "pairs",
    )
    assert result.describe().endswith(": regressed") and result.describe().startswith("+")
    assert result.to_dict()["verdict"] == "regressed" and result.to_dict()["unit"] == "pairs"


# ------------------------------------------------- stored baselines: runs, not samples


def drifting_runs(
    rng: np.random.Generator,
    runs: int,
    drift: float,
    factor: float = 1.0,
    n: int = 100,
    sigma: float = 0.01,
) -> list[np.ndarray]:
    """``runs`` processes of ``n`` samples each; every process has its own level
    (lognormal ``drift``), as on a shared runner."""
    return [
        lognormal(rng, n, sigma, factor * math.exp(rng.normal(0.0, drift))) for _ in range(runs)
    ]


def run_rates(
    drift: float, factor: float, seeds=range(1000), base_runs: int = 10, threshold: float = 0.05
) -> dict[str, float]:
    """Verdict rates of compare_runs: 10 baseline runs (sd from their spread) against
    one PR run, as the stored-baseline gate does."""
    counts = {
        "regressed": 0,
        "improved": 0,
        "unchanged": 0,
        "borderline": 0,
        "significant": 0,
        "covered": 0,
    }
    for seed in seeds:
        rng = np.random.default_rng(seed)
        base = [float(np.median(r)) for r in drifting_runs(rng, base_runs, drift)]
        pr = [float(np.median(r)) for r in drifting_runs(rng, 1, drift, factor)]
        sd, df = pooled_sd([base])
        c = compare_runs(base, pr, sd=sd, df=df, threshold=threshold)
        counts[c.verdict] += 1
        counts["significant"] += c.significant
        counts["covered"] += c.ci_lo <= factor <= c.ci_hi
    return {k: v / len(seeds) for k, v in counts.items()}


def test_pooled_sd_is_the_spread_within_groups():
    x = [1.0, 1.1, 0.95, 1.02]
    sd, df = pooled_sd([x])
    assert df == 3 and sd == pytest.approx(float(np.std(np.log(x), ddof=1)))
    # a second group at another level (a merged speed-up) adds spread only from within
    sd2, df2 = pooled_sd([x, [0.5 * v for v in x]])
    assert df2 == 6 and sd2 == pytest.approx(sd)
    assert pooled_sd([[1.0], [2.0]]) == (None, 0)
    assert pooled_sd([[1.0, 1.1]])[0] is None  # one degree of freedom is not an estimate


def test_compare_runs_interval_and_fields():
    base, pr, sd, df = [1.0, 1.02, 0.98, 1.01], [1.1], 0.02, 3
    c = compare_runs(base, pr, sd=sd, df=df, threshold=0.05)
    d = math.log(1.1) - float(np.mean(np.log(base)))
    half = 3.1824463052837078 * sd * math.sqrt(1 / 4 + 1)  # t quantile 0.975, 3 df
    assert c.ratio == pytest.approx(math.exp(d), rel=1e-12)
    assert (c.ci_lo, c.ci_hi) == pytest.approx((math.exp(d - half), math.exp(d + half)), rel=1e-10)
    assert (c.n_base, c.n_pr, c.paired, c.test, c.unit) == (
        4,
        1,
        False,
        "t-test on run medians",
        "runs",
    )


def test_runs_no_change_rarely_flagged():
    # 3% drift between processes, one PR run against ten baseline runs
    rates = run_rates(0.03, 1.0)
    print("runs, no change:", rates)  # observed: regressed 0.0, significant 0.048, covered 0.952
    assert rates["regressed"] <= 0.02 and rates["improved"] <= 0.02
    assert rates["significant"] <= 0.07
    assert 0.93 <= rates["covered"] <= 0.97  # the t interval has its nominal coverage


def test_runs_detect_a_slowdown_well_beyond_the_drift():
    rates = run_rates(0.03, 1.25)
    print("runs, 25% slower:", rates)  # observed: regressed 1.0
    assert rates["regressed"] >= 0.95
    assert 0.93 <= rates["covered"] <= 0.97
    faster = run_rates(0.03, 0.75, seeds=range(200))
    print("runs, 25% faster:", faster)  # observed: improved 1.0
    assert faster["improved"] >= 0.95 and faster["regressed"] == 0.0


def test_samples_alone_would_blame_drift_on_the_pr():
    """The reason for compare_runs: the same data through a sample-level test
    (Mann-Whitney on one baseline run's samples against the PR run's) finds
    'significant' changes in most trials where nothing changed."""
    from scipy.stats import mannwhitneyu

    sample_level = run_level = 0
    for seed in range(200):
        rng = np.random.default_rng(seed)
        base_runs, (pr,) = drifting_runs(rng, 10, 0.03), drifting_runs(rng, 1, 0.03)
        sample_level += mannwhitneyu(pr, base_runs[-1], alternative="two-sided").pvalue < 0.05
        medians = [float(np.median(r)) for r in base_runs]
        sd, df = pooled_sd([medians])
        run_level += compare_runs(
            medians, [float(np.median(pr))], sd=sd, df=df, threshold=0.05
        ).significant
    print("significant, no change: samples", sample_level / 200, "runs", run_level / 200)
    # observed: samples 0.935, runs 0.035
    assert sample_level / 200 > 0.5 and run_level / 200 <= 0.08


def test_runs_with_assumed_drift_use_normal_quantiles():
    c = compare_runs([1.0], [1.0], sd=0.1, df=None, threshold=0.05)
    assert c.test == "z-test on run medians" and c.verdict == "unchanged"
    assert c.ci_hi == pytest.approx(math.exp(1.959964 * 0.1 * math.sqrt(2)), rel=1e-5)
    assert compare_runs([1.0], [3.0], sd=0.1, df=None, threshold=0.05).verdict == "regressed"


def test_runs_detectable_change_formula():
    # (q_{0.975} + z_{0.8}) * sd * sqrt(1/n + 1/k), normal q when the drift is assumed
    assert runs_detectable_change(0.03, None, 10) == pytest.approx(
        math.expm1((1.959964 + 0.841621) * 0.03 * math.sqrt(1.1)), rel=1e-5
    )
    assert runs_detectable_change(0.03, 9, 10) == pytest.approx(
        math.expm1((2.262157 + 0.841621) * 0.03 * math.sqrt(1.1)), rel=1e-5
    )


def test_runs_detectable_change_matches_simulated_power():
    drift, base_runs = 0.03, 10
    shift = 1 + runs_detectable_change(drift, base_runs - 1, base_runs)
    hits = 0
    for seed in range(400):
        rng = np.random.default_rng(seed)
        base = [float(np.median(r)) for r in drifting_runs(rng, base_runs, drift)]
        pr = [float(np.median(r)) for r in drifting_runs(rng, 1, drift, shift)]
        sd, df = pooled_sd([base])
        hits += compare_runs(base, pr, sd=sd, df=df, threshold=0.0).significant
    print(f"significant at the runs MDC ({shift - 1:.2%}): {hits / 400}")  # observed: 0.79
    assert 0.68 <= hits / 400 <= 0.9
