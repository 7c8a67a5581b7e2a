"""``warm`` leaves no precompile package it did not serve where torch looks for one.

torch finds a package by the compiled forward's name (``<cache dir>/dynamo/<key>``),
not by the code it was verified for. A deploy's cache dir keeps what the previous
deploy warmed; if this warm misses a target (its bundle is gone, or refused) and still
turns package loading on for the others, torch loads the stale package for the target
that missed: an unverified graph of older code (docs/precompile.md: a changed
module-level alias loads the old graph silently). Real bundles in a real local store,
real files in the cache dir; the packages themselves are synthetic (what torch would
load is shown by tests/e2e/test_precompile.py).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gatekeeper import bundle
from gatekeeper.key import target_key
from gatekeeper.project import expand, load_config
from gatekeeper.store import Store
from gatekeeper.store.local import LocalBackend
from gatekeeper.warm import cold, service_env, warm_targets

NO_DEPS = {"format": 1, "modules": {}, "files": {}, "distributions": {}, "absent": []}
CONFIG = textwrap.dedent("""
    [tool.gatekeeper]
    store = "store"

    [[tool.gatekeeper.models]]
    name = "a"
    factory = "models:make_a"
    inputs = [{ shape = [2, 4] }]

    [[tool.gatekeeper.models]]
    name = "b"
    factory = "models:make_b"
    inputs = [{ shape = [2, 4] }]
""")
PACKAGE = {"a": "dynamo/models.A.forward_7", "b": "dynamo/models.B.forward_12"}


@pytest.fixture
def deploy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    root = tmp_path / "project"
    root.mkdir()
    (root / "gatekeeper.toml").write_text(CONFIG)
    config = load_config(root / "gatekeeper.toml")
    targets = {t.model.name: t for t in expand(config)}
    store = Store(LocalBackend(root / "store"))
    cache = tmp_path / "service-cache"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    monkeypatch.delenv("GATEKEEPER_SIGNING_KEY", raising=False)
    return config, targets, store, cache, tmp_path


def _publish(store: Store, tmp: Path, config, target, name: str) -> None:
    """A hit for ``target`` whose bundle carries a verified package at PACKAGE[name]."""
    key = target_key(target, config.base_dir).with_deps(NO_DEPS)
    work = tmp / f"bundle-{name}"
    (work / "cache" / "fxgraph").mkdir(parents=True)
    (work / "cache" / "fxgraph" / "entry").write_text(f"graph of {name}")
    entry = work / "package-entry"
    entry.write_text(f"package of {name}, verified")
    archive, manifest = bundle.pack(
        work / "cache",
        None,
        work,
        target=key.target_id,
        key=key.as_dict(),
        compile_info={"precompile": {"status": "recorded", "verified": True}},
        creator={},
        version="test",
        signing_key=None,
        members={f"precompile/{PACKAGE[name]}/entry": entry},
    )
    loc = key.location()
    assert store.publish_bundle(loc, archive, archive.name, manifest.to_bytes()) == "published"


def _stale(cache: Path, entry: str) -> Path:
    path = cache / entry / "entry"
    path.parent.mkdir(parents=True)
    path.write_text("an earlier deploy's package, verified for older code")
    return path


def test_a_miss_removes_the_stale_package_and_keeps_packages_off(deploy) -> None:
    config, targets, store, cache, tmp = deploy
    _publish(store, tmp, config, targets["b"], "b")  # a's bundle is gone: a misses
    stale = _stale(cache, PACKAGE["a"])

    results = {r.target: r for r in warm_targets(list(targets.values()), config, store, cache)}
    assert results["a/fixed/default"].status == "miss"
    assert results["b/fixed/default"].status == "hit"
    assert not stale.exists()  # torch cannot find it, whatever the service sets
    assert service_env(list(results.values())) == {}  # and loading stays off
    assert results["b/fixed/default"].precompile == "installed"
    assert "a/fixed/default" in (results["b/fixed/default"].precompile_reason or "")
    assert (cache / PACKAGE["b"] / "entry").is_file()


def test_a_package_of_a_target_no_longer_warmed_is_removed(deploy) -> None:
    config, targets, store, cache, tmp = deploy
    for name in ("a", "b"):
        _publish(store, tmp, config, targets[name], name)
    removed_model = _stale(cache, "dynamo/models.Retired.forward_3")

    results = warm_targets(list(targets.values()), config, store, cache)
    assert [r.precompile for r in results] == ["served", "served"]
    assert service_env(results)  # every target served from its own: loading on
    assert not removed_model.exists()
    assert sorted(p.name for p in (cache / "dynamo").iterdir()) == sorted(
        p.split("/")[1] for p in PACKAGE.values()
    )


def test_a_result_reads_every_package_as_an_attribute(deploy) -> None:
    """``r.aot``, ``r.precompile_reason``: None for a package a result never met (a miss,
    a cold start); a name that is no package's stays an AttributeError. The record lives
    below the kinds (gatekeeper.warmed) and no longer asks them for the names: warm
    gives each result a state for every package."""
    config, targets, store, cache, tmp = deploy
    (miss,) = warm_targets([targets["a"]], config, store, cache)
    (cold_one,) = cold([targets["a"]], OSError("no store"))
    for r in (miss, cold_one):
        assert r.status == "miss" and r.aot is None and r.precompile_reason is None
        with pytest.raises(AttributeError):
            r.nonesuch  # noqa: B018
    assert not {"aot", "precompile", "aot_reason"} & set(miss.as_dict())
