"""Paired rounds: is there enough of them to decide? Pure functions over paired latency
samples (seconds), as :func:`gatekeeper.gate.stats.compare` reads them: its estimate
and interval without its test, whether that interval decides a slowdown against the
threshold, and the smallest slowdown samples of that spread could show. The worker asks
:func:`paired_decisive` after each round past ``measure.min_time``
(:func:`gatekeeper.worker.timing.latency`); the gate names
:func:`paired_detectable_change` in an ``inconclusive`` reason."""

from __future__ import annotations

import math

import numpy as np

from .stats import ArrayLike, _check_open_unit, log_ratios

__all__ = ["paired_decisive", "paired_detectable_change", "paired_interval"]

#: fewer pairs than this decide nothing (the rounds' own minimum)
MIN_PAIRS = 5


def _half_width(d: np.ndarray, confidence: float) -> float:
    """Half the t interval of the mean of ``d`` (log scale)."""
    from scipy.stats import t

    return (
        float(t.ppf(0.5 + confidence / 2.0, d.size - 1)) * float(d.std(ddof=1)) / math.sqrt(d.size)
    )


def paired_interval(
    base: ArrayLike, pr: ArrayLike, *, confidence: float = 0.95
) -> tuple[float, float, float]:
    """``(ratio, lo, hi)``: :func:`~gatekeeper.gate.stats.compare`'s paired estimate
    and interval, without its test."""
    d = log_ratios(base, pr)
    mean, half = float(d.mean()), _half_width(d, _check_open_unit(confidence, "confidence"))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def paired_decisive(
    base: ArrayLike, pr: ArrayLike, *, threshold: float, confidence: float = 0.95
) -> bool:
    """Whether paired samples decide a slowdown against ``threshold``: their interval
    lies wholly within ``1 + threshold`` (no such slowdown) or wholly beyond it. While
    it straddles the threshold, the measurement takes more rounds
    (:func:`gatekeeper.worker.timing.latency`); fewer than 5 pairs decide nothing."""
    if len(base) < MIN_PAIRS or len(base) != len(pr):
        return False
    _, lo, hi = paired_interval(base, pr, confidence=confidence)
    upper = 1.0 + float(threshold)
    return hi <= upper or lo > upper


def paired_detectable_change(
    base: ArrayLike,
    pr: ArrayLike,
    *,
    threshold: float = 0.0,
    alpha: float = 0.05,
    power: float = 0.8,
) -> float:
    """Smallest relative slowdown that paired samples with this spread and count would
    call ``regressed`` against ``threshold`` (the interval wholly beyond it) with
    probability about ``power``:
    ``(1 + threshold) * exp((t_{n-1, 1-alpha/2} + z_power) * sd(d) / sqrt(n)) - 1``,
    ``d`` the log ratios."""
    d = log_ratios(base, pr)
    alpha = _check_open_unit(alpha, "alpha")
    power = _check_open_unit(power, "power")
    from scipy.stats import norm, t

    z = float(t.ppf(1.0 - alpha / 2.0, d.size - 1)) + float(norm.ppf(power))
    return (1.0 + threshold) * math.exp(z * float(d.std(ddof=1)) / math.sqrt(d.size)) - 1.0
