"""The report as a JSON document (schema ``gatekeeper.report/1``): the same data as the
markdown, for tools, without the raw timing samples (those stay in results.json)."""

from __future__ import annotations

import math
from typing import Any

from .. import metrics
from ..gate import GateReport, GateRow
from ..results import PACKAGE_FIELDS, TargetResult
from .advice import advise
from .profile import diff as profile_diff
from .rows import (
    base_profile,
    base_result,
    counts,
    figures,
    is_new,
    rule_changes,
    sqnr,
    summary_line,
)

REPORT_SCHEMA = "gatekeeper.report/1"


def _calls(n: float | None) -> float | str | None:
    return "never" if n is not None and math.isinf(n) else n


def _json_safe(x: Any) -> Any:
    """Non-finite floats become None (strict JSON has no NaN); containers recurse."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def _side(base: Any, pr: Any) -> dict:
    return {"base": base, "pr": pr}


def _latency_summaries(r: TargetResult | None) -> dict | None:
    if r is None or r.latency is None:
        return None
    lat = r.latency
    return {
        "eager": lat.eager.model_dump(),
        "compiled": lat.compiled.model_dump(),
        "reference": lat.reference.model_dump() if lat.reference else None,
        "throughput": lat.throughput,
        "inner_loops": lat.inner_loops,
    }


def _target_json(row: GateRow, remeasured: set[str]) -> dict:
    """One target; each registered metric's two sides under its ``json`` key (those of
    the built-in metrics in their places below, any other after them)."""
    out = _fixed_json(row, remeasured)
    # the other timed metrics' comparisons (a generate target's TTFT, TPOT, tokens/s)
    out["timings"] = {k: c.to_dict() for k, c in row.verdict.timings.items()}
    for m in metrics.registry():
        if m.json_key is not None and m.json_key not in out:
            out[m.json_key] = _side(*figures(row, m))
    return out


def _fig(row: GateRow, name: str) -> dict:
    return _side(*figures(row, metrics.get(name)))


def _packages(r: TargetResult) -> dict:
    """Each package's verdict by name, gatekeeper's own also as fields of their own (as
    results.json writes them)."""
    return {**{name: r.packages.get(name) for name in PACKAGE_FIELDS}, "packages": r.packages}


def _fixed_json(row: GateRow, remeasured: set[str]) -> dict:
    r, v, base = row.result, row.verdict, base_result(row)

    def dump(m):
        return m.model_dump(by_alias=True) if m is not None else None

    return {
        "target": r.target,
        "model": r.model,
        "device": r.device,
        "verdict": v.verdict,
        "status": r.status,
        "error": r.error,
        "export": dump(r.export),
        **_packages(r),
        "reasons": list(v.reasons),
        "notes": list(v.notes),
        "borderline": v.borderline,
        "remeasured": r.target in remeasured,
        "latency": v.latency.to_dict() if v.latency else None,
        "speedup_comparison": v.speedup.to_dict() if v.speedup else None,
        "p50_s": _fig(row, "latency"),  # as compared: paired, the base commit's
        "latency_summary": _side(_latency_summaries(base), _latency_summaries(r)),
        "speedup": _fig(row, "speedup"),
        "compile": _side(dump(base.compile) if base else None, dump(r.compile)),
        "compile_s": _fig(row, "compile"),
        "graphs": _side(
            base.graphs.count if base and base.graphs else None,
            r.graphs.count if r.graphs else None,
        ),
        "graph_breaks": _fig(row, "graph-breaks"),
        "break_reasons": [b.model_dump() for b in r.graphs.break_reasons] if r.graphs else [],
        "new_breaks": [b.model_dump() for b in v.new_breaks],
        "recompiles": _fig(row, "recompiles"),
        "memory": _side(dump(base.memory) if base else None, dump(r.memory)),
        "parity": dump(r.parity),
        "quantization": _quantization(row),
        # a distributed target's ranks: each one's medians, cache hits and parity
        "ranks": [x.model_dump(exclude={"cache_used"}) for x in r.ranks] if r.ranks else None,
        "cache": r.compile.cache if r.compile else None,
        "compile_state": _side(
            base.compile.state if base and base.compile else None,
            r.compile.state if r.compile else None,
        ),
        "work": _side(dump(base.work) if base else None, dump(r.work)),
        "base_commit_work": dump(r.paired.work) if r.paired else None,
        "mode": v.mode,
        # the rules that judged it (the base's: gate.governing) and what the change alters
        "rules": v.rules.model_dump(mode="json") if v.rules else None,
        "rules_from": v.rules_from,
        "rule_changes": [c.to_dict() for c in v.rule_changes],
        "definition_changes": [c.to_dict() for c in v.definition_changes],
        "new": is_new(row),
        "profile": _side(dump(base_profile(row)), dump(r.profile)),
        "profile_diff": [
            {
                "name": c.name,
                "base_us": c.base_us,
                "pr_us": c.pr_us,
                "delta_us": c.delta_us,
                "ratio": c.ratio,
            }
            for c in profile_diff(base_prof, r.profile)
        ]
        if (base_prof := base_profile(row)) is not None and r.profile is not None
        else None,
        "disturbed": v.disturbed,
        "detectable": v.detectable,
        "env_key": r.env_key,
        "code_hash": r.code_hash,
        "base_code_hash": r.paired.code_hash if r.paired else (base.code_hash if base else None),
        "baseline": None
        if row.baseline is None
        else {
            "ref": row.baseline.ref,
            "commit": row.baseline.commit,
            "created_at": row.baseline.created_at,
            "noise": row.baseline.noise.model_dump() if row.baseline.noise else None,
        },
    }


def _quantization(row: GateRow) -> dict | None:
    """A quantized target: its config, SQNR vs its float model (the base's beside it) and
    its latency and weights as ratios of its float twin's in this run."""
    q = row.result.quantization
    if q is None:
        return None
    return {
        **q.model_dump(),
        "base_sqnr_db": (sqnr(row) or (None, None))[0],
        "twin": row.verdict.twin,
    }


def report_json(report: GateReport) -> dict:
    """The report as a JSON-serialisable dict (schema ``gatekeeper.report/1``): verdicts,
    comparisons and summaries per target, never the raw timing samples."""
    remeasured = set(report.remeasured)
    doc = {
        "schema": REPORT_SCHEMA,
        "verdict": report.verdict,
        "exit_code": report.exit_code,
        "base_ref": report.base_ref,
        "mode_reason": report.mode_reason,
        **({"unconfined": list(report.unconfined)} if report.unconfined else {}),
        "summary": summary_line(report),
        "counts": counts(report),
        "creator": dict(report.creator or {}),
        "targets": [_target_json(row, remeasured) for row in report.rows],
        "removed": list(report.removed),
        "rule_changes": [
            {**c.to_dict(), "targets": targets} for c, targets in rule_changes(report)
        ],
        "mode_advice": [
            {
                "model": a.model,
                "shapes": a.shapes,
                "serving": a.serving,
                "serving_rule": a.serving_rule,
                "short_job": a.short_job,
                "short_job_rule": a.short_job_rule,
                "unavailable": [{"label": label, "why": why} for label, why in a.unavailable],
                "modes": [
                    {
                        **f.__dict__,
                        "label": f.label,
                        "speedup": f.speedup,
                        "break_even_cold": _calls(f.break_even(f.cold_s)),
                        "break_even_warm": _calls(f.break_even(f.warm_s)),
                    }
                    for f in a.modes
                ],
            }
            for a in advise([row.result for row in report.rows])
        ],
        "remeasured": list(report.remeasured),
    }
    return _json_safe(doc)
