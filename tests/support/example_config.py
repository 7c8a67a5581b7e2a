"""The README's tour config, ``examples/gatekeeper.toml``: every one of its 39 targets
compiled and warmed (issue 42), so a target that silently stops compiling or warming
fails by name. Four files, ``tests/e2e/test_example_config_<i>.py``, each take one
``--shard i/4`` of the targets (about 4 minutes of one core each on an idle 2-core CPU,
the aot targets the slowest; one file of all 38 then took 16 minutes and set the floor of
CI's parallel phase, issue 52), through this module's :func:`tests`.

Per shard, one ``gatekeeper compile`` into a local store, then one ``gatekeeper warm``
into an empty cache dir, as a deploy runs it. Each target's test reads those two runs:
its bundle published and in the store, its compile captured a graph (or, for ``+aot``,
packaged its AOTInductor package), and its warm a ``hit`` that restored the cache files
(the aot package: present, and withheld until a ``check`` verifies it, as
docs/warm-starts.md says). Nothing is timed, so no ``check``: this runs in CI's
parallel phase."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from gatekeeper.project import expand, load_config
from gatekeeper.targets import select

from .helpers import gk_json

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CONFIG = EXAMPLES / "gatekeeper.toml"
SHARDS = 4
ALL = [t.id for t in expand(load_config(CONFIG))]
COMPILE_TIMEOUT = 3600  # one shard's compile: past helpers.gk's default 600 s


def _strategy(target: str) -> str:
    return next((s for s in ("aot", "regional") if f"+{s}" in target), "whole")


def _spec(target: str) -> dict:
    """What the bundle's key must record of the target its id names (a whole,
    float32 or inference target's spec leaves that field out)."""
    mode, *variants = target.split("/")[-1].split("+")
    strategy = _strategy(target)
    return {
        "mode": mode,
        "strategy": None if strategy == "whole" else strategy,
        "precision": "bf16" if "bf16" in variants else None,
        "task": next((t for t in ("train", "generate") if t in variants), None),
        "quantize": "int8-weight-only" if "int8wo" in variants else None,
    }


def _runs(root: Path, shard: str, targets: list[str]) -> dict[str, dict]:
    """The example project (its config and model file) copied to ``root`` with its own
    local store, one shard compiled once and warmed once: per target id, what compile,
    ``store ls`` and warm said of it, and its stored manifest."""
    for name in (CONFIG.name, "tiny_models.py"):
        shutil.copy(EXAMPLES / name, root / name)
    args = ("--config", CONFIG.name, "--shard", shard)
    compiled = gk_json("compile", *args, cwd=root, timeout=COMPILE_TIMEOUT)["targets"]
    stored = gk_json("store", "ls", *args, cwd=root)["bundles"]
    cache = root / "deploy-cache"
    warmed = gk_json("warm", *args, "--cache-dir", str(cache), cwd=root)["targets"]
    out: dict[str, dict] = {t: {} for t in targets}
    for path in (root / ".gatekeeper" / "store" / "bundles").rglob("manifest.json"):
        doc = json.loads(path.read_text())
        out.setdefault(doc["target"], {})["manifest"] = doc
    for kind, rows in (("compile", compiled), ("store", stored), ("warm", warmed)):
        for row in rows:
            out.setdefault(row["target"], {})[kind] = row
    return out


def shard_tests(index: int) -> dict[str, Any]:
    """The fixture and tests of shard ``index`` (of :data:`SHARDS`), to put in a test
    module's globals."""
    shard = f"{index}/{SHARDS}"
    targets = [t.id for t in select(expand(load_config(CONFIG)), shard=shard)]

    @pytest.fixture(scope="module")
    def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
        return _runs(tmp_path_factory.mktemp("examples"), shard, targets)

    def test_every_run_names_exactly_the_shards_targets(runs: dict[str, dict]):
        """No target left out of a run, none extra (a target id the config never named)."""
        for kind in ("compile", "store", "warm", "manifest"):
            missing = [t for t in targets if kind not in runs[t]]
            assert not missing, f"{kind}: no entry for {missing}"
        assert sorted(runs) == sorted(targets), sorted(set(runs) - set(targets))

    @pytest.mark.parametrize("target", targets)
    def test_each_target_is_compiled_into_the_store(runs: dict[str, dict], target: str):
        got = runs[target]
        compiled, stored, manifest = got.get("compile"), got.get("store"), got.get("manifest")
        assert compiled and compiled["status"] == "published", compiled
        assert stored and stored["complete"], stored
        assert stored["code_hash"] == compiled["code_hash"], stored
        assert manifest and manifest["code_hash"] == compiled["code_hash"], manifest
        spec = manifest["key"]["spec"]
        recorded = {k: spec.get(k) for k in ("mode", "strategy", "precision", "task")}
        recorded["quantize"] = (spec.get("quantize") or {}).get("config")
        assert recorded == _spec(target), spec
        if _strategy(target) == "aot":
            # the kind's package: exported and packaged, and in the bundle
            assert compiled["aot"]["status"] == "packaged", compiled["aot"]
            assert "aot/model.pt2" in manifest["files"], sorted(manifest["files"])
        else:
            # the compiled model (or the regional target's block) captured a graph: a
            # target that compiles nothing publishes a bundle of no cache files
            counters = compiled["counters"]
            assert counters["graphs"] >= 1 and counters["fxgraph_cache_miss"] >= 1, counters

    @pytest.mark.parametrize("target", targets)
    def test_each_target_warms_from_its_bundle(runs: dict[str, dict], target: str):
        compiled, warmed = runs[target].get("compile") or {}, runs[target].get("warm")
        assert warmed and warmed["status"] == "hit", warmed
        assert warmed["bundle_code_hash"] == compiled.get("code_hash"), warmed
        if _strategy(target) == "aot":
            # restored and held back for a check to verify ("missing": the bundle has none)
            state = (warmed.get("aot"), warmed.get("aot_reason"))
            assert state == ("unverified", "no check has verified it yet"), warmed
        else:
            assert warmed["files"] >= 1, warmed  # inductor's cache entries restored

    return {k: v for k, v in locals().items() if k == "runs" or k.startswith("test_")}
