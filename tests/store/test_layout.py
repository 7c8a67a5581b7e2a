"""Tests of gatekeeper.store.layout's Store over the local backend: publishing bundles
atomically, finding them (hit / partial / none), read-only mode and listing."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from pathlib import Path

import pytest
from support.helpers import run_threads

from gatekeeper.store import BundleLocation, Store, open_store
from gatekeeper.store.layout import MANIFEST
from gatekeeper.store.local import LocalBackend

TARGET = "mlp/b8/default"
ENV = "torch2.6.0+cpu-py3.11-cpu-x86_64-avx2-t2-3f9c1a"


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(LocalBackend(tmp_path / "store"))


@pytest.fixture
def gk_logs(caplog, monkeypatch):
    """caplog for gatekeeper.*, even after an in-process CLI run stopped propagation."""
    monkeypatch.setattr(logging.getLogger("gatekeeper"), "propagate", True)
    caplog.set_level(logging.WARNING, logger="gatekeeper")
    return caplog


def make_archive(tmp_path: Path, payload: bytes) -> tuple[Path, str, bytes]:
    """An archive file named by its hash, as bundle.pack names it, and its manifest."""
    digest = hashlib.sha256(payload).hexdigest()
    name = f"bundle-{digest[:16]}.tar.zst"
    path = tmp_path / "archives" / digest / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(payload)
    manifest = json.dumps(
        {"archive": {"name": name, "sha256": digest, "size": len(payload)}}
    ).encode()
    return path, name, manifest


def publish(store: Store, tmp_path: Path, loc: BundleLocation, payload: bytes) -> str:
    path, name, manifest = make_archive(tmp_path, payload)
    return store.publish_bundle(loc, path, name, manifest)


def files_under(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


# -- publish --------------------------------------------------------------------------------
def test_publish_then_exists(store, tmp_path):
    loc = BundleLocation(TARGET, ENV, "c0de")
    path, name, manifest = make_archive(tmp_path, b"archive bytes")
    assert store.publish_bundle(loc, path, name, manifest) == "published"
    assert store.has_bundle(loc)
    root = tmp_path / "store"
    prefix = f"bundles/{TARGET}/{ENV}/c0de"
    assert files_under(root / prefix) == sorted([MANIFEST, name])
    assert (root / prefix / name).read_bytes() == b"archive bytes"
    assert (root / prefix / MANIFEST).read_bytes() == manifest
    assert store.publish_bundle(loc, path, name, manifest) == "exists"
    # a second publisher with other bytes also finds it there, and leaves nothing behind
    assert publish(store, tmp_path, loc, b"other bytes") == "exists"
    assert files_under(root / prefix) == sorted([MANIFEST, name])
    assert not [p for p in root.rglob(".tmp-*")]


def test_publish_two_code_hashes_side_by_side(store, tmp_path):
    a, b = BundleLocation(TARGET, ENV, "aaaa"), BundleLocation(TARGET, ENV, "bbbb")
    assert publish(store, tmp_path, a, b"A") == "published"
    assert publish(store, tmp_path, b, b"B") == "published"
    assert store.has_bundle(a) and store.has_bundle(b)
    assert not store.has_bundle(BundleLocation(TARGET, ENV, "cccc"))


def test_download(store, tmp_path):
    loc = BundleLocation(TARGET, ENV, "c0de")
    path, name, manifest = make_archive(tmp_path, b"payload")
    store.publish_bundle(loc, path, name, manifest)
    dest = tmp_path / "dl" / name
    store.download(loc.key(name), dest, max_bytes=len(b"payload"))
    assert dest.read_bytes() == b"payload"
    from gatekeeper.errors import StoreError

    with pytest.raises(StoreError, match="missing"):
        store.download(loc.key("bundle-nope.tar.zst"), tmp_path / "dl" / "x", max_bytes=1)


# -- find -----------------------------------------------------------------------------------
def set_mtime(store: Store, loc: BundleLocation, t: float) -> None:
    p = Path(store.backend.root) / loc.prefix / MANIFEST  # type: ignore[attr-defined]
    os.utime(p, (t, t))


# -- read-only ------------------------------------------------------------------------------
def test_read_only_skips_writes_and_warns_once(tmp_path, gk_logs):
    root = tmp_path / "store"
    ro = Store(LocalBackend(root), read_only=True)
    for h in ("a", "b", "c"):
        assert publish(ro, tmp_path, BundleLocation(TARGET, ENV, h), b"x") == "skipped"
    assert len(ro.skipped_writes) == 3
    assert all(TARGET in w for w in ro.skipped_writes)
    warnings = [r for r in gk_logs.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "read-only" in warnings[0].getMessage()
    assert not root.exists() or files_under(root) == []
    # reads still work on a read-only store
    assert ro.read_manifest(BundleLocation(TARGET, ENV, "a")) is None


def test_read_only_store_still_reads(tmp_path):
    rw = Store(LocalBackend(tmp_path / "store"))
    loc = BundleLocation(TARGET, ENV, "c0de")
    publish(rw, tmp_path, loc, b"x")
    ro = open_store(str(tmp_path / "store"), read_only=True)
    assert ro.read_manifest(loc) is not None
    assert ro.skipped_writes == []


def test_read_only_existing_bundle_is_still_skipped(tmp_path):
    rw = Store(LocalBackend(tmp_path / "store"))
    loc = BundleLocation(TARGET, ENV, "c0de")
    publish(rw, tmp_path, loc, b"x")
    ro = Store(LocalBackend(tmp_path / "store"), read_only=True)
    assert publish(ro, tmp_path, loc, b"x") == "skipped"
    assert len(ro.skipped_writes) == 1


# -- racing publishers ----------------------------------------------------------------------
@pytest.mark.parametrize("round_", range(3))
def test_sixteen_racing_publishers_one_winner(tmp_path, round_):
    root = tmp_path / "store"
    loc = BundleLocation(TARGET, ENV, "c0de")
    n = 16
    archives = [
        make_archive(tmp_path, f"archive {i} of round {round_}".encode() * 500) for i in range(n)
    ]
    barrier = threading.Barrier(n)
    results: list[str | BaseException] = [""] * n

    def worker(i: int) -> None:
        store = Store(LocalBackend(root))  # each publisher its own store, like processes
        path, name, manifest = archives[i]
        barrier.wait()
        try:
            results[i] = store.publish_bundle(loc, path, name, manifest)
        except BaseException as e:  # reported by the assert below
            results[i] = e

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert sorted(map(str, results)) == ["exists"] * (n - 1) + ["published"]

    folder = root / loc.prefix
    left = sorted(p.name for p in folder.iterdir())
    archives_left = [x for x in left if x.endswith(".tar.zst")]
    assert len(archives_left) == 1, left
    assert left == sorted([MANIFEST, archives_left[0]])  # no temp files either
    manifest = json.loads((folder / MANIFEST).read_bytes())
    assert manifest["archive"]["name"] == archives_left[0]
    # the survivor is byte-identical to what its publisher packed
    winner = results.index("published")
    assert archives[winner][1] == archives_left[0]
    assert (folder / archives_left[0]).read_bytes() == archives[winner][0].read_bytes()


# -- listing --------------------------------------------------------------------------------
def test_bundles_lists_complete_and_incomplete(store, tmp_path):
    complete = BundleLocation(TARGET, ENV, "done")
    path, name, manifest = make_archive(tmp_path, b"complete archive")
    store.publish_bundle(complete, path, name, manifest)
    dyn = BundleLocation("block/b1-s32/default+dynamic", ENV, "dyn")
    publish(store, tmp_path, dyn, b"dynamic one")
    half = BundleLocation(TARGET, ENV, "half")
    store.backend.put(half.key("bundle-0123456789abcdef.tar.zst"), b"orphan")
    # baselines and stray objects are not bundles
    store.backend.put("baselines/mlp/b8/default/env/main/latest.json", b"{}")

    listed = {b.location: b for b in store.bundles()}
    assert set(listed) == {complete, dyn, half}
    c = listed[complete]
    assert c.complete
    assert c.keys == tuple(sorted([complete.key(MANIFEST), complete.key(name)]))
    assert c.size == len(b"complete archive") + len(manifest)
    assert c.modified > 0
    h = listed[half]
    assert not h.complete
    assert h.keys == (half.key("bundle-0123456789abcdef.tar.zst"),)
    assert h.size == len(b"orphan")
    assert listed[dyn].complete
    assert listed[dyn].location.target_id == "block/b1-s32/default+dynamic"


def test_bundles_of_an_empty_store(tmp_path):
    assert list(Store(LocalBackend(tmp_path / "nothing-here")).bundles()) == []


def test_location_keys():
    loc = BundleLocation(TARGET, ENV, "c0de")
    assert loc.prefix == f"bundles/{TARGET}/{ENV}/c0de"
    assert loc.key(MANIFEST) == f"bundles/{TARGET}/{ENV}/c0de/manifest.json"


# -- replacing (compile --force) ------------------------------------------------------------
def test_replace_swaps_the_manifest_and_leaves_the_old_archive(store, tmp_path):
    loc = BundleLocation(TARGET, ENV, "c0de")
    assert publish(store, tmp_path, loc, b"first") == "published"
    first = json.loads(store.read(loc.key(MANIFEST))[0])["archive"]["name"]
    path, name, manifest = make_archive(tmp_path, b"second")
    assert store.publish_bundle(loc, path, name, manifest) == "exists"
    assert store.publish_bundle(loc, path, name, manifest, replace=True) == "replaced"
    assert json.loads(store.read(loc.key(MANIFEST))[0])["archive"]["name"] == name
    assert store.backend.head(loc.key(first)) is not None  # a reader may still want it
    (b,) = store.bundles()
    assert [o.key for o in store.unnamed_archives(b)] == [loc.key(first)]
    # replacing where nothing was published is a plain publish
    other = BundleLocation(TARGET, ENV, "new")
    assert store.publish_bundle(other, path, name, manifest, replace=True) == "published"


def test_racing_replacers_each_swap_once_and_a_reader_never_misses(tmp_path):
    root = tmp_path / "store"
    loc = BundleLocation(TARGET, ENV, "c0de")
    first = Store(LocalBackend(root))
    publish(first, tmp_path, loc, b"original")
    n = 8
    archives = [make_archive(tmp_path, f"replacement {i}".encode() * 100) for i in range(n)]
    stop = threading.Event()
    misses: list[str] = []

    def reader() -> None:
        store = Store(LocalBackend(root))
        while not stop.is_set():
            got = store.read(loc.key(MANIFEST))
            name = json.loads(got[0])["archive"]["name"] if got else None
            if name is None or store.read(loc.key(name)) is None:
                misses.append(str(name))

    def replace(i: int) -> str:
        path, name, manifest = archives[i]
        return Store(LocalBackend(root)).publish_bundle(loc, path, name, manifest, replace=True)

    watcher = threading.Thread(target=reader)
    watcher.start()
    try:
        results = run_threads(n, replace)
    finally:
        stop.set()
        watcher.join(timeout=30)
    assert results == ["replaced"] * n and misses == []
    named = json.loads(first.read(loc.key(MANIFEST))[0])["archive"]["name"]
    assert named in {a[1] for a in archives}
    (b,) = first.bundles()
    assert len(first.unnamed_archives(b)) == n  # the original and n - 1 replaced ones


# -- update_manifest: a verdict added to a published bundle ------------------------------------
@pytest.fixture(params=["local", "s3"])
def any_store(request, tmp_path) -> Store:
    if request.param == "local":
        return Store(LocalBackend(tmp_path / "store"))
    return open_store(str(request.getfixturevalue("s3_bucket_uri")))


def test_update_manifest_swaps_only_the_manifest_it_read(any_store, tmp_path):
    loc = BundleLocation(TARGET, ENV, "c0de")
    assert publish(any_store, tmp_path, loc, b"archive") == "published"
    old = any_store.read_manifest(loc)
    assert any_store.update_manifest(loc, old, old + b" ") == "updated"
    assert any_store.read_manifest(loc) == old + b" "
    # written from a stale read (another writer moved it meanwhile): nothing is written
    assert any_store.update_manifest(loc, old, old + b"  ") == "changed"
    assert any_store.read_manifest(loc) == old + b" "
    # a bundle that is gone is not brought back by a verdict
    assert any_store.update_manifest(BundleLocation(TARGET, ENV, "gone"), old, old) == "changed"
    assert not any_store.has_bundle(BundleLocation(TARGET, ENV, "gone"))


def test_update_manifest_on_a_read_only_store_is_skipped(tmp_path):
    loc = BundleLocation(TARGET, ENV, "c0de")
    writable = Store(LocalBackend(tmp_path / "store"))
    publish(writable, tmp_path, loc, b"archive")
    old = writable.read_manifest(loc)
    ro = Store(LocalBackend(tmp_path / "store"), read_only=True)
    assert ro.update_manifest(loc, old, b"{}") == "skipped"
    assert ro.skipped_writes == [f"manifest {TARGET}"]
    assert writable.read_manifest(loc) == old
