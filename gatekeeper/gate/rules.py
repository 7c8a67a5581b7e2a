"""The rules: one target's results against its baseline, under the config's rules.

Pure functions over :mod:`gatekeeper.results` documents; no torch, no store. A verdict is
the first that applies of ``error`` > ``parity-failed`` > ``regressed`` > ``inconclusive``
> ``accepted`` > ``improved`` > ``pass``, or ``no-baseline`` when there is nothing to
compare with and nothing failed.

Rules (defaults in :class:`gatekeeper.config.GateConfig`):

* parity: compiled vs eager, and vs the baseline's reference outputs (or, paired, the
  base commit's outputs), must pass, structure included.
* work: FLOPs per call or inductor's bytes accessed grew beyond ``work_regression``.
  Deterministic, so a single stored baseline run is enough.
* latency, paired mode (the default when the base commit is at hand): base and head
  timed round by round in one process, :func:`stats.compare` on the pairs, where the
  drift between processes cancels. Stored mode: the PR run's median (compiled latency
  divided by the co-measured reference workload) against the medians of the baseline's
  recent runs of the same code, :func:`stats.compare_runs`, paying for the runner's
  drift between processes (gate.drift). Regressed only when significantly slower with
  the whole interval beyond ``latency_regression``; a slowdown past the threshold that
  the run cannot tell from drift is ``inconclusive``.
* speedup: the per-round ratio compiled/eager, compared across runs the same way.
* disturbance: when other processes took the CPU while timing, or the reference
  workload moved, timing can say ``inconclusive`` or ``pass``, never ``regressed`` or
  ``improved``.
* compile time: like with like, judged by inductor's own counters (every FX graph a hit:
  warm; every one a miss: cold): warm vs warm, cold vs cold (a cold PR compile against
  the cold compile of the baseline's bundle), scaled by each run's reference workload,
  beyond ``compile_time_regression`` and by more than COMPILE_FLOOR_S. Mixed or
  mismatched states are reported without a verdict.
* memory: compiled peak beyond ``memory_regression`` and by more than the floor.
* graph breaks: with ``no-increase``, more breaks than the baseline fail, naming the new ones.
* recompiles: every shape set of the model runs in one process after the first compile
  (the shape sweep); with ``recompiles = "no-increase"``, more recompiles than the
  baseline's sweep fail, naming the guard that failed. Baselines without a sweep are not
  compared.
* accepted: a ``regressed`` target the pull request accepts on purpose (``--accept``, the
  ``gatekeeper:accept`` label); parity failures are never accepted.
* exportability: an ``+aot`` target whose model ``torch.export`` refuses on the pull
  request but exported on the base (the base commit's model, paired; else a stored
  baseline, which only an exported, measured package has) is ``regressed``, naming
  torch's reason and the line: a PR that breaks the deploy path fails. Not exportable on
  the base either: ``pass``, with the reason as a note; nothing to tell: ``no-baseline``.
  An ``+aot`` target whose package took its worker down inside torch's AOTInductor
  (``unavailable``) is judged the same way: ``regressed`` when the baseline's package
  ran (same torch and device: the env key), else a note.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import units
from ..config import GateConfig
from ..results import Baseline, GraphBreak, Graphs, TargetResult, TimingMode, Work
from . import stats
from .drift import DEFAULT_DRIFT, DEFAULT_VS_EAGER_DRIFT, disturbance, is_normalised, run_medians
from .verdicts import ORDER as ORDER  # the order of severity, re-exported
from .verdicts import Verdict, worst

COMPILE_FLOOR_S = 1.0  # compile-time changes smaller than this are never a regression
MEMORY_FLOOR = {"cuda": 1 << 20, "cpu": 256 << 10, "rss": 8 << 20}  # bytes
WORK_COUNTERS = {"flops": "FLOPs per call", "bytes_accessed": "bytes accessed per call"}


@dataclass
class TargetVerdict:
    target: str
    verdict: Verdict
    reasons: list[str] = field(default_factory=list)  # why it is not a plain pass
    notes: list[str] = field(default_factory=list)  # worth saying, not failing
    latency: stats.Comparison | None = None  # the latency test
    speedup: stats.Comparison | None = None  # compiled/eager round ratios
    new_breaks: list[GraphBreak] = field(default_factory=list)
    borderline: bool = False  # a timing result to re-measure before believing it
    disturbed: str | None = None  # how disturbed the run was, when it was
    mode: TimingMode | None = None  # what decided the timing
    detectable: float | None = None  # smallest slowdown this run could tell from drift

    def to_dict(self) -> dict[str, Any]:
        """The verdict as plain JSON types (comparisons as dicts)."""
        d = dict(self.__dict__)
        d["latency"] = self.latency.to_dict() if self.latency else None
        d["speedup"] = self.speedup.to_dict() if self.speedup else None
        d["new_breaks"] = [b.model_dump() for b in self.new_breaks]
        return d


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

    parity = result.parity
    if parity is not None:
        label = "vs base commit" if result.paired is not None else "vs baseline"
        for name, check in (("vs eager", parity.vs_eager), (label, parity.vs_baseline)):
            if check is not None and not check.passed:
                found.add("parity-failed")
                v.reasons.append(f"parity {name}: {check.detail or check.method}")

    if result.paired is not None:
        _gate_paired(v, result, rules, found)
    if baseline is None:
        if result.paired is None:
            _work(v, found, result.work, None, "", rules)
            v.verdict = _finish(v, found | {"no-baseline"}, accept)
            return v
    else:
        base = baseline.result
        if result.latency and base.latency and result.paired is None:
            _gate_runs(v, found, result, baseline, rules)
        _compile_time(v, found, result, base, rules)
        _memory(v, found, result, base, rules)
        if result.graphs and base.graphs and result.paired is None:
            _graph_breaks(v, found, base.graphs, result.graphs, rules)
        if result.graphs and base.graphs:
            _recompiles(v, found, base.graphs, result.graphs, rules)
        if result.paired is None:
            _work(v, found, result.work, base.work, "baseline", rules)
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


def _gate_runs(
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
        threshold=rules.latency_regression,
    )
    _timing(v, found, "latency", dataclasses.replace(lat, normalised=normalised))
    _timing(
        v,
        found,
        "speedup vs eager",
        stats.compare_runs(
            base_ratio,
            [p[1] for p in pr],
            sd=ratio_sd or DEFAULT_VS_EAGER_DRIFT,
            df=df if ratio_sd else None,
            threshold=rules.speedup_regression,
        ),
    )
    if not lat_sd:
        v.notes.append(
            f"the baseline has too few runs of its code to measure this runner's "
            f"drift; assumed ±{DEFAULT_DRIFT:.0%} (publish more baselines, or "
            "pair with the base commit)"
        )


def _timing(v: TargetVerdict, found: set[Verdict], name: str, comp: stats.Comparison) -> None:
    """Record one timing comparison: its verdict, reason or note, and its numbers.

    A slowdown past the threshold but not decided (not significant, or the interval
    reaches back inside it) is ``inconclusive`` (and ``run`` measures it again); an
    undecided speed-up is a note. A disturbed run decides nothing: any change past the
    threshold, or an interval that reaches past it, is ``inconclusive``."""
    if name == "latency":
        v.latency = comp
    elif name == "speedup vs eager":
        v.speedup = comp
    limit = 1.0 + comp.threshold
    if comp.verdict == "regressed" and not v.disturbed:
        found.add("regressed")
        v.reasons.append(f"{name} {comp.delta:+.1%} (significant, threshold {comp.threshold:.0%})")
        return
    if comp.verdict == "improved" and not v.disturbed:
        found.add("improved")
        v.notes.append(f"{name} {comp.delta:+.1%} (significant)")
        return
    if comp.verdict == "borderline":
        v.borderline = True
    # a disturbed run vouches only for a change whose whole interval is within bounds
    unsure = comp.ratio > limit or (
        v.disturbed is not None and (comp.ci_hi > limit or comp.ratio < 1.0 - comp.threshold)
    )
    if unsure:
        found.add("inconclusive")
        detect = (
            f", the smallest slowdown it can tell is {v.detectable:.0%}" if v.detectable else ""
        )
        why = "the run was disturbed" if v.disturbed else "this run cannot tell it from drift"
        v.reasons.append(
            f"{name} {comp.delta:+.1%} (CI {comp.ci_lo - 1:+.1%}.."
            f"{comp.ci_hi - 1:+.1%}) is past the {comp.threshold:.0%} threshold "
            f"but {why}{detect}: " + _how_to_decide(v)
        )
    elif comp.verdict in ("borderline", "improved", "regressed"):
        v.notes.append(
            f"{name} {comp.delta:+.1%} is not a clear change beyond the "
            "threshold" + (" (the run was disturbed)" if v.disturbed else "")
        )


def _how_to_decide(v: TargetVerdict) -> str:
    if v.disturbed:
        return "measure again on a quiet runner (one measurement per runner at a time)"
    if v.mode == "paired":
        return "measure again, or raise measure.min_time for more rounds"
    return (
        "pair with the base commit (--mode paired; the Action fetches it) or publish "
        "more baseline runs"
    )


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
    if ratio > 1 + rules.compile_time_regression and p - b > COMPILE_FLOOR_S:
        text = (
            f"{kind} compile time {b:.1f} s -> {p:.1f} s ({ratio - 1:+.0%} load-adjusted, "
            f"threshold {rules.compile_time_regression:.0%})"
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
    if not (result.memory and base.memory and result.memory.kind == base.memory.kind):
        return
    b_mem, p_mem = base.memory.compiled_peak_bytes, result.memory.compiled_peak_bytes
    if (
        b_mem is not None
        and p_mem is not None
        and p_mem > b_mem * (1 + rules.memory_regression)
        and p_mem - b_mem > MEMORY_FLOOR[result.memory.kind]
    ):
        found.add("regressed")
        v.reasons.append(
            f"peak memory {units.mib(b_mem)} MiB -> {units.mib(p_mem)} MiB "
            f"(threshold {rules.memory_regression:.0%})"
        )


def _work(
    v: TargetVerdict,
    found: set[Verdict],
    pr: Work | None,
    base: Work | None,
    against: str,
    rules: GateConfig,
) -> None:
    """FLOPs and bytes accessed: deterministic, so any growth past the threshold counts."""
    if pr is None or base is None:
        return
    for field_name, label in WORK_COUNTERS.items():
        b, p = getattr(base, field_name), getattr(pr, field_name)
        if not b or p is None:
            continue
        change = p / b - 1
        if change > rules.work_regression:
            found.add("regressed")
            v.reasons.append(
                f"{label} {units.count(b)} -> {units.count(p)} ({change:+.1%} vs the {against}, "
                f"threshold {rules.work_regression:.0%})"
            )
        elif change < -rules.work_regression:
            v.notes.append(f"{label} {units.count(b)} -> {units.count(p)} ({change:+.1%})")


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
    if rules.recompiles == "no-increase":
        found.add("regressed")
        v.reasons.append(text)
    else:
        v.notes.append(text)


def _gate_paired(
    v: TargetVerdict, result: TargetResult, rules: GateConfig, found: set[Verdict]
) -> None:
    """Paired mode: base and head measured round by round in one process."""
    pair = result.paired
    assert pair is not None and result.latency is not None
    comp = stats.compare(
        pair.samples,
        result.latency.samples["compiled"],
        paired=True,
        threshold=rules.latency_regression,
    )
    _timing(v, found, "latency", comp)
    v.notes.append(f"paired with {pair.base_ref} ({pair.base_commit[:12]}) in one process")
    if result.graphs:
        _graph_breaks(v, found, pair.graphs, result.graphs, rules)
    _work(v, found, result.work, pair.work, "base commit", rules)


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
    """Gate every result; ``rules_for(target_id)`` gives that target's GateConfig and
    ``accepted(target_id)`` whether the pull request accepts its regression."""
    rows = [
        GateRow(
            r,
            baselines.get(r.target),
            gate_target(r, baselines.get(r.target), rules_for(r.target), accept=accepted(r.target)),
        )
        for r in results
    ]
    verdict = overall([row.verdict for row in rows], require_baseline=require_baseline)
    fail_inconclusive = any(
        row.verdict.verdict == "inconclusive"
        and rules_for(row.result.target).inconclusive == "fail"
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
