"""The generation rules (gatekeeper/gate/generation.py) on documents built by
tests/support/factories.py: TTFT, TPOT and decode tokens/s paired with the base
commit's generation round by round (as latency), or stored against the baseline's run;
recompiles during decode regress whatever the base; the report's row and reason."""

from __future__ import annotations

import re

import pytest
from support.factories import RULES, base_side, make_baseline, make_generation, make_result

from gatekeeper import report
from gatekeeper.gate import GateReport, rules
from gatekeeper.results import TargetResult

TARGET = "lm/fixed/default+generate"


def paired(head_tpot: float, head_ttft: float = 4e-3, **extra) -> TargetResult:
    """A generate target measured paired: the base's generation (tpot 12 ms) in the same
    rounds, the head's with the given figures; the e2e latency unchanged."""
    r = make_result(TARGET, seed=1, others_cores=None)
    assert r.latency is not None and r.graphs is not None
    base_gen = make_generation(seed=7)
    head_gen = make_generation(seed=8, tpot_s=head_tpot, ttft_s=head_ttft, **extra)
    r.generation = head_gen
    r.paired = base_side(r, generation=base_gen)
    return r


def test_a_slower_decode_is_regressed_naming_the_per_token_figure():
    v = rules.gate_target(paired(12e-3 * 1.13), None, RULES)
    assert v.verdict == "regressed", v.reasons
    decode = next(r for r in v.reasons if r.startswith("decode "))
    said = r"decode 1\d\.\d -> 1\d\.\d ms/token \(\+1\d% \[\+1\d, \+1\d\], n=40, threshold 5%\)"
    assert re.fullmatch(said, decode), decode
    rate = next(r for r in v.reasons if r.startswith("decode tokens/s "))
    assert re.fullmatch(r"decode tokens/s \d\d\.\d -> \d\d\.\d tokens/s \(-1\d% .*", rate), rate
    assert not any(r.startswith("time to first token") for r in v.reasons)
    assert v.timings["tpot"].verdict == "regressed"
    assert v.timings["tokens-per-s"].ratio < 1  # in tokens/s' own direction


def test_an_unchanged_generation_passes_and_a_slower_prefill_names_ttft():
    same = rules.gate_target(paired(12e-3), None, RULES)
    assert same.verdict == "pass", same.reasons
    assert {"ttft", "tpot", "tokens-per-s"} <= same.timings.keys()
    slow = rules.gate_target(paired(12e-3, head_ttft=4e-3 * 1.3), None, RULES)
    assert slow.verdict == "regressed"
    assert [r for r in slow.reasons if r.startswith("time to first token ")], slow.reasons


def test_a_threshold_of_its_own_governs_each_figure():
    loose = RULES.model_copy(update={"tpot_regression": 0.45, "tokens_per_s_regression": 0.45})
    assert rules.gate_target(paired(12e-3 * 1.13), None, loose).verdict == "pass"


def test_recompiles_during_decode_regress_whatever_the_base_and_name_the_guard():
    guard = "L['self'].model.norm.calls == 3"
    r = paired(12e-3, decode_recompiles=7, guards=[guard])
    v = rules.gate_target(r, None, RULES)
    assert v.verdict == "regressed"
    assert f"recompiles during decode: 7 after the first decode step: guard failed: {guard}" in (
        v.reasons
    )
    alone = make_result(TARGET, seed=2)
    alone.generation = make_generation(decode_recompiles=2)
    assert rules.gate_target(alone, None, RULES).verdict == "regressed"  # no baseline at all
    off = RULES.model_copy(update={"recompiles": "ignore"})
    noted = rules.gate_target(r, None, off)
    assert noted.verdict == "pass" and any("recompiles during decode" in n for n in noted.notes)
    accepted = rules.gate_target(r, None, RULES, accept=True)
    assert accepted.verdict == "accepted"


@pytest.mark.parametrize(("slower", "verdict"), [(1.0, "pass"), (1.6, "regressed")])
def test_stored_mode_compares_the_runs_medians_at_the_assumed_drift(slower, verdict):
    base = make_result(TARGET, seed=1)
    base.generation = make_generation(seed=3)
    pr = make_result(TARGET, seed=1)
    pr.generation = make_generation(seed=4, tpot_s=12e-3 * slower)
    v = rules.gate_target(pr, make_baseline(base), RULES)
    assert v.verdict == verdict, v.reasons
    if slower > 1:
        said = next(r for r in v.reasons if r.startswith("decode "))
        assert "1 vs 1 run(s)" in said, said


def test_the_report_shows_each_figure_with_its_comparison():
    row = rules.gate_row(paired(12e-3 * 1.13), None, RULES)
    rep = GateReport("regressed", 1, "main", [row])
    md = report.render_markdown(rep)
    header = next(ln for ln in md.splitlines() if ln.startswith("| target "))
    line = next(ln for ln in md.splitlines() if ln.startswith(f"| {TARGET} "))
    cells = dict(
        zip(
            [c.strip() for c in header.strip("|").split("|")],
            [c.strip() for c in line.strip("|").split("|")],
            strict=True,
        )
    )
    assert re.fullmatch(
        r"1\d\.\d ms/token → 1\d\.\d ms/token, \*\*\+1\d\.\d%\*\* .*", cells["decode"]
    )
    assert "40 rounds" in cells["decode"] and re.match(
        r"\d\.\d\d ms → \d\.\d\d ms, ", cells["TTFT"]
    )
    assert re.fullmatch(
        r"\d\d\.\d tokens/s → \d\d\.\d tokens/s, \*\*-1\d\.\d%\*\* .*", cells["tokens/s"]
    )
    doc = report.report_json(rep)["targets"][0]
    assert doc["tpot_s"]["base"] == pytest.approx(12e-3, rel=0.05)
    assert doc["timings"]["tpot"]["verdict"] == "regressed"
    other = make_result("mlp/b8/default", seed=1)
    plain = report.render_markdown(
        GateReport("pass", 0, "main", [rules.gate_row(other, None, RULES)])
    )
    assert "ms/token" not in plain and "TTFT" not in plain  # no column without the figure


def test_a_remeasured_generation_pools_its_rounds():
    from gatekeeper.generation import merged

    a, b = make_generation(seed=1, n=10), make_generation(seed=2, n=30, tpot_s=24e-3)
    both = merged(a, b)
    assert len(both.samples["per_token"]) == 40 and len(both.samples["first_token"]) == 40
    assert both.compiled is not None and both.compiled.tpot_s > 20e-3  # most rounds: b's
    assert both.compiled.tokens_per_s == pytest.approx(1 / both.compiled.tpot_s)
