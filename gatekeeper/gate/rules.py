"""The rules: one target's results against its baseline, under the config's rules.

Pure functions over :mod:`gatekeeper.results` documents; no torch, no store. A verdict is
``error`` > ``parity-failed`` > ``regressed`` > ``improved`` > ``pass`` (the first that
applies), or ``no-baseline`` when there is nothing to compare with and nothing failed.

Rules (defaults in :class:`gatekeeper.config.GateConfig`):

* parity: compiled vs eager, and vs the baseline's reference outputs, must pass.
* latency: the compiled model's per-round latency divided by the co-measured reference
  workload, one median per process (run), against the medians of the baseline's
  recent runs of the same code, with :func:`gatekeeper.stats.compare_runs`: the
  runner's drift between processes, estimated from the baseline's history (or
  DEFAULT_DRIFT until it has enough runs), is in the interval. Regressed only when
  significantly slower with the whole interval beyond ``latency_regression``.
  Paired mode (base and head in one process) uses :func:`gatekeeper.stats.compare` on
  the pairs instead, where that drift cancels.
* speedup: the per-round ratio compiled/eager (back to back in one process), compared
  across runs the same way with ``speedup_regression``; this ratio barely drifts
  between processes, so compiler regressions are found precisely.
* compile time: like with like (warm vs warm, cold vs cold), scaled by each run's
  reference workload (so a busier machine is not a regression), beyond
  ``compile_time_regression`` and by more than COMPILE_FLOOR_S.
* memory: compiled peak beyond ``memory_regression`` and by more than the floor.
* graph breaks: with ``no-increase``, more breaks than the baseline fail, naming the new ones.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..config import GateConfig
from ..results import Baseline, GraphBreak, Graphs, TargetResult
from . import stats
from .drift import DEFAULT_DRIFT, DEFAULT_VS_EAGER_DRIFT, is_normalised, run_medians

COMPILE_FLOOR_S = 1.0  # compile-time changes smaller than this are never a regression
MEMORY_FLOOR = {"cuda": 1 << 20, "rss": 8 << 20}  # bytes; RSS moves by page-cache noise
ORDER = ["error", "parity-failed", "regressed", "improved", "pass", "no-baseline"]


@dataclass
class TargetVerdict:
    target: str
    verdict: str  # pass | improved | regressed | parity-failed | no-baseline | error
    reasons: list[str] = field(default_factory=list)  # why it is not a plain pass
    notes: list[str] = field(default_factory=list)  # worth saying, not failing
    latency: dict | None = None  # stats.Comparison.to_dict() of normalised latency
    speedup: dict | None = None  # stats.Comparison of compiled/eager round ratios
    new_breaks: list[GraphBreak] = field(default_factory=list)
    borderline: bool = False  # a timing result to re-measure before believing it

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["new_breaks"] = [b.model_dump() for b in self.new_breaks]
        return d


def _load(r: TargetResult) -> float:
    """How fast this run's machine was: the reference workload's median (1.0 if absent)."""
    ref = r.latency.reference if r.latency else None
    return ref.p50 if ref is not None and ref.p50 > 0 else 1.0


def _break_key(b: GraphBreak) -> tuple:
    return (b.reason, b.file, b.line)


def gate_target(result: TargetResult, baseline: Baseline | None,
                rules: GateConfig) -> TargetVerdict:
    v = TargetVerdict(result.target, "pass")
    if result.status == "error":
        v.verdict, v.reasons = "error", [result.error or "measurement failed"]
        return v
    found: set[str] = set()

    parity = result.parity
    if parity is not None:
        for name, check in (("vs eager", parity.vs_eager), ("vs baseline", parity.vs_baseline)):
            if check is not None and not check.passed:
                found.add("parity-failed")
                v.reasons.append(f"parity {name}: {check.detail or check.method}")

    if result.paired is not None:
        _gate_paired(v, result, rules, found)
    if baseline is None:
        v.verdict = min(found | {"no-baseline" if result.paired is None else "pass"},
                        key=ORDER.index)
        return v
    base = baseline.result

    if result.latency and base.latency and result.paired is None:
        _gate_runs(v, found, result, baseline, rules)

    if result.compile and base.compile and result.compile.warm == base.compile.warm:
        b, p = base.compile.seconds, result.compile.seconds
        # a busier machine compiles slower: scale by each run's reference workload
        ratio = (p / b) * _load(base) / _load(result)
        if ratio > 1 + rules.compile_time_regression and p - b > COMPILE_FLOOR_S:
            found.add("regressed")
            kind = "warm" if result.compile.warm else "cold"
            v.reasons.append(f"{kind} compile time {b:.1f} s -> {p:.1f} s ({ratio - 1:+.0%} "
                             f"load-adjusted, threshold {rules.compile_time_regression:.0%})")

    if result.memory and base.memory and result.memory.kind == base.memory.kind:
        b_mem, p_mem = base.memory.compiled_peak_bytes, result.memory.compiled_peak_bytes
        if b_mem is not None and p_mem is not None and \
                p_mem > b_mem * (1 + rules.memory_regression) and \
                p_mem - b_mem > MEMORY_FLOOR[result.memory.kind]:
            found.add("regressed")
            v.reasons.append(f"peak memory {b_mem / 2**20:.1f} MiB -> {p_mem / 2**20:.1f} MiB "
                             f"(threshold {rules.memory_regression:.0%})")

    if result.graphs and base.graphs and result.paired is None:
        _graph_breaks(v, found, base.graphs, result.graphs, rules)

    v.verdict = min(found | {"pass"}, key=ORDER.index)
    return v


def _gate_runs(v: TargetVerdict, found: set[str], result: TargetResult, baseline: Baseline,
               rules: GateConfig) -> None:
    """Stored mode: the PR's run medians against the baseline's runs of the same code."""
    base, noise = baseline.result, baseline.noise
    normalised = is_normalised(result) and is_normalised(base)
    runs = [m for m in (noise.runs if noise else [])
            if m.code_hash == base.code_hash and m.normalised == normalised]
    pr = run_medians(result, normalised)
    if runs:
        base_lat, base_ratio = [m.latency for m in runs], [m.vs_eager for m in runs]
    else:  # an older baseline without run medians: its own run
        base_lat, base_ratio = (list(x) for x in zip(*run_medians(base, normalised)))
    if noise is not None and noise.between and runs and all(m.normalised for m in runs):
        lat_sd, ratio_sd, df = noise.between, noise.vs_eager_between, noise.df
    else:
        lat_sd, ratio_sd, df = None, None, None
    lat = stats.compare_runs(base_lat, [p[0] for p in pr], sd=lat_sd or DEFAULT_DRIFT,
                             df=df if lat_sd else None, threshold=rules.latency_regression)
    _timing(v, found, "latency", lat)
    v.latency["normalised"] = normalised  # type: ignore[index]
    _timing(v, found, "speedup vs eager", stats.compare_runs(
        base_ratio, [p[1] for p in pr], sd=ratio_sd or DEFAULT_VS_EAGER_DRIFT,
        df=df if ratio_sd else None, threshold=rules.speedup_regression))
    if not lat_sd:
        v.notes.append(f"the baseline has too few runs of its code to measure this runner's "
                       f"drift; assumed ±{DEFAULT_DRIFT:.0%} (publish more baselines, or "
                       "use --paired)")


def _timing(v: TargetVerdict, found: set[str], name: str, comp: stats.Comparison) -> None:
    """Record one timing comparison: its verdict, reason or note, and its numbers."""
    if name == "latency":
        v.latency = comp.to_dict()
    elif name == "speedup vs eager":
        v.speedup = comp.to_dict()
    if comp.verdict == "regressed":
        found.add("regressed")
        v.reasons.append(f"{name} {comp.delta:+.1%} (significant, threshold "
                         f"{comp.threshold:.0%})")
    elif comp.verdict == "improved":
        found.add("improved")
        v.notes.append(f"{name} {comp.delta:+.1%} (significant)")
    elif comp.verdict == "borderline":
        v.borderline = True
        v.notes.append(f"{name} {comp.delta:+.1%} is borderline: not a clear change beyond "
                       "the threshold")


def _graph_breaks(v: TargetVerdict, found: set[str], base: Graphs, pr: Graphs,
                  rules: GateConfig) -> None:
    old = {_break_key(b) for b in base.break_reasons}
    v.new_breaks = [b for b in pr.break_reasons if _break_key(b) not in old]
    if rules.graph_breaks == "no-increase" and pr.breaks > base.breaks:
        found.add("regressed")
        where = "; ".join(f"{b.reason} at {b.where()}" for b in v.new_breaks[:3])
        v.reasons.append(f"graph breaks {base.breaks} -> {pr.breaks}"
                         + (f": {where}" if where else ""))


def _gate_paired(v: TargetVerdict, result: TargetResult, rules: GateConfig,
                 found: set[str]) -> None:
    """Paired mode: base and head measured round by round in one process."""
    pair = result.paired
    assert pair is not None and result.latency is not None
    _timing(v, found, "latency", stats.compare(
        pair.samples, result.latency.samples["compiled"], paired=True,
        threshold=rules.latency_regression))
    v.latency["paired"] = True  # type: ignore[index]
    v.notes.append(f"paired with {pair.base_ref} ({pair.base_commit[:12]}) in one process")
    if result.graphs:
        _graph_breaks(v, found, pair.graphs, result.graphs, rules)


def overall(verdicts: list[TargetVerdict], *, require_baseline: bool = False) -> str:
    """One verdict for the run: the worst target's. Targets without a baseline do not
    fail a run unless ``require_baseline``."""
    if not verdicts:
        return "pass"
    worst = min((t.verdict for t in verdicts), key=ORDER.index)
    if require_baseline and worst in ("improved", "pass") and \
            any(t.verdict == "no-baseline" for t in verdicts):
        return "no-baseline"
    return worst


def exit_code(verdict: str, *, require_baseline: bool = False) -> int:
    if verdict == "error":
        return 2
    if verdict in ("parity-failed", "regressed"):
        return 1
    if verdict == "no-baseline" and require_baseline:
        return 1
    return 0


@dataclass
class GateRow:
    result: TargetResult
    baseline: Baseline | None
    verdict: TargetVerdict


@dataclass
class GateReport:
    """Everything the report shows: built by the gate, rendered by gatekeeper.report."""

    verdict: str
    exit_code: int
    base_ref: str
    rows: list[GateRow]
    removed: list[str] = field(default_factory=list)  # baseline targets not measured now
    remeasured: list[str] = field(default_factory=list)  # borderline targets measured again
    creator: dict = field(default_factory=dict)


def build_report(results: list[TargetResult], baselines: dict[str, Baseline | None],
                 rules_for, *, base_ref: str, removed: list[str] | None = None,
                 require_baseline: bool = False, creator: dict | None = None) -> GateReport:
    """Gate every result; ``rules_for(target_id)`` gives that target's GateConfig."""
    rows = [GateRow(r, baselines.get(r.target), gate_target(r, baselines.get(r.target),
                                                            rules_for(r.target)))
            for r in results]
    verdict = overall([row.verdict for row in rows], require_baseline=require_baseline)
    return GateReport(verdict, exit_code(verdict, require_baseline=require_baseline),
                      base_ref, rows, sorted(removed or []), creator=creator or {})
