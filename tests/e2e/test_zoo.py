"""The zoo's fast subset on real compiles: a stock causal LM returning its KV cache
(Llama) and a text encoder called with keyword inputs (BERT), as transformers returns
them, through compile, warm, check, baseline and an unchanged pull request
(benchmarks/zoo.py's own code); then a pull request that scales one layer's attention
values fails parity against the base commit, naming that layer's cache leaf."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.helpers import gk

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
# the zoo's own factories and inputs, measured briefly (parity decides here, not timing)
CONFIG = """
[tool.gatekeeper]
store = ".gatekeeper/store"
precompile = "off"  # packages: tests/e2e/test_precompile.py

[tool.gatekeeper.measure]
warmup = 1
min_time = 0.3
shape_sweep = false

[tool.gatekeeper.gate]
latency_regression = 0.95
speedup_regression = 0.95
compile_time_regression = 100.0
memory_regression = 100.0

[[tool.gatekeeper.models]]
name = "llama"
factory = "zoo_models:llama"
inputs = [{ shape = ["batch", "seq"], dtype = "int64", high = 256 }]
shapes = [{ batch = 1, seq = 8 }]

[[tool.gatekeeper.models]]
name = "bert"
factory = "zoo_models:bert"
shapes = [{ batch = 1, seq = 8 }]

[tool.gatekeeper.models.inputs]  # keyword inputs, and a flag passed as it is
input_ids = { shape = ["batch", "seq"], dtype = "int64", high = 256 }
attention_mask = { shape = ["batch", "seq"], dtype = "int64", low = 1, high = 2 }
output_hidden_states = true
"""
SCALED = """
    model = AutoModelForCausalLM.from_config(LlamaConfig(**_tiny_text(num_key_value_heads=2)))
    with torch.no_grad():  # the pull request: layer 1's attention values, 5% larger
        model.model.layers[1].self_attn.v_proj.weight.mul_(1.05)
    return model
"""


def _zoo():
    spec = importlib.util.spec_from_file_location("zoo_bench", ROOT / "benchmarks" / "zoo.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["zoo_bench"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    src = tmp_path_factory.mktemp("zoo-src")
    shutil.copy(ROOT / "examples" / "zoo_models.py", src)
    (src / "gatekeeper.toml").write_text(CONFIG)
    bench = _zoo()
    fams, repo = bench.run_zoo(
        src / "gatekeeper.toml", keep=tmp_path_factory.mktemp("zoo"), pr_touches="file"
    )
    return {f.name: f for f in fams}, repo


def test_stock_models_pass_every_stage_as_they_are(zoo):
    fams, _ = zoo
    for name in ("llama", "bert"):
        fam = fams[name]
        assert fam.ok, (name, fam.stages, fam.errors)
        assert fam.parity and fam.parity.startswith(("allclose", "fp64-rmse")), fam.parity
        assert fam.pr_verdict and "paired" in fam.pr_verdict, fam.pr_verdict
    assert "Cache" not in (fams["bert"].outputs or "")
    assert fams["llama"].outputs.startswith("CausalLMOutputWithPast{")


def test_the_causal_lms_reference_holds_its_cache_and_loads_with_weights_only(zoo):
    import torch

    _, repo = zoo
    ref = repo / "out/llama/base/references/llama__b1-s8__default.pt"
    doc = torch.load(ref, weights_only=True)
    cache_leaves = [k for k, v in doc["leaves"].items() if ".layers[1]." in k]
    assert any(k.endswith(".keys") for k in cache_leaves), sorted(doc["leaves"])
    assert any(k.endswith(".values") for k in cache_leaves)


def test_scaling_one_layers_attention_fails_parity_naming_its_cache_leaf(zoo):
    _, repo = zoo
    factory = repo / "zoo_models.py"
    text = factory.read_text()
    old = (
        "    return AutoModelForCausalLM.from_config("
        "LlamaConfig(**_tiny_text(num_key_value_heads=2)))\n"
    )
    assert old in text
    factory.write_text(text.replace(old, SCALED.lstrip("\n")))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@localhost"]
    subprocess.run([*git, "commit", "-qam", "scale"], cwd=repo, check=True)
    # check compiles the changed model in its worker, paired with main's (warm from its
    # bundle); run's compile stage would compile it once more before that
    check = gk(
        "check", "--base-ref", "main", "--target", "llama/*", "--out", "out/llama/scaled", cwd=repo
    )
    assert check.returncode == 0 and "Traceback" not in check.stderr, check.stderr
    proc = gk(
        "gate",
        "--json",
        "--base-ref",
        "main",
        "--results",
        "out/llama/scaled/results.json",
        cwd=repo,
    )
    assert proc.returncode == 1, proc.stderr
    target = json.loads(proc.stdout)["targets"][0]
    assert target["verdict"] == "parity-failed" and target["mode"] == "paired", target
    results = json.loads((repo / "out/llama/scaled/results.json").read_text())
    parity = results["targets"][0]["parity"]
    assert parity["vs_eager"]["passed"], parity  # compiled still computes what eager does
    detail = parity["vs_baseline"]["detail"]
    assert ".layers[1].values" in detail and ".layers[0]" not in detail, detail
    assert ".layers[1].keys" not in detail, detail  # the keys were not touched


def test_the_readme_names_the_families_ci_runs():
    """The README's zoo table is benchmarks/zoo.py's; what it says CI runs is what this
    file's config holds, no more and no less."""
    readme = (ROOT / "README.md").read_text()
    said = re.search(r"CI runs \w+ of the families,\s+([\w,\s]+?)\s+\(", readme)
    assert said, "the README no longer says which zoo families CI runs"
    named = set(re.split(r",\s*|\s+and\s+", said.group(1)))
    assert named == set(re.findall(r'^name = "([\w-]+)"', CONFIG, re.M)), named
