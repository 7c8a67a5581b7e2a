"""Tests of gatekeeper.report: markdown, JSON and the log line, on hand-built results.

Results and baselines are made by :func:`make_result` with synthetic log-normal latency
samples; the verdicts come from the real gate (gate.build_report), so the report is
tested on what the gate really produces.
"""

from __future__ import annotations

import json
import re

import pytest
from support.factories import ENV, RULES, make_baseline, make_result

from gatekeeper import report, units
from gatekeeper.gate import rules as gate
from gatekeeper.report import markdown
from gatekeeper.results import (
    GraphBreak,
    ParityCheck,
)

NASTY = (
    "Data-dependent branching `if x.sum() > 0:` | col\nsecond line *bold* _u_ "
    "<script>alert(1)</script> @torch.no_grad [link](http://x) # h"
)


def build(results, baselines, **kw) -> gate.GateReport:
    return gate.build_report(
        results,
        baselines,
        lambda t: RULES,
        base_ref="main",
        creator={"commit": "feedfacecafe0123", "ref": "pr-7"},
        **kw,
    )


@pytest.fixture(scope="module")
def rep() -> gate.GateReport:
    results, baselines = [], {}

    base = make_result("resnet-tiny/b1/default", seed=1)
    results.append(make_result("resnet-tiny/b1/default", seed=2))
    baselines[base.target] = make_baseline(base)

    old_break = GraphBreak(reason="call to print", file="mymodel/net.py", line=10)
    base = make_result("gpt2-tiny/b8/max-autotune", seed=3, breaks=[old_break])
    new_break = GraphBreak(reason=NASTY, file="mymodel/attn.py", line=42)
    results.append(
        make_result(
            "gpt2-tiny/b8/max-autotune",
            seed=4,
            compiled_s=1.25e-3,
            breaks=[old_break, new_break],
            recompiles=1,
            code_hash="c0de5678",
        )
    )
    baselines[base.target] = make_baseline(base, history=5)

    results.append(make_result("brand-new/b1/default", seed=5, baseline_parity=False))
    base = make_result("broken/b1/default", seed=8)
    results.append(
        make_result(
            "broken/b1/default",
            error=(
                'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
                "RuntimeError: CUDA out of memory | tried to allocate 2 GiB"
            ),
        )
    )
    baselines[base.target] = make_baseline(base)
    base = make_result("parity/b1/default", seed=6)
    results.append(make_result("parity/b1/default", seed=7, parity_ok=False))
    baselines[base.target] = make_baseline(base)
    base = make_result("fast/b1/default", seed=9, compile_s=14.0)
    results.append(
        make_result(
            "fast/b1/default",
            seed=10,
            compiled_s=0.7e-3,
            compile_s=2.5,
            warm=True,
            cache="hit",
            peak=38 << 20,
        )
    )
    baselines[base.target] = make_baseline(base, history=5)
    return build(results, baselines, removed=["gone/b1/default"])


def _row(md: str, target: str) -> str:
    target_md = markdown.md_text(target)
    lines = [ln for ln in md.splitlines() if ln.startswith(f"| {target_md} ")]
    assert len(lines) == 1, (target, lines)
    return lines[0]


def _section(md: str, target: str) -> str:
    start = md.index(f"<details><summary>{target} ")
    return md[start : md.index("</details>", start)]


def _unescaped_pipes(line: str) -> int:
    # a pipe preceded by an odd number of backslashes is escaped (GFM)
    return sum(1 for m in re.finditer(r"(\\*)\|", line) if len(m.group(1)) % 2 == 0)


def _tables(md: str) -> list[list[str]]:
    tables, cur = [], []
    for ln in md.splitlines():
        if ln.startswith("|"):
            cur.append(ln)
        elif cur:
            tables.append(cur)
            cur = []
    if cur:
        tables.append(cur)
    return tables


# ---------------------------------------------------------------------------- verdicts


def test_verdicts_are_what_the_report_is_about(rep):
    got = {r.result.target: r.verdict.verdict for r in rep.rows}
    assert got == {
        "resnet-tiny/b1/default": "pass",
        "gpt2-tiny/b8/max-autotune": "regressed",
        "brand-new/b1/default": "no-baseline",
        "broken/b1/default": "error",
        "parity/b1/default": "parity-failed",
        "fast/b1/default": "improved",
    }
    assert rep.verdict == "error"


# ---------------------------------------------------------------------------- markdown


def test_headline_and_one_row_per_target(rep):
    md = report.render_markdown(rep)
    first = md.splitlines()[0]
    assert first == "## ⚠️ gatekeeper: error"
    assert "**6 targets** gated against the baseline of `main`" in md
    assert (
        "⚠️ 1 error · ❌ 1 parity-failed · ❌ 1 regressed · 🚀 1 improved · ✅ 1 pass · "
        "⚪ 1 no-baseline"
    ) in md
    main = _tables(md)[0]
    assert main[0].startswith("| target ")
    assert len(main) == 2 + len(rep.rows)
    for row in rep.rows:
        _row(md, row.result.target)
    # worst first
    assert main[2].startswith("| broken/b1/default ")
    assert "commit `feedfacecafe`" in md
    assert report.render_markdown(rep, title="perf gate").startswith("## ⚠️ perf gate: error")


def test_regressed_row_and_details(rep):
    md = report.render_markdown(rep)
    row = _row(md, "gpt2-tiny/b8/max-autotune")
    assert "❌ regressed" in row
    delta = next(
        r.verdict.latency.delta for r in rep.rows if r.result.target == "gpt2-tiny/b8/max-autotune"
    )
    assert re.search(re.escape(f"**{delta:+.1%}** (p") + r"(<0\.001|=0\.0\d+)\)", row)
    assert re.search(r"(\d+ µs|1\.\d\d ms) → 1\.\d\d ms", row)
    assert "1 → 2 (+1 new)" in row
    assert "0 → 1" in row  # recompiles
    assert "6.0 → 6.0 s (cold)" in row
    assert re.search(r"\d\.\d\dx → \d\.\d\dx", row)
    sec = _section(md, "gpt2-tiny/b8/max-autotune")
    assert "**New graph breaks (1)**" in sec
    assert "- `mymodel/attn.py:42` — Data-dependent" in sec
    assert "`mymodel/net.py:10`" in sec  # the old break, in the list of all breaks
    assert "graph breaks 1 -&gt; 2: Data-dependent" in sec  # the gate's reason, escaped
    for part in (
        "p50",
        "p95",
        "p99",
        "mean",
        "compiled (baseline)",
        "eager (PR)",
        "compiled latency ÷ reference workload",
        "t-test on run medians, runs=6/1",
        "±5%",
        "FX graph hit / miss",
        "peak RSS growth",
        "compiled vs eager",
        f"env key: `{ENV}`",
        "code hash: `c0de5678` (baseline: `c0de1234`)",
    ):
        assert part in sec, part


def test_pass_row(rep):
    md = report.render_markdown(rep)
    row = _row(md, "resnet-tiny/b1/default")
    assert "✅ pass" in row
    assert "(n.s.)" in row or "(p=" in row
    assert "eager 2.4e-07 · base 1.2e-07" in row
    assert "| miss " in row
    sec = _section(md, "resnet-tiny/b1/default")
    assert "(unchanged)" in sec


def test_improved_row_with_warm_compile(rep):
    row = _row(report.render_markdown(rep), "fast/b1/default")
    assert "🚀 improved" in row
    assert re.search(r", -\d\d\.\d% \(p(<0\.001|=0\.0\d+)\)", row)
    assert "14.0 s (cold) → 2.5 s (warm)" in row
    assert "40.0 → 38.0" in row
    assert "| hit " in row


def test_added_removed_and_missing_baseline_values(rep):
    md = report.render_markdown(rep)
    added = md.index("**Targets added since the baseline (1)**")
    assert "- `brand-new/b1/default`" in md[added:]
    removed = md.index("**Targets removed since the baseline (1)**")
    assert "- `gone/b1/default`" in md[removed:]
    row = _row(md, "brand-new/b1/default")
    assert "⚪ no-baseline" in row
    assert re.search(r"\| – → (\d+ µs|1\.\d\d ms) +\|", row)
    assert "– → 0" in row  # graph breaks
    assert "base –" in row  # no parity vs baseline


def test_remeasured_listed(rep):
    rep2 = gate.GateReport(
        rep.verdict,
        rep.exit_code,
        rep.base_ref,
        rep.rows,
        rep.removed,
        remeasured=["resnet-tiny/b1/default"],
    )
    md = report.render_markdown(rep2)
    assert "**Borderline targets re-measured (1)**" in md
    assert report.report_json(rep2)["targets"][0]["remeasured"] in (True, False)
    assert [t["target"] for t in report.report_json(rep2)["targets"] if t["remeasured"]] == [
        "resnet-tiny/b1/default"
    ]


def test_error_and_parity_rows(rep):
    md = report.render_markdown(rep)
    row = _row(md, "broken/b1/default")
    assert "⚠️ error" in row
    err = "RuntimeError: CUDA out of memory \\| tried to allocate 2 GiB"
    assert f"- ⚠️ **broken/b1/default**: {err}" in md  # the failures list under the table
    sec = _section(md, "broken/b1/default")
    assert f"**Error:** {err}" in sec
    assert "```text\nTraceback" in sec
    assert "**Reasons**" not in sec  # the error is not repeated as a reason
    prow = _row(md, "parity/b1/default")
    assert "❌ FAILED (vs eager)" in prow
    assert "| max abs err 0.31 &gt; atol 1e-4 |" in _section(md, "parity/b1/default")


def test_nasty_break_reason_does_not_break_tables(rep):
    md = report.render_markdown(rep)
    tables = _tables(md)
    assert len(tables) > 10
    for t in tables:
        n = {_unescaped_pipes(ln) for ln in t}
        assert len(n) == 1, t
    assert "<script>" not in md
    assert "@torch" not in md  # nobody gets mentioned
    assert "\\`if x.sum() &gt; 0:\\` \\| col<br>second line \\*bold\\* \\_u\\_" in md
    # no raw line of the reason escaped its cell or list item
    assert not any(ln.startswith("second line") for ln in md.splitlines())


def test_markdown_escaping_helpers():
    assert markdown.md_text("a|b\nc") == "a\\|b<br>c"
    assert markdown.md_text("x" * 20, limit=5) == "xxxx…"
    assert markdown.md_code("a`b") == "``a`b``"
    assert markdown.md_code("a|b", table=True) == "`a\\|b`"
    assert units.seconds(812e-6) == "812 µs"
    assert units.seconds(1.234e-3) == "1.23 ms"
    assert units.seconds(0.9996) == "1.00 s"
    assert units.seconds(12.5) == "12.5 s"
    assert units.seconds(None) == "–"
    assert (
        markdown.error_line("Traceback (most recent call last):\n  x\nValueError: y")
        == "ValueError: y"
    )
    assert markdown.error_line("boom\nmore") == "boom"


def test_without_details(rep):
    md = report.render_markdown(rep, details=False)
    assert "<details>" not in md
    assert "Targets removed since the baseline" in md


def test_size_cap_drops_details_from_the_end():
    long_breaks = [
        GraphBreak(reason=f"break {i}: " + "`x|y`\n" * 80, file="m.py", line=i) for i in range(60)
    ]
    one = make_result("big/b1/default", breaks=long_breaks)
    results = [one.model_copy(update={"target": f"big{i:02d}/b1/default"}) for i in range(12)]
    rep = build(results, {})
    md = report.render_markdown(rep)
    assert len(md) <= markdown.MAX_MARKDOWN_CHARS
    kept = md.count("<details>")
    assert 0 < kept < 12
    assert md.count("<details>") == md.count("</details>")
    assert f"*Details of {12 - kept} more targets left out" in md
    assert "<details><summary>big00/b1/default " in md  # the first ones stay
    assert "Targets added since the baseline (12)" in md  # the tail survives
    for t in _tables(md):
        assert len({_unescaped_pipes(ln) for ln in t}) == 1


def test_size_cap_last_resort():
    one = make_result("model/b1/default")
    results = [one.model_copy(update={"target": f"model-{i:04d}/b1/default"}) for i in range(400)]
    md = report.render_markdown(build(results, {}), details=False)
    assert len(md) <= markdown.MAX_MARKDOWN_CHARS
    assert "Report truncated" in md


# -------------------------------------------------------------------------------- JSON

TOP_KEYS = {
    "schema",
    "verdict",
    "exit_code",
    "base_ref",
    "summary",
    "counts",
    "creator",
    "targets",
    "removed",
    "remeasured",
    "mode_reason",
    "mode_advice",
    "rule_changes",
}
TARGET_KEYS = {
    "target",
    # a generate target's figures (every target has the keys: null for the others)
    "ttft_s",
    "tpot_s",
    "tokens_per_s",
    "decode_recompiles",
    "timings",
    "rules",
    "rules_from",
    "rule_changes",
    "definition_changes",
    "new",
    "export",
    "aot",
    "precompile",
    "packages",
    "model",
    "device",
    "verdict",
    "status",
    "error",
    "reasons",
    "notes",
    "borderline",
    "remeasured",
    "latency",
    "speedup_comparison",
    "p50_s",
    "latency_summary",
    "speedup",
    "compile",
    "compile_s",
    "graphs",
    "graph_breaks",
    "break_reasons",
    "new_breaks",
    "recompiles",
    "memory",
    "parity",
    "quantization",
    "ranks",
    "cache",
    "env_key",
    "code_hash",
    "base_code_hash",
    "baseline",
    "compile_state",
    "work",
    "base_commit_work",
    "mode",
    "disturbed",
    "detectable",
    "profile",
    "profile_diff",
}
COMPARISON_KEYS = {
    "ratio",
    "delta",
    "ci_lo",
    "ci_hi",
    "p_value",
    "significant",
    "verdict",
    "threshold",
    "n_base",
    "n_pr",
    "paired",
    "test",
    "unit",
}


def test_json_schema_is_stable(rep):
    doc = report.report_json(rep)
    assert set(doc) == TOP_KEYS
    assert doc["schema"] == "gatekeeper.report/1"
    assert set(doc["counts"]) == set(gate.ORDER)
    for t in doc["targets"]:
        assert set(t) == TARGET_KEYS, t["target"]
        for side in (
            "p50_s",
            "latency_summary",
            "speedup",
            "compile",
            "compile_s",
            "graphs",
            "graph_breaks",
            "recompiles",
            "memory",
            "compile_state",
            "work",
            "profile",
        ):
            assert set(t[side]) == {"base", "pr"}
    reg = next(t for t in doc["targets"] if t["verdict"] == "regressed")
    assert set(reg["latency"]) == COMPARISON_KEYS | {"normalised"}
    assert set(reg["speedup_comparison"]) == COMPARISON_KEYS


def test_json_content_and_no_samples(rep):
    doc = report.report_json(rep)
    text = json.dumps(doc, allow_nan=False)
    assert json.loads(text) == doc
    assert "samples" not in text
    assert doc["verdict"] == "error" and doc["exit_code"] == 2
    assert doc["removed"] == ["gone/b1/default"]
    assert doc["counts"]["regressed"] == 1 and doc["counts"]["improved"] == 1
    reg = next(t for t in doc["targets"] if t["verdict"] == "regressed")
    assert reg["latency"]["delta"] > 0.15 and reg["latency"]["normalised"] is True
    assert reg["new_breaks"] == [{"reason": NASTY, "file": "mymodel/attn.py", "line": 42}]
    assert reg["graph_breaks"] == {"base": 1, "pr": 2}
    assert reg["recompiles"] == {"base": 0, "pr": 1}
    assert reg["code_hash"] == "c0de5678" and reg["base_code_hash"] == "c0de1234"
    assert reg["cache"] == "miss" and reg["env_key"] == ENV
    assert reg["latency_summary"]["pr"]["compiled"]["n"] == 40
    new = next(t for t in doc["targets"] if t["verdict"] == "no-baseline")
    assert new["p50_s"]["base"] is None and new["p50_s"]["pr"] > 0
    assert new["latency"] is None and new["baseline"] is None
    err = next(t for t in doc["targets"] if t["verdict"] == "error")
    assert "CUDA out of memory" in err["error"] and err["p50_s"]["pr"] is None


def test_json_replaces_non_finite_numbers():
    r = make_result("nan/b1/default")
    r.parity.vs_eager = ParityCheck(
        passed=False, method="nan-inf", max_abs_err=float("nan"), detail="NaN in output 0"
    )
    doc = report.report_json(build([r], {}))
    json.dumps(doc, allow_nan=False)
    assert doc["targets"][0]["parity"]["vs_eager"]["max_abs_err"] is None
    assert doc["targets"][0]["verdict"] == "parity-failed"


# ---------------------------------------------------------------------------- log line


def test_summary_line(rep):
    assert report.summary_line(rep) == (
        "gatekeeper: error — 1 error, 1 parity-failed, "
        "1 regressed, 1 improved, 1 pass, 1 no-baseline; "
        "1 removed "
        "(base: main)"
    )
    two = build([make_result("a/b1/default", seed=1)], {})
    assert report.summary_line(two) == "gatekeeper: no-baseline — 1 no-baseline (base: main)"
    empty = build([], {})
    assert report.summary_line(empty) == "gatekeeper: pass — no targets (base: main)"
    assert "No targets were measured" in report.render_markdown(empty)


def test_each_row_carries_the_base_branchs_trend_with_this_run_marked():
    target = "trend/b1/default"
    history = [
        make_result(target, seed=s, compiled_s=1e-3 * f)
        for s, f in enumerate([1.0, 1.02, 0.99, 1.01])
    ]
    pr = make_result(target, seed=9, compiled_s=1.3e-3)
    rep = build([pr], {target: make_baseline(history[-1])})
    rep.rows[0].history = history
    md = report.render_markdown(rep, details=False)
    row = next(line for line in md.splitlines() if line.startswith("| trend/b1/default"))
    assert re.search(r"`[▁▂▃▄▅▆▇█]{4}→█`", row), row  # the slower PR at the top of the scale
    assert "Trend: `main`'s last baselines" in md
    rep.rows[0].history = history[:1]  # one point is no trend
    assert not re.search(
        r"`[▁▂▃▄▅▆▇█]+→",
        next(
            line
            for line in report.render_markdown(rep, details=False).splitlines()
            if line.startswith("| trend/b1/default")
        ),
    )
