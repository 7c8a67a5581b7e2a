"""Quantized variants, the parent's side (gatekeeper.quantize): the config axis and its
errors, target ids and the float twin, the key, the refusals, and the SQNR and twin
rules (gatekeeper.gate.quantized) on results built by the factories. The worker's side
runs for real in tests/e2e/test_quantize.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import get_args

import pytest
from support.factories import RULES, make_baseline, make_result
from test_config import MODEL, config_error

from gatekeeper import quantize
from gatekeeper.config import Config, GateConfig
from gatekeeper.errors import ConfigError
from gatekeeper.gate import rules as gate
from gatekeeper.key import compile_spec, target_key
from gatekeeper.project import expand
from gatekeeper.results import Quantization

M = {
    "name": "m",
    "factory": "mod:make",
    "inputs": [{"shape": ["batch", 4]}],
    "shapes": [{"batch": 2}],
}


def targets(**extra):
    return expand(Config.model_validate({"models": [{**M, **extra}]}))


def test_each_config_is_a_target_with_its_suffix_and_none_keeps_the_old_ids():
    (plain,) = targets()
    ts = targets(quantize=list(get_args(quantize.Quantize)))
    assert [t.id for t in ts] == [
        "m/b2/default",
        "m/b2/default+int8wo",
        "m/b2/default+int8dq",
        "m/b2/default+fp8dq",
        "m/b2/default+int4wo",
    ]
    assert ts[0].id == plain.id and compile_spec(ts[0]) == compile_spec(plain)
    assert "quantize" not in ts[0].describe() and ts[0].twin == ts[0].id
    assert {t.twin for t in ts} == {"m/b2/default"}


def test_the_suffix_comes_before_the_strategy_and_training_stays_float():
    ts = targets(
        quantize=["none", "int8-dynamic"],
        strategies=["whole", "regional"],
        tasks=["infer", "train"],
    )
    ids = [t.id for t in ts]
    assert "m/b2/default+int8dq+regional" in ids  # the kind is still the id's last part
    assert "m/b2/default+train" in ids and not any("train+int8" in i for i in ids)
    assert quantize.twin_id("m/b2/default+int8dq+regional") == "m/b2/default+regional"
    assert quantize.twin_id("m/b2/default+regional") is None


def test_the_key_holds_the_config_its_arguments_modules_and_torchaos_version():
    base = {"quantize": ["int8-weight-only"]}
    (one,) = targets(**base)
    (other,) = targets(**base, quantize_options={"int8-weight-only": {"group_size": 32}})
    (fewer,) = targets(**base, quantize_modules=["layers.*"])
    specs = [compile_spec(t) for t in (one, other, fewer)]
    assert len({json.dumps(s, sort_keys=True) for s in specs}) == 3
    q = specs[1]["quantize"]
    assert q["config"] == "int8-weight-only" and q["class"] == "Int8WeightOnlyConfig"
    assert q["options"] == {"group_size": 32} and q["torchao"] == quantize.torchao_version()
    assert one.describe()["quantize"] == specs[0]["quantize"]  # the target's record says it


@pytest.mark.parametrize(
    ("extra", "field", "words"),
    [
        ('quantize = ["int8"]', "models[0].quantize[0]", "expected 'none'"),
        ('quantize = ["none", "none"]', "models[0]", "distinct"),
        (
            "quantize_options = { int8-dynamic = { x = 1 } }",
            "models[0]",
            "int8-dynamic is not in 'quantize'",
        ),
        ('quantize_modules = ["a"]', "models[0]", "'quantize' has only"),
    ],
)
def test_config_errors_name_the_field(tmp_path, extra, field, words):
    msg = config_error(tmp_path, MODEL + extra + "\n")
    assert field in msg and words in msg, msg


def test_float8_on_cpu_and_a_missing_torchao_are_one_line_config_errors(monkeypatch):
    (fp8,) = targets(quantize=["float8-dynamic"], device="cpu")
    with pytest.raises(ConfigError, match=r"^models\.m\.quantize: float8-dynamic needs a CUDA"):
        target_key(fp8, Path("."))
    assert quantize.refusal("float8-dynamic", {"device": "cuda", "capability": "8.0"})
    assert quantize.refusal("float8-dynamic", {"device": "cuda", "capability": "9.0"}) is None
    assert "int4" in (quantize.refusal("int4-weight-only", {"device": "cpu"}) or "")
    monkeypatch.setattr(quantize, "torchao_version", lambda: "0.10.0")
    assert "found torchao 0.10.0" in (quantize.refusal("int8-dynamic", {"device": "cpu"}) or "")


def q(sqnr: float, config: str = "int8-weight-only") -> Quantization:
    return Quantization(config=config, sqnr_db=sqnr, weight_bytes=25, float_weight_bytes=100)


def test_sqnr_below_the_floor_or_fallen_from_the_base_is_regressed():
    target = "m/b2/default+int8wo"
    low = make_result(target).model_copy(update={"quantization": q(12.0)})
    v = gate.gate_target(low, None, RULES)
    assert v.verdict == "regressed"
    said = "SQNR vs float 12.0 dB is below the int8-weight-only floor of 20 dB (gate.sqnr_floor)"
    assert said in v.reasons, v.reasons
    ok = make_result(target).model_copy(update={"quantization": q(41.3)})
    assert gate.gate_target(ok, None, RULES).verdict == "no-baseline"
    # stored mode: against the baseline's SQNR, a threshold in dB
    fallen = make_result(target).model_copy(update={"quantization": q(28.0)})
    base = make_baseline(ok)
    v = gate.gate_target(fallen, base, RULES)
    assert v.verdict == "regressed"
    assert "SQNR vs float 41.3 dB -> 28.0 dB (-13.3 dB, threshold 3 dB)" in v.reasons
    loose = RULES.model_copy(update={"sqnr_regression": 20.0, "sqnr_floor": {}})
    assert not any("SQNR" in r for r in gate.gate_target(fallen, base, loose).reasons)
    assert gate.gate_target(low, None, loose).verdict == "no-baseline"


def test_twin_ratios_and_the_slower_rule_advise_by_default_and_fail_when_set():
    fl = make_result("m/b2/default", compiled_s=1e-3)
    qt = make_result("m/b2/default+int8wo", compiled_s=2e-3, seed=1)
    qt = qt.model_copy(update={"quantization": q(41.0)})
    rep = gate.build_report([fl, qt], {}, lambda t: RULES, base_ref="main")
    v = rep.rows[1].verdict
    assert v.twin is not None and v.twin["twin"] == "m/b2/default"
    assert 1.5 < v.twin["latency"] < 2.5 and v.twin["weights"] == 0.25
    assert any("slower than its float twin" in n for n in v.notes)
    assert rep.exit_code == 0
    strict = GateConfig(quantized_slower="fail")
    rep = gate.build_report([fl, qt], {}, lambda t: strict, base_ref="main")
    assert rep.rows[1].verdict.verdict == "regressed" and rep.exit_code == 1


def test_a_float_twin_that_failed_parity_is_said_on_the_quantized_target():
    fl = make_result("m/b2/default", parity_ok=False)
    qt = make_result("m/b2/default+int8dq", seed=1).model_copy(
        update={"quantization": q(35.0, "int8-dynamic")}
    )
    rep = gate.build_report(
        [fl, qt], {"m/b2/default": make_baseline(fl)}, lambda t: RULES, base_ref="main"
    )
    assert rep.rows[0].verdict.verdict == "parity-failed"
    said = rep.rows[1].verdict.reasons + rep.rows[1].verdict.notes
    assert any("its float model m/b2/default failed parity" in r for r in said), said


def test_the_report_shows_sqnr_beside_parity_and_the_twin_ratios():
    from gatekeeper.report.json import report_json
    from gatekeeper.report.markdown import render_markdown

    fl = make_result("m/b2/default", compiled_s=1e-3)
    qt = make_result("m/b2/default+int8wo", compiled_s=7.1e-4, seed=1)
    qt = qt.model_copy(update={"quantization": q(28.0)})
    base = make_baseline(qt.model_copy(update={"quantization": q(41.3)}))
    rep = gate.build_report(
        [fl, qt], {"m/b2/default+int8wo": base}, lambda t: RULES, base_ref="main"
    )
    md = render_markdown(rep)
    assert "SQNR vs float" in md and "| 41.3 dB → 28.0 dB |" in md, md
    assert "int8-weight-only: 0.7" in md and "x latency, 0.25x weights" in md
    doc = report_json(rep)["targets"][1]["quantization"]
    assert doc["sqnr_db"] == 28.0 and doc["base_sqnr_db"] == 41.3
    assert doc["twin"]["twin"] == "m/b2/default" and doc["twin"]["weights"] == 0.25
    assert report_json(rep)["targets"][0]["quantization"] is None


def test_a_changed_quantization_is_judged_by_sqnr_not_by_parity_vs_the_base():
    """A pull request that quantizes one more layer changes the quantized outputs on
    purpose: parity vs the base is a note, SQNR decides (before, parity-failed)."""
    from gatekeeper.results import ParityCheck

    r = make_result("m/b2/default+int8wo")
    assert r.parity is not None
    failed = ParityCheck(passed=False, method="failed", detail="max abs err 0.5 > atol 1e-4")
    r = r.model_copy(
        update={
            "parity": r.parity.model_copy(update={"vs_baseline": failed}),
            "quantization": q(3.0).model_copy(update={"modules": ["body.*", "head"]}),
        }
    )
    base = make_baseline(r.model_copy(update={"quantization": q(41.0)}))
    v = gate.gate_target(r, base, RULES)
    assert v.verdict == "regressed", (v.reasons, v.notes)
    assert any("below the int8-weight-only floor" in x for x in v.reasons)
    assert any("its quantization changed" in n for n in v.notes)
    same = r.model_copy(update={"quantization": q(41.0)})
    assert gate.gate_target(same, base, RULES).verdict == "parity-failed"
