"""Statistics for the performance gate: summaries, rank tests, ratio intervals, verdicts.

Pure functions over latency samples (seconds, lower is better). Depends only on the
standard library and numpy: no I/O, no torch, no scipy. Every function that
resamples takes a ``seed``, so the same samples always give the same verdict.

The pieces:

- :func:`summarize` and :func:`noise` describe one set of samples.
- :func:`mann_whitney_u` (unpaired) and :func:`wilcoxon_signed_rank` (paired) test
  whether one set is shifted against the other.
- :func:`bootstrap_ratio_ci` (unpaired) and :func:`paired_ratio_ci` (paired) estimate
  how large the change is: the ratio PR / base with a confidence interval.
- :func:`compare` combines an effect size and a test into the gate's verdict, using
  the rule in :func:`decide`.
- :func:`compare_runs` compares *runs* (one median per process) against a stored
  baseline's runs, with the runner's drift between processes from :func:`pooled_sd`.
- :func:`min_detectable_change` says how small a slowdown a runner can resolve.

The samples of one side are treated as independent draws from one distribution.
Drift *between* processes or machines (a stored baseline measured in another run) is
not visible in the samples of either side, so it is not covered by these intervals:
thousands of samples from one process make a tiny interval around that process's own
level. Two honest answers: paired A/B samples in one process (:func:`paired_ratio_ci`),
where the drift cancels, or the process as the unit of comparison
(:func:`compare_runs`), where the drift is measured and paid for.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Callable, Literal, Sequence, Union

import numpy as np

__all__ = [
    "MAD_TO_SIGMA",
    "Summary",
    "Comparison",
    "Verdict",
    "summarize",
    "noise",
    "mann_whitney_u",
    "wilcoxon_signed_rank",
    "bootstrap_ratio_ci",
    "paired_ratio_ci",
    "decide",
    "compare",
    "pooled_sd",
    "compare_runs",
    "min_detectable_change",
    "runs_detectable_change",
]

#: Scale factor that turns a median absolute deviation into a standard deviation for
#: normal data (1 / Phi^-1(3/4)).
MAD_TO_SIGMA = 1.4826

Alternative = Literal["two-sided", "greater", "less"]
Verdict = Literal["regressed", "improved", "unchanged", "borderline"]
ArrayLike = Union[Sequence[float], np.ndarray]

_ALTERNATIVES = ("two-sided", "greater", "less")
# Exact Mann-Whitney null distribution: used (without ties) while n1*n2 stays small
# and the number of arrangements C(n1+n2, n1) fits in int64.
_MWU_EXACT_MAX_CELLS = 2500
# Exact Wilcoxon signed-rank distribution: 2**n arrangements must fit in int64.
_WILCOXON_EXACT_MAX_N = 50
# Bootstrap works on chunks of at most this many resampled values (memory bound).
_BOOTSTRAP_CHUNK = 1 << 21

_STD_NORMAL = NormalDist()


# --------------------------------------------------------------------------- validation


def _samples(x: ArrayLike, name: str, *, positive: bool = True) -> np.ndarray:
    """Return ``x`` as a 1-D float array, or raise ValueError saying what is wrong."""
    try:
        arr = np.asarray(x, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: samples must be numbers ({exc})") from None
    if arr.ndim != 1:
        raise ValueError(f"{name}: samples must be a flat sequence of numbers, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name}: no samples (need at least one measurement)")
    if not np.all(np.isfinite(arr)):
        bad = int(np.count_nonzero(~np.isfinite(arr)))
        raise ValueError(f"{name}: {bad} of {arr.size} samples are NaN or infinite")
    if positive and np.any(arr <= 0):
        bad = int(np.count_nonzero(arr <= 0))
        raise ValueError(
            f"{name}: {bad} of {arr.size} samples are zero or negative (min {arr.min()!r}); "
            "latency samples must be positive durations in seconds"
        )
    return arr


def _check_alternative(alternative: str) -> None:
    if alternative not in _ALTERNATIVES:
        raise ValueError(f"alternative must be one of {_ALTERNATIVES}, got {alternative!r}")


def _check_open_unit(value: float, name: str) -> float:
    value = float(value)
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be strictly between 0 and 1, got {value!r}")
    return value


def _check_resamples(n_resamples: int) -> int:
    if isinstance(n_resamples, bool) or int(n_resamples) != n_resamples or n_resamples < 1:
        raise ValueError(f"n_resamples must be a positive integer, got {n_resamples!r}")
    return int(n_resamples)


# ------------------------------------------------------------------------------ summary


@dataclass(frozen=True)
class Summary:
    """Descriptive statistics of latency samples (seconds).

    Percentiles use linear interpolation between order statistics (numpy's default,
    Hyndman-Fan type 7). ``stdev`` is the sample standard deviation (ddof=1; 0 for a
    single sample). ``mad`` is the raw median absolute deviation from the median,
    *not* scaled to a standard deviation; ``iqr`` is p75 - p25.
    """

    n: int
    mean: float
    median: float
    p95: float
    p99: float
    min: float
    max: float
    stdev: float
    mad: float
    iqr: float

    @property
    def noise(self) -> float:
        """Relative robust spread, ``1.4826 * mad / median`` (see :func:`noise`)."""
        return MAD_TO_SIGMA * self.mad / self.median

    def to_dict(self) -> dict:
        """Plain dict of the fields, for JSON."""
        return asdict(self)


def summarize(samples: ArrayLike) -> Summary:
    """Summarise positive latency samples in seconds; ValueError when empty or non-positive."""
    x = _samples(samples, "samples")
    median = float(np.median(x))
    p25, p75, p95, p99 = (float(v) for v in np.percentile(x, [25, 75, 95, 99]))
    return Summary(
        n=int(x.size),
        mean=float(np.mean(x)),
        median=median,
        p95=p95,
        p99=p99,
        min=float(np.min(x)),
        max=float(np.max(x)),
        stdev=float(np.std(x, ddof=1)) if x.size > 1 else 0.0,
        mad=float(np.median(np.abs(x - median))),
        iqr=p75 - p25,
    )


def noise(samples: ArrayLike) -> float:
    """Relative robust spread of latency samples: ``1.4826 * MAD / median``.

    For log-normal timing noise with a small sigma this estimates that sigma (e.g.
    0.03 for "3% noise"), and it ignores a minority of outliers, unlike the
    coefficient of variation.
    """
    x = _samples(samples, "samples")
    median = float(np.median(x))
    return MAD_TO_SIGMA * float(np.median(np.abs(x - median))) / median


# -------------------------------------------------------------------- distributions


def _norm_sf(z: float) -> float:
    """Upper tail of the standard normal, accurate far into the tail."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def _norm_ppf(p: float) -> float:
    return _STD_NORMAL.inv_cdf(p)


def _t_cdf(t: float, df: int) -> float:
    """Student t CDF for integer ``df`` (closed-form series, Abramowitz & Stegun 26.7.3-4)."""
    theta = math.atan(t / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    c2 = c * c
    if df % 2 == 1:
        if df == 1:
            a = 2.0 * theta / math.pi
        else:
            j = np.arange(1, (df - 3) // 2 + 1, dtype=float)
            total = c * (1.0 + float(np.cumprod(c2 * (2.0 * j) / (2.0 * j + 1.0)).sum()))
            a = 2.0 / math.pi * (theta + s * total)
    else:
        j = np.arange(1, (df - 2) // 2 + 1, dtype=float)
        a = s * (1.0 + float(np.cumprod(c2 * (2.0 * j - 1.0) / (2.0 * j)).sum()))
    return 0.5 + 0.5 * a


def _t_ppf(p: float, df: int) -> float:
    """Student t quantile for integer ``df >= 1`` and ``0.5 < p < 1``."""
    if df > 1000:
        # Cornish-Fisher expansion (A&S 26.7.5); error far below 1e-10 at this df.
        z = _norm_ppf(p)
        g1 = (z**3 + z) / 4
        g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
        g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
        g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
        return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if _t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _average_ranks(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ranks 1..n with ties given their average rank, and the size of each tie group."""
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    avg = ends - (counts - 1) / 2.0
    return avg[inverse.ravel()], counts


def _mwu_exact_counts(n1: int, n2: int) -> np.ndarray:
    """``counts[u]`` = number of arrangements with U = u, for u = 0..n1*n2.

    The generating function of U is the Gaussian binomial coefficient
    [n1+n2 choose n2]_q = prod_{i=1..n2} (1 - q^(n1+i)) / (1 - q^i); each factor is
    applied exactly in int64 (every intermediate polynomial is again a Gaussian
    binomial, so the values stay below C(n1+n2, n2)).
    """
    m, n = max(n1, n2), min(n1, n2)
    size = m * n + 1
    c = np.zeros(size, dtype=np.int64)
    c[0] = 1
    for i in range(1, n + 1):
        k = m + i
        if k < size:
            c[k:] -= c[:-k].copy()
        # divide by (1 - q^i): c[j] += c[j - i], i.e. a running sum per residue class mod i
        pad = (-size) % i
        block = np.concatenate([c, np.zeros(pad, dtype=np.int64)]).reshape(-1, i)
        c = np.cumsum(block, axis=0).ravel()[:size]
    return c


def _wilcoxon_exact_counts(n: int) -> np.ndarray:
    """``counts[t]`` = number of sign patterns with T+ = t (generating fn prod (1 + q^i))."""
    size = n * (n + 1) // 2 + 1
    c = np.zeros(size, dtype=np.int64)
    c[0] = 1
    for i in range(1, n + 1):
        c[i:] += c[:-i].copy()
    return c


def _tail_pvalues(counts: np.ndarray, stat: int, total: int) -> tuple[float, float]:
    """(P(S >= stat), P(S <= stat)) from an exact null distribution."""
    upper = int(counts[stat:].sum()) / total
    lower = int(counts[: stat + 1].sum()) / total
    return upper, lower


# ---------------------------------------------------------------------- rank tests


def mann_whitney_u(
    a: ArrayLike,
    b: ArrayLike,
    alternative: Alternative = "two-sided",
    *,
    method: Literal["auto", "exact", "asymptotic"] = "auto",
) -> tuple[float, float]:
    """Mann-Whitney U test of samples ``a`` against ``b``: returns ``(U, p_value)``.

    ``U`` is the statistic of ``a``: the number of pairs (a_i, b_j) with a_i > b_j,
    ties counting 1/2 (the same convention as ``scipy.stats.mannwhitneyu``).
    ``alternative="greater"`` tests whether ``a`` is stochastically greater than ``b``
    (for latencies: ``a`` slower), ``"less"`` the reverse, ``"two-sided"`` either.

    ``method="auto"`` uses the exact null distribution when there are no ties and
    n1*n2 <= 2500 (and C(n1+n2, n1) < 2**62, e.g. up to 30 x 30 or 5 x 500), else the
    normal approximation with tie-corrected variance
    ``n1*n2/12 * ((n+1) - sum(t^3 - t) / (n(n-1)))`` and a 0.5 continuity correction.
    A sample set with every value tied has no evidence either way: p = 1.
    Values may be any finite reals (not only latencies).
    """
    _check_alternative(alternative)
    if method not in ("auto", "exact", "asymptotic"):
        raise ValueError(f"method must be 'auto', 'exact' or 'asymptotic', got {method!r}")
    x = _samples(a, "a", positive=False)
    y = _samples(b, "b", positive=False)
    n1, n2 = x.size, y.size
    ranks, ties = _average_ranks(np.concatenate([x, y]))
    u1 = float(ranks[:n1].sum() - n1 * (n1 + 1) / 2.0)
    has_ties = bool(np.any(ties > 1))

    cells = n1 * n2
    exact_ok = not has_ties and cells <= _MWU_EXACT_MAX_CELLS and math.comb(n1 + n2, n1) < 2**62
    if method == "exact":
        if has_ties:
            raise ValueError("exact Mann-Whitney p-values need samples without ties; use method='auto'")
        if not exact_ok:
            raise ValueError(f"samples too large for the exact distribution ({n1} x {n2}); use method='auto'")
    use_exact = method == "exact" or (method == "auto" and exact_ok)

    if use_exact:
        counts = _mwu_exact_counts(n1, n2)
        upper, lower = _tail_pvalues(counts, int(round(u1)), math.comb(n1 + n2, n1))
        if alternative == "greater":
            p = upper
        elif alternative == "less":
            p = lower
        else:
            p = 2.0 * min(upper, lower)
        return u1, float(min(1.0, p))

    n = n1 + n2
    tie_term = float(np.sum(ties.astype(float) ** 3 - ties))
    var = cells / 12.0 * ((n + 1) - tie_term / (n * (n - 1)))
    if var <= 0:
        return u1, 1.0
    mu = cells / 2.0
    if alternative == "greater":
        u = u1
    elif alternative == "less":
        u = cells - u1
    else:
        u = max(u1, cells - u1)
    p = _norm_sf((u - mu - 0.5) / math.sqrt(var))
    if alternative == "two-sided":
        p *= 2.0
    return u1, float(min(1.0, max(0.0, p)))


def wilcoxon_signed_rank(
    diffs: ArrayLike,
    alternative: Alternative = "two-sided",
    *,
    method: Literal["auto", "exact", "asymptotic"] = "auto",
) -> tuple[float, float]:
    """Wilcoxon signed-rank test that paired differences centre on 0: ``(T+, p_value)``.

    ``diffs`` are per-pair differences, e.g. log(pr_i / base_i). ``T+`` is the sum of
    the ranks of |d| over the positive differences. ``"greater"`` tests whether the
    differences are shifted above 0 (PR slower), ``"less"`` below. Zero differences
    are dropped (Wilcoxon's method); tied |d| get average ranks.

    ``method="auto"`` uses the exact null distribution when no difference is zero or
    tied and n <= 50, else the normal approximation with mean n(n+1)/4, variance
    ``n(n+1)(2n+1)/24 - sum(t^3 - t)/48`` and a 0.5 continuity correction (matches
    ``scipy.stats.wilcoxon(..., correction=True)``). With no non-zero difference, p = 1.
    """
    _check_alternative(alternative)
    if method not in ("auto", "exact", "asymptotic"):
        raise ValueError(f"method must be 'auto', 'exact' or 'asymptotic', got {method!r}")
    d = _samples(diffs, "diffs", positive=False)
    had_zeros = bool(np.any(d == 0))
    d = d[d != 0]
    n = d.size
    if n == 0:
        return 0.0, 1.0
    ranks, ties = _average_ranks(np.abs(d))
    r_plus = float(ranks[d > 0].sum())
    has_ties = bool(np.any(ties > 1))

    exact_ok = not has_ties and not had_zeros and n <= _WILCOXON_EXACT_MAX_N
    if method == "exact" and not exact_ok:
        raise ValueError(
            "exact signed-rank p-values need at most 50 differences, none zero or tied; use method='auto'"
        )
    if method == "exact" or (method == "auto" and exact_ok):
        upper, lower = _tail_pvalues(_wilcoxon_exact_counts(n), int(round(r_plus)), 2**n)
        p = {"greater": upper, "less": lower}.get(alternative, 2.0 * min(upper, lower))
        return r_plus, float(min(1.0, p))

    mu = n * (n + 1) / 4.0
    var = n * (n + 1) * (2 * n + 1) / 24.0 - float(np.sum(ties.astype(float) ** 3 - ties)) / 48.0
    if var <= 0:
        return r_plus, 1.0
    sd = math.sqrt(var)
    if alternative == "greater":
        p = _norm_sf((r_plus - mu - 0.5) / sd)
    elif alternative == "less":
        p = _norm_sf((mu - r_plus - 0.5) / sd)
    else:
        p = 2.0 * _norm_sf((abs(r_plus - mu) - 0.5) / sd)
    return r_plus, float(min(1.0, max(0.0, p)))


# ---------------------------------------------------------------- ratio intervals


def _bootstrap_stat(
    x: np.ndarray, statistic: Callable[..., np.ndarray], n_resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """``statistic`` of ``n_resamples`` resamples (with replacement) of ``x``, vectorised."""
    n = x.size
    rows = max(1, _BOOTSTRAP_CHUNK // n)
    out = np.empty(n_resamples)
    for start in range(0, n_resamples, rows):
        stop = min(n_resamples, start + rows)
        resampled = x[rng.integers(0, n, size=(stop - start, n))]
        if statistic is np.median:
            # A full sort of each row is several times faster than np.median's
            # two-pivot partition at the sample sizes the gate uses.
            resampled.sort(axis=1)
            out[start:stop] = 0.5 * (resampled[:, (n - 1) // 2] + resampled[:, n // 2])
        else:
            out[start:stop] = statistic(resampled, axis=1)
    return out


def bootstrap_ratio_ci(
    base: ArrayLike,
    pr: ArrayLike,
    *,
    statistic: Callable[..., np.ndarray] = np.median,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Percentile-bootstrap CI of ``statistic(pr) / statistic(base)``: ``(point, lo, hi)``.

    ``base`` and ``pr`` are resampled independently (unpaired samples);
    ``statistic`` must accept ``axis=`` like ``np.median`` / ``np.mean``. ``point`` is
    the ratio on the original samples, ``[lo, hi]`` the central ``confidence``
    interval of the resampled ratios. Deterministic for a given ``seed``.
    """
    b = _samples(base, "base")
    p = _samples(pr, "pr")
    confidence = _check_open_unit(confidence, "confidence")
    n_resamples = _check_resamples(n_resamples)
    sb, sp = float(statistic(b)), float(statistic(p))
    if not (sb > 0 and sp > 0):
        raise ValueError("statistic must be positive on positive samples")
    rng = np.random.default_rng(seed)
    ratios = _bootstrap_stat(p, statistic, n_resamples, rng) / _bootstrap_stat(b, statistic, n_resamples, rng)
    tail = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(ratios, [tail, 1.0 - tail])
    return sp / sb, float(lo), float(hi)


def paired_ratio_ci(
    base: ArrayLike,
    pr: ArrayLike,
    *,
    confidence: float = 0.95,
    method: Literal["t", "bootstrap"] = "t",
    n_resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """CI of the typical ratio pr/base over back-to-back pairs: ``(point, lo, hi)``.

    ``base[i]`` and ``pr[i]`` were measured together, so they share that moment's
    machine state (a busy neighbour, a clock change). With ``d_i = log(pr_i/base_i)``
    the common factor cancels; ``point = exp(mean(d))`` is the geometric mean of the
    per-pair ratios and the interval is ``exp(mean(d) +/- t_{n-1} * sd(d)/sqrt(n))``.

    Why a t interval on the log-ratios (the default) rather than a bootstrap:

    - the d_i are close to symmetric even when latencies are right-skewed: the drift
      cancels and what remains is the difference of two like noise terms, so the
      mean of d converges fast and the t interval is accurate at the sample sizes
      the gate uses (about 20 and more);
    - at small n the percentile bootstrap of a mean is too narrow (it uses the
      normal quantile and the biased sd), i.e. it fails PRs too readily; the t
      quantile accounts for the estimated sd;
    - an outlier pair inflates sd(d) and widens the interval, so a stray sample
      makes the gate ask for a re-measure rather than fail;
    - it needs no random numbers: same samples, same interval.

    ``method="bootstrap"`` gives the percentile bootstrap of the same mean instead
    (``n_resamples``, ``seed``). Needs at least 2 pairs of equal length.
    """
    b = _samples(base, "base")
    p = _samples(pr, "pr")
    if b.size != p.size:
        raise ValueError(f"paired samples need equal lengths, got base={b.size} and pr={p.size}")
    if b.size < 2:
        raise ValueError("paired samples need at least 2 pairs")
    confidence = _check_open_unit(confidence, "confidence")
    d = np.log(p) - np.log(b)
    n = d.size
    mean = float(d.mean())
    if method == "t":
        half = _t_ppf(0.5 + confidence / 2.0, n - 1) * float(d.std(ddof=1)) / math.sqrt(n)
        return math.exp(mean), math.exp(mean - half), math.exp(mean + half)
    if method == "bootstrap":
        rng = np.random.default_rng(seed)
        means = _bootstrap_stat(d, np.mean, _check_resamples(n_resamples), rng)
        tail = (1.0 - confidence) / 2.0
        lo, hi = np.quantile(means, [tail, 1.0 - tail])
        return math.exp(mean), math.exp(float(lo)), math.exp(float(hi))
    raise ValueError(f"method must be 't' or 'bootstrap', got {method!r}")


# ----------------------------------------------------------------------- the gate


@dataclass(frozen=True)
class Comparison:
    """The gate's comparison of PR samples against base samples (lower is better).

    ``ratio`` is pr/base: the ratio of medians (unpaired) or the geometric mean of the
    per-pair ratios (paired); ``delta = ratio - 1`` (+0.08 = 8% slower).
    ``[ci_lo, ci_hi]`` is its ``confidence`` interval. ``p_value`` is the one-sided
    p-value of the rank test in the direction of the observed change (PR slower when
    ratio >= 1, faster otherwise); ``test`` names that test. ``significant`` and
    ``verdict`` follow :func:`decide`.
    """

    ratio: float
    delta: float
    ci_lo: float
    ci_hi: float
    p_value: float
    significant: bool
    verdict: Verdict
    threshold: float
    n_base: int
    n_pr: int
    paired: bool
    test: str

    def describe(self) -> str:
        """One line for a report, e.g. ``+8.1% (95% CI +6.9%..+9.4%), p=3e-12: regressed``."""
        return (
            f"{self.delta:+.1%} (CI {self.ci_lo - 1:+.1%}..{self.ci_hi - 1:+.1%}), "
            f"p={self.p_value:.2g}: {self.verdict}"
        )

    def to_dict(self) -> dict:
        """Plain dict of the fields, for JSON."""
        return asdict(self)


def decide(
    ratio: float,
    ci_lo: float,
    ci_hi: float,
    p_slower: float,
    p_faster: float,
    *,
    threshold: float,
    alpha: float = 0.05,
) -> tuple[Verdict, bool]:
    """Apply the gate's decision rule; returns ``(verdict, significant)``.

    Inputs: the point ratio ``r = pr/base`` (lower is better, so r > 1 is slower), its
    confidence interval ``[lo, hi]``, and the one-sided p-values of the rank test for
    "PR slower" (``p_slower``) and "PR faster" (``p_faster``). With
    ``U = 1 + threshold`` and ``L = 1 - threshold``:

    - *significantly slower* means ``p_slower < alpha`` and ``lo > 1``;
      *significantly faster* means ``p_faster < alpha`` and ``hi < 1``;
      ``significant`` is either of the two.
    - **regressed**: significantly slower and ``r > U`` and ``lo > U`` (the whole
      interval lies beyond the threshold).
    - **improved**: significantly faster and ``r < L`` and ``hi < L``.
    - **borderline** (re-measure before failing): otherwise, when ``r > U`` or
      ``r < L`` (the point estimate is beyond the threshold but the change is not
      significant or its interval reaches back inside the threshold); or when the
      change is significantly slower with ``hi > U``, or significantly faster with
      ``lo < L`` (significant, and the interval straddles the threshold).
    - **unchanged**: everything else: the point estimate is within the threshold
      and the change is either not significant or its interval stays within it.
    """
    threshold = float(threshold)
    if not 0.0 <= threshold < 1.0:
        raise ValueError(f"threshold must be a fraction in [0, 1), e.g. 0.05 for 5%, got {threshold!r}")
    alpha = _check_open_unit(alpha, "alpha")
    upper, lower = 1.0 + threshold, 1.0 - threshold
    slower = p_slower < alpha and ci_lo > 1.0
    faster = p_faster < alpha and ci_hi < 1.0
    if slower and ratio > upper and ci_lo > upper:
        verdict: Verdict = "regressed"
    elif faster and ratio < lower and ci_hi < lower:
        verdict = "improved"
    elif ratio > upper or ratio < lower or (slower and ci_hi > upper) or (faster and ci_lo < lower):
        verdict = "borderline"
    else:
        verdict = "unchanged"
    return verdict, bool(slower or faster)


def compare(
    base: ArrayLike,
    pr: ArrayLike,
    *,
    threshold: float,
    alpha: float = 0.05,
    confidence: float = 0.95,
    paired: bool = False,
    seed: int = 0,
    n_resamples: int = 2000,
) -> Comparison:
    """Compare PR latency samples against base samples and decide (lower is better).

    Unpaired (default): ``ratio`` = median(pr) / median(base), interval from
    :func:`bootstrap_ratio_ci` (median, ``confidence``, ``n_resamples``, ``seed``),
    significance from the one-sided Mann-Whitney U test (:func:`mann_whitney_u`).

    Paired (``paired=True``, ``base[i]`` and ``pr[i]`` measured back to back):
    ``ratio`` = geometric mean of pr_i/base_i with the t interval of
    :func:`paired_ratio_ci`, significance from the one-sided Wilcoxon signed-rank test
    on log(pr_i/base_i) (the paired counterpart of Mann-Whitney; the unpaired test
    would drown the effect in the drift that pairing cancels).

    The verdict follows :func:`decide`: "regressed" needs the PR to be significantly
    slower (one-sided rank test p < alpha and the interval's lower bound > 1) with the
    interval entirely above ``1 + threshold``; "improved" is the mirror image below
    ``1 - threshold``; "borderline" means re-measure (beyond the threshold but not
    significant, or significant with the interval straddling the threshold);
    otherwise "unchanged".
    """
    b = _samples(base, "base")
    p = _samples(pr, "pr")
    if paired:
        ratio, lo, hi = paired_ratio_ci(b, p, confidence=confidence)
        d = np.log(p) - np.log(b)
        _, p_slower = wilcoxon_signed_rank(d, "greater")
        _, p_faster = wilcoxon_signed_rank(d, "less")
        test = "wilcoxon-signed-rank"
    else:
        ratio, lo, hi = bootstrap_ratio_ci(
            b, p, statistic=np.median, confidence=confidence, n_resamples=n_resamples, seed=seed
        )
        _, p_slower = mann_whitney_u(p, b, "greater")
        _, p_faster = mann_whitney_u(p, b, "less")
        test = "mann-whitney-u"
    return _comparison(ratio, lo, hi, p_slower, p_faster, threshold=threshold, alpha=alpha,
                       n=(b.size, p.size), paired=paired, test=test)


def _comparison(ratio: float, lo: float, hi: float, p_slower: float, p_faster: float, *,
                threshold: float, alpha: float, n: tuple[int, int], paired: bool,
                test: str) -> Comparison:
    """A Comparison with the verdict of :func:`decide`."""
    verdict, significant = decide(ratio, lo, hi, p_slower, p_faster, threshold=threshold,
                                  alpha=alpha)
    return Comparison(ratio=ratio, delta=ratio - 1.0, ci_lo=lo, ci_hi=hi,
                      p_value=p_slower if ratio >= 1.0 else p_faster,
                      significant=significant, verdict=verdict, threshold=float(threshold),
                      n_base=int(n[0]), n_pr=int(n[1]), paired=bool(paired), test=test)


def pooled_sd(groups: Sequence[ArrayLike]) -> tuple[float | None, int]:
    """The spread between runs of the same code: ``(sd, df)`` of log run medians.

    Each group holds the medians of runs that measured the same thing (one code hash);
    their deviations from their own group's mean are pooled, so a real change of level
    between groups (a merged speed-up) is not mistaken for drift. ``df`` is the count
    of runs minus the count of groups; ``sd`` is None while df < 2.
    """
    dev, df = 0.0, 0
    for g in groups:
        x = np.log(_samples(g, "run medians"))
        dev += float(((x - x.mean()) ** 2).sum())
        df += x.size - 1
    return (math.sqrt(dev / df) if df >= 2 else None), df


def compare_runs(
    base_runs: ArrayLike,
    pr_runs: ArrayLike,
    *,
    sd: float,
    df: int | None,
    threshold: float,
    alpha: float = 0.05,
    confidence: float = 0.95,
) -> Comparison:
    """Compare a PR's runs with a stored baseline's runs, one median per process.

    Within one process the samples scatter little, but a process's level drifts
    (memory layout, frequency, the neighbours of a shared runner): across processes
    of unchanged code the median moves by a few percent, so thousands of samples from
    one run say nothing about the next. Here the unit is the run. With ``x`` the log
    medians of the ``n`` baseline runs and ``y`` those of the ``k`` PR runs::

        d = mean(y) - mean(x),   se = sd * sqrt(1/n + 1/k)

    ``sd`` is the runner's drift between runs (log scale, e.g. from :func:`pooled_sd`
    over the baseline's history) with ``df`` degrees of freedom: the interval is
    ``exp(d +/- t_df * se)`` and the one-sided p-values come from the t distribution.
    ``df=None`` means ``sd`` is assumed, not estimated (normal quantiles). The verdict
    follows :func:`decide`, as in :func:`compare`.
    """
    x = np.log(_samples(base_runs, "base runs"))
    y = np.log(_samples(pr_runs, "pr runs"))
    if not (math.isfinite(sd) and sd > 0):
        raise ValueError(f"sd must be a positive finite number, got {sd!r}")
    if df is not None and (int(df) != df or df < 1):
        raise ValueError(f"df must be a positive integer or None, got {df!r}")
    confidence = _check_open_unit(confidence, "confidence")
    d = float(y.mean() - x.mean())
    se = sd * math.sqrt(1.0 / x.size + 1.0 / y.size)
    q = 0.5 + confidence / 2.0
    half = (_t_ppf(q, int(df)) if df is not None else _norm_ppf(q)) * se
    z = d / se
    p_slower = 1.0 - _t_cdf(z, int(df)) if df is not None else _norm_sf(z)
    p_faster = _t_cdf(z, int(df)) if df is not None else _norm_sf(-z)
    return _comparison(math.exp(d), math.exp(d - half), math.exp(d + half), p_slower,
                       p_faster, threshold=threshold, alpha=alpha, n=(x.size, y.size),
                       paired=False, test="t-test on run medians" if df is not None
                       else "z-test on run medians")


def min_detectable_change(
    samples_or_noise: Union[float, ArrayLike],
    n: int,
    *,
    alpha: float = 0.05,
    power: float = 0.8,
) -> float:
    """Smallest relative slowdown that :func:`compare` (unpaired) detects as significant.

    ``samples_or_noise`` is either the relative noise sigma (e.g. 0.03) or latency
    samples, from which :func:`noise` (1.4826 * MAD / median) is taken. ``n`` is the
    number of samples on *each* side. The formula is the two-sample normal
    approximation for a difference of medians of log-latency::

        mdc = exp((z_{1 - alpha/2} + z_{power}) * sqrt(pi/2) * sigma * sqrt(2/n)) - 1

    ``sqrt(pi/2) * sigma / sqrt(n)`` is the large-sample standard error of a sample
    median; ``z_{1 - alpha/2}`` because compare's binding condition is the lower
    bound of the two-sided ``1 - alpha`` interval (alpha = 1 - confidence, 0.05 for
    the default 95%) exceeding 1. A slowdown of ``mdc`` is flagged significant with
    probability about ``power``; to be reported "regressed" the slowdown must also
    clear the threshold with its whole interval, i.e. be about ``threshold + mdc``
    (when mdc is small). A threshold below mdc cannot be enforced with ``n`` samples
    on this runner. For paired samples use ``(z_{1-alpha/2} + z_power) * sd(d)/sqrt(n)``
    with d the per-pair log-ratios.
    """
    if isinstance(samples_or_noise, (int, float, np.floating, np.integer)) and not isinstance(
        samples_or_noise, bool
    ):
        sigma = float(samples_or_noise)
        if not (math.isfinite(sigma) and sigma >= 0):
            raise ValueError(f"noise must be a finite non-negative fraction, got {sigma!r}")
    else:
        sigma = noise(samples_or_noise)
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise ValueError(f"n must be a positive integer number of samples per side, got {n!r}")
    alpha = _check_open_unit(alpha, "alpha")
    power = _check_open_unit(power, "power")
    z = _norm_ppf(1.0 - alpha / 2.0) + _norm_ppf(power)
    return math.expm1(z * math.sqrt(math.pi / 2.0) * sigma * math.sqrt(2.0 / n))


def runs_detectable_change(sd: float, df: int | None, n_base: int, n_pr: int = 1, *,
                           alpha: float = 0.05, power: float = 0.8) -> float:
    """Smallest relative slowdown :func:`compare_runs` finds significant with probability
    about ``power``: ``exp((q_{1-alpha/2} + z_power) * sd * sqrt(1/n_base + 1/n_pr)) - 1``,
    q from the t distribution with ``df`` (normal when df is None)."""
    alpha = _check_open_unit(alpha, "alpha")
    q = _t_ppf(1.0 - alpha / 2.0, int(df)) if df is not None else _norm_ppf(1.0 - alpha / 2.0)
    z = q + _norm_ppf(_check_open_unit(power, "power"))
    return math.expm1(z * sd * math.sqrt(1.0 / n_base + 1.0 / n_pr))
