"""bisect's scratch store over a store: it reads both and writes only the scratch one
(the store under it is a real local store, whose files are compared before and after)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gatekeeper.errors import PreconditionFailed
from gatekeeper.store.layout import BundleLocation, Store
from gatekeeper.store.local import LocalBackend
from gatekeeper.store.overlay import OverlayBackend


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def stacked(tmp_path: Path) -> tuple[OverlayBackend, LocalBackend]:
    lower = LocalBackend(tmp_path / "store")
    lower.put("a/shared.json", b"lower")
    lower.put("a/only-below.json", b"below")
    return OverlayBackend(LocalBackend(tmp_path / "scratch"), lower), lower


def test_reads_see_both_and_the_scratch_store_wins(stacked, tmp_path: Path):
    over, lower = stacked
    over.put("a/shared.json", b"upper")
    over.put("a/only-above.json", b"above")
    assert over.get("a/shared.json")[0] == b"upper"
    assert over.get("a/only-below.json")[0] == b"below"
    assert over.head("a/only-below.json").size == 5
    assert over.download("a/only-below.json", tmp_path / "x") and (tmp_path / "x").read_bytes()
    listed = sorted((o.key, o.size) for o in over.list("a/"))
    assert listed == [("a/only-above.json", 5), ("a/only-below.json", 5), ("a/shared.json", 5)]
    assert lower.get("a/shared.json")[0] == b"lower"


def test_the_store_below_is_never_written(stacked, tmp_path: Path):
    over, lower = stacked
    before = files(tmp_path / "store")
    with pytest.raises(PreconditionFailed):  # create-only sees the store's object
        over.put("a/only-below.json", b"x", if_none_match=True)
    with pytest.raises(PreconditionFailed):
        over.put("a/only-below.json", b"x", if_match='"stale"')
    etag = lower.head("a/only-below.json").etag
    over.put("a/only-below.json", b"noted", if_match=etag)  # copied up, then changed
    assert over.get("a/only-below.json")[0] == b"noted"
    over.delete("a/shared.json")  # the scratch store has none: the store's stays
    assert over.get("a/shared.json")[0] == b"lower"
    assert files(tmp_path / "store") == before


def test_a_bundle_note_on_a_stored_bundle_goes_to_the_scratch_store(tmp_path: Path):
    """What check does to a bundle it verified (update_manifest): here, on a copy."""
    lower = Store(LocalBackend(tmp_path / "store"))
    loc = BundleLocation("m/s/v", "env", "code")
    archive = tmp_path / "bundle-1.tar.zst"
    archive.write_bytes(b"archive")
    assert lower.publish_bundle(loc, archive, archive.name, b"manifest") == "published"
    before = files(tmp_path / "store")
    over = Store(OverlayBackend(LocalBackend(tmp_path / "scratch"), lower.backend))
    assert over.has_bundle(loc) and over.manifests("m/s/v", "env") == [loc]
    assert over.update_manifest(loc, b"manifest", b"manifest, verified") == "updated"
    assert over.read_manifest(loc) == b"manifest, verified"
    assert lower.read_manifest(loc) == b"manifest" and files(tmp_path / "store") == before
