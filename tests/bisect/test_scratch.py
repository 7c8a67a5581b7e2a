"""bisect's scratch store: bundles it compiles stay out of the store, and the bundle a
compile is seeded from is its nearest neighbour's (no compile here)."""

from __future__ import annotations

import os
from pathlib import Path

from gatekeeper.bisect.measure import ScratchStore
from gatekeeper.store import open_store
from gatekeeper.store.layout import BundleLocation


def publish(store, code: str, tmp_path: Path, when: int) -> None:
    archive = tmp_path / f"bundle-{code}.tar.zst"
    archive.write_bytes(code.encode())
    loc = BundleLocation("m/s/v", "env", code)
    assert store.publish_bundle(loc, archive, archive.name, b"{}") == "published"
    manifest = Path(store.backend.upper.root if hasattr(store.backend, "upper") else store.uri)
    manifest = manifest / loc.key("manifest.json")
    os.utime(manifest, (when, when))  # "newest" by a clock of its own


def test_the_nearest_commits_bundle_is_listed_first(tmp_path: Path):
    store = open_store(str(tmp_path / "store"))
    publish(store, "stored", tmp_path, 1_000)
    scratch = ScratchStore.over(store, tmp_path / "scratch")
    for when, code in enumerate(("far", "near", "newest"), 2_000):
        publish(scratch, code, tmp_path, when)
    codes = lambda: [loc.code_hash for loc in scratch.manifests("m/s/v", "env")]  # noqa: E731
    assert codes() == ["newest", "near", "far", "stored"]  # no preference: newest first
    scratch.prefer = ["near", "far"]
    assert codes() == ["near", "far", "newest", "stored"]
    scratch.prefer = ["stored"]
    assert codes()[0] == "stored"
    # what bisect compiled stays in its scratch folder
    assert [loc.code_hash for loc in store.manifests("m/s/v", "env")] == ["stored"]
