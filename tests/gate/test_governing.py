"""The base's rules judge a change (gate.governing): paired, the base commit's config's
rules recorded with each result; stored, the rules stored with the baseline; the
change's own only for a target new in it or a baseline without rules. And what the
report shows is what the verdict used: paired columns are the base commit's, a graph
break more never sits beside a pass without saying why. Hand-built results; the real
compiles are in tests/e2e/test_base_as_it_was.py."""

from __future__ import annotations

import json

from support.factories import base_side, make_baseline, make_result

from gatekeeper import report
from gatekeeper.config import GateConfig, ModelConfig
from gatekeeper.gate import governing
from gatekeeper.gate import rules as gate
from gatekeeper.project import definition
from gatekeeper.results import BaseTarget, GraphBreak, Graphs, Work
from gatekeeper.targets import Target

TARGET = "m/b1/default"
WORK = Work(flops=1_000_000, bytes_accessed=200_000, kernels=3, instructions="unavailable")
BASE_RULES = GateConfig()
LOOSE = GateConfig(
    latency_regression=0.9, speedup_regression=0.9, work_regression=10.0, graph_breaks="ignore"
)
BREAK = GraphBreak(reason="data-dependent branch", file="models.py", line=7)


def defined(rules: GateConfig = BASE_RULES, definition: dict | None = None) -> BaseTarget:
    return BaseTarget(defined=True, rules=rules, definition=definition)


def paired(result, *, breaks: int = 0, work: Work | None = WORK, scale: float = 1.0) -> None:
    """Pair ``result`` with a base commit measured beside it (its compiled latency
    divided by ``scale``)."""
    result.paired = base_side(
        result,
        [x / scale for x in result.latency.samples["compiled"]],
        graphs=Graphs(count=breaks + 1, breaks=breaks),
        work=work,
    )


def heavier(seed: int = 2, **kw):
    """A change with 25% more FLOPs, under the loosened rules of its own config."""
    r = make_result(TARGET, seed=seed, work=WORK.model_copy(update={"flops": 1_250_000}), **kw)
    r.rules = LOOSE
    return r


def build(results, baselines=None, own: GateConfig = LOOSE):
    return gate.build_report(results, baselines or {}, lambda t: own, base_ref="main")


def test_paired_the_base_commits_rules_judge_a_change_that_loosens_its_own():
    pr = heavier()
    paired(pr)
    pr.base_target = defined()
    (row,) = build([pr]).rows
    assert row.verdict.verdict == "regressed", row.verdict.reasons
    assert any("FLOPs" in r and "threshold 5%" in r for r in row.verdict.reasons)
    assert row.verdict.rules_from == "base commit" and row.verdict.rules == BASE_RULES
    assert [str(c) for c in row.verdict.rule_changes] == [
        "latency_regression 0.05 → 0.9",
        "speedup_regression 0.05 → 0.9",
        "work_regression 0.05 → 10",
        "graph_breaks no-increase → ignore",
    ]
    (note,) = [n for n in row.verdict.notes if "rules" in n]
    assert note.startswith("gated by the base commit's rules") and "work_regression" in note
    # the same result judged by its own rules passes: what the base's rules are for
    assert gate.gate_target(pr, None, LOOSE).verdict == "pass"


def test_stored_the_rules_stored_with_the_baseline_judge_it():
    base = make_result(TARGET, seed=1, work=WORK)
    base.rules = BASE_RULES
    pr = heavier()
    (row,) = build([pr], {TARGET: make_baseline(base)}).rows
    assert row.verdict.verdict == "regressed" and row.verdict.rules_from == "baseline"
    assert {c.field for c in row.verdict.rule_changes} >= {"work_regression", "graph_breaks"}


def test_a_baseline_without_rules_stays_readable_and_the_report_says_whose_rules_judge():
    """Baselines published before rules were stored with them: the change's own rules,
    and a note that says so."""
    old = make_baseline(make_result(TARGET, seed=1, work=WORK))
    doc = json.loads(old.dump())
    doc["result"].pop("rules", None)
    old = type(old).model_validate(doc)
    assert old.result.rules is None
    (row,) = build([heavier()], {TARGET: old}).rows
    assert row.verdict.verdict == "pass" and row.verdict.rules_from == "this change"
    assert any("records no gate rules" in n for n in row.verdict.notes), row.verdict.notes
    assert row.verdict.rule_changes == []


def test_the_base_inconclusive_policy_decides_the_exit_code():
    """A disturbed run 50% slower is inconclusive; the base's ``inconclusive = "fail"``
    fails it although the change says ``"pass"`` (and the other way round)."""
    codes = {}
    for base_policy in ("fail", "pass"):
        pr = make_result(TARGET, seed=2, n=60, noise=0.01, others_cores=0.6, own_cores=1.9)
        paired(pr, scale=1.5)
        pr.base_target = defined(GateConfig(inconclusive=base_policy))
        own = GateConfig(inconclusive="pass" if base_policy == "fail" else "fail")
        rep = build([pr], own=own)
        assert rep.rows[0].verdict.verdict == "inconclusive", rep.rows[0].verdict.reasons
        codes[base_policy] = rep.exit_code
    assert codes == {"fail": 1, "pass": 0}


def test_a_target_new_in_the_change_has_no_baseline_whatever_the_store_holds():
    stale = make_baseline(make_result(TARGET, seed=1, work=WORK))
    pr = heavier()
    pr.base_target = BaseTarget(defined=False)
    (row,) = build([pr], {TARGET: stale}).rows
    assert row.verdict.verdict == "no-baseline" and row.baseline is None
    assert any("new in this change" in n for n in row.verdict.notes)
    md = report.render_markdown(build([pr], {TARGET: stale}))
    assert "**Targets added since the baseline (1)**" in md


def test_a_redefined_target_says_what_changed_on_one_line():
    model = ModelConfig(name="m", factory="models:make", inputs=[{"shape": [1, 4]}])
    old = definition(Target(model, (), "default", False))
    new_model = model.model_copy(
        update={"factory": "models:make_fast", "options": {"max_fusion_size": 1}}
    )
    new = definition(Target(new_model, (), "default", False))
    pr = make_result(TARGET, seed=2, work=WORK)
    pr.definition = new
    paired(pr)
    pr.base_target = defined(definition=old)
    (row,) = build([pr], own=BASE_RULES).rows
    assert [str(c) for c in row.verdict.definition_changes] == [
        "factory models:make → models:make_fast",
        "options.max_fusion_size unset → 1",
    ]
    (note,) = [n for n in row.verdict.notes if n.startswith("this change redefines")]
    assert "\n" not in note and "factory models:make → models:make_fast" in note


def test_definition_leaves_out_other_targets_axes_and_rules():
    model = ModelConfig(
        name="m",
        factory="models:make",
        inputs=[{"shape": ["batch", 4]}],
        shapes=[{"batch": 1}, {"batch": 8}],
        strategies=["whole", "regional"],
        regions=["layers.*"],
        gate={"work_regression": 1.0},
    )
    whole = definition(Target(model, (("batch", 1),), "default", False))
    assert not {"name", "gate", "shapes", "strategies", "regions"} & set(whole)
    assert whole["shape_set"] == {"batch": 1} and whole["factory"] == "models:make"
    regional = Target(model, (("batch", 1),), "default", False, strategy="regional")
    assert definition(regional)["regions"] == ["layers.*"]


def test_paired_columns_are_the_base_commits_and_stored_ones_are_labelled():
    """The p50 and graph-break columns show what the paired verdict compared (the base
    commit); the stored baseline's figures that a paired row still shows carry †."""
    base = make_result(TARGET, seed=1, compiled_s=5e-3, work=WORK)  # an old, slow baseline
    pr = make_result(TARGET, seed=2, work=WORK, breaks=[BREAK])
    paired(pr, breaks=0)
    pr.base_target = defined()
    rep = build([pr], {TARGET: make_baseline(base)}, own=BASE_RULES)
    md = report.render_markdown(rep)
    (row_line,) = [ln for ln in md.splitlines() if ln.startswith("| m/b1/default ")]
    assert "5.00 ms" not in row_line  # not the stored baseline's p50
    assert "0 → 1 (+1 new)" in row_line and "❌ regressed" in row_line
    assert "†" in row_line and "against the stored baseline" in md
    doc = report.report_json(rep)
    (t,) = doc["targets"]
    assert t["graph_breaks"] == {"base": 0, "pr": 1}
    assert abs(t["p50_s"]["base"] - 1e-3) < 2e-4, t["p50_s"]
    section = md[md.index("<details><summary>m/b1/default") :]
    assert "compiled (base commit)" in section and "baseline (stored)" in section


def test_a_new_graph_break_never_sits_beside_a_pass_without_saying_why():
    pr = make_result(TARGET, seed=2, work=WORK, breaks=[BREAK])
    paired(pr, breaks=0)
    pr.base_target = defined(GateConfig(graph_breaks="ignore"))
    rep = build([pr], own=GateConfig(graph_breaks="ignore"))
    (row,) = rep.rows
    assert row.verdict.verdict == "pass"
    line = next(ln for ln in report.render_markdown(rep).splitlines() if "| m/b1/default " in ln)
    assert '0 → 1 (+1 new) (not gated: graph_breaks = "ignore")' in line, line
    accepted = gate.build_report(
        [pr.model_copy(update={"base_target": defined()})],
        {},
        lambda t: BASE_RULES,
        base_ref="main",
        accepted=lambda t: True,
    )
    assert accepted.rows[0].verdict.verdict == "accepted"
    line = next(
        ln for ln in report.render_markdown(accepted).splitlines() if "| m/b1/default " in ln
    )
    assert "0 → 1 (+1 new) (accepted)" in line, line


def test_the_report_lists_each_rule_the_change_alters_once():
    rows = []
    for i, name in enumerate(("a/b1/default", "b/b1/default")):
        r = heavier(seed=10 + i)
        r.target = name
        paired(r)
        r.base_target = defined()
        rows.append(r)
    rep = build(rows)
    md = report.render_markdown(rep)
    head = md[: md.index("### Details")] if "### Details" in md else md
    assert head.count("**Rules this change alters**") == 1
    for line in (
        "- `latency_regression`: 0.05 → 0.9 (every target)",
        "- `work_regression`: 0.05 → 10 (every target)",
        "- `graph_breaks`: no-increase → ignore (every target)",
    ):
        assert line in head, head
    doc = report.report_json(rep)
    assert {c["field"] for c in doc["rule_changes"]} == {
        "latency_regression",
        "speedup_regression",
        "work_regression",
        "graph_breaks",
    }
    assert all(c["targets"] == ["a/b1/default", "b/b1/default"] for c in doc["rule_changes"])


def test_show_keeps_values_short_and_readable():
    assert governing.show(None) == "unset" and governing.show(0.05) == "0.05"
    assert governing.show({"a": 1}) == '{"a": 1}' and governing.show(True) == "true"
    assert len(governing.show("x" * 500)) == governing.MAX_VALUE_CHARS
