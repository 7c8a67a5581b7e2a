"""The README's minimal config names ``modes = ["default", "max-autotune"]``: a
``max-autotune`` target end to end on CPU, where inductor benchmarks its C++ GEMM
templates against ATen's at compile time. Compiled cold into the store, warmed into an
empty cache dir (every FX graph a hit in a new process: what max-autotune chose travels
in the bundle, no benchmarking again), then checked (served from the bundle, parity
with eager). One compile per session: one Linear layer, so one GEMM is tuned."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from support.helpers import gk_json, write_project

TARGET = "lin/b16/max-autotune"
MODEL = textwrap.dedent("""
    import torch
    from torch import nn

    class Lin(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(64, 64)

        def forward(self, x):
            return torch.relu(self.fc(x))

    def make():
        return Lin()
""")
CONFIG = textwrap.dedent("""
    [tool.gatekeeper]
    store = "store"
    precompile = "off"  # packages: tests/e2e/test_precompile.py

    [tool.gatekeeper.measure]
    warmup = 2
    min_time = 0.3

    [[tool.gatekeeper.models]]
    name = "lin"
    factory = "tinymodel:make"
    inputs = [{ shape = ["batch", 64] }]
    shapes = [{ batch = 16 }]
    modes = ["max-autotune"]
""")


@pytest.fixture(scope="session")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = write_project(tmp_path_factory.mktemp("autotune"), MODEL, CONFIG)
    (entry,) = gk_json("compile", cwd=root)["targets"]
    return root, entry


def test_a_max_autotune_target_compiles_into_the_store(compiled):
    root, entry = compiled
    assert entry["target"] == TARGET and entry["status"] == "published", entry
    assert entry["counters"]["fxgraph_cache_miss"] >= 1, entry  # cold: tuned here
    (manifest,) = (root / "store" / "bundles").rglob("manifest.json")
    spec = json.loads(manifest.read_text())["key"]["spec"]
    assert spec["mode"] == "max-autotune", spec


def test_it_warms_into_a_new_process_with_every_graph_a_hit(compiled, tmp_path: Path):
    root, entry = compiled
    (warmed,) = gk_json("warm", "--probe", "--cache-dir", str(tmp_path / "cache"), cwd=root)[
        "targets"
    ]
    assert warmed["target"] == TARGET and warmed["status"] == "hit", warmed
    assert warmed["bundle_code_hash"] == entry["code_hash"], warmed
    assert warmed["fxgraph_cache_hit"] >= 1 and warmed["fxgraph_cache_miss"] == 0, warmed


def test_it_checks_from_its_bundle_with_parity(compiled):
    root, _ = compiled
    gk_json("check", "--out", "out", cwd=root)
    (result,) = json.loads((root / "out" / "results.json").read_text())["targets"]
    assert result["target"] == TARGET and result["status"] == "ok", result
    assert result["compile"]["cache"] == "hit", result["compile"]
    assert result["compile"]["fxgraph_cache_miss"] == 0, result["compile"]
    assert result["parity"]["vs_eager"]["passed"], result["parity"]
