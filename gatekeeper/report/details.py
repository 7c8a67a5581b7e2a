"""A target's folded ``<details>`` section in the markdown report: its reasons and
notes, graph breaks, where the time went, and the tables of latency, compile, work,
memory and parity, each side labelled by what it is (the base commit, paired; the
stored baseline)."""

from __future__ import annotations

import html

from .. import kinds, metrics, units
from ..gate import GateRow
from ..gate.stats import Comparison, summarize
from ..results import GraphBreak, LatencySummary, ParityCheck, TargetResult
from ..units import DASH
from .profile import diff as profile_diff
from .rows import base_profile, base_result, base_value
from .text import (
    MAX_BREAKS_LISTED,
    MAX_ERROR_CHARS,
    MAX_REASON_CHARS,
    code_block,
    error_line,
    md_code,
    md_table,
    md_text,
    verdict_label,
)

# ------------------------------------------------------------------------- row accessors


def base_label(r: TargetResult) -> str:
    """What a result's outputs and timing were compared with."""
    return "base commit" if r.paired is not None else "baseline"


def parity_failed(r: TargetResult) -> list[str]:
    if r.parity is None:
        return []
    checks = (("vs eager", r.parity.vs_eager), (f"vs {base_label(r)}", r.parity.vs_baseline))
    return [name for name, c in checks if c is not None and not c.passed]


def _stored_sides(row: GateRow) -> list[tuple[str, TargetResult | None]]:
    """The sides of a figure compared with the stored baseline: labelled as such in a
    paired row, whose timing and graph breaks are the base commit's."""
    label = "baseline (stored)" if row.result.paired is not None else "baseline"
    return [(label, base_result(row)), ("PR", row.result)]


# ---------------------------------------------------------------------- details section


def _summary_rows(label: str, s: LatencySummary | None) -> list[str] | None:
    if s is None:
        return None
    return [
        label,
        units.seconds(s.p50),
        units.seconds(s.p95),
        units.seconds(s.p99),
        units.seconds(s.mean),
        str(s.n),
    ]


def _latency_table(row: GateRow) -> str | None:
    """Paired: the base commit's compiled latency, timed in the same rounds as this run's
    (eager and the reference ran once per round, for both); stored: the baseline's."""
    pair, pr = row.result.paired, row.result
    base = None if pair is not None else base_result(row)
    rows = []
    if pair is not None and pair.samples:
        s = summarize(pair.samples)
        rows.append(
            [
                "compiled (base commit)",
                *(units.seconds(x) for x in (s.median, s.p95, s.p99, s.mean)),
                str(s.n),
            ]
        )
    for kind in ("eager", "compiled", "reference"):
        for side, r in (("baseline", base), ("PR", pr)):
            if r is None or r.latency is None:
                continue
            line = _summary_rows(f"{kind} ({side})", getattr(r.latency, kind))
            if line:
                rows.append(line)
    if not rows:
        return None
    return md_table(rows, ["", "p50", "p95", "p99", "mean", "n"])


def _comparison_row(label: str, comp: Comparison) -> list[str]:
    return [
        label,
        f"{comp.ratio:.3f}",
        units.change(comp.delta),
        f"{units.change(comp.ci_lo - 1)} .. {units.change(comp.ci_hi - 1)}",
        units.p_value(comp.p_value) + ("" if comp.significant else " (n.s.)"),
        f"±{comp.threshold:.0%}",
        comp.verdict,
        f"{comp.test}, {comp.unit}={comp.n_base}/{comp.n_pr}",
    ]


def _comparison_table(row: GateRow) -> str | None:
    v = row.verdict
    rows = []
    if v.latency:
        label = (
            "compiled latency ÷ reference workload"
            if v.latency.normalised
            else "compiled latency (not normalised)"
        )
        rows.append(_comparison_row(label, v.latency))
    if v.speedup:
        rows.append(_comparison_row("compiled ÷ eager per round (speedup)", v.speedup))
    if not rows:
        return None
    return md_table(
        rows, ["PR vs base", "ratio", "Δ", "CI", "p-value", "threshold", "verdict", "test"]
    )


def _compile_table(row: GateRow) -> str | None:
    rows = []
    pair = row.result.paired
    if pair is not None:  # compiled after this run's, in its process: for reference only
        rows.append(
            ["base commit", f"{pair.compile_seconds:.2f} s", *[DASH] * 4, str(pair.graphs.count)]
        )
    for side, r in _stored_sides(row):
        if r is None or r.compile is None:
            continue
        c = r.compile
        graphs = str(r.graphs.count) if r.graphs else DASH
        rows.append(
            [
                side,
                f"{c.seconds:.2f} s",
                c.state,
                c.cache,
                f"{c.fxgraph_cache_hit} / {c.fxgraph_cache_miss}",
                f"{c.autograd_cache_hit} / {c.autograd_cache_miss}",
                graphs,
            ]
        )
    if not rows:
        return None
    return md_table(
        rows,
        [
            "",
            "compile",
            "start",
            "cache",
            "FX graph hit / miss",
            "AOT autograd hit / miss",
            "graphs",
        ],
    )


def _memory_table(row: GateRow) -> str | None:
    rows = []
    for side, r in _stored_sides(row):
        if r is None or r.memory is None:
            continue
        m = r.memory
        source = metrics.get("memory").sources.get(m.source, m.source)
        rows.append([side, source, units.mib(m.eager_peak_bytes), units.mib(m.compiled_peak_bytes)])
    if not rows:
        return None
    return md_table(rows, ["", "measured as", "eager (MiB)", "compiled (MiB)"])


def _group_table(row: GateRow, group: str) -> str | None:
    """A group's metrics (the work counters), one row per side: the base commit's
    (paired) or the baseline's, and the PR's."""
    members = metrics.group(group)
    rows = []
    for side, values in (
        (base_label(row.result), [base_value(row, m) for m in members]),
        ("PR", [m.read(row.result) for m in members]),
    ):
        if any(v is not None for v in values):
            rows.append([side, *(m.fmt(v) for m, v in zip(members, values, strict=True))])
    if not rows:
        return None
    return md_table(rows, ["", *(m.heading or m.label for m in members)])


def shows_profile(row: GateRow, everything: bool = False) -> bool:
    """A profile diff for a target whose timing got worse (or every one, ``--profile``)."""
    if row.result.profile is None or base_profile(row) is None:
        return False
    timing = [c for c in (row.verdict.latency, row.verdict.speedup) if c]
    slower = any(c.verdict in ("regressed", "borderline") or c.delta > c.threshold for c in timing)
    return everything or (
        row.verdict.verdict in ("regressed", "inconclusive", "accepted") and slower
    )


def _profile_section(row: GateRow, everything: bool) -> list[str]:
    base, pr = base_profile(row), row.result.profile
    if base is None or pr is None or not shows_profile(row, everything):
        return []
    rows = [
        [
            md_text(c.name, 80),
            units.seconds(c.base_us * 1e-6),
            units.seconds(c.pr_us * 1e-6),
            units.seconds(c.delta_us * 1e-6),
            units.change(c.ratio) if c.ratio is not None else "new",
        ]
        for c in profile_diff(base, pr)
    ]
    unit = "device" if pr.device_time else "CPU"
    out = [
        f"**Where the time went** ({unit} self time per call, torch.profiler over "
        f"{pr.calls} calls; {'the base commit' if row.result.paired else 'the baseline'} "
        "→ this run)\n",
        md_table(rows, ["operator", "base", "PR", "Δ", "Δ%"]),
    ]
    traces = [t for t in (base.trace if row.result.paired else None, pr.trace) if t]
    if traces:
        out.append(
            "\nChrome traces (open in Perfetto or chrome://tracing): "
            + ", ".join(md_code(t) for t in traces)
        )
    return out + [""]


def _parity_table(r: TargetResult) -> str | None:
    if r.parity is None:
        return None
    rows = []
    checks: list[tuple[str, ParityCheck | None]] = [
        ("compiled vs eager", r.parity.vs_eager),
        (f"compiled vs {base_label(r)}", r.parity.vs_baseline),
    ]
    missing = (
        "not compared: the base commit's config builds other inputs"
        if r.paired is not None
        else "no baseline reference outputs"
    )
    for label, c in checks:
        if c is None:
            rows.append([label, DASH, DASH, DASH, DASH, DASH, missing])
            continue
        cos = DASH if c.cosine is None else f"{c.cosine:.6f}"
        rows.append(
            [
                label,
                "✅ pass" if c.passed else "❌ FAILED",
                md_text(c.method),
                units.sci(c.max_abs_err),
                units.sci(c.rmse),
                cos,
                md_text(c.detail, MAX_REASON_CHARS) if c.detail else "",
            ]
        )
    table = md_table(rows, ["", "result", "method", "max abs err", "RMSE", "cosine", "detail"])
    out = r.parity.outputs
    if out is None:
        return table
    parts = [
        f"Outputs compared: {md_code(out.structure)}, {out.leaves} leaves "
        f"({out.tensors} tensors, {out.elements:,} numbers)"
    ]
    parts += [f"{md_code(path)}: {md_code(name)}" for path, name in out.containers.items()]
    return table + "\n\n" + "; ".join(parts) + "."


def _break_where(b: GraphBreak, *, table: bool = False) -> str:
    return md_code(b.where(), table=table) if b.file else "?"


def _breaks_section(row: GateRow) -> list[str]:
    out: list[str] = []
    new = row.verdict.new_breaks
    if new:
        out.append(f"**New graph breaks ({len(new)})**\n")
        for b in new[:MAX_BREAKS_LISTED]:
            out.append(f"- {_break_where(b)} — {md_text(b.reason, MAX_REASON_CHARS)}")
        if len(new) > MAX_BREAKS_LISTED:
            out.append(f"- … and {len(new) - MAX_BREAKS_LISTED} more")
        out.append("")
    r = row.result
    if r.graphs is not None and r.graphs.break_reasons:
        new_keys = {(b.reason, b.file, b.line) for b in new}
        reasons = r.graphs.break_reasons
        rows = [
            [
                str(i),
                _break_where(b, table=True),
                "🆕" if (b.reason, b.file, b.line) in new_keys else "",
                md_text(b.reason, MAX_REASON_CHARS),
            ]
            for i, b in enumerate(reasons[:MAX_BREAKS_LISTED], 1)
        ]
        out.append(f"**All graph breaks in this PR ({len(reasons)})**\n")
        out.append(md_table(rows, ["#", "where", "new", "reason"]))
        if len(reasons) > MAX_BREAKS_LISTED:
            out.append(f"\n*… and {len(reasons) - MAX_BREAKS_LISTED} more (see results.json)*")
        out.append("")
    return out


def details_section(row: GateRow, everything: bool = False) -> str:
    r, v = row.result, row.verdict
    parts = [
        f"<details><summary>{html.escape(r.target)} — {verdict_label(v.verdict)}</summary>",
        "",
        *_outcome(r),
    ]
    reasons = [x for x in v.reasons if x != r.error]  # an error is shown above
    if reasons:
        parts.append("**Reasons**\n")
        parts += [f"- {md_text(x, MAX_REASON_CHARS)}" for x in reasons]
        parts.append("")
    if v.notes:
        parts.append("**Notes**\n")
        parts += [f"- {md_text(x, MAX_REASON_CHARS)}" for x in v.notes]
        parts.append("")
    parts += _breaks_section(row)
    parts += _profile_section(row, everything)
    for title, table in (
        ("Latency", _latency_table(row)),
        ("Latency comparison", _comparison_table(row)),
        ("Compile", _compile_table(row)),
        *((title, _group_table(row, group)) for group, title in metrics.GROUPS.items()),
        ("Peak memory", _memory_table(row)),
        ("Parity", _parity_table(r)),
        ("Ranks", _ranks_table(r)),
    ):
        if table:
            parts += [f"**{title}**\n", table, ""]
    parts += ["**Environment**\n", *_environment(row), "", "</details>"]
    return "\n".join(parts)


def _ranks_table(r: TargetResult) -> str | None:
    """A distributed target's ranks: each one's medians (its latency is the slowest
    rank's, round by round), its cache hits and its parity."""
    if not r.ranks:
        return None
    paired = any(x.base_latency_p50 is not None for x in r.ranks)

    def ms(x: float | None) -> str:
        return f"{x * 1e3:.3f}" if x is not None else "-"

    head = ["rank", "compiled p50 ms", "CPU p50 ms"]
    head += ["base p50 ms", "base CPU p50 ms"] if paired else []
    head += ["slowest in rounds", "FX hits / misses", "parity"]
    rows = []
    for x in r.ranks:
        row = [str(x.rank), ms(x.latency_p50), ms(x.cpu_p50)]
        row += [ms(x.base_latency_p50), ms(x.base_cpu_p50)] if paired else []
        parity = "-" if x.parity is None else "pass" if x.parity else "**fail**"
        row += [
            str(x.slowest_rounds) if x.slowest_rounds is not None else "-",
            f"{x.fxgraph_cache_hit} / {x.fxgraph_cache_miss}",
            parity,
        ]
        rows.append(row)
    return md_table(rows, head)


def _outcome(r: TargetResult) -> list[str]:
    """What became of the target besides its figures: an error, a kind that cannot be
    had here or cannot build the model, and each package's verdict."""
    parts = []
    if r.status == "error":
        parts += [f"**Error:** {md_text(error_line(r.error), MAX_REASON_CHARS)}", ""]
        if r.error and r.error.strip() != error_line(r.error):
            text = (
                r.error if len(r.error) <= MAX_ERROR_CHARS else "…\n" + r.error[-MAX_ERROR_CHARS:]
            )
            parts += [code_block(text), ""]
    if r.status == "unavailable":
        title = kinds.of_id(r.target).title or "unavailable"
        parts += [f"**{title}:** {md_text(r.error or r.status, MAX_REASON_CHARS)}", ""]
    if r.export is not None and not r.export.exportable:
        how = "strict" if r.export.strict else "non-strict"
        parts += [
            f"**Not exportable** ({how} torch.export) at {md_code(r.export.where())}: "
            f"{md_text(r.export.reason, MAX_REASON_CHARS)}",
            "",
        ]
    known = {p.name: p for p in kinds.packages()}
    for name, doc in r.packages.items():
        # a package of a kind not installed here is said as any package's verdict
        package = known.get(name)
        line = package.detail(doc) if package is not None else kinds.base.verdict_line(doc)
        if doc and line is not None:
            said, reason = line
            why = f" ({md_text(reason, MAX_REASON_CHARS)})" if reason else ""
            title = package.title if package is not None else name
            parts += [f"**{md_text(title)} package:** {said}{why}", ""]
    return parts


def _environment(row: GateRow) -> list[str]:
    """Where and how it was measured, and against what."""
    r, v, base = row.result, row.verdict, base_result(row)
    env = [f"- env key: {md_code(r.env_key)}"]
    code = f"- code hash: {md_code(r.code_hash)}"
    base_hash = r.paired.code_hash if r.paired is not None else (base.code_hash if base else None)
    if base_hash is not None:
        code += (
            " (unchanged)"
            if base_hash == r.code_hash
            else f" ({base_label(r)}: {md_code(base_hash)})"
        )
    env.append(code)
    env.append(f"- device: {md_code(r.device)}")
    if v.mode:
        env.append(f"- timing decided by: {v.mode} mode")
    d = r.latency.disturbance if r.latency else None
    if d is not None and d.others_cores is not None:
        env.append(
            f"- machine while timing: other processes used {d.others_cores:.2f} of "
            f"{d.cores} cores; reference workload spread "
            f"{(d.reference_noise or 0):.1%}" + (" (**disturbed**)" if v.disturbed else "")
        )
    if row.baseline is not None:
        commit = row.baseline.commit
        env.append(
            f"- baseline: {md_code(row.baseline.ref)}"
            + (f" at {md_code(commit[:12])}" if commit else "")
            + f", measured {md_text(row.baseline.created_at)}"
        )
        noise = row.baseline.noise
        if noise is not None:
            between = (
                f", {noise.between:.1%} between {len(noise.runs)} runs"
                if noise.between is not None
                else ""
            )
            env.append(
                f"- noise on this runner: {noise.within:.1%} within a run{between}; "
                f"smallest slowdown it can detect: **{noise.detectable:.1%}**"
            )
    return env
