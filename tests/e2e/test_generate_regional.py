"""A regional generation end to end (docs/generation.md, "Strategies" and "A regional
generation") on a stock transformers LlamaForCausalLM of five tiny layers, built from
its config with random weights: compile publishes the layers' graphs, check reports
every layer compiled (a graph per layer for the prefill and one for the decode: ten,
more than Dynamo's default limit of 8 per code object, past which the other layers
would run eager without a word), parity by tokens and no decode recompile; warm
restores them and docs/generation.md's regional service block, as it is, in a fresh
interpreter on the warmed dir compiles nothing (torch's counters: 0 FX graph misses).

Five layers because that is the fewest whose graphs pass the default limit; one cold
compile of two FX graphs (the other layers hit inductor's cache)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.helpers import git, gk, tiny_llama

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
LAYERS = 5
CONFIG = """
store = "store"
precompile = "off"

[measure]
warmup = 1
min_time = 0.3
shape_sweep = false

[[models]]
name = "lm"
factory = "lm:make_lm"
inputs = { input_ids = { shape = [1, 32], dtype = "int64", high = 2048 } }
tasks = ["generate"]
strategies = ["regional"]
generate = { new_tokens = 16 }
"""


def _service() -> str:
    """docs/generation.md's regional service, as the page shows it."""
    text = (ROOT / "docs" / "generation.md").read_text()
    section = text.split("### A regional generation", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("generate-regional")
    (root / "lm.py").write_text(tiny_llama(layers=LAYERS))
    (root / "gatekeeper.toml").write_text(CONFIG)
    (root / ".gitignore").write_text("store/\nout/\nwarm/\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", ".")
    git(root, "commit", "-qm", "main")
    gk("compile", cwd=root, check=True)
    gk("check", "--out", "out", cwd=root, check=True)
    return root


def test_a_regional_generation_compiles_every_layer_and_passes_parity_by_tokens(project):
    (r,) = json.loads((project / "out" / "results.json").read_text())["targets"]
    assert r["target"] == "lm/fixed/default+generate+regional" and r["status"] == "ok", r
    graphs = 2 * LAYERS  # each layer's prefill and decode: Dynamo kept them all
    assert r["graphs"]["count"] == graphs and r["graphs"]["breaks"] == 0, r["graphs"]
    assert r["compile"]["fxgraph_cache_hit"] == graphs and r["compile"]["fxgraph_cache_miss"] == 0
    gen = r["generation"]
    assert gen["decode_recompiles"] == 0 and gen["loop"] == "generate", gen
    parity = r["parity"]["vs_eager"]
    assert parity["passed"], parity
    assert parity["detail"] == "tokens: the same 1x16 greedy tokens from 2 prompt(s)"
    assert 0 < gen["compiled"]["tpot_s"] and 0 < gen["compiled"]["ttft_s"]


def test_warm_then_the_docs_regional_service_compiles_nothing(project):
    cache = project / "warm"
    proc = gk("warm", "--cache-dir", str(cache), "--json", cwd=project, check=True)
    (t,) = json.loads(proc.stdout)["targets"]
    assert t["status"] == "hit", t
    code = _service() + (
        "\nimport json\nfrom torch._dynamo.utils import counters\n"
        "print(json.dumps(dict(counters['inductor'])))\n"
    )
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    ran = subprocess.run(
        [sys.executable, "-c", code], cwd=project, env=env, capture_output=True, text=True
    )
    assert ran.returncode == 0, ran.stderr
    found = json.loads(ran.stdout.strip().splitlines()[-1])
    assert found.get("fxgraph_cache_miss", 0) == 0, found
    assert found.get("fxgraph_cache_hit") == 2 * LAYERS, found
