"""What is called and how, on real compiles, through ``gatekeeper check`` and ``gate``:
keyword inputs with a plain value, a method target (``call``), a function target
(``function``), an inputs factory returning ``(args, kwargs)``, a training step of a
method; and a model torch cannot compile, which is that target's error with torch's
message and the model's file:line while the other targets go on, its two shape sets
grouped in the report. ``check`` compiles each target in its worker (no bundle to warm
from): ``run``'s compile stage before it would compile each once more and assert
nothing of its own here."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from support.helpers import gk, write_project

MODEL = textwrap.dedent("""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x, *, scale=1.0, mask=None):
            h = self.fc(x) * scale
            if mask is not None:
                h = h * mask
            return {"h": h, "rows": x.shape[0], "scale": scale}

        def encode(self, x, bias):
            return torch.tanh(self.fc(x) + bias)

    def make():
        return Net()

    def gelu_mix(a, b, *, alpha):
        return torch.nn.functional.gelu(a) * alpha + b

    def factory_inputs(shapes):
        return (torch.randn(shapes["batch"], 8),), {"scale": 2.0}

    class Branchy(nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow: no full graph
                return x * 2
            return x

    def branchy():
        return Branchy()
""")

CONFIG = textwrap.dedent("""
    [tool.gatekeeper]
    store = "store"
    precompile = "off"  # packages: tests/e2e/test_precompile.py

    [tool.gatekeeper.measure]
    warmup = 1
    min_time = 0.2
    shape_sweep = false

    [[tool.gatekeeper.models]]
    name = "kw"
    factory = "tinymodel:make"
    shapes = [{ batch = 4 }]

    [tool.gatekeeper.models.inputs]
    x = { shape = ["batch", 8] }
    mask = { shape = ["batch", 8], dtype = "bool" }
    scale = 0.5

    [[tool.gatekeeper.models]]
    name = "method"
    factory = "tinymodel:make"
    call = "encode"
    inputs = [{ shape = ["batch", 8] }, { shape = [8] }]
    shapes = [{ batch = 4 }]
    tasks = ["infer", "train"]

    [[tool.gatekeeper.models]]
    name = "fn"
    function = "tinymodel:gelu_mix"
    inputs = { a = { shape = ["batch", 8] }, b = { shape = ["batch", 8] }, alpha = 1.5 }
    shapes = [{ batch = 4 }]

    [[tool.gatekeeper.models]]
    name = "made"
    factory = "tinymodel:make"
    inputs_factory = "tinymodel:factory_inputs"
    shapes = [{ batch = 4 }]

    [[tool.gatekeeper.models]]
    name = "branchy"
    factory = "tinymodel:branchy"
    fullgraph = true
    inputs = [{ shape = ["batch", 8] }]
    shapes = [{ batch = 2 }, { batch = 3 }]
""")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = write_project(tmp_path_factory.mktemp("forms"), MODEL, CONFIG)
    proc = gk("check", "--json", "--out", "out", cwd=root)
    assert "Traceback" not in proc.stderr, proc.stderr
    gate = gk("gate", "--json", "--results", "out/results.json", cwd=root)
    assert "Traceback" not in gate.stderr and gate.returncode == proc.returncode, gate.stderr
    results = json.loads((root / "out" / "results.json").read_text())
    by_id = {t["target"]: t for t in results["targets"]}
    return proc, by_id, root


def test_keyword_method_function_and_factory_targets_compile_and_match_eager(run):
    _, by_id, _ = run
    for target in (
        "kw/b4/default",
        "method/b4/default",
        "method/b4/default+train",
        "fn/b4/default",
        "made/b4/default",
    ):
        r = by_id[target]
        assert r["status"] == "ok", (target, r.get("error"))
        assert r["parity"]["vs_eager"]["passed"], (target, r["parity"])
    # plain values come back as plain leaves: the keyword input reached the model
    assert by_id["kw/b4/default"]["parity"]["outputs"]["leaves"] == 3
    assert by_id["fn/b4/default"]["parity"]["outputs"]["kind"] == "tensor"


def test_the_keyword_and_method_reference_outputs_hold_what_was_called(run):
    _, _, root = run
    kw = torch.load(root / "out/references/kw__b4__default.pt", weights_only=True)
    assert kw["leaves"]["output['scale']"] == 0.5 and kw["leaves"]["output['rows']"] == 4
    made = torch.load(root / "out/references/made__b4__default.pt", weights_only=True)
    assert made["leaves"]["output['scale']"] == 2.0  # the factory's keyword argument


def test_a_model_torch_cannot_compile_is_its_targets_error_naming_file_and_line(run):
    proc, by_id, root = run
    assert proc.returncode == 2, proc.stderr  # an error, and the other targets went on
    line = next(n for n, ln in enumerate(MODEL.splitlines(), 1) if "x.sum() > 0" in ln)
    for target in ("branchy/b2/default", "branchy/b3/default"):
        r = by_id[target]
        assert r["status"] == "error", r
        assert "\n" not in r["error"] and f"tinymodel.py:{line}" in r["error"], r["error"]
    report = (root / "out" / "report.md").read_text()
    grouped = [ln for ln in report.splitlines() if "branchy/b2" in ln and "(2 targets)" in ln]
    assert grouped and "branchy/b3/default" in grouped[0], report
