"""The rules: one target's results against its baseline, under the base's rules.

Pure functions over :mod:`gatekeeper.results` documents; no torch, no store. A verdict is
the first that applies of ``error`` > ``parity-failed`` > ``regressed`` > ``inconclusive``
> ``accepted`` > ``improved`` > ``pass``, or ``no-baseline`` when there is nothing to
compare with and nothing failed (a target the base does not define included).
:func:`gate_row` gates a target under the rules that govern it (:mod:`.governing`: the
base commit's config's, or those stored with the baseline; never the change's own when
the base's are known) and lists what the change alters of them and of the target.

Each rule, its setting and its default: docs/gate.md ("Gate rules"); each metric's
threshold, floor and direction: :mod:`gatekeeper.metrics`; the statistics of the timing
rules: :mod:`.stats` and docs/statistics.md; an ``+aot`` target not exportable or
``unavailable``: docs/strategies.md ("Not exportable") and docs/gpu.md ("AOTInductor on
CUDA"); a generate target's TTFT, TPOT, tokens/s and recompiles during decode:
:mod:`.generation`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .. import metrics, units
from ..config import GateConfig
from ..results import Baseline, GraphBreak, Graphs, TargetResult
from . import generation, quantized, rounds, stats
from .drift import disturbance
from .governing import definition_changes, governing, notes, rule_changes
from .timing import gate_runs, name_rank, timing
from .verdicts import ORDER as ORDER  # the order of severity, re-exported
from .verdicts import TargetVerdict as TargetVerdict
from .verdicts import Verdict, worst


def _load(r: TargetResult) -> float:
    """How fast this run's machine was: the reference workload's median (1.0 if absent)."""
    ref = r.latency.reference if r.latency else None
    return ref.p50 if ref is not None and ref.p50 > 0 else 1.0


def _break_key(b: GraphBreak) -> tuple:
    return (b.reason, b.file, b.line)


def gate_target(
    result: TargetResult, baseline: Baseline | None, rules: GateConfig, *, accept: bool = False
) -> TargetVerdict:
    v = TargetVerdict(
        result.target,
        "pass",
        mode=result.mode or ("paired" if result.paired is not None else "stored"),
    )
    if result.status == "error":
        v.verdict, v.reasons = "error", [result.error or "measurement failed"]
        return v
    if result.status in ("not-exportable", "unavailable"):
        return _not_exportable(v, result, baseline, accept)
    found: set[Verdict] = set()
    base = baseline.result if baseline is not None else None
    v.disturbed = disturbance(result, base)

    paired_q = result.paired.quantization if result.paired is not None else None
    base_q = paired_q or (base.quantization if base is not None and not result.paired else None)
    parity = result.parity
    if parity is not None:
        label = "vs base commit" if result.paired is not None else "vs baseline"
        for name, check in (("vs eager", parity.vs_eager), (label, parity.vs_baseline)):
            if check is not None and not check.passed:
                if name != "vs eager" and quantized.requantized(result, base_q):
                    v.notes.append(
                        f"parity {name}: {check.detail or check.method} (its "
                        "quantization changed: SQNR vs float judges it)"
                    )
                    continue
                found.add("parity-failed")
                v.reasons.append(f"parity {name}: {check.detail or check.method}")

    if result.paired is not None:
        _gate_paired(v, result, base, rules, found)
    quantized.sqnr(v, found, result, base_q, rules)
    generation.gate_generation(v, found, result, base, rules)  # TTFT, TPOT, tokens/s
    if baseline is None:
        if result.paired is None:
            _counted(v, found, result, None, rules)
            v.verdict = _finish(v, found | {"no-baseline"}, accept)
            return v
    else:
        base = baseline.result
        if result.latency and base.latency and result.paired is None:
            gate_runs(v, found, result, baseline, rules)
        _compile_time(v, found, result, base, rules)
        _memory(v, found, result, base, rules)
        if result.graphs and base.graphs and result.paired is None:
            _graph_breaks(v, found, base.graphs, result.graphs, rules)
        if result.graphs and base.graphs:
            _recompiles(v, found, base.graphs, result.graphs, rules)
        if result.paired is None:
            _counted(v, found, result, base, rules)
    v.verdict = _finish(v, found | {"pass"}, accept)
    return v


def _not_exportable(
    v: TargetVerdict, result: TargetResult, baseline: Baseline | None, accept: bool
) -> TargetVerdict:
    """An ``+aot`` target torch.export refused, or whose package took its worker down
    (``unavailable``): regressed when the base exported (and its package ran)."""
    said = result.export.says() if result.export else (result.error or result.status)
    base = result.export.base_exportable if result.export else None
    if base is None and baseline is not None:
        base = baseline.result.status == "ok"  # published: exported, packaged, measured
    if base:
        ran = "the base exported" if result.status == "not-exportable" else "the base's ran"
        v.reasons.append(f"{said} ({ran})")
        v.verdict = _finish(v, {"regressed"}, accept)
    elif base is False:
        v.notes.append(f"{said}, as on the base")
        v.verdict = "pass"
    else:
        v.notes.append(said)
        v.verdict = "no-baseline"
    return v


def _finish(v: TargetVerdict, found: set[Verdict], accept: bool) -> Verdict:
    verdict = worst(found)
    if v.disturbed:
        v.notes.append(f"this run was disturbed: {v.disturbed}")
    if verdict == "regressed" and accept:
        v.notes.append(
            "the pull request accepts this regression (--accept or the gatekeeper:accept label)"
        )
        return "accepted"
    return verdict


def _compile_time(
    v: TargetVerdict,
    found: set[Verdict],
    result: TargetResult,
    base: TargetResult,
    rules: GateConfig,
) -> None:
    pc, bc = result.compile, base.compile
    if pc is None or bc is None:
        return
    if pc.state == bc.state and pc.state in ("warm", "cold"):
        b, p, kind = bc.seconds, pc.seconds, pc.state
    elif pc.state == "cold" and bc.state == "warm" and bc.cold_seconds:
        b, p, kind = bc.cold_seconds, pc.seconds, "cold"  # the cold compile of base's bundle
    else:
        v.notes.append(
            f"compile time not compared: this run compiled {pc.state} "
            f"(FX graph hits {pc.fxgraph_cache_hit}, misses {pc.fxgraph_cache_miss}),"
            f" the baseline {bc.state}"
        )
        return
    # a busier machine compiles slower: scale by each run's reference workload
    ratio = (p / b) * _load(base) / _load(result)
    m = metrics.get("compile")
    threshold = m.setting(rules) or 0.0
    if ratio > 1 + threshold and p - b > m.floor_for():
        text = (
            f"{kind} {m.label} {b:.1f} s -> {p:.1f} s ({ratio - 1:+.0%} load-adjusted, "
            f"threshold {m.amount_text(threshold)})"
        )
        if v.disturbed:
            found.add("inconclusive")
            v.reasons.append(f"{text}, on a disturbed run: measure again on a quiet runner")
        else:
            found.add("regressed")
            v.reasons.append(text)


def _memory(
    v: TargetVerdict,
    found: set[Verdict],
    result: TargetResult,
    base: TargetResult,
    rules: GateConfig,
) -> None:
    m = metrics.get("memory")
    source = m.source(result) if m.source else None
    if source is None or m.source is None or m.source(base) != source:
        return
    b_mem, p_mem = m.value(base), m.value(result)
    threshold = m.setting(rules) or 0.0
    if (
        b_mem is not None
        and p_mem is not None
        and p_mem > b_mem * (1 + threshold)
        and p_mem - b_mem > m.floor_for(source)
    ):
        found.add("regressed")
        v.reasons.append(
            f"{m.label} {units.mib(b_mem)} MiB -> {units.mib(p_mem)} MiB "
            f"(threshold {m.amount_text(threshold)})"
        )


def _counted(
    v: TargetVerdict,
    found: set[Verdict],
    result: TargetResult,
    base: TargetResult | None,
    rules: GateConfig,
) -> None:
    """Every counted metric (gatekeeper.metrics): against the base commit's figure where
    it was measured beside this one (paired), else the baseline's; past its bound fails
    whatever the base."""
    for m in metrics.counted():
        p = m.value(result)
        if p is not None and m.bound is not None:
            _bound(v, found, m, p, float(getattr(rules, m.bound)))
        if result.paired is not None and m.beside is not None:
            b, against = m.base_value(result.paired), "base commit"
        elif base is not None:
            b, against = m.value(base), "baseline"
        else:
            continue
        threshold = m.setting(rules)
        if b is None or p is None or threshold is None:
            continue
        change = m.change(b, p)
        if change is None or abs(p - b) <= m.floor_for(m.source(result) if m.source else None):
            continue
        said = f"{m.label} {m.fmt(b)} -> {m.fmt(p)} ({m.change_text(change)}"
        if m.worse(change) > threshold:
            found.add("regressed")
            v.reasons.append(f"{said} vs the {against}, threshold {m.amount_text(threshold)})")
        elif m.worse(change) < -threshold:
            v.notes.append(f"{said})")


def _bound(
    v: TargetVerdict, found: set[Verdict], m: metrics.Metric, p: float, limit: float
) -> None:
    """A value on the wrong side of the metric's bound setting (``sqnr_floor``)."""
    if (p < limit) if m.better == "higher" else (p > limit):
        side = "below" if m.better == "higher" else "above"
        found.add("regressed")
        v.reasons.append(f"{m.label} {m.fmt(p)} is {side} {m.bound} = {m.fmt(limit)}")


def _graph_breaks(
    v: TargetVerdict, found: set[Verdict], base: Graphs, pr: Graphs, rules: GateConfig
) -> None:
    old = {_break_key(b) for b in base.break_reasons}
    v.new_breaks = [b for b in pr.break_reasons if _break_key(b) not in old]
    if rules.graph_breaks == "no-increase" and pr.breaks > base.breaks:
        found.add("regressed")
        where = "; ".join(f"{b.reason} at {b.where()}" for b in v.new_breaks[:3])
        v.reasons.append(
            f"graph breaks {base.breaks} -> {pr.breaks}" + (f": {where}" if where else "")
        )


def _recompiles(
    v: TargetVerdict, found: set[Verdict], base: Graphs, pr: Graphs, rules: GateConfig
) -> None:
    """The shape sweep: more recompiles than the baseline's fail, naming the guard torch
    says failed. A baseline measured before the sweep existed is not compared."""
    if base.sweep is None or pr.sweep is None:
        return
    b, p = base.sweep.recompiles, pr.sweep.recompiles
    if p <= b:
        return
    new = [g for g in pr.sweep.guards if g not in base.sweep.guards] or pr.sweep.guards
    text = f"recompiles over {pr.sweep.shape_sets} shape set(s) {b} -> {p}" + (
        f": guard failed: {new[0]}" if new else ""
    )
    v.recompiled(found, text, rules.recompiles == "no-increase")


def _gate_paired(
    v: TargetVerdict,
    result: TargetResult,
    base: TargetResult | None,
    rules: GateConfig,
    found: set[Verdict],
) -> None:
    """Paired mode: base and head measured round by round in one process (``base``:
    the stored baseline's result, for a counted metric not measured beside it)."""
    pair = result.paired
    assert pair is not None and result.latency is not None
    comp = stats.compare(
        pair.samples,
        result.latency.samples["compiled"],
        paired=True,
        threshold=metrics.get("latency").setting(rules) or 0.0,
    )
    v.detectable = rounds.paired_detectable_change(
        pair.samples, result.latency.samples["compiled"], threshold=rules.latency_regression
    )
    timing(v, found, "latency", comp)
    name_rank(v, result)
    v.notes.append(f"paired with {pair.base_ref} ({pair.base_commit[:12]}) in one process")
    if result.graphs:
        _graph_breaks(v, found, pair.graphs, result.graphs, rules)
    _counted(v, found, result, base, rules)


def overall(verdicts: list[TargetVerdict], *, require_baseline: bool = False) -> Verdict:
    """One verdict for the run: the worst target's. Targets without a baseline do not
    fail a run unless ``require_baseline``."""
    if not verdicts:
        return "pass"
    verdict = worst(t.verdict for t in verdicts)
    if (
        require_baseline
        and verdict in ("accepted", "improved", "pass")
        and any(t.verdict == "no-baseline" for t in verdicts)
    ):
        return "no-baseline"
    return verdict


def exit_code(
    verdict: Verdict, *, require_baseline: bool = False, fail_inconclusive: bool = False
) -> int:
    if verdict == "error":
        return 2
    if verdict in ("parity-failed", "regressed"):
        return 1
    if verdict == "inconclusive" and fail_inconclusive:
        return 1
    if verdict == "no-baseline" and require_baseline:
        return 1
    return 0


@dataclass
class GateRow:
    result: TargetResult
    baseline: Baseline | None
    verdict: TargetVerdict
    history: list[TargetResult] = field(default_factory=list)  # the base branch's, oldest first


@dataclass
class GateReport:
    """Everything the report shows: built by the gate, rendered by gatekeeper.report."""

    verdict: Verdict
    exit_code: int
    base_ref: str
    rows: list[GateRow]
    removed: list[str] = field(default_factory=list)  # baseline targets not measured now
    remeasured: list[str] = field(default_factory=list)  # borderline targets measured again
    creator: dict = field(default_factory=dict)
    mode_reason: str | None = None  # how the run chose paired or stored mode
    profile_all: bool = False  # show every target's profile diff, not only the slower ones
    # why the run's model code ran without its whole box (results.unconfined)
    unconfined: list[str] = field(default_factory=list)


def gate_row(
    result: TargetResult, baseline: Baseline | None, own: GateConfig, *, accept: bool = False
) -> GateRow:
    """One target gated under the rules that govern it (gate.governing: the base's, not
    the change's ``own``), with what the change alters of them and of the target."""
    if result.base_target is not None and not result.base_target.defined:
        baseline = None  # new in this change: whatever the store holds is not its base
    gov = governing(own, result.base_target, baseline, paired=result.paired is not None)
    v = gate_target(result, baseline, gov.rules, accept=accept)
    v.rules, v.rules_from = gov.rules, gov.source
    if gov.source != "this change":
        v.rule_changes = rule_changes(gov.rules, own)
    v.definition_changes = definition_changes(result, baseline)
    v.notes += notes(result, gov, v.rule_changes, v.definition_changes)
    return GateRow(result, baseline, v)


def build_report(
    results: list[TargetResult],
    baselines: dict[str, Baseline | None],
    rules_for: Callable[[str], GateConfig],
    *,
    base_ref: str,
    removed: list[str] | None = None,
    require_baseline: bool = False,
    creator: dict | None = None,
    accepted: Callable[[str], bool] = lambda target: False,
) -> GateReport:
    """Gate every result; ``rules_for(target_id)`` gives the change's own GateConfig for
    that target (the base's rules govern where they are known: :func:`gate_row`) and
    ``accepted(target_id)`` whether the pull request accepts its regression."""
    rows = [
        gate_row(r, baselines.get(r.target), rules_for(r.target), accept=accepted(r.target))
        for r in results
    ]
    quantized.twins(rows)  # quantized targets beside their float twins
    verdict = overall([row.verdict for row in rows], require_baseline=require_baseline)
    fail_inconclusive = any(
        row.verdict.verdict == "inconclusive"
        and row.verdict.rules is not None
        and row.verdict.rules.inconclusive == "fail"
        for row in rows
    )
    return GateReport(
        verdict,
        exit_code(verdict, require_baseline=require_baseline, fail_inconclusive=fail_inconclusive),
        base_ref,
        rows,
        sorted(removed or []),
        creator=creator or {},
    )
