"""A generate target's timed rounds: as :func:`gatekeeper.worker.timing.latency` times
a forward, round by round and interleaved (eager, compiled, paired the base commit's,
and the drift reference; the same order rules, the same halfway, the same stop), but
each sample is one whole generation, timed token by token: its end-to-end seconds (the
``latency`` the gate pairs like any target's), its time to first token and its time per
output token (the median gap between its later tokens), each kept round by round so
that the paired gate compares TTFT and TPOT with the base's as it compares latency.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..config import MeasureConfig
from ..gate import rounds
from .generate import Run
from .timing import (
    CpuWatch,
    DriftReference,
    _enough,
    _loops,
    _round_order,
    _timed,
    latency_doc,
    time_limit,
)

# what each round records of a generation, besides its end-to-end seconds
PER_ROUND = ("first_token", "per_token")


def _decided(samples: dict[str, list[float]], per: dict[str, dict], decide_at: float) -> bool:
    """Paired: the rounds decide a slowdown of the generation, its first token and its
    decode against ``decide_at`` (none of their intervals straddles it)."""
    pairs = [(samples["base"], samples["compiled"])]
    pairs += [(per[k]["base"], per[k]["compiled"]) for k in PER_ROUND]
    return all(rounds.paired_decisive(b, h, threshold=decide_at) for b, h in pairs)


def _side(
    runs: dict[str, Callable[[], Run]],
    name: str,
    samples: dict[str, list[float]],
    per: dict[str, dict[str, list[float]]],
    gaps: dict[str, list[float]],
) -> None:
    run = runs[name]()
    samples[name].append(run.e2e)
    per["first_token"][name].append(run.ttft)
    per["per_token"][name].append(run.tpot)
    gaps[name].extend(run.gaps)


def generation_rounds(
    runs: dict[str, Callable[[], Run]],
    device: str,
    budget: MeasureConfig,
    halfway: Callable[[], Any] | None = None,
    decide_at: float | None = None,
) -> tuple[dict, dict]:
    """Warm up, then one generation of each side (``eager``, ``compiled`` and, paired,
    ``base``) and a drift-reference sample per round until ``min_time`` has passed (at
    least 5 rounds) or ``max_samples`` rounds were taken; paired with ``decide_at``, on
    while undecided up to :func:`~gatekeeper.worker.timing.time_limit`. Returns the
    latency document (seconds per generation, as :func:`~gatekeeper.worker.timing.latency`
    returns it) and, by figure then side, the per-round TTFT and TPOT and every
    token gap."""
    ref = DriftReference(device)
    for _ in range(budget.warmup):
        for fn in runs.values():
            fn()
    ref_loops = _loops(max(_timed(ref, 1, device), 1e-7))
    names = [*runs, "reference"]
    samples: dict[str, list[float]] = {n: [] for n in names}
    per: dict[str, dict[str, list[float]]] = {k: {n: [] for n in runs} for k in PER_ROUND}
    gaps: dict[str, list[float]] = {n: [] for n in runs}
    watch, start, half = CpuWatch(), time.perf_counter(), 0
    while len(samples["eager"]) < budget.max_samples:
        n, elapsed = len(samples["eager"]), time.perf_counter() - start
        done = _enough(_Alone, budget, elapsed, n, half)
        if done and "base" in runs and decide_at is not None and halfway is None:
            done = elapsed >= time_limit(budget) or _decided(samples, per, decide_at)
        if halfway is not None and (
            done or elapsed >= budget.min_time / 2 or n >= budget.max_samples // 2
        ):
            half, done, paused = n, False, time.perf_counter()
            halfway()
            halfway = None
            for _ in range(budget.warmup):
                for fn in runs.values():
                    fn()
            start += time.perf_counter() - paused
        if done:
            break
        for name in _round_order(names, n):
            if name == "reference":
                samples[name].append(_timed(ref, ref_loops, device))
            else:
                _side(runs, name, samples, per, gaps)
    watch.stop()
    latency = latency_doc(samples, 1, watch, start)
    latency.pop("cpu")  # a distributed target's only
    return latency, {**per, "gaps": gaps, "e2e": {n: samples[n] for n in runs}}


class _Alone:
    """One process (no team of ranks: a generate target is not distributed)."""

    @staticmethod
    def any(flag: bool) -> bool:
        return flag


def side_figures(per: dict, name: str, batch: int) -> dict[str, float]:
    """One side's medians (a :class:`gatekeeper.generation.Side`), from
    :func:`generation_rounds`' per-round figures and ``samples``' end-to-end ones."""
    ttft = float(np.median(per["first_token"][name]))
    tpot = float(np.median(per["per_token"][name]))
    gaps = per["gaps"][name] or per["per_token"][name]
    return {
        "ttft_s": ttft,
        "tpot_s": tpot,
        "tpot_p95_s": float(np.percentile(gaps, 95)),
        "tokens_per_s": batch / tpot,
        "e2e_s": float(np.median(per["e2e"][name])),
    }
