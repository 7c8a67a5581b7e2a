"""The generation rules (docs/generation.md): a generate target's time to first token,
time per output token (decode) and decode tokens/s against the base's, and the
compiles of its steady decode.

* **TTFT, TPOT, tokens/s**: paired, the base commit's generation was timed in the same
  rounds, so each figure is compared round by round as latency is
  (:func:`gatekeeper.gate.stats.compare`: the geometric mean of the per-round ratios,
  its t interval, the signed-rank test), at its own threshold (``ttft_regression``,
  ``tpot_regression``, ``tokens_per_s_regression``; latency's default). Stored, the
  run's medians (over the reference workload's, as latency's) against the baseline's,
  at the drift assumed between runs (:func:`gatekeeper.gate.stats.compare_runs`).
  Decode tokens/s is the batch over TPOT, so it is compared on the same rounds as
  seconds per token, a drop past its threshold a slowdown past ``1 / (1 - t) - 1``.
  The reason reads ``decode 12.3 -> 13.9 ms/token (+13% [+9, +17], n=200, threshold
  5%)``; the verdict's rules are latency's (:func:`gatekeeper.gate.timing.timing`).
* **recompiles during decode**: after the first decode step compiled, a generation
  compiles nothing; each compile Dynamo made after it regresses the target (whatever
  the base), named with the guard that failed (``gate.recompiles = "ignore"``: a note).

Pure: no torch, no I/O.
"""

from __future__ import annotations

import dataclasses
import statistics

from .. import metrics, units
from ..config import GateConfig
from ..generation import Generation
from ..results import TargetResult
from . import stats
from .drift import DEFAULT_DRIFT
from .timing import timing
from .verdicts import TargetVerdict, Verdict


def _reference(r: TargetResult) -> float | None:
    ref = r.latency.reference if r.latency else None
    return ref.p50 if ref is not None and ref.p50 > 0 else None


def _stored(
    name: str, gen: Generation, base: TargetResult, result: TargetResult, threshold: float
) -> stats.Comparison | None:
    """This run's median against the baseline's, each over its reference workload's
    when both have one, at the drift assumed between runs."""
    other, key = base.generation, metrics.get(name).samples or ""
    if other is None or not other.samples.get(key) or not gen.samples.get(key):
        return None
    b, p = statistics.median(other.samples[key]), statistics.median(gen.samples[key])
    rb, rp = _reference(base), _reference(result)
    if rb and rp:
        b, p = b / rb, p / rp
    return stats.compare_runs([b], [p], sd=DEFAULT_DRIFT, df=None, threshold=threshold)


def _facing(comp: stats.Comparison, better: str | None) -> stats.Comparison:
    """A comparison of seconds as its metric reads it (tokens/s: the inverse)."""
    if better != "higher":
        return comp
    return dataclasses.replace(
        comp,
        ratio=1 / comp.ratio,
        delta=1 / comp.ratio - 1,
        ci_lo=1 / comp.ci_hi,
        ci_hi=1 / comp.ci_lo,
    )


def said(m: metrics.Metric, b: float | None, p: float | None, comp: stats.Comparison) -> str:
    """``decode 12.3 -> 13.9 ms/token (+13% [+9, +17], n=200)``."""
    shown = _facing(comp, m.better)
    figures = units.span(m.fmt, b, p) if b is not None and p is not None else m.fmt(p)
    interval = f"[{(shown.ci_lo - 1) * 100:+.0f}, {(shown.ci_hi - 1) * 100:+.0f}]"
    n = f"n={comp.n_pr}" if comp.paired else f"{comp.n_base} vs {comp.n_pr} run(s)"
    return f"{m.label} {figures} ({shown.delta:+.0%} {interval}, {n})"


def gate_generation(
    v: TargetVerdict,
    found: set[Verdict],
    result: TargetResult,
    base: TargetResult | None,
    rules: GateConfig,
) -> None:
    """Every generation rule for ``result`` (nothing for another target): paired with
    ``result.paired``'s generation, else against ``base`` (the stored baseline's)."""
    gen = result.generation
    if gen is None or gen.compiled is None:
        return
    _decode_recompiles(v, found, gen, rules)
    pair = result.paired.generation if result.paired is not None else None
    for m in metrics.registry():
        if m.samples is None:
            continue
        name, key = m.name, m.samples
        threshold = m.setting(rules) or 0.0
        # a drop of tokens/s by t is a rise of seconds per token by 1 / (1 - t) - 1
        cost = threshold if m.better != "higher" else 1 / (1 - threshold) - 1
        if pair is not None:
            b, p = pair.samples.get(key) or [], gen.samples.get(key) or []
            if len(b) < 2 or len(b) != len(p):
                continue
            comp = stats.compare(b, p, paired=True, threshold=cost)
            assert result.paired is not None and m.beside is not None
            before = m.beside(result.paired)
        elif base is not None:
            found_comp = _stored(name, gen, base, result, cost)
            if found_comp is None:
                continue
            comp, before = found_comp, m.read(base)
        else:
            continue
        v.timings[name] = _facing(comp, m.better)
        b_value, p_value = metrics.number(before), metrics.number(m.read(result))
        timing(v, found, m.label, comp, said(m, b_value, p_value, comp), threshold)


def _decode_recompiles(
    v: TargetVerdict, found: set[Verdict], gen: Generation, rules: GateConfig
) -> None:
    """Any compile of steady decode, named with the guard that failed."""
    if not gen.decode_recompiles:
        return
    m = metrics.get("decode-recompiles")
    guard = gen.decode_recompile_guards[0] if gen.decode_recompile_guards else None
    text = f"{m.label}: {gen.decode_recompiles} after the first decode step" + (
        f": guard failed: {guard}" if guard else ""
    )
    v.recompiled(found, text, rules.recompiles == "no-increase")
