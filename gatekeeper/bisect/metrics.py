"""What one measurement of a commit says about the metric bisected: like good, changed
like bad, or undecided (another measurement may decide). Pure: results in, a
:class:`Figure` out; no torch, no store.

Each commit is measured paired with the good commit (or, to confirm a culprit, with its
parent) in one process, so latency is the gate's paired test (:func:`gate.rules.gate_target`,
its significance and disturbance rules, at ``--min-effect``), parity the compiled
outputs against the base commit's, work and graph breaks the base's counters measured
beside it. Peak memory and compile time are compared with the base measured on its own
(a separate process: the worker does not measure the base's peak or a cold compile of
it), with the gate's floors.

A change counts only in the direction bad changed in (the first measurement sets it):
bisecting a slowdown, a commit that got faster is like good.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, replace
from typing import Literal, get_args

from .. import units
from ..config import GateConfig
from ..gate import rules
from ..gate.drift import is_normalised, run_medians
from ..results import TargetResult

Metric = Literal["latency", "parity", "memory", "compile", "work", "graph-breaks"]
METRICS: tuple[Metric, ...] = get_args(Metric)
# the metrics compared with a measurement of the base on its own (not measured beside it)
ALONE: tuple[Metric, ...] = ("memory", "compile")
# the gate rule whose threshold is the default --min-effect (None: any change counts)
THRESHOLDS: dict[Metric, str | None] = {
    "latency": "latency_regression",
    "memory": "memory_regression",
    "compile": "compile_time_regression",
    "work": "work_regression",
    "parity": None,
    "graph-breaks": None,
}


@dataclass(frozen=True)
class Figure:
    outcome: Literal["good", "bad", "undecided"]
    text: str  # "latency +25.3% (CI +23.1%..+27.0%), p<0.001"
    delta: float | None = None  # the relative change (graph breaks: the count's)
    ci_lo: float | None = None  # its interval, relative (latency only)
    ci_hi: float | None = None
    p_value: float | None = None
    direction: int = 0  # +1: more (slower, bigger), -1: less, 0: no direction (parity)
    again: bool = False  # undecided, and another measurement may decide it

    def as_dict(self) -> dict:
        return asdict(self)


def default_threshold(metric: Metric, gate: GateConfig) -> float | None:
    name = THRESHOLDS[metric]
    return None if name is None else float(getattr(gate, name))


def classify(
    metric: Metric,
    result: TargetResult,
    base: TargetResult | None,
    gate: GateConfig,
    threshold: float | None,
    direction: int | None,
) -> Figure | str:
    """The figure of ``result`` (paired with the base commit); ``base``: the base
    measured on its own (memory, compile). ``direction`` None: this is bad, any change
    counts and sets it. A string: why this result cannot say (bisect skips the commit)."""
    if metric in ALONE:
        if base is None:
            return "no measurement of the base commit to compare with"
        return _alone(metric, result, base, threshold or 0.0, direction)
    if result.paired is None:
        return "the base commit's model could not be measured beside it"
    if metric == "latency":
        return _latency(result, gate, threshold or 0.0, direction)
    if metric == "parity":
        check = result.parity.vs_baseline if result.parity else None
        if check is None:
            return "no parity check against the base commit"
        if check.passed:
            return Figure("good", f"parity: outputs match the base commit's ({check.method})")
        return Figure("bad", f"parity: {check.detail or check.method}")
    if metric == "work":
        return _work(result, threshold or 0.0, direction)
    graphs = result.graphs
    if graphs is None:
        return "no graph count"
    b, p = result.paired.graphs.breaks, graphs.breaks
    reasons = [f"{x.reason} at {x.where()}" for x in graphs.break_reasons][:2]
    text = f"graph breaks {b} -> {p}" + (f": {'; '.join(reasons)}" if p > b and reasons else "")
    return _step(p - b, 0.0, direction, Figure("good", text, delta=float(p - b)))


def _step(change: float, threshold: float, direction: int | None, figure: Figure) -> Figure:
    """``figure`` as bad when ``change`` is past ``threshold`` in bad's direction (any,
    for bad itself), else as it is (good)."""
    sign = (change > threshold) - (change < -threshold)
    if sign and direction in (None, sign):
        return replace(figure, outcome="bad", direction=sign)
    return figure


def _latency(
    result: TargetResult, gate: GateConfig, threshold: float, direction: int | None
) -> Figure:
    verdict = rules.gate_target(
        result, None, gate.model_copy(update={"latency_regression": threshold})
    )
    comp = verdict.latency
    assert comp is not None  # a paired result has one
    disturbed = verdict.disturbed
    text = f"latency {comp.delta:+.1%} (CI {comp.ci_lo - 1:+.1%}..{comp.ci_hi - 1:+.1%}), " + (
        units.p_value(comp.p_value) + (f", disturbed: {disturbed}" if disturbed else "")
    )
    figure = Figure(
        "good",
        text,
        delta=comp.delta,
        ci_lo=comp.ci_lo - 1,
        ci_hi=comp.ci_hi - 1,
        p_value=comp.p_value,
    )
    sign = {"regressed": 1, "improved": -1}.get(comp.verdict, 0)
    if sign and not disturbed and direction in (None, sign):
        return replace(figure, outcome="bad", direction=sign)
    within = 1 - threshold <= comp.ci_lo and comp.ci_hi <= 1 + threshold
    if comp.verdict == "borderline" or (disturbed and not within):
        return replace(figure, outcome="undecided", again=True)
    return figure


def _work(result: TargetResult, threshold: float, direction: int | None) -> Figure | str:
    """The counter (FLOPs, bytes accessed) that changed most."""
    head, base = result.work, result.paired.work if result.paired else None
    found = []
    for name, label in rules.WORK_COUNTERS.items():
        b, p = getattr(base, name, None), getattr(head, name, None)
        if b and p is not None:
            found.append((p / b - 1, f"{label} {units.count(b)} -> {units.count(p)}"))
    if not found:
        return "no work counters on both sides"
    change, text = max(found, key=lambda f: abs(f[0]))
    text = f"{text} ({units.change(change)})"
    return _step(change, threshold, direction, Figure("good", text, delta=change))


def _alone(
    metric: Metric,
    result: TargetResult,
    base: TargetResult,
    threshold: float,
    direction: int | None,
) -> Figure | str:
    p: float | None
    b: float | None
    if metric == "memory":
        m, bm = result.memory, base.memory
        p = m.compiled_peak_bytes if m else None
        b = bm.compiled_peak_bytes if bm else None
        if m is None or bm is None or p is None or not b or m.kind != bm.kind:
            return "no peak memory of the same kind on both sides"
        floor = float(rules.MEMORY_FLOOR[m.kind])
        text = f"peak memory {units.size(b)} -> {units.size(p)}"
    else:
        p = result.compile.seconds if result.compile else None
        b = base.compile.seconds if base.compile else None
        if p is None or not b:
            return "no compile time on both sides"
        floor, text = (
            rules.COMPILE_FLOOR_S,
            f"cold compile {units.seconds(b)} -> {units.seconds(p)}",
        )
    change = p / b - 1
    figure = Figure("good", f"{text} ({units.change(change)})", delta=change)
    if abs(p - b) <= floor:  # too small to count, whatever the ratio
        return figure
    return _step(change, threshold, direction, figure)


def stored_value(metric: Metric, result: TargetResult) -> float | str | None:
    """What a stored baseline says of the metric, for narrowing the range: the median
    normalised latency of its runs, its reference outputs' sha256, peak memory, bytes
    accessed (else FLOPs), graph breaks; None where it says nothing (compile time: too
    dependent on what the runner's cache held)."""
    if metric == "latency":
        runs = run_medians(result, is_normalised(result)) if result.latency else []
        return statistics.median(m[0] for m in runs) if runs else None
    if metric == "parity":
        return result.reference.sha256 if result.reference else None
    if metric == "memory":
        return result.memory.compiled_peak_bytes if result.memory else None
    if metric == "work":
        w = result.work
        return (w.bytes_accessed or w.flops) if w else None
    if metric == "graph-breaks":
        return float(result.graphs.breaks) if result.graphs else None
    return None


def position(metric: Metric, good: float, bad: float, value: float) -> float | None:
    """Where ``value`` lies from good (0) to bad (1): on a log scale for the ratios
    (latency, memory, work), linear for counts; None when good and bad do not differ."""
    if metric == "graph-breaks":
        g, b, v = float(good), float(bad), float(value)
    elif min(good, bad, value) > 0:
        g, b, v = math.log(good), math.log(bad), math.log(value)
    else:
        return None
    return None if b == g else (v - g) / (b - g)
