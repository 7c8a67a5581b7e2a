"""What the markdown and the JSON report both read off a :class:`GateReport`: one row's
figures on either side (the baseline's or the base commit's, and this run's), the count
of targets per verdict, the rules a change alters, and the one-line summary. No
formatting beyond that line.

What the report shows is what the verdict used: paired, latency and graph breaks are
the base commit's, measured in the same process (:func:`base_p50`,
:func:`base_breaks`); the figures paired mode still compares with the stored baseline
(compile time, memory, recompiles, speedup) say so (:func:`from_baseline`)."""

from __future__ import annotations

import statistics

from .. import units
from ..gate import ORDER, GateReport, GateRow, Verdict
from ..gate.governing import Change
from ..results import Profile, TargetResult


def base_result(row: GateRow) -> TargetResult | None:
    """The baseline's result (None without a baseline)."""
    return row.baseline.result if row.baseline is not None else None


def from_baseline(row: GateRow) -> bool:
    """Whether a paired row's figures that are not paired come from a stored baseline."""
    return row.result.paired is not None and row.baseline is not None


def base_p50(row: GateRow) -> float | None:
    """The p50 this run's is compared with: the base commit's, timed in the same rounds
    (paired), else the baseline's."""
    pair = row.result.paired
    if pair is not None:
        return statistics.median(pair.samples) if pair.samples else None
    return p50(base_result(row))


def base_breaks(row: GateRow) -> int | None:
    """The graph breaks this run's are compared with: the base commit's (paired), else
    the baseline's."""
    pair = row.result.paired
    return pair.graphs.breaks if pair is not None else breaks(base_result(row))


def is_new(row: GateRow) -> bool:
    """A target the base does not define: not in the base commit's config (paired), or
    without a baseline (stored)."""
    r = row.result
    if r.base_target is not None:
        return not r.base_target.defined
    return row.baseline is None and r.paired is None


def rule_changes(report: GateReport) -> list[tuple[Change, list[str]]]:
    """Each rule the change alters, with the targets it alters it for (in the order
    they were gated), once per distinct change."""
    out: dict[tuple, tuple[Change, list[str]]] = {}
    for row in report.rows:
        for c in row.verdict.rule_changes:
            key = (c.field, repr(c.base), repr(c.pr))
            out.setdefault(key, (c, []))[1].append(row.result.target)
    return list(out.values())


def p50(r: TargetResult | None) -> float | None:
    return r.latency.compiled.p50 if r is not None and r.latency is not None else None


def speedup(r: TargetResult | None) -> float | None:
    return r.latency.speedup if r is not None and r.latency is not None else None


def compile_s(r: TargetResult | None) -> float | None:
    return r.compile.seconds if r is not None and r.compile is not None else None


def breaks(r: TargetResult | None) -> int | None:
    return r.graphs.breaks if r is not None and r.graphs is not None else None


def recompiles(r: TargetResult | None) -> int | None:
    """Recompiles after the first compile: while measuring, plus the shape sweep's."""
    if r is None or r.graphs is None:
        return None
    return r.graphs.recompiles + (r.graphs.sweep.recompiles if r.graphs.sweep else 0)


def peak(r: TargetResult | None) -> int | None:
    return r.memory.compiled_peak_bytes if r is not None and r.memory is not None else None


def base_profile(row: GateRow) -> Profile | None:
    """The profile this run's is compared with: the base commit's (paired), else the
    baseline's."""
    r, b = row.result, base_result(row)
    return r.paired.profile if r.paired else (b.profile if b else None)


def sqnr(row: GateRow) -> tuple[float | None, float | None] | None:
    """A quantized target's SQNR vs its float model: (the base commit's, paired, else the
    baseline's; this run's), in dB. None for a float target."""
    q = row.result.quantization
    if q is None:
        return None
    pair, b = row.result.paired, base_result(row)
    base = pair.quantization if pair is not None else (b.quantization if b else None)
    return (base.sqnr_db if base else None, q.sqnr_db)


def twin_line(row: GateRow) -> str | None:
    """``int8-weight-only: 0.71x latency, 0.27x weights`` beside its float twin."""
    twin, q = row.verdict.twin, row.result.quantization
    if twin is None or q is None:
        return None
    return (
        f"{q.config}: {units.speedup(twin['latency'])} latency, "
        f"{units.speedup(twin['weights'])} weights (vs {twin['twin']})"
    )


def counts(report: GateReport) -> dict[Verdict, int]:
    """Targets per verdict, every verdict present (zeros included), in severity order."""
    out = dict.fromkeys(ORDER, 0)
    for row in report.rows:
        out[row.verdict.verdict] += 1
    return out


def summary_line(report: GateReport) -> str:
    """One line for logs: ``gatekeeper: regressed — 1 regressed, 5 pass (base: main)``."""
    parts = [f"{n} {v}" for v, n in counts(report).items() if n]
    line = f"gatekeeper: {report.verdict} — {', '.join(parts) if parts else 'no targets'}"
    if report.removed:
        line += f"; {len(report.removed)} removed"
    return f"{line} (base: {report.base_ref})"
