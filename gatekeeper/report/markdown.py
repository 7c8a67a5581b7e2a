"""The gate's report as GitHub-flavoured markdown (PR comment, job summary), and one log line.

Both render one :class:`gatekeeper.gate.GateReport`; nothing here measures or
decides. No torch, no I/O.

* :func:`render_markdown` — a headline, one table with a row per target, the reasons of
  the failing targets, a folded ``<details>`` section per target, then the targets added
  and removed since the baseline and the borderline ones that were re-measured. Kept
  under :data:`MAX_MARKDOWN_CHARS` (GitHub refuses comments over 65,536 characters) by
  dropping details sections from the end, which holds the least severe targets.
* :func:`summary_line` (from :mod:`.rows`) — ``gatekeeper: regressed — 1 regressed, 5
  pass (base: main)``.

Text that comes from the measured code (graph-break reasons, errors, parity details)
contains backticks, pipes, ``<``, ``@`` and newlines; it goes through :func:`md_text`
before it reaches markdown, so it can neither break a table nor ping anyone.
"""

from __future__ import annotations

import html
import math
import re
import statistics
from collections.abc import Iterable
from typing import Any

from tabulate import tabulate

from .. import units
from ..gate import GateReport, GateRow, Verdict
from ..gate.drift import normalised_latency
from ..gate.stats import Comparison
from ..gate.verdicts import EXPLAINED, FAILING, severity
from ..results import GraphBreak, LatencySummary, ParityCheck, TargetResult
from ..units import DASH
from .advice import Advice, advise
from .profile import diff as profile_diff
from .rows import base_profile, base_result, breaks, counts, p50, peak, recompiles, speedup
from .rows import summary_line as summary_line
from .trend import sparkline

MAX_MARKDOWN_CHARS = 60_000
ARROW = "→"
EMOJI: dict[Verdict, str] = {
    "pass": "✅",
    "improved": "🚀",
    "regressed": "❌",
    "parity-failed": "❌",
    "inconclusive": "🟡",
    "accepted": "☑️",
    "no-baseline": "⚪",
    "error": "⚠️",
}

# caps that keep one pathological target from filling the whole report
MAX_BREAKS_LISTED = 50  # graph breaks listed per target in its details
MAX_REASON_CHARS = 500  # one graph-break reason / gate reason in a table or list
MAX_ERROR_CHARS = 3000  # an error's text in its details (the tail is kept)
MAX_LIST_ITEMS = 100  # added / removed / re-measured target lists

_MD_ESCAPES = str.maketrans(
    {
        **{c: "\\" + c for c in "\\`*_[]|~#!"},
        "&": "&amp;",
        "<": "&lt;",
        ">": "&gt;",
        "@": "@\u200b",
    }
)
_NEWLINES = re.compile(r"\r\n|\r|\n")


# ------------------------------------------------------------------------------ escaping


def _truncate(text: str, limit: int | None) -> str:
    if limit is not None and len(text) > limit:
        return text[: max(0, limit - 1)].rstrip() + "…"
    return text


def md_text(text: Any, limit: int | None = None) -> str:
    """``text`` as one line of literal markdown, safe in a table cell and in a list item.

    Markdown punctuation (backslash, backticks, ``*``, ``_``, brackets, ``|``, ``~``,
    ``#``, ``!``) is backslash-escaped, ``&``/``<``/``>`` become entities, newlines
    become ``<br>``, and ``@`` gets a zero-width space so that ``@torch.no_grad`` in a
    reason mentions nobody. ``limit`` truncates the raw text first (with "…").
    """
    s = _truncate(str(text), limit)
    return _NEWLINES.sub("<br>", s.strip().translate(_MD_ESCAPES))


def md_code(text: Any, *, table: bool = False) -> str:
    """``text`` as an inline code span (a fence longer than any backtick run inside it).
    In a table cell ``|`` must still be escaped, even inside code (GFM)."""
    s = " ".join(str(text).split())  # no newlines in a code span
    run = max((len(m) for m in re.findall(r"`+", s)), default=0)
    fence = "`" * (run + 1)
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    if table:
        s = s.replace("|", "\\|")
    return f"{fence}{pad}{s}{pad}{fence}"


def _code_block(text: str) -> str:
    run = max((len(m) for m in re.findall(r"`{3,}", text)), default=2)
    fence = "`" * (run + 1)
    return f"{fence}text\n{text.rstrip()}\n{fence}"


# ----------------------------------------------------------------------------- formatting


def _pair(base: str | None, pr: str | None) -> str:
    """``base → PR``; a missing side is "–", both missing is "–"."""
    b = DASH if base is None else base
    p = DASH if pr is None else pr
    return DASH if b == DASH and p == DASH else f"{b} {ARROW} {p}"


def _emoji(verdict: Verdict) -> str:
    return EMOJI[verdict]


def _verdict_label(verdict: Verdict) -> str:
    return f"{_emoji(verdict)} {verdict}"


def _sorted_rows(report: GateReport) -> list[GateRow]:
    """Worst first (the order of :data:`gatekeeper.gate.ORDER`), else as measured."""
    return sorted(report.rows, key=lambda row: severity(row.verdict.verdict))


def error_line(error: str | None) -> str:
    """The line of an error worth showing: the exception line of a traceback, else the
    first non-empty line."""
    lines = [ln.strip() for ln in (error or "").splitlines() if ln.strip()]
    if not lines:
        return "measurement failed"
    return lines[-1] if lines[0].startswith("Traceback") else lines[0]


# ------------------------------------------------------------------------- row accessors


def _parity_failed(r: TargetResult) -> list[str]:
    if r.parity is None:
        return []
    checks = (("vs eager", r.parity.vs_eager), ("vs baseline", r.parity.vs_baseline))
    return [name for name, c in checks if c is not None and not c.passed]


# ------------------------------------------------------------------------ the main table

HEADERS = [
    "target",
    "verdict",
    "p50 latency (Δ, trend)",
    "speedup vs eager",
    "compile",
    "graph breaks",
    "recompiles",
    "peak mem compiled (MiB)",
    "parity (max abs err)",
    "cache",
]


def _latency_cell(row: GateRow) -> str:
    base, pr = base_result(row), row.result
    cell = _pair(units.seconds(p50(base)), units.seconds(p50(pr)))
    comp = row.verdict.latency
    if comp:
        delta = units.change(comp.delta)
        if comp.verdict == "regressed":
            delta = f"**{delta}**"
        sig = units.p_value(comp.p_value) if comp.significant else "n.s."
        cell += f", {delta} ({sig}{', paired' if comp.paired else ''})"
    trend = _trend(row)
    if trend:
        cell += f" {md_code(trend, table=True)}"
    return cell


def _trend(row: GateRow) -> str:
    """The base branch's last baselines (normalised latency, oldest first) and, after the
    arrow, this run's point on the same scale."""

    def level(r: TargetResult) -> float | None:
        xs = normalised_latency(r)
        return statistics.median(xs) if xs else None

    return (
        sparkline([level(r) for r in row.history], level(row.result))
        if len(row.history) >= 2
        else ""
    )


def _speedup_cell(row: GateRow) -> str:
    cell = _pair(units.speedup(speedup(base_result(row))), units.speedup(speedup(row.result)))
    comp = row.verdict.speedup
    if comp and comp.verdict in ("regressed", "improved"):
        cell += f" ({EMOJI['regressed' if comp.verdict == 'regressed' else 'improved']})"
    return cell


def _compile_cell(row: GateRow) -> str:
    base, pr = base_result(row), row.result
    bc, pc = (base.compile if base else None), pr.compile
    if pc is None and bc is None:
        return DASH
    if bc is not None and pc is not None and bc.state == pc.state:
        return f"{bc.seconds:.1f} {ARROW} {pc.seconds:.1f} s ({pc.state})"
    b = f"{bc.seconds:.1f} s ({bc.state})" if bc else DASH
    p = f"{pc.seconds:.1f} s ({pc.state})" if pc else DASH
    return f"{b} {ARROW} {p}"


def _breaks_cell(row: GateRow) -> str:
    b, p = breaks(base_result(row)), breaks(row.result)
    cell = _pair(None if b is None else str(b), None if p is None else str(p))
    if row.verdict.new_breaks:
        cell += f" (+{len(row.verdict.new_breaks)} new)"
    return cell


def _recompiles_cell(row: GateRow) -> str:
    b, p = recompiles(base_result(row)), recompiles(row.result)
    return _pair(None if b is None else str(b), None if p is None else str(p))


def _memory_cell(row: GateRow) -> str:
    return _pair(units.mib(peak(base_result(row))), units.mib(peak(row.result)))


def _parity_cell(row: GateRow) -> str:
    r = row.result
    if r.parity is None:
        return DASH
    failed = _parity_failed(r)
    if failed:
        return "❌ FAILED (" + ", ".join(failed) + ")"
    vb = r.parity.vs_baseline
    return (
        f"eager {units.sci(r.parity.vs_eager.max_abs_err)} · "
        f"base {units.sci(vb.max_abs_err) if vb else DASH}"
    )


def _table_row(row: GateRow) -> list[str]:
    r = row.result
    return [
        md_text(r.target),
        _verdict_label(row.verdict.verdict),
        _latency_cell(row),
        _speedup_cell(row),
        _compile_cell(row),
        _breaks_cell(row),
        _recompiles_cell(row),
        _memory_cell(row),
        _parity_cell(row),
        r.compile.cache if r.compile else DASH,
    ]


def _table(rows: Iterable[list[str]], headers: list[str]) -> str:
    """A GitHub table. Cells are already escaped; newlines are made ``<br>`` here as a
    last guard, since one would split the row."""
    safe = [[_NEWLINES.sub("<br>", str(c)) for c in row] for row in rows]
    return tabulate(safe, headers=headers, tablefmt="github", disable_numparse=True)


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
    base, pr = base_result(row), row.result
    rows = []
    for kind in ("eager", "compiled", "reference"):
        for side, r in (("base", base), ("PR", pr)):
            if r is None or r.latency is None:
                continue
            line = _summary_rows(f"{kind} ({side})", getattr(r.latency, kind))
            if line:
                rows.append(line)
    if not rows:
        return None
    return _table(rows, ["", "p50", "p95", "p99", "mean", "n"])


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
    return _table(
        rows, ["PR vs base", "ratio", "Δ", "CI", "p-value", "threshold", "verdict", "test"]
    )


def _compile_table(row: GateRow) -> str | None:
    rows = []
    for side, r in (("base", base_result(row)), ("PR", row.result)):
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
    return _table(
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
    for side, r in (("base", base_result(row)), ("PR", row.result)):
        if r is None or r.memory is None:
            continue
        m = r.memory
        kind = {"cuda": "CUDA max allocated", "cpu": "peak bytes allocated"}.get(
            m.kind, "peak RSS growth"
        )
        rows.append([side, kind, units.mib(m.eager_peak_bytes), units.mib(m.compiled_peak_bytes)])
    if not rows:
        return None
    return _table(rows, ["", "kind", "eager (MiB)", "compiled (MiB)"])


def _work_table(row: GateRow) -> str | None:
    base = base_result(row)
    base_work = row.result.paired.work if row.result.paired else (base.work if base else None)
    sides = [("base commit" if row.result.paired else "base", base_work), ("PR", row.result.work)]
    rows = []
    for side, w in sides:
        if w is None:
            continue
        rows.append(
            [
                side,
                units.count(w.flops),
                units.count(w.bytes_accessed),
                units.count(w.kernels),
                units.count(w.instructions),
            ]
        )
    if not rows:
        return None
    return _table(
        rows,
        ["", "FLOPs / call", "bytes accessed / call", "kernels generated", "instructions / call"],
    )


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
        _table(rows, ["operator", "base", "PR", "Δ", "Δ%"]),
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
        ("compiled vs baseline", r.parity.vs_baseline),
    ]
    for label, c in checks:
        if c is None:
            rows.append([label, DASH, DASH, DASH, DASH, DASH, "no baseline reference outputs"])
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
    table = _table(rows, ["", "result", "method", "max abs err", "RMSE", "cosine", "detail"])
    out = r.parity.outputs
    if out is None:
        return table
    parts = [
        f"Outputs compared: {md_code(out.kind)}, {out.leaves} leaves "
        f"({out.tensors} tensors, {out.elements:,} numbers)"
    ]
    parts += [f"{md_code(path)}: {md_code(kind)}" for path, kind in out.containers.items()]
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
        out.append(_table(rows, ["#", "where", "new", "reason"]))
        if len(reasons) > MAX_BREAKS_LISTED:
            out.append(f"\n*… and {len(reasons) - MAX_BREAKS_LISTED} more (see results.json)*")
        out.append("")
    return out


def _details(row: GateRow, everything: bool = False) -> str:
    r, v = row.result, row.verdict
    base = base_result(row)
    parts = [
        f"<details><summary>{html.escape(r.target)} — {_verdict_label(v.verdict)}</summary>",
        "",
    ]
    if r.status == "error":
        parts += [f"**Error:** {md_text(error_line(r.error), MAX_REASON_CHARS)}", ""]
        if r.error and r.error.strip() != error_line(r.error):
            text = (
                r.error if len(r.error) <= MAX_ERROR_CHARS else "…\n" + r.error[-MAX_ERROR_CHARS:]
            )
            parts += [_code_block(text), ""]
    if r.status == "unavailable":
        parts += [f"**AOTInductor:** {md_text(r.error or r.status, MAX_REASON_CHARS)}", ""]
    if r.export is not None and not r.export.exportable:
        how = "strict" if r.export.strict else "non-strict"
        parts += [
            f"**Not exportable** ({how} torch.export) at {md_code(r.export.where())}: "
            f"{md_text(r.export.reason, MAX_REASON_CHARS)}",
            "",
        ]
    if r.aot:
        verified = r.aot.get("verified")
        state = (
            "verified" if verified is True else "rejected" if verified is False else "not verified"
        )
        first = r.aot.get("first_call_seconds")
        parts += [
            f"**AOTInductor package:** {state}"
            + (f", first call {units.seconds(first)} in a new process" if first else "")
            + (f" ({md_text(r.aot['reason'], MAX_REASON_CHARS)})" if r.aot.get("reason") else ""),
            "",
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
        ("Work per call (deterministic)", _work_table(row)),
        ("Peak memory", _memory_table(row)),
        ("Parity", _parity_table(r)),
    ):
        if table:
            parts += [f"**{title}**\n", table, ""]
    env = [f"- env key: {md_code(r.env_key)}"]
    code = f"- code hash: {md_code(r.code_hash)}"
    if base is not None:
        code += (
            " (unchanged)"
            if base.code_hash == r.code_hash
            else f" (baseline: {md_code(base.code_hash)})"
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
    parts += ["**Environment**\n", *env, "", "</details>"]
    return "\n".join(parts)


# --------------------------------------------------------------------------- markdown


def _headline(report: GateReport, title: str) -> str:
    n = len(report.rows)
    tally = " · ".join(f"{_emoji(v)} {c} {v}" for v, c in counts(report).items() if c)
    lines = [
        f"## {_emoji(report.verdict)} {md_text(title)}: {report.verdict}",
        "",
        f"**{n} target{'s' if n != 1 else ''}** gated against the baseline of "
        f"{md_code(report.base_ref)}" + (f": {tally}" if tally else ""),
    ]
    c = report.creator or {}
    extra = []
    if c.get("commit"):
        extra.append(f"commit {md_code(str(c['commit'])[:12])}")
    if c.get("ref"):
        extra.append(f"ref {md_code(c['ref'])}")
    run = c.get("workflow_run")
    if isinstance(run, str) and run.startswith(("https://", "http://")) and " " not in run:
        extra.append(f"[workflow run]({run.replace(')', '%29')})")
    if extra:
        lines += ["", " · ".join(extra)]
    if report.mode_reason:
        lines += ["", f"Timing: {md_text(report.mode_reason)}."]
    return "\n".join(lines)


def _failures(rows: list[GateRow]) -> str | None:
    items = []
    # targets that failed with the same error (a model torch cannot compile, at every
    # shape set and mode) are one item
    errors: dict[str, list[str]] = {}
    for row in rows:
        if row.verdict.verdict == "error":
            errors.setdefault(error_line(row.result.error), []).append(row.result.target)
    for row in rows:
        v = row.verdict
        if v.verdict not in EXPLAINED:
            continue
        if v.verdict == "error":
            line = error_line(row.result.error)
            targets = errors.pop(line, None)
            if targets is None:  # listed with the first target of its group
                continue
            names = ", ".join(f"**{md_text(t)}**" for t in targets)
            count = f" ({len(targets)} targets)" if len(targets) > 1 else ""
            items.append(f"- {_emoji(v.verdict)} {names}{count}: {md_text(line, MAX_REASON_CHARS)}")
            continue
        why = v.reasons or [v.verdict]
        items.append(
            f"- {_emoji(v.verdict)} **{md_text(row.result.target)}**: "
            + "; ".join(md_text(w, MAX_REASON_CHARS) for w in why)
        )
    return "\n".join(items) if items else None


def _calls(n: float | None) -> str:
    if n is None:
        return DASH
    return "never" if math.isinf(n) else f"{math.ceil(n):,}"


def _advice_note(f: Any) -> str:
    if not f.ok:
        return "❌ parity"
    if f.strategy == "aot" and f.verified is not True:
        return "package not verified" if f.verified is None else "❌ package rejected"
    return ""


def _advice_block(a: Advice) -> str:
    rows = [
        [
            md_code(f.label, table=True),
            units.seconds(f.cold_s),
            units.seconds(f.warm_s),
            units.seconds(f.p50),
            units.speedup(f.speedup),
            units.mib(f.peak),
            f"{_calls(f.break_even(f.cold_s))} / {_calls(f.break_even(f.warm_s))}",
            _advice_note(f),
        ]
        for f in a.modes
    ]
    rows += [
        [md_code(label, table=True), *[DASH] * 6, md_text(why, MAX_REASON_CHARS)]
        for label, why in a.unavailable
    ]
    table = _table(
        rows,
        [
            "mode+strategy" if a.strategies else "mode",
            "compile cold",
            "deploy first call",
            "p50",
            "speedup vs eager",
            "peak MiB",
            "break-even calls (cold / warm)",
            "note",
        ],
    )
    lines = [f"**{md_text(a.model)} / {md_text(a.shapes)}**", "", table, ""]
    if a.serving:
        lines.append(f"- serving: {md_code(a.serving)} — {md_text(a.serving_rule)}")
    if a.short_job:
        lines.append(f"- short jobs: {md_code(a.short_job)} — {md_text(a.short_job_rule)}")
    return "\n".join(lines)


def _mode_advice(report: GateReport) -> str | None:
    advice = advise([row.result for row in report.rows])
    if not advice:
        return None
    strategies = any(a.strategies for a in advice)
    return "\n\n".join(
        [
            "### Which mode and strategy?" if strategies else "### Which mode?",
            "<sub>Break-even: compile time ÷ time saved per "
            "call against eager. Cold: an empty cache; deploy first call: the first call "
            "in a new process after a warm start from the bundle (aot: the package "
            "loaded).</sub>",
            *[_advice_block(a) for a in advice],
        ]
    )


def _target_list(title: str, targets: list[str], note: str = "") -> str | None:
    if not targets:
        return None
    lines = [f"**{title} ({len(targets)})**" + (f" — {note}" if note else ""), ""]
    lines += [f"- {md_code(t)}" for t in targets[:MAX_LIST_ITEMS]]
    if len(targets) > MAX_LIST_ITEMS:
        lines.append(f"- … and {len(targets) - MAX_LIST_ITEMS} more")
    return "\n".join(lines)


def _hard_cap(text: str, limit: int) -> str:
    """Last resort when even the report without details is too big: cut at a line."""
    note = (
        "\n\n*Report truncated to stay under "
        f"{limit:,} characters; the JSON report has every target.*\n"
    )
    cut = text.rfind("\n", 0, max(0, limit - len(note)))
    return text[: max(cut, 0)] + note


def render_markdown(report: GateReport, *, title: str = "gatekeeper", details: bool = True) -> str:
    """The report as GitHub-flavoured markdown, under :data:`MAX_MARKDOWN_CHARS`."""
    rows = _sorted_rows(report)
    head = [_headline(report, title)]
    if rows:
        head.append(_table((_table_row(r) for r in rows), HEADERS))
        notes = []
        if any(r.verdict.latency and r.verdict.latency.normalised for r in rows):
            notes.append(
                "Δ compares compiled latency divided by a co-measured reference "
                "workload (which cancels machine drift), so it can differ from the "
                "ratio of the raw p50s. n.s. = not significant."
            )
        if any(r.verdict.latency and r.verdict.latency.paired for r in rows):
            notes.append(
                "paired: Δ is the base commit against this change, timed round by "
                "round in one process."
            )
        if any(_trend(r) for r in rows):
            notes.append(
                f"Trend: {md_code(report.base_ref)}'s last baselines (latency ÷ "
                f"reference workload, oldest first), then {ARROW} this run."
            )
        if notes:
            head.append("<sub>" + " ".join(notes) + "</sub>")
    else:
        head.append("*No targets were measured.*")
    failures = _failures(rows)
    if failures:
        failed = any(r.verdict.verdict in FAILING for r in rows)
        head += ["**Why it failed**" if failed else "**What needs a look**", failures]

    advice = _mode_advice(report)
    if advice:
        head.append(advice)
    tail = []
    added = [r.result.target for r in rows if r.baseline is None]
    for block in (
        _target_list(
            "Targets added since the baseline",
            added,
            "no baseline to compare with yet; merging publishes one",
        ),
        _target_list(
            "Targets removed since the baseline",
            list(report.removed),
            "in the baseline, not measured now",
        ),
        _target_list(
            "Borderline targets re-measured",
            list(report.remeasured),
            "their first measurement was too close to the threshold to trust",
        ),
    ):
        if block:
            tail.append(block)

    sections = [_details(r, report.profile_all) for r in rows] if details else []

    def assemble(kept: list[str], dropped: int) -> str:
        parts = list(head)
        if kept or dropped:
            parts.append("### Details")
            parts += kept
        if dropped:
            parts.append(
                f"*Details of {dropped} more target{'s' if dropped != 1 else ''} "
                f"left out to keep this report under {MAX_MARKDOWN_CHARS:,} "
                "characters; the JSON report and results.json have them.*"
            )
        parts += tail
        return "\n\n".join(parts) + "\n"

    kept = list(sections)
    text = assemble(kept, 0)
    # drop details from the end (the least severe targets) until the report fits
    while len(text) > MAX_MARKDOWN_CHARS and kept:
        total = len(text)
        # jump close to the target size, then fine-tune one by one
        excess = total - MAX_MARKDOWN_CHARS
        while kept and excess > 0:
            excess -= len(kept.pop()) + 2
        text = assemble(kept, len(sections) - len(kept))
    if len(text) > MAX_MARKDOWN_CHARS:
        text = _hard_cap(text, MAX_MARKDOWN_CHARS)
    return text
