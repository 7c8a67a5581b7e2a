"""A target's packages as a mapping by name: gatekeeper's own (``precompile``, ``aot``)
and any other kind's alike reach results.json, the markdown report and report.json.
Documents written before (a field per built-in package) still read, and gatekeeper's
own packages are still written as those fields (docs/strategies.md says why)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.factories import RULES, make_baseline, make_result
from support.helpers import registered

from gatekeeper import kinds, report
from gatekeeper.gate import rules as gate
from gatekeeper.results import Baseline, Results, TargetResult, load_results, write_results

TARGET = "tiny/b4/default"
PRECOMPILE = {"status": "recorded", "files": 3, "verified": True, "now": False}
AOT = {"verified": False, "reason": "the package's outputs differ vs eager", "from": "bundle"}


def results_of(*targets: TargetResult) -> Results:
    return Results(
        created_at="2025-01-01T00:00:00Z",
        gatekeeper_version="0",
        creator={},
        base_ref="main",
        targets=list(targets),
    )


def old_form(result: TargetResult, **fields: dict | None) -> dict:
    """``result``'s document as gatekeeper wrote it before packages were a mapping: a
    field per built-in package, null when the target had none, no ``packages``."""
    doc = json.loads(result.model_dump_json())
    doc.pop("packages", None)
    return {**doc, "precompile": None, "aot": None, **fields}


def test_a_results_file_in_the_old_form_reads_its_packages(tmp_path: Path) -> None:
    doc = json.loads(results_of(make_result(TARGET)).dump())
    doc["targets"] = [old_form(make_result(TARGET), precompile=PRECOMPILE, aot=AOT)]
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc))
    (r,) = load_results(path).targets
    assert r.packages == {"precompile": PRECOMPILE, "aot": AOT}
    # written again: the same fields, no mapping beside them (nothing else to say)
    (again,) = json.loads(load_results(write_results(load_results(path), tmp_path)).dump())[
        "targets"
    ]
    assert (again["precompile"], again["aot"]) == (PRECOMPILE, AOT)
    assert "packages" not in again


def test_a_baseline_in_the_old_form_reads_its_packages() -> None:
    base = json.loads(make_baseline(make_result(TARGET)).dump())
    base["result"] = old_form(make_result(TARGET), precompile=PRECOMPILE)
    read = Baseline.model_validate_json(json.dumps(base))
    assert read.result.packages == {"precompile": PRECOMPILE}


def test_another_kinds_package_is_written_under_packages_and_reads_back() -> None:
    r = make_result(TARGET)
    r.packages = {"aot": AOT, "nograd": {"verified": True}}
    (doc,) = json.loads(results_of(r).dump())["targets"]
    assert doc["aot"] == AOT and doc["precompile"] is None
    assert doc["packages"] == {"nograd": {"verified": True}}
    assert TargetResult.model_validate(doc).packages == r.packages


class Record(kinds.Package):
    name = "nograd"
    title = "no_grad record"
    worker = "nograd_kind:RECORD"
    ready = "recorded"


@pytest.fixture
def record() -> Iterator[kinds.Package]:
    with registered(Record()) as package:
        yield package


def gated(r: TargetResult) -> tuple[str, dict]:
    rep = gate.build_report(
        [r],
        {r.target: make_baseline(make_result(TARGET, seed=1))},
        lambda t: RULES,
        base_ref="main",
        creator={},
    )
    (target,) = report.report_json(rep)["targets"]
    return report.render_markdown(rep), target


def test_another_kinds_package_verdict_is_in_the_report_and_its_json(record) -> None:
    """check/target.py kept only the packages TargetResult had a field for: a third
    party's verdict never reached results.json, the report or report.json."""
    r = make_result(TARGET)
    r.packages = {"nograd": {"verified": False, "reason": "outputs differ vs eager"}}
    md, doc = gated(r)
    assert "**no\\_grad record package:** rejected (outputs differ vs eager)" in md
    assert doc["packages"] == r.packages and doc["aot"] is None


def test_a_package_whose_kind_is_not_installed_is_reported_by_its_name() -> None:
    r = make_result(TARGET)
    r.packages = {"elsewhere": {"verified": True, "first_call_seconds": 0.25}}
    md, doc = gated(r)
    assert "**elsewhere package:** verified, first call 250 ms in a new process" in md
    assert doc["packages"] == r.packages


def test_memory_source_and_output_structure_keep_their_written_names(tmp_path: Path) -> None:
    """In code a memory figure's ``source`` and the outputs' top-level ``structure``
    (the word ``kind`` is an artifact kind's alone); results.json and report.json keep
    writing and reading both as ``kind``, so older results and gatekeepers read them."""
    doc = json.loads(make_result(TARGET).model_dump_json(by_alias=True))
    doc["memory"] = {"kind": "cpu", "eager_peak_bytes": 1 << 20, "compiled_peak_bytes": 2 << 20}
    doc["parity"] = {
        "vs_eager": {"passed": True, "method": "allclose"},
        "outputs": {"kind": "tuple[2]", "leaves": 2, "tensors": 2, "elements": 8},
    }
    r = TargetResult.model_validate(doc)
    assert r.memory is not None and r.memory.source == "cpu"
    assert r.parity is not None and r.parity.outputs is not None
    assert r.parity.outputs.structure == "tuple[2]"
    (written,) = json.loads(write_results(results_of(r), tmp_path).read_text())["targets"]
    assert written["memory"]["kind"] == "cpu" and "source" not in written["memory"]
    assert written["parity"]["outputs"] == {**doc["parity"]["outputs"], "containers": {}}
    markdown, target = gated(r)
    assert target["memory"]["pr"]["kind"] == "cpu" and "source" not in target["memory"]["pr"]
    assert target["parity"]["outputs"]["kind"] == "tuple[2]"
    assert "`tuple[2]`" in markdown and "peak bytes allocated" in markdown
