"""What a store holds is untrusted: anyone who can write one object (a leaked write
credential, a tampered object) must not be able to stop a lookup, exhaust a reader's
memory, or make prune delete what a baseline needs. Both backends: a local directory
and S3 on moto's server (see docs/hardening.md).
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest
from support.factories import ENV as RESULT_ENV
from support.factories import make_baseline, make_result
from support.helpers import gk
from support.stores import StoreFactory, keys, make_bundle, publish

from gatekeeper import bundle, compile
from gatekeeper.errors import StoreError
from gatekeeper.key import CacheKey, find_bundle
from gatekeeper.store import BundleLocation, Store, baselines, maintenance
from gatekeeper.store.layout import MANIFEST
from gatekeeper.store.local import LocalBackend

SIGNING_KEY = b"sk-untrusted-store-tests"
# the documented caps (gatekeeper.store.layout): a manifest, a baseline
MAX_MANIFEST_BYTES = MAX_DOCUMENT_BYTES = 16 << 20
TARGET = "net/b4/default"
ENV_KEY = "torch2.13.0+cpu-py3.11-cpu-x86_64-avx2-t2-45b1e9"
# what a worker records for a model of nothing but torch, and for one whose module is gone
NO_DEPS = {"format": 1, "modules": {}, "files": {}, "distributions": {}, "absent": []}
GONE = {**NO_DEPS, "modules": {"gatekeeper_tests_gone_module": "0" * 64}}

# signatures that are not hmac-sha256:<64 lowercase hex>; the first one made
# hmac.compare_digest raise TypeError, which nothing caught
BAD_SIGNATURES = [
    "hmac-sha256:é",
    "hmac-sha256:" + "Z" * 64,
    "hmac-sha256:" + "a" * 63,
    "sha1:" + "a" * 40,
    12,
    ["hmac-sha256:" + "a" * 64],
]


def _key(root: Path) -> CacheKey:
    return CacheKey(TARGET, ENV_KEY, "cpu", {"torch": "2.13.0"}, {"mode": "default"}, ["m:f"], root)


def _publish_signed(store: Store, tmp: Path, k: CacheKey, deps: dict) -> BundleLocation:
    cache = tmp / "cache"
    (cache / "fx").mkdir(parents=True)
    (cache / "fx" / "entry").write_bytes(b"graph" * 100)
    kd = k.with_deps(deps).as_dict()
    archive, manifest = bundle.pack(
        cache,
        None,
        tmp,
        target=TARGET,
        key=kd,
        compile_info={},
        creator={},
        version="0",
        signing_key=SIGNING_KEY,
    )
    loc = BundleLocation(TARGET, k.env_key, kd["code_hash"])
    assert store.publish_bundle(loc, archive, archive.name, manifest.to_bytes()) == "published"
    return loc


def _forge(store: Store, valid: BundleLocation, code_hash: str, signature: object) -> str:
    """A copy of ``valid``'s manifest at ``code_hash`` with ``signature`` in it."""
    got = store.backend.get(valid.key(MANIFEST))
    assert got is not None
    doc = json.loads(got[0])
    doc["code_hash"] = doc["key"]["code_hash"] = code_hash
    doc["signature"] = signature
    key = BundleLocation(TARGET, valid.env_key, code_hash).key(MANIFEST)
    store.backend.put(key, json.dumps(doc).encode())
    return key


def test_a_malformed_signature_refuses_that_manifest_and_the_lookup_goes_on(
    stores: StoreFactory, tmp_path: Path
) -> None:
    store = stores()
    k = _key(tmp_path)
    # the valid bundle is another version's (partial): the lookup reads every manifest
    valid = _publish_signed(store, tmp_path / "valid", k, GONE)
    for n, signature in enumerate(BAD_SIGNATURES):
        _forge(store, valid, f"f0f0f0f0f0f0f0{n:02d}", signature)

    match, _ = find_bundle(store, k, signing_key=SIGNING_KEY)
    assert match is not None and (match.status, match.location) == ("partial", valid)
    # without a key the signature is not checked, but its form still is
    match, _ = find_bundle(store, k, signing_key=None)
    assert match is not None and match.location == valid

    # the manifest a later compile would publish is not blocked by a forged one
    os.environ["GATEKEEPER_SIGNING_KEY"] = SIGNING_KEY.decode()
    try:
        forged = BundleLocation(TARGET, ENV_KEY, "f0f0f0f0f0f0f000")
        assert compile._usable(store, forged) is False
        assert compile._usable(store, valid) is True
    finally:
        del os.environ["GATEKEEPER_SIGNING_KEY"]


def test_store_verify_reports_a_forged_manifest_instead_of_crashing(
    stores: StoreFactory, tmp_path: Path
) -> None:
    store = stores()
    valid = _publish_signed(store, tmp_path / "valid", _key(tmp_path), NO_DEPS)
    forged = _forge(store, valid, "f0f0f0f0f0f0f0f0", "hmac-sha256:é")

    proc = gk(
        "store",
        "verify",
        "--store",
        str(stores.root),
        "--json",
        cwd=tmp_path,
        env={"GATEKEEPER_SIGNING_KEY": SIGNING_KEY.decode()},
    )
    assert proc.returncode == 1, proc.stderr  # a failed verify, not "internal error" (2)
    assert "internal error" not in proc.stderr
    found = {o["key"]: o for o in json.loads(proc.stdout)["objects"]}
    assert found[valid.prefix]["ok"] is True
    refused = found[forged.rsplit("/", 1)[0]]
    assert refused["ok"] is False and "signature" in refused["detail"]


def test_prune_keeps_the_dynamic_bundle_a_baseline_points_to(
    stores: StoreFactory, tmp_path: Path
) -> None:
    """A dynamic model's targets (m/b1/default+dynamic, m/b2/...) share one bundle
    under m/dynamic/default+dynamic: prune must see that a baseline points to it."""
    store = stores()
    shared = publish(
        store, tmp_path, "kept", target="m/dynamic/default+dynamic", env_key=RESULT_ENV,
        code_hash="d1d1d1d1d1d1d1d1",
    )  # fmt: skip
    other = publish(
        store, tmp_path, "old", target="m/dynamic/default+dynamic", env_key=RESULT_ENV,
        code_hash="0ld00ld00ld00ld0",
    )  # fmt: skip
    for target in ("m/b1/default+dynamic", "m/b2/default+dynamic"):
        result = make_result(target, code_hash=shared.code_hash)
        key = baselines.BaselineKey(target, RESULT_ENV, "main")
        assert baselines.publish(store, key, make_baseline(result)) == "published"

    doomed = maintenance.prune(
        store, keep=None, older_than_days=0, dry_run=True, now=time.time() + 60
    )
    assert not [k for k in doomed if k.startswith(shared.prefix + "/")]
    assert [k for k in doomed if k.startswith(other.prefix + "/")]  # prune does prune

    maintenance.prune(store, keep=1, older_than_days=0, now=time.time() + 60)
    assert keys(store, shared.prefix + "/")  # still there for the next PR and deploy


def test_an_oversized_manifest_is_refused_unread_and_the_lookup_goes_on(
    stores: StoreFactory, tmp_path: Path
) -> None:
    store = stores()
    k = _key(tmp_path)
    valid = _publish_signed(store, tmp_path / "valid", k, GONE)
    huge = BundleLocation(TARGET, ENV_KEY, "b1b1b1b1b1b1b1b1")
    store.backend.put(huge.key(MANIFEST), b"{" + b" " * MAX_MANIFEST_BYTES + b"}")

    with pytest.raises(StoreError, match="refused unread"):
        store.read_manifest(huge)
    match, _ = find_bundle(store, k, signing_key=SIGNING_KEY)
    assert match is not None and match.location == valid
    findings = {f.key: f for f in maintenance.verify(store, SIGNING_KEY)}
    assert not findings[huge.prefix].ok and "refused unread" in findings[huge.prefix].detail
    assert findings[valid.prefix].ok


def test_an_oversized_baseline_is_refused_unread_and_can_be_replaced(
    stores: StoreFactory, tmp_path: Path
) -> None:
    store = stores()
    key = baselines.BaselineKey(TARGET, RESULT_ENV, "main")
    store.backend.put(key.latest, b"[" + b"0," * (MAX_DOCUMENT_BYTES // 2) + b"0]")

    with pytest.raises(StoreError, match="refused unread") as e:
        baselines.fetch(store, key)
    assert "\n" not in str(e.value)
    assert dict(baselines.documents(store)) == {key.latest: None}  # unreadable, skipped
    doc = make_baseline(make_result(TARGET))
    assert baselines.publish(store, key, doc) == "published"  # replaces it
    fetched = baselines.fetch(store, key)
    assert fetched is not None and fetched.created_at == doc.created_at


def test_a_download_larger_than_its_record_is_refused(stores: StoreFactory, tmp_path: Path) -> None:
    store = stores()
    loc, archive, _ = make_bundle(tmp_path, "big")
    key = loc.key(archive.name)
    store.backend.upload(key, archive)
    size = archive.stat().st_size
    dest = tmp_path / "down" / archive.name

    with pytest.raises(StoreError, match="refused"):
        store.download(key, dest, max_bytes=size - 1)
    assert not dest.exists() and not list(dest.parent.glob("*.part"))
    store.download(key, dest, max_bytes=size)
    assert dest.read_bytes() == archive.read_bytes()


def test_extraction_refuses_a_member_whose_size_is_not_the_manifests(tmp_path: Path) -> None:
    """The archive is what its manifest hashes, but a member is larger than the
    manifest says: refused before the member is read (its sha256 would match)."""
    _, archive, manifest_bytes = make_bundle(tmp_path, "sizes")
    manifest = bundle.verify_manifest(manifest_bytes, target="tiny/b4/default", signing_key=None)
    name = "cache/kernel.cpp"
    entry = manifest.files[name]
    lying = manifest.model_copy(
        update={
            "files": {
                **manifest.files,
                name: entry.model_copy(update={"size": entry.size - 100}),
            }
        }
    )
    staging = tmp_path / "staging"
    with pytest.raises(bundle.BundleError, match="bytes in the archive") as e:
        bundle.extract(archive, lying, staging)
    assert name in str(e.value)
    assert not staging.exists()


def test_local_store_objects_are_readable_as_the_umask_allows(tmp_path: Path) -> None:
    """A store shared by a CI user and a service's group: every object gets the mode
    any new file gets (0666 less the umask), not mkstemp's 0600."""
    for umask, mode in ((0o022, 0o644), (0o002, 0o664), (0o077, 0o600)):
        old = os.umask(umask)
        try:
            root = tmp_path / f"store-{umask:o}"
            store = Store(LocalBackend(root))
            loc = publish(store, tmp_path, f"perm{umask:o}")
            store.write("baselines/x/y/z/e/main/latest.json", b"{}")
            assert (
                store.update_manifest(loc, store.read_manifest(loc) or b"", b'{"n": 1}')
                == "updated"
            )
        finally:
            os.umask(old)
        objects = [p for p in root.rglob("*") if p.is_file() and ".locks" not in p.parts]
        assert len(objects) == 3  # archive, manifest (replaced), baseline
        assert {stat.S_IMODE(p.stat().st_mode) for p in objects} == {mode}, umask
