"""Statistics for the performance gate: summaries, the two comparisons, the verdict rule.

Pure functions over latency samples (seconds, lower is better): no I/O, no torch.
Distributions and tests come from ``scipy.stats``, imported inside the functions that
need them, so importing this module (every gatekeeper process does, a service calling
``gatekeeper.warm_start()`` included) never loads scipy.

Why two comparisons and no sample-level one: a process's level drifts (memory layout,
clock frequency, a shared runner's neighbours), so across processes of unchanged code
the median moves by a few percent while one process's samples scatter far less. That
drift is invisible in either side's samples, and a test over the samples of two
processes blames it on the PR (Mann-Whitney called 93% of unchanged runs significant).
The honest answers: measure base and PR round by round in one process, where the drift
cancels (:func:`compare` with ``paired=True``), or take the process as the unit
(:func:`compare_runs`), where the drift between runs is measured (:func:`pooled_sd`)
and paid for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np

__all__ = [
    "MAD_TO_SIGMA",
    "Summary",
    "Comparison",
    "Decision",
    "summarize",
    "noise",
    "decide",
    "compare",
    "pooled_sd",
    "compare_runs",
    "runs_detectable_change",
]

#: Scale factor that turns a median absolute deviation into a standard deviation for
#: normal data (1 / Phi^-1(3/4)).
MAD_TO_SIGMA = 1.4826

#: what one comparison says (the target's verdict is the gate's: gate.verdicts)
Decision = Literal["regressed", "improved", "unchanged", "borderline"]
Unit = Literal["pairs", "runs"]  # what a comparison's n counts
ArrayLike = Sequence[float] | np.ndarray

# The exact signed-rank distribution is used up to this many differences (none zero
# or tied), the normal approximation beyond.
_WILCOXON_EXACT_MAX_N = 50


def _samples(x: ArrayLike, name: str) -> np.ndarray:
    """``x`` as a 1-D array of positive finite floats, or ValueError saying what is wrong."""
    try:
        arr = np.asarray(x, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: samples must be numbers ({exc})") from None
    if arr.ndim != 1:
        raise ValueError(
            f"{name}: samples must be a flat sequence of numbers, got shape {arr.shape}"
        )
    if arr.size == 0:
        raise ValueError(f"{name}: no samples (need at least one measurement)")
    if not np.all(np.isfinite(arr)):
        bad = int(np.count_nonzero(~np.isfinite(arr)))
        raise ValueError(f"{name}: {bad} of {arr.size} samples are NaN or infinite")
    if np.any(arr <= 0):
        bad = int(np.count_nonzero(arr <= 0))
        raise ValueError(
            f"{name}: {bad} of {arr.size} samples are zero or negative (min "
            f"{arr.min()!r}); latency samples must be positive durations in seconds"
        )
    return arr


def _check_open_unit(value: float, name: str) -> float:
    value = float(value)
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be strictly between 0 and 1, got {value!r}")
    return value


# ------------------------------------------------------------------------------ summary


@dataclass(frozen=True)
class Summary:
    """Descriptive statistics of latency samples (seconds).

    Percentiles interpolate linearly between order statistics (numpy's default).
    ``stdev`` has ddof=1 (0 for one sample); ``mad`` is the raw median absolute
    deviation, *not* scaled to a standard deviation; ``iqr`` is p75 - p25.
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


def summary_doc(samples: ArrayLike) -> dict[str, float]:
    """:func:`summarize` as the results' ``LatencySummary`` fields (``p50`` the median)."""
    s = summarize(samples)
    return {
        "n": s.n,
        "mean": s.mean,
        "p50": s.median,
        "p95": s.p95,
        "p99": s.p99,
        "min": s.min,
        "max": s.max,
        "stdev": s.stdev,
    }


def noise(samples: ArrayLike) -> float:
    """Relative robust spread of latency samples: ``1.4826 * MAD / median``.

    For log-normal timing noise with a small sigma this estimates that sigma (0.03 for
    "3% noise"), and unlike the coefficient of variation it ignores a minority of
    outliers (stalls).
    """
    x = _samples(samples, "samples")
    median = float(np.median(x))
    return MAD_TO_SIGMA * float(np.median(np.abs(x - median))) / median


# ----------------------------------------------------------------------- the verdict


@dataclass(frozen=True)
class Comparison:
    """The gate's comparison of PR against base (lower is better).

    ``ratio`` is pr/base (``delta = ratio - 1``, +0.08 = 8% slower) with its
    ``confidence`` interval ``[ci_lo, ci_hi]``. ``p_value`` is the one-sided p-value of
    ``test`` in the direction of the observed change (PR slower when ratio >= 1).
    ``n_base``/``n_pr`` count ``unit``s: "pairs" (paired :func:`compare`) or "runs"
    (:func:`compare_runs`). ``significant`` and ``verdict`` follow :func:`decide`.
    ``normalised`` says, where the gate sets it (stored mode's latency), whether the
    values compared were divided by the co-measured reference workload; None elsewhere.
    """

    ratio: float
    delta: float
    ci_lo: float
    ci_hi: float
    p_value: float
    significant: bool
    verdict: Decision
    threshold: float
    n_base: int
    n_pr: int
    paired: bool
    test: str
    unit: Unit
    normalised: bool | None = None

    def describe(self) -> str:
        """One line for a report, e.g. ``+8.1% (CI +6.9%..+9.4%), p=3e-12: regressed``."""
        return (
            f"{self.delta:+.1%} (CI {self.ci_lo - 1:+.1%}..{self.ci_hi - 1:+.1%}), "
            f"p={self.p_value:.2g}: {self.verdict}"
        )

    def to_dict(self) -> dict:
        """Plain dict of the fields, for JSON (``normalised`` only when set)."""
        d = asdict(self)
        if self.normalised is None:
            del d["normalised"]
        return d


def decide(
    ratio: float,
    ci_lo: float,
    ci_hi: float,
    p_slower: float,
    p_faster: float,
    *,
    threshold: float,
    alpha: float = 0.05,
    interval_decides: bool = False,
) -> tuple[Decision, bool]:
    """The gate's decision rule; returns ``(verdict, significant)``.

    ``ratio`` is pr/base with interval ``[lo, hi]``; ``p_slower``/``p_faster`` are the
    test's one-sided p-values. With ``U = 1 + threshold`` and ``L = 1 - threshold``:

    - *significantly slower*: ``p_slower < alpha`` and ``lo > 1``; *significantly
      faster*: ``p_faster < alpha`` and ``hi < 1``. ``significant`` is either.
    - **regressed**: significantly slower, ``ratio > U`` and ``lo > U`` (the whole
      interval lies beyond the threshold); **improved** is the mirror below ``L``.
    - **borderline** (re-measure before failing): the point estimate is beyond the
      threshold but that is not shown, or the change is significant and its interval
      straddles the threshold; with ``interval_decides`` (the paired comparison, whose
      interval is the measurement's own), also any interval that reaches past the
      upper threshold: a slowdown it does not rule out is not ``unchanged``.
    - **unchanged**: everything else.
    """
    threshold = float(threshold)
    if not 0.0 <= threshold < 1.0:
        raise ValueError(
            f"threshold must be a fraction in [0, 1), e.g. 0.05 for 5%, got {threshold!r}"
        )
    alpha = _check_open_unit(alpha, "alpha")
    upper, lower = 1.0 + threshold, 1.0 - threshold
    slower = p_slower < alpha and ci_lo > 1.0
    faster = p_faster < alpha and ci_hi < 1.0
    if slower and ratio > upper and ci_lo > upper:
        verdict: Decision = "regressed"
    elif faster and ratio < lower and ci_hi < lower:
        verdict = "improved"
    elif (
        ratio > upper
        or ratio < lower
        or (slower and ci_hi > upper)
        or (faster and ci_lo < lower)
        or (interval_decides and ci_hi > upper)
    ):
        verdict = "borderline"
    else:
        verdict = "unchanged"
    return verdict, bool(slower or faster)


def _comparison(
    ratio: float,
    lo: float,
    hi: float,
    p_slower: float,
    p_faster: float,
    *,
    threshold: float,
    alpha: float,
    n: tuple[int, int],
    paired: bool,
    test: str,
    unit: Unit,
) -> Comparison:
    """A Comparison with the verdict of :func:`decide` (a paired one's interval decides)."""
    verdict, significant = decide(
        ratio,
        lo,
        hi,
        p_slower,
        p_faster,
        threshold=threshold,
        alpha=alpha,
        interval_decides=paired,
    )
    return Comparison(
        ratio=ratio,
        delta=ratio - 1.0,
        ci_lo=lo,
        ci_hi=hi,
        p_value=p_slower if ratio >= 1.0 else p_faster,
        significant=significant,
        verdict=verdict,
        threshold=float(threshold),
        n_base=int(n[0]),
        n_pr=int(n[1]),
        paired=bool(paired),
        test=test,
        unit=unit,
    )


def _signed_rank_p(d: np.ndarray) -> tuple[float, float]:
    """One-sided Wilcoxon signed-rank p-values (shifted above 0, below 0) of ``d``.

    Zero differences are dropped. Exact null distribution when no difference is zero
    or tied and n <= 50; otherwise the normal approximation with tie-corrected variance
    and continuity correction. With no non-zero difference there is no evidence: 1, 1.
    """
    from scipy.stats import wilcoxon

    nz = d[d != 0]
    if nz.size == 0:
        return 1.0, 1.0
    exact = (
        nz.size == d.size
        and nz.size <= _WILCOXON_EXACT_MAX_N
        and np.unique(np.abs(nz)).size == nz.size
    )
    method = "exact" if exact else "asymptotic"
    slower, faster = (
        float(wilcoxon(nz, correction=True, alternative=alt, method=method).pvalue)
        for alt in ("greater", "less")
    )
    return slower, faster


def log_ratios(base: ArrayLike, pr: ArrayLike) -> np.ndarray:
    """``log(pr_i / base_i)`` of paired samples, or ValueError saying what is wrong."""
    b = _samples(base, "base")
    p = _samples(pr, "pr")
    if b.size != p.size:
        raise ValueError(f"paired samples need equal lengths, got base={b.size} and pr={p.size}")
    if b.size < 2:
        raise ValueError("paired samples need at least 2 pairs")
    return np.log(p) - np.log(b)


def compare(
    base: ArrayLike,
    pr: ArrayLike,
    *,
    threshold: float,
    alpha: float = 0.05,
    confidence: float = 0.95,
    paired: bool,
) -> Comparison:
    """Compare back-to-back pairs ``(base[i], pr[i])`` measured in one process.

    The pair shares that moment's machine state, which cancels in
    ``d_i = log(pr_i / base_i)``. ``ratio = exp(mean(d))`` (the geometric mean of the
    per-pair ratios) with the interval ``exp(mean(d) +/- t_{n-1} * sd(d) / sqrt(n))``;
    significance from the one-sided Wilcoxon signed-rank test on ``d``. The verdict
    follows :func:`decide`.

    Why a t interval on the log-ratios rather than a bootstrap: the d_i are close to
    symmetric even when latencies are skewed (the difference of two like noise terms),
    so the t interval is accurate at the gate's sample sizes; at small n the percentile
    bootstrap is too narrow (fails PRs too readily); an outlier pair widens the interval
    (re-measure, not fail); and it needs no random numbers.

    ``paired`` must be True: unpaired samples come from two processes, whose drift a
    sample-level test blames on the PR (see the module docstring; use
    :func:`compare_runs`).
    """
    if not paired:
        raise ValueError(
            "unpaired samples from two processes cannot be compared sample by "
            "sample (drift between processes); use compare_runs"
        )
    d = log_ratios(base, pr)
    confidence = _check_open_unit(confidence, "confidence")
    from scipy.stats import t

    n, mean = d.size, float(d.mean())
    half = float(t.ppf(0.5 + confidence / 2.0, n - 1)) * float(d.std(ddof=1)) / math.sqrt(n)
    p_slower, p_faster = _signed_rank_p(d)
    return _comparison(
        math.exp(mean),
        math.exp(mean - half),
        math.exp(mean + half),
        p_slower,
        p_faster,
        threshold=threshold,
        alpha=alpha,
        n=(n, n),
        paired=True,
        test="wilcoxon-signed-rank",
        unit="pairs",
    )


# ------------------------------------------------- stored baselines: runs, not samples


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

    With ``x`` the log medians of the ``n`` baseline runs and ``y`` those of the ``k``
    PR runs::

        d = mean(y) - mean(x),   se = sd * sqrt(1/n + 1/k)

    ``sd`` is the runner's drift between runs (log scale, e.g. :func:`pooled_sd` over
    the baseline's history) with ``df`` degrees of freedom: the interval is
    ``exp(d +/- t_df * se)`` and the one-sided p-values come from t_df. ``df=None``
    means ``sd`` is assumed, not estimated: normal quantiles. Verdict: :func:`decide`.
    """
    x = np.log(_samples(base_runs, "base runs"))
    y = np.log(_samples(pr_runs, "pr runs"))
    if not (math.isfinite(sd) and sd > 0):
        raise ValueError(f"sd must be a positive finite number, got {sd!r}")
    if df is not None and (int(df) != df or df < 1):
        raise ValueError(f"df must be a positive integer or None, got {df!r}")
    confidence = _check_open_unit(confidence, "confidence")
    from scipy.stats import norm, t

    dist = t(int(df)) if df is not None else norm()
    d = float(y.mean() - x.mean())
    se = sd * math.sqrt(1.0 / x.size + 1.0 / y.size)
    half = float(dist.ppf(0.5 + confidence / 2.0)) * se
    z = d / se
    return _comparison(
        math.exp(d),
        math.exp(d - half),
        math.exp(d + half),
        float(dist.sf(z)),
        float(dist.cdf(z)),
        threshold=threshold,
        alpha=alpha,
        n=(x.size, y.size),
        paired=False,
        test="t-test on run medians" if df is not None else "z-test on run medians",
        unit="runs",
    )


def runs_detectable_change(
    sd: float,
    df: int | None,
    n_base: int,
    n_pr: int = 1,
    *,
    alpha: float = 0.05,
    power: float = 0.8,
) -> float:
    """Smallest relative slowdown :func:`compare_runs` finds significant with probability
    about ``power``: ``exp((q_{1-alpha/2} + z_power) * sd * sqrt(1/n_base + 1/n_pr)) - 1``,
    q from the t distribution with ``df`` (normal when df is None)."""
    alpha = _check_open_unit(alpha, "alpha")
    power = _check_open_unit(power, "power")
    from scipy.stats import norm, t

    q = float((t(int(df)) if df is not None else norm()).ppf(1.0 - alpha / 2.0))
    z = q + float(norm.ppf(power))
    return math.expm1(z * sd * math.sqrt(1.0 / n_base + 1.0 / n_pr))
