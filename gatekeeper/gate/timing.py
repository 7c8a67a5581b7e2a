"""The timing rules: latency and speedup vs eager against the baseline's runs (stored
mode), one comparison at a time recorded on the verdict (both modes), and what a
target's row says when the run cannot decide. See gatekeeper.gate.rules."""

from __future__ import annotations

import dataclasses

from .. import metrics
from ..config import GateConfig
from ..distributed import slow_rank
from ..results import Baseline, TargetResult
from . import stats
from .drift import DEFAULT_DRIFT, DEFAULT_VS_EAGER_DRIFT, is_normalised, run_medians
from .verdicts import TargetVerdict, Verdict


def gate_runs(
    v: TargetVerdict,
    found: set[Verdict],
    result: TargetResult,
    baseline: Baseline,
    rules: GateConfig,
) -> None:
    """Stored mode: the PR's run medians against the baseline's runs of the same code."""
    base, noise = baseline.result, baseline.noise
    normalised = is_normalised(result) and is_normalised(base)
    runs = [
        m
        for m in (noise.runs if noise else [])
        if m.code_hash == base.code_hash and m.normalised == normalised
    ]
    pr = run_medians(result, normalised)
    if runs:
        base_lat, base_ratio = [m.latency for m in runs], [m.vs_eager for m in runs]
    else:  # an older baseline without run medians: its own run
        base_lat, base_ratio = (list(x) for x in zip(*run_medians(base, normalised), strict=True))
    if noise is not None and noise.between and runs and all(m.normalised for m in runs):
        lat_sd, ratio_sd, df = noise.between, noise.vs_eager_between, noise.df
    else:
        lat_sd, ratio_sd, df = None, None, None
    v.detectable = stats.runs_detectable_change(
        lat_sd or DEFAULT_DRIFT, df if lat_sd else None, len(base_lat), len(pr)
    )
    lat = stats.compare_runs(
        base_lat,
        [p[0] for p in pr],
        sd=lat_sd or DEFAULT_DRIFT,
        df=df if lat_sd else None,
        threshold=metrics.get("latency").setting(rules) or 0.0,
    )
    timing(v, found, "latency", dataclasses.replace(lat, normalised=normalised))
    name_rank(v, result, base)
    timing(
        v,
        found,
        "speedup vs eager",
        stats.compare_runs(
            base_ratio,
            [p[1] for p in pr],
            sd=ratio_sd or DEFAULT_VS_EAGER_DRIFT,
            df=df if ratio_sd else None,
            threshold=metrics.get("speedup").setting(rules) or 0.0,
        ),
    )
    if not lat_sd:
        v.notes.append(
            f"the baseline has too few runs of its code to measure this runner's "
            f"drift; assumed ±{DEFAULT_DRIFT:.0%} (publish more baselines, or "
            "pair with the base commit)"
        )


def name_rank(v: TargetVerdict, result: TargetResult, base: TargetResult | None = None) -> None:
    """A distributed target's latency regression: say which rank it is on (its CPU time
    per call rose most; the others wait for it in a collective)."""
    if not result.ranks or v.latency is None or v.latency.verdict != "regressed":
        return
    if (which := slow_rank(result, base)) is None:
        return
    for i, reason in enumerate(v.reasons):
        if reason.startswith("latency "):
            v.reasons[i] = f"{reason} on {which}"


def timing(
    v: TargetVerdict,
    found: set[Verdict],
    name: str,
    comp: stats.Comparison,
    said: str | None = None,
    threshold: float | None = None,
) -> None:
    """Record one timing comparison: its verdict, reason or note, and its numbers.

    A slowdown past the threshold but not decided (not significant, or the interval
    reaches back inside it) is ``inconclusive`` (and ``run`` measures it again); an
    undecided speed-up is a note. A disturbed run decides nothing: any change past the
    threshold, or an interval that reaches past it, is ``inconclusive``. ``said``: the
    change in words (default: ``name`` and its delta), ``threshold`` the one said
    (default: the comparison's)."""
    if name == "latency":
        v.latency = comp
    elif name == "speedup vs eager":
        v.speedup = comp
    limit = 1.0 + comp.threshold
    said = said or f"{name} {comp.delta:+.1%}"
    shown = comp.threshold if threshold is None else threshold
    if comp.verdict == "regressed" and not v.disturbed:
        found.add("regressed")
        v.reasons.append(
            f"{said} (significant, threshold {shown:.0%})"
            if said.endswith("%")
            else f"{said.removesuffix(')')}, threshold {shown:.0%})"
        )
        return
    if comp.verdict == "improved" and not v.disturbed:
        found.add("improved")
        v.notes.append(f"{said} (significant)" if said.endswith("%") else said)
        return
    if comp.verdict == "borderline":
        v.borderline = True
    # a disturbed run vouches only for a change whose whole interval is within bounds;
    # a paired one only for a slowdown its interval rules out
    reaches = comp.ci_hi > limit and (comp.paired or v.disturbed is not None)
    unsure = (
        comp.ratio > limit
        or reaches
        or (v.disturbed is not None and comp.ratio < 1.0 - comp.threshold)
    )
    if unsure:
        found.add("inconclusive")
        detect = (
            f", the smallest slowdown it can tell is {v.detectable:.0%}" if v.detectable else ""
        )
        why = "the run was disturbed" if v.disturbed else "this run cannot tell it from drift"
        if comp.paired and not v.disturbed:
            why = f"{comp.n_pr} rounds do not decide it"
        interval = f" (CI {comp.ci_lo - 1:+.1%}..{comp.ci_hi - 1:+.1%})"
        v.reasons.append(
            f"{said}{interval if said.endswith('%') else ''} "
            f"{'is' if comp.ratio > limit else 'reaches'} past the "
            f"{shown:.0%} threshold but {why}{detect}: " + how_to_decide(v)
        )
    elif comp.verdict in ("borderline", "improved", "regressed"):
        v.notes.append(
            f"{said} is not a clear change beyond the "
            "threshold" + (" (the run was disturbed)" if v.disturbed else "")
        )


def how_to_decide(v: TargetVerdict) -> str:
    if v.disturbed:
        return "measure again on a quiet runner (one measurement per runner at a time)"
    if v.mode == "paired":
        return "measure again, or raise measure.max_time for more rounds"
    return (
        "pair with the base commit (--mode paired; the Action fetches it) or publish "
        "more baseline runs"
    )
