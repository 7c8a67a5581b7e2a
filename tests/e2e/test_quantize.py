"""Quantized variants end to end, with the real torchao and real compiles: a tiny model
with ``quantize = ["none", "int8-weight-only", "int8-dynamic"]`` through compile, warm
(a hit), check and baseline on main, then pull requests checked paired with main: one
unchanged, one that quantizes one more layer (SQNR below the floor), one that changes a
config argument (SQNR fallen from main's), one that changes the float model's numerics;
and the configs that cannot run here (torchao not installed included), one line each.

One project, compiled, checked and baselined once for the module; every test that reads
or writes it works on its own copy (its git history, store and results), so each passes
alone or in any order."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.helpers import git, gk, gk_json, write_project
from support.projects import QUIET, check_gate

# ``head`` has an outlier column whose input is always 0 (``body``'s last row is zero):
# the float output never sees it, but int8's per-row scale does, and rounds every other
# weight of ``head`` to 0. Quantizing ``body`` alone keeps the SQNR high.
MODEL = textwrap.dedent("""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
            self.head = nn.Linear(64, 32)
            with torch.no_grad():
                self.body[2].weight[0].zero_()
                self.body[2].bias[0] = 0.0
                self.head.weight[:, 0] = 1000.0

        def forward(self, x):
            return self.head(torch.relu(self.body(x)))

    def make():
        return Net()
""")

CONFIG = textwrap.dedent("""
    store = "store"
    precompile = "off"

    [measure]  # short: these tests judge accuracy; no paired rounds past min_time
    min_time = 0.2
    max_time = 0.2
    warmup = 1
    shape_sweep = false

    [gate]  # wide timing thresholds: these tests judge accuracy, not a shared runner's speed
    latency_regression = 0.9
    speedup_regression = 0.9
    compile_time_regression = 10.0
    memory_regression = 10.0

    [[models]]
    name = "qnet"
    factory = "tinymodel:make"
    inputs = [{ shape = ["batch", 64] }]
    shapes = [{ batch = 8 }]
    quantize = ["none", "int8-weight-only", "int8-dynamic"]
    quantize_modules = ["body.*"]
""")
FLOAT, INT8WO, INT8DQ = "qnet/b8/default", "qnet/b8/default+int8wo", "qnet/b8/default+int8dq"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Path:
    """main, compiled, checked and published as the baseline. Read only through
    :func:`repo`'s copies."""
    root = write_project(tmp_path_factory.mktemp("quantize"), MODEL, CONFIG)
    (root / ".gitignore").write_text("store/\nresults.json\nreport.*\nreferences/\ntraces/\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", ".")
    git(root, "commit", "-qm", "base")
    compiled = gk_json("compile", cwd=root, env=QUIET)["targets"]
    assert [(t["target"], t["status"]) for t in compiled] == [
        (FLOAT, "published"),
        (INT8WO, "published"),
        (INT8DQ, "published"),
    ], compiled
    checked = gk("check", "--mode", "stored", cwd=root, env=QUIET)
    assert checked.returncode == 0, checked.stderr
    gk("baseline", "--ref", "main", cwd=root, check=True)
    return root


@pytest.fixture
def repo(compiled: Path, tmp_path: Path) -> Path:
    """A test's own copy of the compiled project: the config or model it rewrites, the
    results, report and bundles its check writes, no other test sees."""
    root = tmp_path / "project"
    shutil.copytree(compiled, root, symlinks=True)
    return root


def _results(root: Path) -> dict[str, dict]:
    return {t["target"]: t for t in json.loads((root / "results.json").read_text())["targets"]}


def test_main_measures_sqnr_weights_and_parity_vs_its_own_quantized_eager(repo: Path):
    found = _results(repo)
    assert found[FLOAT]["quantization"] is None
    for target, config in ((INT8WO, "int8-weight-only"), (INT8DQ, "int8-dynamic")):
        q, t = found[target]["quantization"], found[target]
        assert q["config"] == config and q["modules"] == ["body.*"] and q["torchao"]
        assert q["sqnr_db"] > 20, q  # body only: above torchao's int8 floor
        assert q["weight_bytes"] < q["float_weight_bytes"], q  # int8 weights, counted
        assert t["parity"]["vs_eager"]["passed"], t["parity"]  # compiled == quantized eager
        assert t["compile"]["cache"] == "hit", t["compile"]  # warm from compile's bundle
    manifests = [json.loads(p.read_text()) for p in (repo / "store").rglob("manifest.json")]
    keyed = {m["key"]["spec"].get("quantize", {}).get("config") for m in manifests}
    assert keyed == {None, "int8-weight-only", "int8-dynamic"}


def test_warm_probe_hits_the_quantized_graphs(repo: Path, tmp_path: Path):
    probe = gk_json(
        "warm",
        "--cache-dir",
        str(tmp_path / "c"),
        "--probe",
        "--target",
        "*+int8*",
        cwd=repo,
        env=QUIET,  # the compile's thread count: the env key's
    )
    assert len(probe["targets"]) == 2
    for entry in probe["targets"]:
        assert entry["status"] == "hit", entry
        assert entry["fxgraph_cache_hit"] >= 1 and entry["fxgraph_cache_miss"] == 0, entry


def test_an_unchanged_pull_request_passes(repo: Path):
    code, doc, _ = check_gate(repo)
    assert code == 0, doc
    by = {t["target"]: t for t in doc["targets"]}
    for target in (INT8WO, INT8DQ):
        assert by[target]["verdict"] in ("pass", "inconclusive"), by[target]
        assert not any("SQNR" in r for r in by[target]["reasons"]), by[target]
        assert by[target]["quantization"]["twin"]["twin"] == FLOAT
    report = (repo / "report.md").read_text()
    assert "SQNR vs float" in report and "int8-weight-only: " in report and "x weights" in report


def test_quantizing_one_more_layer_falls_below_the_floor(repo: Path):
    config = repo / "gatekeeper.toml"
    config.write_text(CONFIG.replace('["body.*"]', '["body.*", "head"]'))
    try:
        code, doc, _ = check_gate(repo, "--target", INT8WO)
    finally:
        git(repo, "checkout", "gatekeeper.toml")
    assert code == 1, doc
    (t,) = doc["targets"]
    assert t["verdict"] == "regressed", t
    said = " ".join(t["reasons"])
    assert "below the int8-weight-only floor of 20 dB" in said, said
    assert "SQNR vs float" in said and "->" in said, said  # and its fall from main's


def test_a_config_argument_that_costs_accuracy_is_regressed_by_sqnr(repo: Path):
    """``reduce_range`` halves int8-dynamic's range (about 6 dB): another config argument
    than main's, so SQNR vs float judges it, paired with main's, and parity vs main's
    outputs (meant to differ) is no failure."""
    config = repo / "gatekeeper.toml"
    config.write_text(CONFIG + "quantize_options = { int8-dynamic = { reduce_range = true } }\n")
    try:
        code, doc, _ = check_gate(repo, "--target", INT8DQ)
    finally:
        git(repo, "checkout", "gatekeeper.toml")
    assert code == 1, doc
    (t,) = doc["targets"]
    assert t["verdict"] == "regressed", t
    assert t["quantization"]["options"] == {"reduce_range": True}, t["quantization"]
    (said,) = [r for r in t["reasons"] if "SQNR" in r]
    assert re.fullmatch(
        r"SQNR vs float [\d.]+ dB -> [\d.]+ dB \(-[\d.]+ dB, threshold 3 dB\)", said
    )
    assert not any("parity" in r for r in t["reasons"]), t


def test_a_float_model_whose_numerics_change_fails_both(repo: Path):
    model = repo / "tinymodel.py"
    model.write_text(MODEL.replace("return self.head(", "return 1.5 * self.head("))
    try:
        code, doc, _ = check_gate(repo, "--target", FLOAT, "--target", INT8DQ)
    finally:
        git(repo, "checkout", "tinymodel.py")
    assert code == 1, doc
    by = {t["target"]: t for t in doc["targets"]}
    assert by[FLOAT]["verdict"] == "parity-failed", by[FLOAT]
    quantized = by[INT8DQ]
    assert quantized["verdict"] == "parity-failed", quantized
    assert any(f"its float model {FLOAT} failed parity" in r for r in quantized["reasons"])


@pytest.mark.parametrize(
    ("quantize", "env", "says"),
    [
        ("float8-dynamic", {}, "float8-dynamic needs a CUDA GPU of compute capability 8.9"),
        ("int4-weight-only", {}, "int4-weight-only needs a CUDA GPU"),
        (
            "int8-dynamic",
            {"old": "0.10.0"},
            "int8-dynamic needs torchao>=0.17, found torchao 0.10.0",
        ),
    ],
)
def test_what_cannot_run_here_is_one_line_and_exit_2(tmp_path, quantize, env, says):
    root = write_project(
        tmp_path, MODEL, CONFIG.replace('"int8-weight-only", "int8-dynamic"', f'"{quantize}"')
    )
    extra = {}
    if "old" in env:  # an older torchao's metadata first on the path: what is installed
        info = tmp_path / "site" / f"torchao-{env['old']}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: torchao\nVersion: {env['old']}\n"
        )
        extra = {"PYTHONPATH": str(tmp_path / "site")}
    proc = gk("compile", cwd=root, env=extra)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert f"models.qnet.quantize: {says}" in proc.stderr, proc.stderr


def test_torchao_that_does_not_import_is_one_line_naming_the_extra(tmp_path):
    """A torchao the worker cannot import (a package on the path that fails as a missing
    one does): the target's error names the config and the install command."""
    root = write_project(tmp_path, MODEL, CONFIG.replace('"none", ', ""))
    stub = tmp_path / "site" / "torchao"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'torchao'\")\n")
    proc = gk("compile", "--target", INT8DQ, cwd=root, env={"PYTHONPATH": str(tmp_path / "site")})
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "torchao" in ln]
    assert len(lines) == 1, proc.stderr
    assert "int8-dynamic needs torchao>=0.17 (pip install 'gatekeeper[quant]')" in lines[0]


def _without_torchao(site: Path) -> dict[str, str]:
    """An environment in which torchao is not installed, for real: a ``sitecustomize``
    on PYTHONPATH (which the worker's allow-list passes too) swaps each ``sys.path``
    directory that holds torchao for a shadow of links to everything else in it, so both
    ``import torchao`` and its installed metadata are gone, and torch and the rest stay."""
    mapping = {}
    for i, entry in enumerate(map(Path, sys.path)):
        if entry.is_dir() and ((entry / "torchao").exists() or any(entry.glob("torchao-*"))):
            shadow = site / f"shadow{i}"
            shadow.mkdir(parents=True)
            for item in entry.iterdir():
                if item.name != "torchao" and not item.name.startswith("torchao-"):
                    (shadow / item.name).symlink_to(item)
            mapping[str(entry)] = str(shadow)
    assert mapping, "torchao is not installed here: nothing to hide"
    (site / "sitecustomize.py").write_text(
        f"import sys\nsys.path[:] = [{mapping!r}.get(p, p) for p in sys.path]\n"
    )
    return {"PYTHONPATH": str(site)}


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_torchao_not_installed_is_one_line_exit_2_and_the_store_untouched(repo, tmp_path):
    """torchao absent (not importable, no metadata): ``compile`` and ``check`` refuse the
    quantized targets before any work, the float one included, in one line naming the
    config and the extra; the store and the results stay as they were."""
    env = _without_torchao(tmp_path / "site")
    hidden = subprocess.run(
        [sys.executable, "-c", "import importlib.util as u; print(u.find_spec('torchao'))"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    assert hidden.stdout.strip() == "None", hidden  # the blocker blocks
    store, results = _files(repo / "store"), (repo / "results.json").read_bytes()
    for command in (["compile"], ["check", "--mode", "stored"]):
        proc = gk(*command, cwd=repo, env=env)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert line == (
            "gatekeeper: error: models.qnet.quantize: int8-weight-only needs torchao>=0.17, "
            "which is not installed (pip install 'gatekeeper[quant]')"
        ), proc.stderr
    assert _files(repo / "store") == store  # nothing compiled, published or pruned
    assert (repo / "results.json").read_bytes() == results
