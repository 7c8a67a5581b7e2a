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

import statistics
from collections.abc import Callable

from .. import metrics, units
from ..gate import GateReport, GateRow
from ..gate.drift import normalised_latency
from ..gate.governing import show
from ..gate.verdicts import EXPLAINED, FAILING
from ..results import TargetResult
from ..units import DASH
from .details import details_section, parity_failed
from .rows import (
    base_breaks,
    base_p50,
    base_result,
    breaks,
    counts,
    figures,
    from_baseline,
    is_new,
    p50,
    peak,
    recompiles,
    rule_changes,
    speedup,
    twin_note,
)
from .rows import summary_line as summary_line
from .text import (
    ARROW,
    EMOJI,
    MAX_LIST_ITEMS,
    MAX_REASON_CHARS,
    emoji,
    md_code,
    md_table,
    md_text,
    sides,
    sorted_rows,
    verdict_label,
)
from .text import error_line as error_line
from .trend import sparkline
from .which_mode import mode_advice

MAX_MARKDOWN_CHARS = 60_000
# the runner's owner let model code run where no box could be made (GATEKEEPER_UNCONFINED)
UNCONFINED = "⚠️ **unconfined**"
STORED = " †"  # a paired row's figure compared with the stored baseline


# ------------------------------------------------------------------------ the main table

# a metric's column (gatekeeper.metrics' ``column``) is drawn by its cell here, or, for
# a metric without one, as both sides in its format, shown when any row has the figure
CELLS: dict[str, Callable[[GateRow], str]] = {}


def _cell(metric: str) -> Callable[[Callable[[GateRow], str]], Callable[[GateRow], str]]:
    def add(draw: Callable[[GateRow], str]) -> Callable[[GateRow], str]:
        CELLS[metric] = draw
        return draw

    return add


def _columns(rows: list[GateRow]) -> list[metrics.Metric]:
    """The metrics with a column: those with a cell of their own always, any other when
    a row has its figure."""
    return [
        m
        for m in metrics.registry()
        if m.column and (m.name in CELLS or any(v is not None for r in rows for v in figures(r, m)))
    ]


@_cell("latency")
def _latency_cell(row: GateRow) -> str:
    cell = sides(units.seconds(base_p50(row)), units.seconds(p50(row.result)))
    comp = row.verdict.latency
    if comp:
        delta = units.change(comp.delta)
        if comp.verdict == "regressed":
            delta = f"**{delta}**"
        if comp.paired:  # the estimate the verdict read, its interval and its rounds
            interval = f"[{units.change(comp.ci_lo - 1)}, {units.change(comp.ci_hi - 1)}]"
            cell += f", {delta} {interval}, {comp.n_pr} rounds"
        else:
            sig = units.p_value(comp.p_value) if comp.significant else "n.s."
            cell += f", {delta} ({sig})"
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


def _stored(row: GateRow, cell: str) -> str:
    """A paired row's figure compared with the stored baseline, marked as such."""
    return cell + STORED if from_baseline(row) and cell != DASH else cell


@_cell("speedup")
def _speedup_cell(row: GateRow) -> str:
    cell = sides(units.speedup(speedup(base_result(row))), units.speedup(speedup(row.result)))
    comp = row.verdict.speedup
    if comp and comp.verdict in ("regressed", "improved"):
        cell += f" ({EMOJI['regressed' if comp.verdict == 'regressed' else 'improved']})"
    return _stored(row, cell)


@_cell("compile")
def _compile_cell(row: GateRow) -> str:
    base, pr = base_result(row), row.result
    bc, pc = (base.compile if base else None), pr.compile
    if pc is None and bc is None:
        return DASH
    if bc is not None and pc is not None and bc.state == pc.state:
        return _stored(row, f"{bc.seconds:.1f} {ARROW} {pc.seconds:.1f} s ({pc.state})")
    b = f"{bc.seconds:.1f} s ({bc.state})" if bc else DASH
    p = f"{pc.seconds:.1f} s ({pc.state})" if pc else DASH
    return _stored(row, f"{b} {ARROW} {p}")


@_cell("graph-breaks")
def _breaks_cell(row: GateRow) -> str:
    """Graph breaks of the side the verdict compared with; more breaks beside a verdict
    that does not fail say why."""
    b, p = base_breaks(row), breaks(row.result)
    cell = sides(None if b is None else str(b), None if p is None else str(p))
    v = row.verdict
    if v.new_breaks:
        cell += f" (+{len(v.new_breaks)} new)"
    if b is not None and p is not None and p > b and v.verdict not in FAILING:
        off = v.rules is not None and v.rules.graph_breaks == "ignore"
        cell += (
            " (accepted)"
            if v.verdict == "accepted"
            else ' (not gated: graph_breaks = "ignore")'
            if off
            else " (not gated)"
        )
    return cell


@_cell("recompiles")
def _recompiles_cell(row: GateRow) -> str:
    b, p = recompiles(base_result(row)), recompiles(row.result)
    return _stored(row, sides(None if b is None else str(b), None if p is None else str(p)))


@_cell("memory")
def _memory_cell(row: GateRow) -> str:
    return _stored(row, sides(units.mib(peak(base_result(row))), units.mib(peak(row.result))))


@_cell("parity")
def _parity_cell(row: GateRow) -> str:
    r = row.result
    if r.parity is None:
        return DASH
    failed = parity_failed(r)
    if failed:
        return "❌ FAILED (" + ", ".join(failed) + ")"
    vb = r.parity.vs_baseline
    return (
        f"eager {units.sci(r.parity.vs_eager.max_abs_err)} · "
        f"base {units.sci(vb.max_abs_err) if vb else DASH}"
    )


def _figure_cell(row: GateRow, m: metrics.Metric) -> str:
    """A metric without a cell of its own: both sides in its format, and the
    comparison that judged a timed one (its change, interval and rounds)."""
    b, p = figures(row, m)
    cell = sides(m.fmt(b), m.fmt(p))
    comp = row.verdict.timings.get(m.name)
    if comp is not None and b is not None:
        delta = units.change(comp.delta)
        interval = f"[{units.change(comp.ci_lo - 1)}, {units.change(comp.ci_hi - 1)}]"
        n = f"{comp.n_pr} rounds" if comp.paired else "stored"
        cell += f", {f'**{delta}**' if comp.verdict == 'regressed' else delta} {interval}, {n}"
    from_stored = row.result.paired is not None and m.beside is None
    return _stored(row, cell) if from_stored else cell


def _table_row(row: GateRow, columns: list[metrics.Metric]) -> list[str]:
    r = row.result
    return [
        md_text(r.target),
        verdict_label(row.verdict.verdict),
        *(CELLS[m.name](row) if m.name in CELLS else _figure_cell(row, m) for m in columns),
        r.compile.cache if r.compile else DASH,
    ]


# --------------------------------------------------------------------------- markdown


def _headline(report: GateReport, title: str) -> str:
    n = len(report.rows)
    tally = " · ".join(f"{emoji(v)} {c} {v}" for v, c in counts(report).items() if c)
    lines = [
        f"## {emoji(report.verdict)} {md_text(title)}: {report.verdict}",
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
    if report.unconfined:
        why = "; ".join(md_text(w) for w in report.unconfined)
        lines += ["", f"{UNCONFINED}: the model code ran without its box ({why})."]
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
            items.append(f"- {emoji(v.verdict)} {names}{count}: {md_text(line, MAX_REASON_CHARS)}")
            continue
        why = v.reasons or [v.verdict]
        items.append(
            f"- {emoji(v.verdict)} **{md_text(row.result.target)}**: "
            + "; ".join(md_text(w, MAX_REASON_CHARS) for w in why)
        )
    return "\n".join(items) if items else None


def _rule_changes(report: GateReport) -> str | None:
    """Each gate rule the change alters (old → new): the base's rules judged this run,
    so a change cannot loosen its own gate; its own apply once it is merged."""
    altered = rule_changes(report)
    if not altered:
        return None
    every = len(report.rows)
    lines = [
        "**Rules this change alters** — the base's rules judged this run; the new ones "
        "apply once it is merged",
        "",
    ]
    for change, targets in altered:
        which = (
            "every target"
            if len(targets) == every
            else ", ".join(md_code(t) for t in targets[:MAX_LIST_ITEMS])
        )
        lines.append(
            f"- {md_code(change.field)}: {md_text(show(change.base))} {ARROW} "
            f"{md_text(show(change.pr))} ({which})"
        )
    return "\n".join(lines)


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
    rows = sorted_rows(report)
    head = _head(report, rows, title)
    tail = _tail(report, rows)
    sections = [details_section(r, report.profile_all) for r in rows] if details else []

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


def _head(report: GateReport, rows: list[GateRow], title: str) -> list[str]:
    """The headline, the table and its notes, why it failed, the rules a change
    altered, and which mode to pick."""
    head = [_headline(report, title)]
    if rows:
        columns = _columns(rows)
        titles = ["target", "verdict", *(m.column or m.name for m in columns), "cache"]
        head.append(md_table((_table_row(r, columns) for r in rows), titles))
        if notes := _table_notes(report, rows):
            head.append("<sub>" + " ".join(notes) + "</sub>")
    else:
        head.append("*No targets were measured.*")
    failures = _failures(rows)
    if failures:
        failed = any(r.verdict.verdict in FAILING for r in rows)
        head += ["**Why it failed**" if failed else "**What needs a look**", failures]
    for block in (_rule_changes(report), mode_advice(report)):
        if block:
            head.append(block)
    return head


def _table_notes(report: GateReport, rows: list[GateRow]) -> list[str]:
    notes = []
    if any(r.verdict.latency and r.verdict.latency.normalised for r in rows):
        notes.append(
            "Δ compares compiled latency divided by a co-measured reference "
            "workload (which cancels machine drift), so it can differ from the "
            "ratio of the raw p50s. n.s. = not significant."
        )
    if any(r.verdict.latency and r.verdict.latency.paired for r in rows):
        notes.append(
            "paired: Δ is the base commit against this change, timed round by round in one "
            "process: the geometric mean of the rounds' ratios, with its 95% interval "
            "(it can differ from the ratio of the p50s)."
        )
    if any(from_baseline(r) for r in rows):
        notes.append(
            f"{STORED.strip()} against the stored baseline of "
            f"{md_code(report.base_ref)}: paired runs time, count graph breaks and "
            "work against the base commit, and compare the rest with its baseline."
        )
    if twins := twin_note(rows):
        notes.append(twins)
    if any(_trend(r) for r in rows):
        notes.append(
            f"Trend: {md_code(report.base_ref)}'s last baselines (latency ÷ "
            f"reference workload, oldest first), then {ARROW} this run."
        )
    return notes


def _tail(report: GateReport, rows: list[GateRow]) -> list[str]:
    """The lists of targets added, removed and re-measured."""
    added = [r.result.target for r in rows if is_new(r)]
    blocks = (
        _target_list(
            "Targets added since the baseline",
            added,
            "the base defines no such target: nothing to compare with yet; merging "
            "publishes a baseline",
        ),
        _target_list(
            "Targets removed since the baseline",
            list(report.removed),
            "in the base commit's config or the baseline, not measured now",
        ),
        _target_list(
            "Borderline targets re-measured",
            list(report.remeasured),
            "their first measurement was too close to the threshold to trust",
        ),
    )
    return [b for b in blocks if b]
