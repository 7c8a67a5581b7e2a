"""What the markdown and the JSON report both read off a :class:`GateReport`: one row's
figures on either side (the baseline's or the base commit's, and this run's), the count
of targets per verdict, the rules a change alters, and the one-line summary. No
formatting beyond that line.

What the report shows is what the verdict used: paired, latency and graph breaks are
the base commit's, measured in the same process (:func:`base_p50`,
:func:`base_breaks`); the figures paired mode still compares with the stored baseline
(compile time, memory, recompiles, speedup) say so (:func:`from_baseline`). Each
figure is read through its descriptor in :mod:`gatekeeper.metrics` (:func:`figures`)."""

from __future__ import annotations

from .. import metrics, units
from ..gate import ORDER, GateReport, GateRow, Verdict
from ..gate.governing import Change
from ..results import Profile, TargetResult


def base_result(row: GateRow) -> TargetResult | None:
    """The baseline's result (None without a baseline)."""
    return row.baseline.result if row.baseline is not None else None


def from_baseline(row: GateRow) -> bool:
    """Whether a paired row's figures that are not paired come from a stored baseline."""
    return row.result.paired is not None and row.baseline is not None


def base_value(row: GateRow, m: metrics.Metric) -> metrics.Value:
    """The figure this run's is compared with: the base commit's where it was measured
    beside this one (paired), else the baseline's."""
    pair = row.result.paired
    if pair is not None and m.beside is not None:
        return m.beside(pair)
    b = base_result(row)
    return m.read(b) if b is not None else None


def figures(row: GateRow, m: metrics.Metric) -> tuple[metrics.Value, metrics.Value]:
    """The metric's figure on both sides: what it is compared with, and this run's."""
    return base_value(row, m), m.read(row.result)


def _read(name: str, r: TargetResult | None) -> metrics.Value:
    return metrics.get(name).read(r) if r is not None else None


def base_p50(row: GateRow) -> float | None:
    """The p50 this run's is compared with: the base commit's, timed in the same rounds
    (paired), else the baseline's."""
    return metrics.number(base_value(row, metrics.get("latency")))


def base_breaks(row: GateRow) -> int | None:
    """The graph breaks this run's are compared with: the base commit's (paired), else
    the baseline's."""
    b = metrics.number(base_value(row, metrics.get("graph-breaks")))
    return None if b is None else int(b)


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
    return metrics.number(_read("latency", r))


def speedup(r: TargetResult | None) -> float | None:
    return metrics.number(_read("speedup", r))


def compile_s(r: TargetResult | None) -> float | None:
    return metrics.number(_read("compile", r))


def breaks(r: TargetResult | None) -> int | None:
    b = metrics.number(_read("graph-breaks", r))
    return None if b is None else int(b)


def recompiles(r: TargetResult | None) -> int | None:
    """Recompiles after the first compile: while measuring, plus the shape sweep's."""
    n = metrics.number(_read("recompiles", r))
    return None if n is None else int(n)


def peak(r: TargetResult | None) -> int | None:
    n = metrics.number(_read("memory", r))
    return None if n is None else int(n)


def base_profile(row: GateRow) -> Profile | None:
    """The profile this run's is compared with: the base commit's (paired), else the
    baseline's."""
    r, b = row.result, base_result(row)
    return r.paired.profile if r.paired else (b.profile if b else None)


def sqnr(row: GateRow) -> tuple[float | None, float | None] | None:
    """A quantized target's SQNR vs its float model, in dB: (the base commit's, paired,
    else the baseline's; this run's). None for a float target."""
    if row.result.quantization is None:
        return None
    b, p = figures(row, metrics.get("sqnr"))
    return metrics.number(b), metrics.number(p)


def twin_line(row: GateRow) -> str | None:
    """``int8-weight-only: 0.71x latency, 0.27x weights`` beside its float twin."""
    twin, q = row.verdict.twin, row.result.quantization
    if twin is None or q is None:
        return None
    return (
        f"{q.config}: {units.speedup(twin['latency'])} latency, "
        f"{units.speedup(twin['weights'])} weights (vs {twin['twin']})"
    )


def twin_note(rows: list[GateRow]) -> str | None:
    """The markdown table's note of each quantized target beside its float twin."""
    from .text import md_code, md_text

    twins = [f"{md_code(r.result.target)} {md_text(line)}" for r in rows if (line := twin_line(r))]
    if not twins:
        return None
    return (
        "Quantized targets beside their float twin in this run (p50, weight bytes): "
        + "; ".join(twins)
        + ". SQNR: the quantized model's output vs its float model's, in dB."
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
