"""Mode advice: several modes of one model and shape set compared side by side, with
break-even call counts and a recommendation for serving and for short jobs."""

from __future__ import annotations

import math

from support.factories import RULES, make_result

from gatekeeper import report
from gatekeeper.gate import rules as gate
from gatekeeper.report.advice import SHORT_JOB_CALLS, advise


def mode_result(
    mode: str, *, compiled_s: float, cold_s: float, warm_s: float, parity_ok: bool = True
):
    r = make_result(
        f"gpt/b4/{mode}",
        seed=len(mode),
        compiled_s=compiled_s,
        eager_s=2e-3,
        compile_s=warm_s,
        warm=True,
        cache="hit",
        cold_s=cold_s,
        parity_ok=parity_ok,
    )
    return r


def test_break_even_and_recommendations():
    default = mode_result("default", compiled_s=1.0e-3, cold_s=10.0, warm_s=2.0)
    autotune = mode_result("max-autotune", compiled_s=0.8e-3, cold_s=60.0, warm_s=3.0)
    (a,) = advise([default, autotune, make_result("other/b1/default")])
    figs = {f.mode: f for f in a.modes}
    # 1 ms saved per call: 10 s of cold compile pays off after 10,000 calls
    assert math.isclose(figs["default"].break_even(figs["default"].cold_s), 10_000, rel_tol=0.05)
    assert a.serving == "max-autotune" and "lowest p50" in a.serving_rule
    # 1,000 calls: 10 + 1 s (default) and 60 + 0.8 s (autotune) against 2 s eager
    assert a.short_job == "eager" and f"{SHORT_JOB_CALLS:,} calls" in a.short_job_rule


def test_a_mode_that_fails_parity_is_never_recommended():
    default = mode_result("default", compiled_s=1.0e-3, cold_s=0.5, warm_s=0.2)
    broken = mode_result("max-autotune", compiled_s=0.5e-3, cold_s=0.5, warm_s=0.2, parity_ok=False)
    (a,) = advise([default, broken])
    assert a.serving == "default" and a.short_job == "default"


def test_the_report_shows_the_comparison():
    rows = [
        mode_result("default", compiled_s=1.0e-3, cold_s=10.0, warm_s=2.0),
        mode_result("max-autotune", compiled_s=0.8e-3, cold_s=60.0, warm_s=3.0),
    ]
    rep = gate.build_report(rows, {}, lambda t: RULES, base_ref="main")
    md = report.render_markdown(rep, details=False)
    assert "### Which mode?" in md and "break-even calls (cold / warm)" in md
    assert "- serving: `max-autotune`" in md and "- short jobs: `eager`" in md
    doc = report.report_json(rep)
    (advice,) = doc["mode_advice"]
    assert advice["serving"] == "max-autotune"
    assert {m["mode"] for m in advice["modes"]} == {"default", "max-autotune"}


# -- strategies (issue 23) ------------------------------------------------------------------
def strategy_result(strategy: str, *, compiled_s: float, warm_s: float, verified=None):
    r = make_result(
        "gpt/b4/default" + ("" if strategy == "whole" else f"+{strategy}"),
        seed=len(strategy),
        compiled_s=compiled_s,
        eager_s=2e-3,
        compile_s=warm_s,
        warm=True,
        cache="hit",
        cold_s=20.0,
    )
    if strategy == "aot":
        r.packages["aot"] = {"verified": verified, "first_call_seconds": 0.02}
    return r


def test_every_mode_and_strategy_in_one_table_aot_only_when_verified():
    whole = strategy_result("whole", compiled_s=1.0e-3, warm_s=3.0)
    regional = strategy_result("regional", compiled_s=1.01e-3, warm_s=2.0)
    aot = strategy_result("aot", compiled_s=1.0e-3, warm_s=0.5, verified=True)
    (a,) = advise([whole, regional, aot])
    assert [f.label for f in a.modes] == ["default", "default+regional", "default+aot"]
    # p50s tie: the smallest deploy first call wins, the verified package loaded (0.02 s)
    assert a.serving == "default+aot" and "load_aot" in a.serving_rule
    assert {f.label: f.warm_s for f in a.modes}["default+aot"] == 0.02
    (a,) = advise([whole, regional, strategy_result("aot", compiled_s=1e-3, warm_s=0.5)])
    assert a.serving == "default+regional"  # an unverified package is never recommended
    rep = gate.build_report([whole, regional, aot], {}, lambda t: RULES, base_ref="main")
    md = report.render_markdown(rep, details=False)
    assert "### Which mode and strategy?" in md and "| mode+strategy" in md
    assert "- serving: `default+aot`" in md and "deploy first call" in md
