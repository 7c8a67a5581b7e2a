"""Faults degrade and leave nothing behind, on both backends (a local directory and S3 on
moto's server): a store pruned while it is listed or verified, writes that fail for
lack of space, and the orphans a killed or failed publish leaves for verify and prune.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from support.stores import StoreFactory, keys, make_bundle, publish

from gatekeeper.store import maintenance
from gatekeeper.store.local import LocalBackend

GRACE = maintenance.ORPHAN_GRACE_S


def later() -> float:
    return time.time() + GRACE + 3600


def failed(findings: list[maintenance.Finding]) -> dict[str, str]:
    return {f.key: f.detail for f in findings if not f.ok}


# -- a store that changes while it is read -----------------------------------------------


def test_listing_while_another_process_prunes(stores: StoreFactory, tmp_path: Path):
    """The listing has begun (a folder read, its first file seen) when a prune in
    another client deletes every bundle; the listing goes on without what vanished."""
    store = stores()
    for i in range(4):
        publish(store, tmp_path, f"b{i}", code_hash=f"{i:016x}")
    listing = store.backend.list("bundles/")
    first = next(listing)
    pruned = maintenance.prune(stores(), keep=None, older_than_days=0, now=later())
    assert len(pruned) == 8
    rest = list(listing)  # used to raise FileNotFoundError on the local backend
    assert first.key in pruned and {i.key for i in rest} <= set(pruned)
    assert list(store.backend.list("bundles/")) == []


def test_verify_while_another_process_prunes(stores: StoreFactory, tmp_path: Path):
    """verify lists the bundles, then a prune deletes two of them before verify reads
    them: they are gone, not broken."""
    store = stores()
    locs = [publish(store, tmp_path, f"v{i}", code_hash=f"{i:016x}") for i in range(3)]
    bundles = store.bundles

    def listed_then_pruned() -> Any:
        listed = list(bundles())
        gone = maintenance.prune(stores(), keep=1, older_than_days=None)
        assert len(gone) == 4
        return iter(listed)

    store.bundles = listed_then_pruned  # type: ignore[method-assign]
    findings = maintenance.verify(store, None)
    assert failed(findings) == {}
    assert len([f for f in findings if f.ok]) == 1
    assert sum(loc.prefix in {f.key for f in findings} for loc in locs) == 1


# -- orphans ------------------------------------------------------------------------------------


def test_orphans_are_reported_by_verify_and_removed_by_prune(stores: StoreFactory, tmp_path: Path):
    """An archive that no manifest names (a bundle re-published in place, a race's loser
    that died before cleaning up) and, on a local store, the temporary files of killed
    writes: invisible to readers, reported and removed once past the grace."""
    store = stores()
    loc = publish(store, tmp_path, "kept")
    _, stray, _ = make_bundle(tmp_path, "stray")  # same target, env and code: same folder
    store.write(loc.key(stray.name), stray)
    orphans = {loc.key(stray.name)}
    if stores.kind == "local":
        root = Path(stores.root)
        for name in (".tmp-k1l2m3", "bundle-0000.tar.zst.part"):
            (root / loc.prefix / name).write_bytes(b"half a write")
            orphans.add(f"{loc.prefix}/{name}")
        assert {i.key for i in store.backend.temporaries()} == orphans - {loc.key(stray.name)}
        assert not any(".tmp-" in k or k.endswith(".part") for k in keys(store))

    assert failed(maintenance.verify(store, None)) == {}  # may still be publishes in progress
    assert maintenance.prune(store, keep=5, older_than_days=None) == []
    found = failed(maintenance.verify(store, None, now=later()))
    assert set(found) == orphans
    assert "no manifest names it" in found[loc.key(stray.name)]
    assert sorted(
        maintenance.prune(store, keep=5, older_than_days=None, now=later(), dry_run=True)
    ) == sorted(orphans)
    assert sorted(maintenance.prune(store, keep=5, older_than_days=None, now=later())) == sorted(
        orphans
    )
    assert failed(maintenance.verify(store, None, now=later())) == {}
    assert store.read_manifest(loc) is not None
    if stores.kind == "local":
        assert list(store.backend.temporaries()) == []


# -- writes that fail for lack of space ------------------------------------------------------

_WRITE = textwrap.dedent("""
    import resource, signal, sys
    from pathlib import Path
    from gatekeeper.errors import StoreError
    from gatekeeper.store.local import LocalBackend

    root, src, how = sys.argv[1:4]
    backend = LocalBackend(root)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))  # the disk is "full"
    try:
        if how == "put":
            backend.put("baselines/t/latest.json", Path(src).read_bytes())
        else:
            backend.upload("bundles/t/bundle.tar.zst", Path(src), if_none_match=True)
    except StoreError as e:
        print(e)
        sys.exit(3)
""")


@pytest.mark.parametrize("how", ["put", "upload"])
def test_local_write_that_runs_out_of_space(how: str, tmp_path: Path):
    """In a process whose files may not grow past 64 KiB (RLIMIT_FSIZE: the kernel
    refuses with EFBIG, as a full disk refuses with ENOSPC), a 200 KB write fails with one
    line naming the object's path and leaves no temporary file."""
    root, src = tmp_path / "store", tmp_path / "big"
    src.write_bytes(os.urandom(200_000))
    proc = subprocess.run(
        [sys.executable, "-c", _WRITE, str(root), str(src), how],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    key = "baselines/t/latest.json" if how == "put" else "bundles/t/bundle.tar.zst"
    assert proc.stdout == f"cannot write {root}/{key}: File too large\n"
    assert [p.name for p in root.rglob("*") if p.is_file()] == []
    assert list(LocalBackend(root).list()) == []
