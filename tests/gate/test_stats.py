"""Tests of gatekeeper.gate.stats: the statistics themselves, on synthetic latency samples.

Rates over seeds are deterministic (every generator is seeded); the observed values
quoted in the comments are what this numpy produced, the asserts leave room for
another numpy's streams.
"""

from __future__ import annotations

import math
import statistics
import time

import numpy as np
import pytest

from gatekeeper.gate import stats
from gatekeeper.gate.stats import (
    Comparison,
    bootstrap_ratio_ci,
    compare,
    compare_runs,
    decide,
    mann_whitney_u,
    min_detectable_change,
    noise,
    paired_ratio_ci,
    pooled_sd,
    runs_detectable_change,
    summarize,
    wilcoxon_signed_rank,
)

SEEDS = range(200)
LATENCY = 0.010  # 10 ms: the scale is irrelevant to every statistic here


def lognormal(rng: np.random.Generator, n: int, sigma: float, factor: float = 1.0) -> np.ndarray:
    """Latency samples whose median is LATENCY * factor, multiplicative noise ``sigma``."""
    return LATENCY * factor * np.exp(rng.normal(0.0, sigma, n))


def verdict_rates(make_pair, seeds=SEEDS, **kwargs) -> dict[str, float]:
    """Fraction of seeds giving each verdict (plus 'significant')."""
    counts = {"regressed": 0, "improved": 0, "unchanged": 0, "borderline": 0, "significant": 0}
    for seed in seeds:
        base, pr = make_pair(np.random.default_rng(seed))
        result = compare(base, pr, **kwargs)
        counts[result.verdict] += 1
        counts["significant"] += result.significant
    return {k: v / len(seeds) for k, v in counts.items()}


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
    "min_detectable_change": lambda x: min_detectable_change(x, 50),
    "bootstrap/pr": lambda x: bootstrap_ratio_ci([1.0, 1.1], x),
    "bootstrap/base": lambda x: bootstrap_ratio_ci(x, [1.0, 1.1]),
    "paired/base": lambda x: paired_ratio_ci(x, [1.0] * max(len(x), 2)),
    "compare/pr": lambda x: compare([1.0, 1.1], x, threshold=0.05),
    "compare/base": lambda x: compare(x, [1.0, 1.1], threshold=0.05),
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
        compare([0.01, 0.02], [0.01, 0.0], threshold=0.05)
    with pytest.raises(ValueError, match=r"^base: no samples"):
        compare([], [0.01], threshold=0.05)


def test_bad_parameters_raise_value_error():
    a, b = [0.01, 0.011, 0.012], [0.012, 0.013, 0.014]
    with pytest.raises(ValueError, match="alternative"):
        mann_whitney_u(a, b, "bigger")
    with pytest.raises(ValueError, match="method"):
        mann_whitney_u(a, b, method="fast")
    with pytest.raises(ValueError, match="alternative"):
        wilcoxon_signed_rank(a, "up")
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_ratio_ci(a, b, confidence=95)
    with pytest.raises(ValueError, match="n_resamples"):
        bootstrap_ratio_ci(a, b, n_resamples=0)
    with pytest.raises(ValueError, match="equal lengths"):
        paired_ratio_ci(a, b[:2])
    with pytest.raises(ValueError, match="at least 2 pairs"):
        paired_ratio_ci([0.01], [0.02])
    with pytest.raises(ValueError, match="method"):
        paired_ratio_ci(a, b, method="jackknife")
    with pytest.raises(ValueError, match="threshold"):
        compare(a, b, threshold=5)
    with pytest.raises(ValueError, match="threshold"):
        compare(a, b, threshold=-0.01)
    with pytest.raises(ValueError, match="alpha"):
        compare(a, b, threshold=0.05, alpha=0)
    with pytest.raises(ValueError, match="n must be"):
        min_detectable_change(0.03, 0)
    with pytest.raises(ValueError, match="noise"):
        min_detectable_change(-0.03, 10)
    with pytest.raises(ValueError, match="power"):
        min_detectable_change(0.03, 10, power=1.0)


def test_mann_whitney_accepts_any_finite_values():
    u, p = mann_whitney_u([-1.0, 0.0], [2.0, 3.0], "less")
    assert u == 0.0 and p == pytest.approx(1 / 6)


# -------------------------------------------------------------- rank tests vs scipy


@pytest.fixture(scope="module")
def scipy_stats():
    return pytest.importorskip("scipy.stats")


ALTERNATIVES = ("two-sided", "greater", "less")


def test_mann_whitney_exact_matches_scipy(scipy_stats):
    rng = np.random.default_rng(3)
    checked = 0
    for n1 in (1, 2, 3, 5, 8, 13):
        for n2 in (1, 2, 4, 7, 20):
            for _ in range(3):
                a, b = rng.normal(0.3, 1, n1), rng.normal(0, 1, n2)
                for alt in ALTERNATIVES:
                    u, p = mann_whitney_u(a, b, alt)  # auto: exact (no ties, small)
                    ref = scipy_stats.mannwhitneyu(a, b, alternative=alt, method="exact")
                    assert u == ref.statistic
                    assert p == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-15)
                    checked += 1
    assert checked == 6 * 5 * 3 * 3


def test_mann_whitney_exact_far_tail_and_larger_sizes(scipy_stats):
    rng = np.random.default_rng(4)
    for n1, n2 in ((30, 30), (5, 500), (25, 40)):
        a, b = rng.normal(1.0, 1, n1), rng.normal(0, 1, n2)
        for alt in ALTERNATIVES:
            u, p = mann_whitney_u(a, b, alt, method="exact")
            ref = scipy_stats.mannwhitneyu(a, b, alternative=alt, method="exact")
            assert u == ref.statistic
            assert p == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-300)
    # complete separation, 30 x 30: p = 1 / C(60, 30)
    _, p = mann_whitney_u(np.arange(30.0) + 100, np.arange(30.0), "greater")
    assert p == pytest.approx(1 / math.comb(60, 30), rel=1e-12)


@pytest.mark.parametrize("n1,n2", [(10, 12), (40, 35), (100, 100), (200, 50)])
def test_mann_whitney_normal_approximation_with_ties_matches_scipy(scipy_stats, n1, n2):
    rng = np.random.default_rng(n1 * 1000 + n2)
    # a coarse timer: 10 ms +/- 3%, read with 0.1 ms resolution -> many ties
    a = np.round(lognormal(rng, n1, 0.03, 1.01), 4)
    b = np.round(lognormal(rng, n2, 0.03), 4)
    assert len(np.unique(np.concatenate([a, b]))) <= (n1 + n2) / 2
    for alt in ALTERNATIVES:
        u, p = mann_whitney_u(a, b, alt)  # auto: ties -> normal approximation
        ref = scipy_stats.mannwhitneyu(a, b, alternative=alt, method="asymptotic", use_continuity=True)
        assert u == ref.statistic
        assert p == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-15)


def test_mann_whitney_normal_approximation_without_ties_matches_scipy(scipy_stats):
    rng = np.random.default_rng(5)
    a, b = lognormal(rng, 300, 0.03, 1.005), lognormal(rng, 250, 0.03)
    for alt in ALTERNATIVES:
        _, p = mann_whitney_u(a, b, alt)  # too large for the exact distribution
        ref = scipy_stats.mannwhitneyu(a, b, alternative=alt, method="asymptotic")
        assert p == pytest.approx(ref.pvalue, rel=1e-9)
        # and close to the exact answer where both exist
        a30, b30 = a[:30], b[:30]
        exact = mann_whitney_u(a30, b30, alt, method="exact")[1]
        approx = mann_whitney_u(a30, b30, alt, method="asymptotic")[1]
        assert approx == pytest.approx(exact, abs=0.01)


def test_mann_whitney_ties():
    # every value tied: no evidence either way
    assert mann_whitney_u([0.01] * 5, [0.01] * 7, "greater") == (17.5, 1.0)
    assert mann_whitney_u([0.01] * 5, [0.01] * 7) == (17.5, 1.0)
    with pytest.raises(ValueError, match="without ties"):
        mann_whitney_u([1.0, 2.0], [2.0, 3.0], method="exact")
    # ties count one half: U for a=[1,2] vs b=[2,3] is 0 + 0.5
    assert mann_whitney_u([1.0, 2.0], [2.0, 3.0])[0] == 0.5


def test_wilcoxon_exact_matches_scipy(scipy_stats):
    rng = np.random.default_rng(6)
    for n in (1, 2, 3, 5, 9, 15, 25, 50):
        d = rng.normal(0.3, 1, n)
        for alt in ALTERNATIVES:
            t, p = wilcoxon_signed_rank(d, alt)
            ref = scipy_stats.wilcoxon(d, alternative=alt, method="exact")
            assert p == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-15)
            if alt != "two-sided":
                assert t == ref.statistic


def test_wilcoxon_normal_approximation_with_ties_and_zeros_matches_scipy(scipy_stats):
    rng = np.random.default_rng(7)
    d = np.round(rng.normal(0.2, 1, 120), 1)  # ties and zeros
    assert np.any(d == 0) and len(np.unique(np.abs(d))) < 60
    for alt in ALTERNATIVES:
        t, p = wilcoxon_signed_rank(d, alt)
        ref = scipy_stats.wilcoxon(d, alternative=alt, zero_method="wilcox", correction=True, method="asymptotic")
        assert p == pytest.approx(ref.pvalue, rel=1e-9)
    assert wilcoxon_signed_rank([0.0, 0.0]) == (0.0, 1.0)


def test_t_quantiles_match_scipy(scipy_stats):
    for df in (1, 2, 3, 4, 5, 7, 10, 19, 30, 99, 250, 1000, 1001, 5000, 100000):
        for p in (0.9, 0.95, 0.975, 0.995):
            assert stats._t_ppf(p, df) == pytest.approx(scipy_stats.t.ppf(p, df), rel=1e-10)


# ------------------------------------------------------------------- ratio intervals


def test_bootstrap_ci_brackets_point_and_is_deterministic():
    rng = np.random.default_rng(8)
    base, pr = lognormal(rng, 100, 0.03), lognormal(rng, 100, 0.03, 1.10)
    point, lo, hi = bootstrap_ratio_ci(base, pr)
    assert point == pytest.approx(np.median(pr) / np.median(base))
    assert lo < point < hi
    assert bootstrap_ratio_ci(base, pr) == (point, lo, hi)
    assert bootstrap_ratio_ci(base, pr, seed=1) != (point, lo, hi)
    # the fast median path agrees with a generic median statistic
    generic = bootstrap_ratio_ci(base, pr, statistic=lambda x, axis=None: np.median(x, axis=axis))
    assert generic == pytest.approx((point, lo, hi), rel=1e-12)
    # a narrower confidence gives a narrower interval; mean works too
    _, lo90, hi90 = bootstrap_ratio_ci(base, pr, confidence=0.90)
    assert lo < lo90 < hi90 < hi
    mean_point, _, _ = bootstrap_ratio_ci(base, pr, statistic=np.mean)
    assert mean_point == pytest.approx(np.mean(pr) / np.mean(base))


def test_bootstrap_ci_covers_true_ratio_at_nominal_rate():
    # true ratio 1.10 (of medians, and of means: same sigma on both sides);
    # 5% lognormal noise, 100 samples a side, 95% CI, 200 seeds each
    covered = {np.median: 0, np.mean: 0}
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        base, pr = lognormal(rng, 100, 0.05), lognormal(rng, 100, 0.05, 1.10)
        for statistic in covered:
            _, lo, hi = bootstrap_ratio_ci(base, pr, statistic=statistic, n_resamples=1000, seed=seed)
            covered[statistic] += lo <= 1.10 <= hi
    # observed (1000 resamples): median 194/200 = 0.97, mean 185/200 = 0.925
    print(f"bootstrap coverage: median {covered[np.median]}/200, mean {covered[np.mean]}/200")
    assert 0.89 <= covered[np.median] / 200 <= 0.99
    assert 0.89 <= covered[np.mean] / 200 <= 0.99


def test_bootstrap_is_fast():
    rng = np.random.default_rng(9)
    base, pr = lognormal(rng, 200, 0.03), lognormal(rng, 200, 0.03)
    best = math.inf
    for _ in range(7):
        start = time.perf_counter()
        bootstrap_ratio_ci(base, pr, n_resamples=2000)
        best = min(best, time.perf_counter() - start)
    print(f"bootstrap 200+200 samples, 2000 resamples: {best * 1e3:.1f} ms")  # observed ~13 ms
    assert best < 0.05


def test_paired_t_interval_matches_scipy(scipy_stats):
    rng = np.random.default_rng(10)
    base = lognormal(rng, 25, 0.05)
    pr = base * np.exp(rng.normal(0.04, 0.02, 25))
    point, lo, hi = paired_ratio_ci(base, pr, confidence=0.9)
    d = np.log(pr / base)
    ref_lo, ref_hi = scipy_stats.t.interval(0.9, len(d) - 1, loc=d.mean(), scale=scipy_stats.sem(d))
    assert point == pytest.approx(math.exp(d.mean()))
    assert (lo, hi) == pytest.approx((math.exp(ref_lo), math.exp(ref_hi)), rel=1e-10)
    # the bootstrap variant is close and seeded
    b_point, b_lo, b_hi = paired_ratio_ci(base, pr, confidence=0.9, method="bootstrap")
    assert b_point == point
    assert b_lo == pytest.approx(lo, rel=0.01) and b_hi == pytest.approx(hi, rel=0.01)
    assert paired_ratio_ci(base, pr, confidence=0.9, method="bootstrap") == (b_point, b_lo, b_hi)
    # identical pairs: a zero-width interval at 1
    assert paired_ratio_ci(base, base) == (1.0, 1.0, 1.0)


def drifting_pairs(rng: np.random.Generator, n: int, factor: float, drift: float = 0.10, sigma: float = 0.02):
    """Back-to-back pairs sharing a per-pair machine-state factor (10% drift, 2% noise)."""
    common = np.exp(rng.normal(0.0, drift, n))
    return lognormal(rng, n, sigma) * common, lognormal(rng, n, sigma, factor) * common


def test_paired_ci_narrower_than_unpaired_under_shared_drift():
    width_ratios, covered = [], 0
    for seed in SEEDS:
        base, pr = drifting_pairs(np.random.default_rng(seed), 50, 1.08)
        _, plo, phi = paired_ratio_ci(base, pr)
        _, ulo, uhi = bootstrap_ratio_ci(base, pr, n_resamples=500, seed=seed)
        width_ratios.append((phi - plo) / (uhi - ulo))
        covered += plo <= 1.08 <= phi
    width_ratios = np.array(width_ratios)
    # observed: paired interval 0.16x as wide (median; at most 0.28x); paired coverage 0.950
    print(f"paired/unpaired CI width: median {np.median(width_ratios):.3f}, max {width_ratios.max():.3f}; "
          f"paired coverage {covered / 200:.3f}")
    assert np.median(width_ratios) < 0.3
    assert np.all(width_ratios < 1.0)
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


# ------------------------------------------------------- compare over many seeds


def test_detects_15_percent_regression():
    # 3% lognormal noise, 100 samples a side, 15% slower, 5% threshold
    rates = verdict_rates(lambda rng: (lognormal(rng, 100, 0.03), lognormal(rng, 100, 0.03, 1.15)), threshold=0.05)
    print("15% slower:", rates)  # observed: regressed 1.0 (200/200)
    assert rates["regressed"] >= 0.95
    assert rates["improved"] == 0.0


def test_same_distribution_rarely_flagged():
    rates = verdict_rates(lambda rng: (lognormal(rng, 100, 0.03), lognormal(rng, 100, 0.03)), threshold=0.05)
    print("no change:", rates)  # observed: regressed 0.0, improved 0.0, unchanged 1.0, significant 0.02
    assert rates["regressed"] <= 0.02
    assert rates["improved"] <= 0.02
    assert rates["unchanged"] >= 0.95
    assert rates["significant"] <= 0.05  # a false "significant" needs both the test and the CI


def test_same_distribution_with_stalls_and_few_samples_rarely_flagged():
    # harder: 5% noise, 30 samples, 5% of samples hit by a 1.5-3x stall
    def make(rng):
        def side():
            x = lognormal(rng, 30, 0.05)
            hit = rng.random(30) < 0.05
            return np.where(hit, x * rng.uniform(1.5, 3.0, 30), x)

        return side(), side()

    rates = verdict_rates(make, threshold=0.05)
    print("no change, noisy:", rates)  # observed: regressed 0.0, borderline 0.005, significant 0.01
    assert rates["regressed"] <= 0.02
    assert rates["improved"] <= 0.02


def test_detects_15_percent_improvement():
    rates = verdict_rates(lambda rng: (lognormal(rng, 100, 0.03), lognormal(rng, 100, 0.03, 1 / 1.15)), threshold=0.05)
    print("15% faster:", rates)  # observed: improved 1.0 (200/200)
    assert rates["improved"] >= 0.95
    assert rates["regressed"] == 0.0


def test_change_at_the_threshold_is_borderline():
    # true slowdown exactly at the 5% threshold: neither pass nor fail, re-measure
    rates = verdict_rates(
        lambda rng: (lognormal(rng, 100, 0.03), lognormal(rng, 100, 0.03, 1.05)), seeds=range(100), threshold=0.05
    )
    print("5% slower, 5% threshold:", rates)  # observed (100 seeds): borderline 0.97, regressed 0.02, unchanged 0.01
    assert rates["borderline"] >= 0.85
    assert rates["regressed"] <= 0.06
    assert rates["improved"] == 0.0


def test_small_real_change_below_threshold_is_unchanged_but_significant():
    rates = verdict_rates(
        lambda rng: (lognormal(rng, 100, 0.003), lognormal(rng, 100, 0.003, 1.01)), seeds=range(50), threshold=0.05
    )
    assert rates["unchanged"] == 1.0 and rates["significant"] == 1.0


def test_beyond_threshold_but_not_significant_is_borderline():
    base = [0.0100, 0.0130, 0.0080, 0.0110, 0.0090, 0.0120]
    pr = [0.0132, 0.0099, 0.0121, 0.0143, 0.0088, 0.0110]
    result = compare(base, pr, threshold=0.05)
    assert result.ratio == pytest.approx(1.10)
    assert not result.significant
    assert result.p_value > 0.05
    assert result.verdict == "borderline"


def test_compare_handles_quantized_timer_ties():
    rng = np.random.default_rng(11)
    base = np.round(lognormal(rng, 100, 0.03), 4)  # 0.1 ms resolution: ~10 distinct values
    pr = np.round(lognormal(rng, 100, 0.03, 1.15), 4)
    assert compare(base, pr, threshold=0.05).verdict == "regressed"
    same = compare(base, base, threshold=0.05)
    assert (same.verdict, same.ratio, same.significant) == ("unchanged", 1.0, False)
    assert same.p_value == pytest.approx(0.5, abs=0.01)  # U at its null mean: one-sided p ~ 1/2
    constant = compare([0.01] * 20, [0.01] * 20, threshold=0.05)
    assert (constant.verdict, constant.ci_lo, constant.ci_hi, constant.p_value) == ("unchanged", 1.0, 1.0, 1.0)


def test_paired_mode_beats_drift():
    # 8% slower, pairs share a 10% drift factor, 50 pairs, 5% threshold
    paired = verdict_rates(lambda rng: drifting_pairs(rng, 50, 1.08), threshold=0.05, paired=True)
    unpaired = verdict_rates(lambda rng: drifting_pairs(rng, 50, 1.08), seeds=range(50), threshold=0.05)
    null = verdict_rates(lambda rng: drifting_pairs(rng, 50, 1.0), threshold=0.05, paired=True)
    # observed: paired regressed 1.0; unpaired regressed 0.02 (borderline 0.98); paired null regressed 0.0
    print("paired:", paired, "unpaired:", unpaired, "paired null:", null)
    assert paired["regressed"] >= 0.95
    assert unpaired["regressed"] <= 0.2
    assert null["regressed"] <= 0.02 and null["improved"] <= 0.02


def test_compare_fields_and_determinism():
    rng = np.random.default_rng(12)
    base, pr = lognormal(rng, 60, 0.03), lognormal(rng, 60, 0.03, 1.2)
    result = compare(base, pr, threshold=0.05)
    assert isinstance(result, Comparison)
    assert result == compare(base, pr, threshold=0.05)
    assert result.delta == pytest.approx(result.ratio - 1)
    assert result.ratio == pytest.approx(np.median(pr) / np.median(base))
    assert result.ci_lo < result.ratio < result.ci_hi
    assert (result.n_base, result.n_pr, result.paired, result.test) == (60, 60, False, "mann-whitney-u")
    assert result.p_value == pytest.approx(mann_whitney_u(pr, base, "greater")[1])
    assert result.describe().endswith(": regressed") and result.describe().startswith("+")
    assert result.to_dict()["verdict"] == "regressed"
    paired = compare(base, pr, threshold=0.05, paired=True)
    assert paired.test == "wilcoxon-signed-rank" and paired.paired
    assert paired.ratio == pytest.approx(math.exp(np.mean(np.log(pr / base))))


# -------------------------------------------------------------- detectable change


def test_min_detectable_change_formula():
    expected = math.expm1((1.959964 + 0.841621) * math.sqrt(math.pi / 2) * 0.03 * math.sqrt(2 / 100))
    assert min_detectable_change(0.03, 100) == pytest.approx(expected, rel=1e-5)
    assert min_detectable_change(0.03, 100) == pytest.approx(0.0150, abs=1e-4)
    assert min_detectable_change(0.03, 400) < min_detectable_change(0.03, 100)
    assert min_detectable_change(0.06, 100) > min_detectable_change(0.03, 100)
    assert min_detectable_change(0.03, 100, power=0.9) > min_detectable_change(0.03, 100)
    assert min_detectable_change(0.0, 10) == 0.0
    samples = lognormal(np.random.default_rng(13), 500, 0.04)
    assert min_detectable_change(samples, 100) == min_detectable_change(noise(samples), 100)


def test_min_detectable_change_matches_simulated_power():
    # a slowdown of exactly the MDC is found significant in about `power` of the runs
    shift = 1 + min_detectable_change(0.03, 100, power=0.8)
    rates = verdict_rates(
        lambda rng: (lognormal(rng, 100, 0.03), lognormal(rng, 100, 0.03, shift)), seeds=range(100), threshold=0.0
    )
    print(f"significant at the MDC ({shift - 1:.2%}): {rates['significant']}")  # observed: 0.82 (100 seeds)
    assert 0.65 <= rates["significant"] <= 0.93


# ------------------------------------------------- stored baselines: runs, not samples


def drifting_runs(rng: np.random.Generator, runs: int, drift: float, factor: float = 1.0,
                  n: int = 100, sigma: float = 0.01) -> list[np.ndarray]:
    """``runs`` processes of ``n`` samples each; every process has its own level
    (lognormal ``drift``), as on a shared runner."""
    return [lognormal(rng, n, sigma, factor * math.exp(rng.normal(0.0, drift)))
            for _ in range(runs)]


def run_rates(drift: float, factor: float, seeds=range(1000), base_runs: int = 10,
              threshold: float = 0.05) -> dict[str, float]:
    """Verdict rates of compare_runs: 10 baseline runs (sd from their spread) against
    one PR run, as the stored-baseline gate does."""
    counts = {"regressed": 0, "improved": 0, "unchanged": 0, "borderline": 0,
              "significant": 0, "covered": 0}
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
    """The reason for compare_runs: the same data through the sample-level test finds
    'significant' changes in most trials where nothing changed."""
    sample_level = run_level = 0
    for seed in range(200):
        rng = np.random.default_rng(seed)
        base_runs, (pr,) = drifting_runs(rng, 10, 0.03), drifting_runs(rng, 1, 0.03)
        sample_level += compare(base_runs[-1], pr, threshold=0.05).significant
        medians = [float(np.median(r)) for r in base_runs]
        sd, df = pooled_sd([medians])
        run_level += compare_runs(medians, [float(np.median(pr))], sd=sd, df=df,
                                  threshold=0.05).significant
    print("significant, no change: samples", sample_level / 200, "runs", run_level / 200)
    # observed: samples 0.925, runs 0.035
    assert sample_level / 200 > 0.5 and run_level / 200 <= 0.08


def test_runs_with_assumed_drift_use_normal_quantiles():
    c = compare_runs([1.0], [1.0], sd=0.1, df=None, threshold=0.05)
    assert c.test == "z-test on run medians" and c.verdict == "unchanged"
    assert c.ci_hi == pytest.approx(math.exp(1.959964 * 0.1 * math.sqrt(2)), rel=1e-5)
    assert compare_runs([1.0], [3.0], sd=0.1, df=None, threshold=0.05).verdict == "regressed"
    for bad in (dict(sd=0.0, df=3), dict(sd=float("nan"), df=3), dict(sd=0.1, df=0)):
        with pytest.raises(ValueError):
            compare_runs([1.0], [1.0], threshold=0.05, **bad)


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
