"""A changed model compiles only what changed (issue 23, item 6), with real compiles.

``compile`` seeds its cache dir with the newest bundle of the same target and env, so
inductor's content-addressed keys decide what still hits; the new bundle carries only
what the compile read, loaded or wrote. The model has a graph break, so it is two FX
graphs: a comment-only change must reuse both, a change to the second layer only one,
and the bundle of that change must not carry the old second graph's entry.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest
from support.helpers import gk, gk_json, write_project

MODEL = textwrap.dedent("""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(16, 32)
            self.fc2 = nn.Linear(32, 4)

        def forward(self, x):
            h = torch.relu(self.fc1(x))
            torch._dynamo.graph_break()
            return self.fc2(h)

    def make():
        return Net()
""")

CONFIG = textwrap.dedent("""
    [tool.gatekeeper]
    store = "store"
    precompile = "off"  # packages: tests/e2e/test_precompile.py

    [[tool.gatekeeper.models]]
    name = "net"
    factory = "tinymodel:make"
    inputs = [{ shape = ["batch", 16] }]
    shapes = [{ batch = 4 }]
""")


def files(root: Path, code_hash: str) -> set[str]:
    """The members a stored bundle carries."""
    (manifest,) = (root / "store" / "bundles").rglob(f"{code_hash}/manifest.json")
    return set(json.loads(manifest.read_text())["files"])


def fx_entries(root: Path, code_hash: str) -> set[str]:
    """The FX graph cache entries a stored bundle carries (``fxgraph/<k>/<key>``)."""
    names = files(root, code_hash)
    return {"/".join(n.split("/")[1:4]) for n in names if n.startswith("cache/fxgraph/")}


def probe(root: Path, cache: Path) -> dict:
    (entry,) = gk_json("warm", "--cache-dir", str(cache), "--probe", cwd=root)["targets"]
    return entry


@pytest.fixture(scope="session")
def compiled(tmp_path_factory) -> dict:
    root = write_project(tmp_path_factory.mktemp("seeded") / "project", MODEL, CONFIG)
    (entry,) = gk_json("compile", cwd=root)["targets"]
    assert entry["status"] == "published" and "seed" not in entry, entry
    assert entry["counters"]["fxgraph_cache_miss"] == 2, entry  # two graphs, both cold
    return {"root": root, "entry": entry}


def test_a_comment_only_change_reuses_every_graph_and_its_bundle_warms(
    compiled: dict, tmp_path: Path, shared_headers: Path
):
    root = compiled["root"]
    model = root / "tinymodel.py"
    model.write_text("# a comment-only change: another code hash, the same graphs\n" + MODEL)
    (entry,) = gk_json("compile", cwd=root)["targets"]
    assert entry["status"] == "published", entry
    assert entry["code_hash"] != compiled["entry"]["code_hash"]
    seed = entry["seed"]
    assert seed["code_hash"] == compiled["entry"]["code_hash"]
    assert (seed["fx_graphs_reused"], seed["fx_graphs"]) == (2, 2), entry
    assert entry["counters"]["fxgraph_cache_miss"] == 0, entry
    # it keeps the graphs it reused, not a byte of the seed it never touched
    assert fx_entries(root, entry["code_hash"]) == fx_entries(root, seed["code_hash"])
    assert seed["dropped"] > 0, seed  # the kernels' C++ sources: a hit never reads them
    # the ISA check the header worker kept ships too, though this compile's process may
    # never have read it (forked from a server that ran the check: it inherits the
    # answer); without it a deploy warmed from this bundle builds six programs again
    isa = {
        p.relative_to(d).as_posix() for d in shared_headers.glob("isa-*") for p in d.rglob("*.so")
    }
    assert isa, sorted(shared_headers.iterdir())
    assert {f"cache/{rel}" for rel in isa} <= files(root, entry["code_hash"]), isa

    warmed = probe(root, tmp_path / "deploy")  # a fresh process on the new bundle alone
    assert warmed["status"] == "hit" and warmed["bundle_code_hash"] == entry["code_hash"]
    assert (warmed["fxgraph_cache_hit"], warmed["fxgraph_cache_miss"]) == (2, 0), warmed
    assert warmed["autograd_cache_miss"] == 0, warmed

    # a one-layer change compiles that graph alone, and its bundle drops the old entry
    model.write_text(model.read_text().replace("return self.fc2(h)", "return self.fc2(h * 2)"))
    (changed,) = gk_json("compile", cwd=root)["targets"]
    assert changed["status"] == "published", changed
    assert changed["seed"]["code_hash"] == entry["code_hash"]
    assert (changed["seed"]["fx_graphs_reused"], changed["seed"]["fx_graphs"]) == (1, 2)
    before, after = fx_entries(root, entry["code_hash"]), fx_entries(root, changed["code_hash"])
    assert len(after) == 2 and len(after & before) == 1, (before, after)

    warmed = probe(root, tmp_path / "deploy2")
    assert warmed["bundle_code_hash"] == changed["code_hash"]
    assert (warmed["fxgraph_cache_hit"], warmed["fxgraph_cache_miss"]) == (2, 0), warmed


def test_cold_compiles_from_an_empty_cache(compiled: dict, tmp_path: Path):
    root = tmp_path / "project"
    write_project(root, "# another comment\n" + MODEL, CONFIG)
    store = compiled["root"] / "store"
    (entry,) = gk_json("compile", "--cold", "--store", str(store), cwd=root)["targets"]
    assert entry["status"] == "published" and "seed" not in entry, entry
    assert entry["counters"]["fxgraph_cache_hit"] == 0, entry


def test_a_seed_larger_than_its_record_is_refused_unread(compiled: dict, tmp_path: Path):
    """compile's seed download is capped at the size the seed's manifest records: an
    archive grown past it (by anyone who can write one object to the store) is refused
    before its bytes are written out, and the compile goes on cold."""
    root = tmp_path / "project"
    shutil.copytree(compiled["root"], root)
    archives = list((root / "store" / "bundles").rglob("*.tar.zst"))
    assert archives
    for archive in archives:  # every bundle the lookup may pick as the seed
        with archive.open("ab") as f:
            f.write(b"\0" * (8 << 20))
    model = root / "tinymodel.py"
    model.write_text("# a change no bundle was built for\n" + model.read_text())
    proc = gk("compile", "--json", cwd=root)
    assert proc.returncode == 0, proc.stderr
    (entry,) = json.loads(proc.stdout)["targets"]
    assert entry["status"] == "published" and "seed" not in entry, entry
    (line,) = [ln for ln in proc.stderr.splitlines() if "not seeded from bundle" in ln]
    assert "refused unread" in line and "more than the" in line, line
