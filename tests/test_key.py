"""Tests of the cache key's pure parts (gatekeeper.key, gatekeeper.worker.deps): the env
key and the compile environment, the code hash, recording dependencies, re-checking them
without importing anything, and finding this checkout's bundle in a store.

No compiles here: tests/e2e/test_stale_keys.py does the same end to end.
"""

from __future__ import annotations

import importlib
import logging
import sys
import textwrap
from pathlib import Path

import pytest

from gatekeeper import bundle, key
from gatekeeper.key import CacheKey, code_hash, compile_env, env_key, find_bundle
from gatekeeper.store import BundleLocation, Store
from gatekeeper.store.local import LocalBackend
from gatekeeper.warm import settle
from gatekeeper.worker import deps as wdeps

TARGET = "net/b4/default"
OLD_FACTS = {
    "torch": "2.13.0+cpu",
    "torch_git": "abc",
    "triton": None,
    "python": "3.11",
    "arch": "x86_64",
    "device": "cpu",
    "cpu_capability": "avx2",
    "threads": 2,
    "isa_flags": "0123456789ab",
}


@pytest.fixture
def gk_logs(caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("gatekeeper"), "propagate", True)
    caplog.set_level(logging.WARNING, logger="gatekeeper")
    return caplog


# -- env key ----------------------------------------------------------------------------
def test_env_key_of_existing_stores_is_unchanged():
    """Computed by the code before compile variables counted: old stores keep warming."""
    assert env_key(OLD_FACTS) == "torch2.13.0+cpu-py3.11-cpu-x86_64-avx2-t2-45b1e9"


def test_compile_env_counts_only_what_changes_compiled_code():
    environ = {
        "TORCHINDUCTOR_SIZE_ASSERTS": "0",
        "TORCHDYNAMO_CAPTURE_SCALAR_OUTPUTS": "1",
        "TORCH_COMPILE_CPROFILE": "1",
        "TRITON_DEFAULT_FP_FUSION": "0",
        "CXX": "clang++",
        "TORCHINDUCTOR_CACHE_DIR": "/c",
        "TRITON_CACHE_DIR": "/t",
        "TORCH_LOGS": "+dynamo",
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
        "TORCH_TRACE": "/x",
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
        "HOME": "/root",
        "PATH": "/bin",
    }
    assert compile_env(environ) == {
        "CXX": "clang++",
        "TORCHDYNAMO_CAPTURE_SCALAR_OUTPUTS": "1",
        "TORCHINDUCTOR_SIZE_ASSERTS": "0",
        "TORCH_COMPILE_CPROFILE": "1",
        "TRITON_DEFAULT_FP_FUSION": "0",
    }


def test_env_facts_carry_compile_env_only_when_set(monkeypatch):
    for name in list(compile_env()):
        monkeypatch.delenv(name)
    plain = key.env_facts("cpu")
    assert "compile_env" not in plain
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/somewhere")  # a location: no change
    assert key.env_facts("cpu") == plain
    monkeypatch.setenv("TORCHINDUCTOR_SIZE_ASSERTS", "0")
    changed = key.env_facts("cpu")
    assert changed["compile_env"] == {"TORCHINDUCTOR_SIZE_ASSERTS": "0"}
    assert env_key(changed) != env_key(plain)


# -- code hash ---------------------------------------------------------------------------
DEPS = {
    "format": 1,
    "modules": {"m": "a" * 64},
    "files": {"d.json": "b" * 64},
    "distributions": {"lib": "1.0"},
    "absent": [],
}


def test_code_hash_covers_refs_spec_and_every_dependency():
    spec = {"mode": "default"}
    base = code_hash(["m:make"], spec, DEPS)
    assert code_hash(["m:make_other"], spec, DEPS) != base  # (a) another factory
    assert code_hash(["m:make"], {"mode": "max-autotune"}, DEPS) != base
    for kind, change in (
        ("modules", {"m": "c" * 64}),
        ("files", {"d.json": "c" * 64}),
        ("distributions", {"lib": "1.1"}),
    ):
        assert code_hash(["m:make"], spec, {**DEPS, kind: change}) != base, kind
    assert code_hash(["m:make"], spec, {**DEPS, "absent": ["fancy"]}) != base
    assert code_hash(["m:make"], spec, {**DEPS, "format": 9}) == base  # bookkeeping only


# -- recording (the worker's side) -------------------------------------------------------
def write_dist(site: Path, name: str, version: str, body: str) -> None:
    for old in site.glob(f"{name}-*.dist-info"):
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    (site / name).mkdir(parents=True, exist_ok=True)
    (site / name / "__init__.py").write_text(body)
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text(f"{name}/__init__.py,,\n{info.name}/METADATA,,\n")


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project (pkg.sub.mod imports a sibling module, reads a data file, imports an
    installed distribution and tries an absent one), a site dir beside it."""
    root, site = tmp_path / "project", tmp_path / "site"
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "sub" / "__init__.py").write_text("")
    (root / "pkg" / "sub" / "mod.py").write_text(
        textwrap.dedent("""
        import json
        from pathlib import Path

        import gkkeydep
        import gkkeyhelp
        try:
            import gk_not_installed_anywhere
        except ImportError:
            gk_not_installed_anywhere = None

        def make():
            with open(Path(__file__).parents[2] / "out.log", "w") as f:
                f.write("written, so not a dependency")
            return json.loads((Path(__file__).parents[2] / "dims.json").read_text())
    """)
    )
    (root / "gkkeyhelp.py").write_text("X = 1\n")
    (root / "dims.json").write_text('{"hidden": 32}\n')
    write_dist(site, "gkkeydep", "1.0", "Y = 2\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(root))
    names = ("pkg", "pkg.sub", "pkg.sub.mod", "gkkeyhelp", "gkkeydep")
    yield root, site
    for name in names:
        sys.modules.pop(name, None)
    wdeps._dist_index.cache_clear()


def record(root: Path) -> dict:
    with wdeps.recording(root) as rec:
        mod = importlib.import_module("pkg.sub.mod")
        mod.make()
    rec.note(refs=["pkg.sub.mod:make"])
    return rec.finish()


def test_recorder_names_what_the_build_used(project):
    root, _ = project
    deps = record(root)
    assert set(deps["modules"]) == {"pkg", "pkg.sub", "pkg.sub.mod", "gkkeyhelp"}
    assert deps["files"] == {"dims.json": wdeps.sha256_file(root / "dims.json")}
    assert deps["distributions"] == {"gkkeydep": "1.0"}
    assert deps["absent"] == ["gk_not_installed_anywhere"]
    assert not any("json" in m for m in deps["modules"])  # the interpreter's library


def test_recorder_counts_factory_modules_loaded_before(project):
    root, _ = project
    importlib.import_module("pkg.sub.mod")  # already imported when the build starts
    with wdeps.recording(root) as rec:
        pass
    rec.note(refs=["pkg.sub.mod:make"])
    assert "pkg.sub.mod" in rec.finish()["modules"]


# -- re-checking (the parent's side, no import) ------------------------------------------
def test_resolve_matches_then_names_each_change(project):
    root, site = project
    deps = record(root)
    assert key.resolve_deps(deps, root) | {"format": 1} == deps
    cases = [
        (lambda: (root / "gkkeyhelp.py").write_text("X = 2\n"), "module gkkeyhelp changed"),
        (lambda: (root / "dims.json").write_text('{"hidden": 48}\n'), "file dims.json changed"),
        (lambda: write_dist(site, "gkkeydep", "1.1", "Y = 2\n"), "distribution gkkeydep changed"),
        (
            lambda: (root / "gk_not_installed_anywhere.py").write_text(""),
            "module gk_not_installed_anywhere is importable now",
        ),
    ]
    for change, expected in cases:
        change()
        current = key.resolve_deps(deps, root)
        assert key.first_difference(deps, current) == expected
        deps = {
            **deps,
            **{k: v for k, v in current.items() if k != "absent"},
            "absent": deps["absent"],
        }
        if "importable" in expected:
            break


def test_locate_reads_the_given_checkout_not_sys_modules(tmp_path):
    """Paired mode: the base's dotted module from the base checkout even when the
    head's package is imported, and without running any package's __init__."""
    head, base = tmp_path / "head", tmp_path / "base"
    for root in (head, base):
        (root / "gkdot" / "sub").mkdir(parents=True)
        (root / "gkdot" / "sub" / "mod.py").write_text(f"WHERE = {root.name!r}\n")
        (root / "gkdot" / "sub" / "__init__.py").write_text("")
    (head / "gkdot" / "__init__.py").write_text("")
    (base / "gkdot" / "__init__.py").write_text("raise RuntimeError('never imported')\n")
    sys.path.insert(0, str(head))
    try:
        importlib.import_module("gkdot.sub.mod")
        found, path = wdeps.locate("gkdot.sub.mod", wdeps.search_path(base))
        assert found and Path(path) == base / "gkdot" / "sub" / "mod.py"
        found, path = wdeps.locate("gkdot.sub.mod", wdeps.search_path(head))
        assert Path(path) == head / "gkdot" / "sub" / "mod.py"
        assert wdeps.locate("gkdot.nope", wdeps.search_path(base)) == (False, None)
    finally:
        sys.path.remove(str(head))
        for name in ("gkdot", "gkdot.sub", "gkdot.sub.mod"):
            sys.modules.pop(name, None)


def test_other_version_swaps_sibling_modules_a_recorded_build_imported(tmp_path):
    from gatekeeper.worker import model as wmodel

    head, base = tmp_path / "head", tmp_path / "base"
    for root, value in ((head, "head"), (base, "base")):
        (root / "gkswap2").mkdir(parents=True)
        (root / "gkswap2" / "__init__.py").write_text("import gkside\nWHERE = gkside.V\n")
        (root / "gkside.py").write_text(f"V = {value!r}\n")
    sys.path.insert(0, str(head))
    try:
        with wdeps.recording(head) as rec:
            importlib.import_module("gkswap2")
        wmodel._user_modules.update(rec.finish()["modules"])
        with wmodel.other_version(base, ["gkswap2.models"]):
            assert importlib.import_module("gkswap2").WHERE == "base"
        assert sys.modules["gkswap2"].WHERE == "head" and sys.modules["gkside"].V == "head"
    finally:
        sys.path.remove(str(head))
        wmodel._user_modules.difference_update({"gkswap2", "gkside"})
        for name in ("gkswap2", "gkside"):
            sys.modules.pop(name, None)


# -- finding this checkout's bundle --------------------------------------------------------
def make_key(root: Path, refs=("pkg.sub.mod:make",)) -> CacheKey:
    return CacheKey(TARGET, "env-1", "cpu", dict(OLD_FACTS), {"mode": "default"}, list(refs), root)


def publish(
    store: Store,
    tmp: Path,
    k: CacheKey,
    *,
    deps: dict | None,
    code: str | None = None,
    where: str | None = None,
) -> BundleLocation:
    cache = tmp / "cache"
    (cache / "fx").mkdir(parents=True, exist_ok=True)
    (cache / "fx" / "entry").write_text(str(deps) + str(code))
    kd = (
        k.with_deps(deps).as_dict()
        if deps is not None
        else {**k.as_dict(), "code_hash": code, "files": {"x.py": "0" * 64}, "deps": None}
    )
    if deps is None:
        kd.pop("deps")
    archive, manifest = bundle.pack(
        cache,
        None,
        tmp,
        target=TARGET,
        key=kd,
        compile_info={},
        creator={},
        version="0",
        signing_key=None,
    )
    loc = BundleLocation(TARGET, k.env_key, where or kd["code_hash"])
    assert store.publish_bundle(loc, archive, archive.name, manifest.to_bytes()) == "published"
    return loc


def test_find_hit_partial_old_format_and_moved_manifest(project, tmp_path, gk_logs):
    root, _ = project
    store = Store(LocalBackend(tmp_path / "store"))
    k = make_key(root)
    assert find_bundle(store, k, signing_key=None) == (
        None,
        "no bundle for this target and environment",
    )
    deps = record(root)
    old = publish(store, tmp_path / "a", k, deps=None, code="0ld0ld0ld0ld0ld0")
    match, _ = find_bundle(store, k, signing_key=None)
    assert match.status == "partial" and match.location == old  # never a hit

    hit = publish(store, tmp_path / "b", k, deps=deps)
    match, _ = find_bundle(store, k, signing_key=None)
    assert (match.status, match.location) == ("hit", hit)
    assert match.key.code_hash == hit.code_hash == k.with_deps(deps).code_hash
    # another factory of the same module: not this bundle
    match, _ = find_bundle(store, make_key(root, ["pkg.sub.mod:other"]), signing_key=None)
    assert match.status == "partial"
    # a data file changes: partial (the newest bundle), not hit
    (root / "dims.json").write_text('{"hidden": 64}\n')
    match, _ = find_bundle(store, k, signing_key=None)
    assert match.status == "partial" and match.location == hit
    (root / "dims.json").write_text('{"hidden": 32}\n')

    # a manifest copied under another code hash is refused with one warning
    moved = publish(store, tmp_path / "c", k, deps=deps, where="feedfacefeedface")
    gk_logs.clear()
    match, _ = find_bundle(store, k, signing_key=None)
    assert match.location == hit
    (warning,) = [r.getMessage() for r in gk_logs.records]
    assert "refused" in warning and moved.code_hash in warning


def test_settle_calls_a_hit_whose_graphs_all_miss_stale():
    assert settle("hit", {"fxgraph_cache_hit": 0, "fxgraph_cache_miss": 2}) == "stale"
    assert settle("hit", {"fxgraph_cache_hit": 1, "fxgraph_cache_miss": 1}) == "hit"
    assert settle("hit", {"fxgraph_cache_hit": 0, "fxgraph_cache_miss": 0}) == "hit"
    assert settle("partial", {"fxgraph_cache_hit": 0, "fxgraph_cache_miss": 2}) == "partial"
    assert settle("miss", None) == "miss"


def test_results_and_action_output_know_stale(tmp_path, monkeypatch):
    from gatekeeper.github.announce import announce_warm
    from gatekeeper.results import CompileStats

    assert CompileStats(seconds=1.0, warm=True, cache="stale").cache == "stale"
    out = tmp_path / "out"
    monkeypatch.setenv("GITHUB_OUTPUT", str(out))
    announce_warm(["hit", "stale"])
    assert "cache-hit" in out.read_text() and "true" not in out.read_text()


@pytest.mark.parametrize(
    "bad", [[], {"modules": []}, {"modules": {"m": 1}}, {"absent": "x"}, {"files": {"f": None}}]
)
def test_malformed_recorded_dependencies_are_partial_not_a_crash(project, tmp_path, bad):
    root, _ = project
    store = Store(LocalBackend(tmp_path / "store"))
    k = make_key(root)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "entry").write_text("x")
    kd = {**k.as_dict(), "code_hash": "badbadbadbadbad0", "deps": bad}
    archive, manifest = bundle.pack(
        cache,
        None,
        tmp_path,
        target=TARGET,
        key=kd,
        compile_info={},
        creator={},
        version="0",
        signing_key=None,
    )
    store.publish_bundle(
        BundleLocation(TARGET, k.env_key, "badbadbadbadbad0"),
        archive,
        archive.name,
        manifest.to_bytes(),
    )
    match, _ = find_bundle(store, k, signing_key=None)
    assert match.status == "partial" and "malformed" in match.why


# -- tasks, precisions, dynamic (issue 12) ---------------------------------------------------
def test_compile_spec_has_task_precision_and_no_shapes_when_dynamic():
    import json

    from gatekeeper.config import Config
    from gatekeeper.key import compile_spec
    from gatekeeper.project import expand

    m = {
        "name": "m",
        "factory": "mod:make",
        "inputs": [{"shape": ["batch", 4]}],
        "shapes": [{"batch": 2}, {"batch": 8}],
    }
    plain = expand(Config.model_validate({"models": [m]}))
    variants = expand(
        Config.model_validate(
            {"models": [{**m, "tasks": ["infer", "train"], "precisions": ["fp32", "bf16"]}]}
        )
    )
    # inference float32: the spec (so the code hash) of stores from before is unchanged
    assert compile_spec(variants[0]) == compile_spec(plain[0])
    assert "task" not in compile_spec(plain[0]) and "precision" not in compile_spec(plain[0])
    specs = [compile_spec(t) for t in variants[:4]]
    assert len({json.dumps(s, sort_keys=True) for s in specs}) == 4  # no two collide
    assert specs[3]["task"] == "train" and specs[3]["precision"] == "bf16"
    assert specs[3]["train"]["optimizer"] == "AdamW"
    dyn = expand(Config.model_validate({"models": [{**m, "dynamic": True}]}))
    assert compile_spec(dyn[0]) == compile_spec(dyn[1])  # one key for every shape set
    assert compile_spec(dyn[0])["inputs"][0]["shape"] == ["batch", 4]


def test_compile_spec_adds_call_function_and_keyword_inputs_only_when_used():
    from gatekeeper.config import ModelConfig
    from gatekeeper.targets import Target

    def spec(**model):
        m = ModelConfig.model_validate({"name": "m", "shapes": [{"batch": 2}], **model})
        return key.compile_spec(Target(m, (("batch", 2),), "default", False))

    positional = spec(factory="a:b", inputs=[{"shape": ["batch", 4]}])
    # a positional config's spec is what it always was: its stored bundles still hit
    assert positional["inputs"] == [
        {"shape": [2, 4], "stride": [4, 1], "dtype": "float32", "low": None, "high": None}
    ]
    assert "call" not in positional and "function" not in positional
    named = spec(factory="a:b", inputs={"x": {"shape": ["batch", 4]}, "use_cache": False})
    assert named["inputs"] == {"x": positional["inputs"][0], "use_cache": {"value": False}}
    assert spec(factory="a:b", call="encode", inputs=[{"shape": ["batch", 4]}])["call"] == "encode"
    fn = spec(function="a:c", inputs=[{"shape": ["batch", 4]}])
    assert fn["function"] == "a:c"
    assert key.refs_of(ModelConfig(name="m", function="a:c", inputs=[])) == ["a:c"]


def test_strategy_is_in_the_spec_and_whole_keeps_the_old_one():
    import json

    from gatekeeper.config import Config
    from gatekeeper.key import compile_spec
    from gatekeeper.project import expand

    m = {"name": "m", "factory": "mod:make", "inputs": [{"shape": ["batch", 4]}]}
    m["shapes"] = [{"batch": 2}]
    (plain,) = expand(Config.model_validate({"models": [m]}))
    whole, regional, aot = expand(
        Config.model_validate({"models": [{**m, "strategies": ["whole", "regional", "aot"]}]})
    )
    assert compile_spec(whole) == compile_spec(plain)  # today's keys and stores unchanged
    assert compile_spec(regional)["strategy"] == "regional"
    assert compile_spec(aot)["export"] == {"strict": False, "weights": "auto"}
    named = expand(
        Config.model_validate(
            {"models": [{**m, "strategies": ["regional", "aot"], "regions": ["layers.*"]}]}
        )
    )
    strict = expand(
        Config.model_validate(
            {"models": [{**m, "strategies": ["aot"], "export": {"strict": True}}]}
        )
    )
    specs = [compile_spec(t) for t in (whole, regional, aot, named[0], strict[0])]
    assert len({json.dumps(s, sort_keys=True) for s in specs}) == 5  # each its own key


# -- generation (issue 50) -------------------------------------------------------------------
def test_generate_is_in_the_spec_and_infer_keeps_its_key():
    import json

    from gatekeeper.config import Config
    from gatekeeper.key import compile_spec
    from gatekeeper.project import definition, expand

    m = {
        "name": "lm",
        "factory": "mod:make",
        "inputs": {"input_ids": {"shape": [1, 32], "dtype": "int64", "high": 2048}},
    }
    plain = compile_spec(expand(Config.model_validate({"models": [m]}))[0])
    both = expand(Config.model_validate({"models": [{**m, "tasks": ["infer", "generate"]}]}))
    assert compile_spec(both[0]) == plain  # the infer target's key is what it was
    gen = compile_spec(both[1])
    assert gen["task"] == "generate" and "train" not in gen
    assert gen["generate"] == {"new_tokens": 16, "cache": "static"}
    longer = {**m, "tasks": ["generate"], "generate": {"new_tokens": 32}}
    other = compile_spec(expand(Config.model_validate({"models": [longer]}))[0])
    assert json.dumps(other, sort_keys=True) != json.dumps(gen, sort_keys=True)
    assert "generate" not in definition(both[0]) and "generate" in definition(both[1])
