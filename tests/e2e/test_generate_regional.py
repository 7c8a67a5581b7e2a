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
from pathlib import Path

import pytest
from support.helpers import (
    docs_code,
    generated_by_tokens,
    gk,
    inductor_counters,
    main_branch,
    tiny_llama,
    tiny_llama_config,
)

pytest.importorskip("transformers")

LAYERS = 5


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("generate-regional")
    files = {
        "lm.py": tiny_llama(layers=LAYERS),
        "gatekeeper.toml": tiny_llama_config('["regional"]'),
    }
    main_branch(root, {**files, ".gitignore": "store/\nout/\nwarm/\n"})
    gk("compile", cwd=root, check=True)
    gk("check", "--out", "out", cwd=root, check=True)
    return root


def test_a_regional_generation_compiles_every_layer_and_passes_parity_by_tokens(project):
    (r,) = json.loads((project / "out" / "results.json").read_text())["targets"]
    graphs = 2 * LAYERS  # each layer's prefill and decode: Dynamo kept them all
    generated_by_tokens(r, "lm/fixed/default+generate+regional", graphs)
    assert r["compile"]["fxgraph_cache_hit"] == graphs and r["compile"]["fxgraph_cache_miss"] == 0


def test_warm_then_the_docs_regional_service_compiles_nothing(project):
    cache = project / "warm"
    proc = gk("warm", "--cache-dir", str(cache), "--json", cwd=project, check=True)
    (t,) = json.loads(proc.stdout)["targets"]
    assert t["status"] == "hit", t
    service = docs_code("generation.md", "### A regional generation")
    found = inductor_counters(service, project, cache)
    assert found.get("fxgraph_cache_miss", 0) == 0, found
    assert found.get("fxgraph_cache_hit") == 2 * LAYERS, found
