"""Looking after a store: ``verify`` re-hashes what is stored, ``prune`` drops what is
not needed.

Prune never deletes a bundle or reference outputs that a baseline points to. Both see
the orphans a failed or killed publish leaves, once they are older than
``ORPHAN_GRACE_S`` (until then they may be a publish in progress): temporary files
(``.tmp-*``, ``*.part``; local stores), archives that no manifest names, and reference
outputs that no baseline names. ``verify`` reports them, ``prune`` deletes them. Both
tolerate a store that changes while they run: what vanished meanwhile is skipped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from .. import bundle
from ..errors import BundleError, ObjectTooLarge, StoreError
from ..hashing import sha256_bytes
from ..results import Baseline
from ..scratch import scratch_dir
from . import baselines
from .base import ObjectInfo
from .layout import (
    MANIFEST,
    MAX_MANIFEST_BYTES,
    BundleLocation,
    Store,
    StoredBundle,
    bundle_target,
)

ORPHAN_GRACE_S = 24 * 3600  # an orphan this young may still be a publish in progress


@dataclass
class Finding:
    key: str
    ok: bool
    detail: str = ""

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _orphan_detail(named: str) -> str:
    return f"orphan: no manifest names it (the manifest names {named})"


def _temporaries(store: Store, now: float) -> list[ObjectInfo]:
    return [i for i in store.backend.temporaries() if now - i.modified > ORPHAN_GRACE_S]


_TEMPORARY = "temporary file of an interrupted write"


def _verify_bundle(
    store: Store, b: StoredBundle, tmp: Path, signing_key: bytes | None, now: float
) -> list[Finding]:
    loc = b.location
    try:
        got = store.read(loc.key(MANIFEST), max_bytes=MAX_MANIFEST_BYTES)
    except ObjectTooLarge as e:
        return [Finding(loc.prefix, False, str(e))]
    if got is None:
        if b.complete:
            return []  # deleted since it was listed (a prune running meanwhile)
        return [Finding(loc.prefix, False, "no manifest (unpublished leftover)")]
    try:
        manifest = bundle.verify_manifest(got[0], target=loc.target_id, signing_key=signing_key)
        if (manifest.env_key, manifest.code_hash) != (loc.env_key, loc.code_hash):
            raise BundleError(
                f"{loc.target_id}: manifest is for {manifest.env_key}/"
                f"{manifest.code_hash}, stored under {loc.env_key}/{loc.code_hash}"
            )
        archive = tmp / manifest.archive.name
        try:
            store.download(loc.key(manifest.archive.name), archive, max_bytes=manifest.archive.size)
        except StoreError:
            if store.backend.head(loc.key(MANIFEST)) is None:
                return []  # pruned while we looked
            raise
        staging = tmp / "staging"
        bundle.extract(archive, manifest, staging)  # re-hashes the archive and every member
    except (BundleError, StoreError) as e:
        return [Finding(loc.prefix, False, str(e))]
    finally:
        for p in sorted(tmp.rglob("*"), reverse=True):
            p.unlink() if p.is_file() else p.rmdir()
    name = manifest.archive.name
    return [Finding(loc.prefix, True, f"{len(manifest.files)} files")] + [
        Finding(i.key, False, _orphan_detail(name))
        for i in store.unnamed_archives(b)
        if now - i.modified > ORPHAN_GRACE_S
    ]


def _baselines(store: Store) -> list[tuple[str, Baseline | None]]:
    return list(baselines.documents(store))


def verify(store: Store, signing_key: bytes | None, *, now: float | None = None) -> list[Finding]:
    """Every bundle, baseline and reference outputs re-hashed; orphans past their grace
    reported. ``now`` (epoch seconds) is the time ages are measured from."""
    now = time.time() if now is None else now
    findings = []
    with scratch_dir("gk-verify-") as tmp:
        for b in store.bundles():
            findings += _verify_bundle(store, b, Path(tmp), signing_key, now)
    docs = _baselines(store)
    for key, doc in docs:
        if doc is None:
            findings.append(Finding(key, False, "not a valid baseline document"))
            continue
        ref = doc.result.reference
        if doc.reference_key and ref:
            try:
                got = store.read(doc.reference_key, max_bytes=ref.size)
            except ObjectTooLarge as e:
                findings.append(Finding(doc.reference_key, False, str(e)))
                continue
            if got is None:
                findings.append(Finding(doc.reference_key, False, f"missing (named by {key})"))
            elif sha256_bytes(got[0]) != ref.sha256:
                findings.append(Finding(doc.reference_key, False, "sha256 does not match"))
            elif key.endswith("latest.json"):
                findings.append(Finding(doc.reference_key, True, "reference outputs"))
        findings.append(Finding(key, True, "baseline"))
    named = {doc.reference_key for _, doc in docs if doc is not None and doc.reference_key}
    findings += [
        Finding(i.key, False, "orphan: reference outputs no baseline names")
        for i in baselines.outputs(store)
        if i.key not in named and now - i.modified > ORPHAN_GRACE_S
    ]
    findings += [Finding(i.key, False, _TEMPORARY) for i in _temporaries(store, now)]
    return findings


def protected(store: Store) -> tuple[set[str], set[str]]:
    """Bundle prefixes and object keys that some baseline points to."""
    bundles, keys = set(), set()
    for _, doc in _baselines(store):
        if doc is None:
            continue
        r = doc.result
        # a dynamic model's targets share one bundle, stored under <model>/dynamic/...
        bundles.add(BundleLocation(bundle_target(r.target), r.env_key, r.code_hash).prefix)
        if doc.reference_key:
            keys.add(doc.reference_key)
    return bundles, keys


def prune(
    store: Store,
    *,
    keep: int | None,
    older_than_days: float | None,
    dry_run: bool = False,
    now: float | None = None,
) -> list[str]:
    """Delete bundles beyond the newest ``keep`` per target and env, and/or older than
    ``older_than_days``; and, whatever the options, the orphans past their grace
    (temporary files, archives without a manifest or that no manifest names, reference
    outputs no baseline names). Returns the keys deleted (or that would be). ``now``
    (epoch seconds) is the time ages are measured from (default: the clock)."""
    now = time.time() if now is None else now
    keep_bundles, keep_keys = protected(store)
    doomed: list[str] = []
    groups: dict[tuple[str, str], list[StoredBundle]] = {}
    for b in store.bundles():
        if not b.complete:
            if now - b.modified > ORPHAN_GRACE_S:
                doomed += b.keys
            continue
        # an archive its manifest no longer names (replaced by `compile --force`)
        doomed += [o.key for o in store.unnamed_archives(b) if now - o.modified > ORPHAN_GRACE_S]
        groups.setdefault((b.location.target_id, b.location.env_key), []).append(b)
    for group in groups.values():
        group.sort(key=lambda b: b.modified, reverse=True)
        for rank, b in enumerate(group):
            too_many = keep is not None and rank >= keep
            too_old = older_than_days is not None and now - b.modified > older_than_days * 86400
            if (too_many or too_old) and b.location.prefix not in keep_bundles:
                # the manifest goes first, so a reader never finds a manifest without data
                doomed += sorted(
                    (k for k in b.keys if k not in doomed), key=lambda k: not k.endswith(MANIFEST)
                )
    # outputs are stored before the baseline that names them: unnamed ones may be
    # mid-publish, so they get the same grace as an archive without a manifest
    min_age = max((older_than_days or 0) * 86400, ORPHAN_GRACE_S)
    for info in baselines.outputs(store):
        if info.key not in keep_keys and now - info.modified > min_age:
            doomed.append(info.key)
    doomed += [i.key for i in _temporaries(store, now)]
    if dry_run:
        return doomed
    # what a read-only (or denied) store skipped was not deleted: Store counts it instead
    return [key for key in doomed if store.delete(key)]
