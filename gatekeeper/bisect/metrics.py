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
from typing import Literal

from .. import metrics as registry
from .. import units
from ..config import GateConfig
from ..gate import rules
from ..gate.drift import is_normalised, run_medians
from ..results import TargetResult

Metric = str  # one of names(): a registered metric bisected, or a group of them ("work")


def names() -> tuple[Metric, ...]:
    """bisect's ``--metric`` choices, read off the metric registry."""
    return registry.bisectable()


def alone(metric: Metric) -> bool:
    """Compared with a measurement of the base on its own (the worker does not measure
    its figure beside the head's: memory, compile time). Parity compares the outputs
    with the base commit's, measured beside them."""
    return metric != "parity" and all(m.beside is None for m in registry.members(metric))


def threshold_setting(metric: Metric) -> str | None:
    """The gate rule whose threshold is the default --min-effect (None: any change counts)."""
    return next((m.threshold for m in registry.members(metric) if m.threshold), None)


def relative(metric: Metric) -> bool:
    """Whether --min-effect is a fraction of the base's figure (else an amount in its unit)."""
    return all(m.relative for m in registry.members(metric))


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
    name = threshold_setting(metric)
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
    if alone(metric):
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
    if metric != "graph-breaks":
        return _counted(metric, result, threshold or 0.0, direction)
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


def _counted(
    metric: Metric, result: TargetResult, threshold: float, direction: int | None
) -> Figure | str:
    """The metric against the base commit's figure measured beside it; a group (work:
    FLOPs, bytes accessed): the member that changed most."""
    found = []
    pair = result.paired
    assert pair is not None
    for m in registry.members(metric):
        b, p = m.base_value(pair), m.value(result)
        change = m.change(b, p) if b is not None and p is not None else None
        if change is not None:
            found.append((change, m, f"{m.label} {m.fmt(b)} -> {m.fmt(p)}"))
    if not found:
        what = f"{metric} counters" if metric in registry.GROUPS else registry.get(metric).label
        return f"no {what} on both sides"
    change, m, text = max(found, key=lambda f: abs(f[0]))
    text = f"{text} ({m.change_text(change)})"
    return _step(change, threshold, direction, Figure("good", text, delta=change))


def _alone(
    metric: Metric,
    result: TargetResult,
    base: TargetResult,
    threshold: float,
    direction: int | None,
) -> Figure | str:
    """A metric measured on each side in its own process, with the gate's floor."""
    m = registry.get(metric)
    source = m.source(result) if m.source else None
    p, b = m.value(result), m.value(base)
    if m.source is not None and (source is None or m.source(base) != source):
        return f"no {m.label} of the same kind on both sides"
    if p is None or not b:
        return f"no {m.label} on both sides"
    label = "cold compile" if metric == "compile" else m.label  # bisect compiles cold
    change = m.change(b, p)
    assert change is not None
    figure = Figure(
        "good", f"{label} {m.fmt(b)} -> {m.fmt(p)} ({m.change_text(change)})", delta=change
    )
    if abs(p - b) <= m.floor_for(source):  # too small to count, whatever the ratio
        return figure
    return _step(change, threshold, direction, figure)


def stored_value(metric: Metric, result: TargetResult) -> float | str | None:
    """What a stored baseline says of the metric, for narrowing the range: the median
    normalised latency of its runs, its reference outputs' sha256, else the metric's
    figure (a group: its last member's that has one, bytes accessed else FLOPs); None
    where it says nothing (compile time: too dependent on what the runner's cache held)."""
    if metric == "latency":
        runs = run_medians(result, is_normalised(result)) if result.latency else []
        return statistics.median(m[0] for m in runs) if runs else None
    if metric == "parity":
        return result.reference.sha256 if result.reference else None
    if metric == "compile":
        return None
    return next((v for m in reversed(registry.members(metric)) if (v := m.value(result))), None)


def position(metric: Metric, good: float, bad: float, value: float) -> float | None:
    """Where ``value`` lies from good (0) to bad (1): on a log scale for the ratios
    (latency, memory, work), linear for counts and amounts; None when good and bad do
    not differ."""
    if not relative(metric):
        g, b, v = float(good), float(bad), float(value)
    elif min(good, bad, value) > 0:
        g, b, v = math.log(good), math.log(bad), math.log(value)
    else:
        return None
    return None if b == g else (v - g) / (b - g)
