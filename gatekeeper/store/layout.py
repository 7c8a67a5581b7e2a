"""What lives where in a store, and the atomic moves that publish it.

Layout under the store's root (a local directory or ``s3://bucket/prefix``)::

    bundles/<target-id>/<env-key>/<code-hash>/bundle-<sha16>.tar.zst   (archive first)
    bundles/<target-id>/<env-key>/<code-hash>/manifest.json            (manifest last)
    baselines/<target-id>/<env-key>/<ref>/latest.json                  (compare-and-swap)
    baselines/<target-id>/<env-key>/<ref>/history/<stamp>-<commit>.json (append-only)

The archive's name carries its own content hash, so racing publishers never overwrite
each other's archive: the create-only write of ``manifest.json`` picks the one winner,
and a loser removes its own archive. Replacing a bundle (``compile --force``) uploads
the new archive first, then swaps the manifest in one compare-and-swap write (``If-Match``
on the old manifest's ETag; locally ``os.replace`` under the store's lock) and leaves the
old archive where it was: a reader that read the old manifest still finds its archive,
and ``store prune`` deletes an archive no manifest names once its grace has passed. The
store knows nothing of torch; it does not trust what it reads either — verification
happens in :mod:`gatekeeper.bundle`.
"""

from __future__ import annotations

import builtins
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import AccessDenied, ObjectTooLarge, PreconditionFailed, StoreError
from .base import Backend, ObjectInfo

log = logging.getLogger("gatekeeper.store")

MANIFEST = "manifest.json"
# The most a document read before it is verified may have: a manifest (every file of a
# cache dir with its sha256: about 150 bytes a file) and a baseline (every timing
# sample of one run). Anything larger is refused unread: a 3 GiB object must not be a
# MemoryError in a deploy.
MAX_MANIFEST_BYTES = 16 << 20
MAX_DOCUMENT_BYTES = 16 << 20
# bundles / model / shapes / variant / env-key / code-hash / file
_DEPTH = 7


@dataclass(frozen=True)
class BundleLocation:
    target_id: str
    env_key: str
    code_hash: str

    @property
    def prefix(self) -> str:
        return f"bundles/{self.target_id}/{self.env_key}/{self.code_hash}"

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}"


def bundle_target(target_id: str) -> str:
    """Where the bundle of the target ``target_id`` lives: its own id, or for a
    ``dynamic`` model (``+dynamic`` in its variant) ``<model>/dynamic/<variant>``, the
    one bundle all its shape sets share (:attr:`gatekeeper.targets.Target.bundle_id`)."""
    parts = target_id.split("/")
    if len(parts) == 3 and "dynamic" in parts[2].split("+")[1:]:
        return f"{parts[0]}/dynamic/{parts[2]}"
    return target_id


@dataclass(frozen=True)
class StoredBundle:
    location: BundleLocation
    size: int  # archive + manifest bytes
    modified: float
    complete: bool  # has a manifest (an archive without one is an unpublished leftover)
    keys: tuple[str, ...]
    objects: tuple[ObjectInfo, ...] = ()


@dataclass
class Store:
    backend: Backend
    read_only: bool = False
    skipped_writes: list[str] = field(default_factory=list)
    _said_read_only: bool = False

    @property
    def uri(self) -> str:
        return self.backend.uri

    # -- writes all pass through here, so read-only mode is one rule --------------------
    def _skip(self, what: str) -> None:
        self.skipped_writes.append(what)
        if not self._said_read_only:
            log.warning("store %s is read-only: writes are skipped", self.uri)
            self._said_read_only = True

    def _writing(self, what: str) -> bool:
        if self.read_only:
            self._skip(what)
            return False
        return True

    def _denied(self, what: str, err: AccessDenied) -> None:
        """A denied write turns the store read-only for the rest of the run."""
        log.warning("%s; treating store %s as read-only from now on", err, self.uri)
        self.read_only = True
        self._said_read_only = True
        self.skipped_writes.append(what)

    # -- plain objects, for layouts built elsewhere (baselines) ---------------------------
    def read(
        self, key: str, *, max_bytes: int | None = MAX_DOCUMENT_BYTES
    ) -> tuple[bytes, str] | None:
        """A document's bytes and ETag (None when absent); larger than ``max_bytes``:
        ObjectTooLarge, unread (``None``: no cap, for objects verified by their size)."""
        return self.backend.get(key, max_bytes=max_bytes)

    def write(
        self,
        key: str,
        data: bytes | Path,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str | None:
        """Write bytes (or upload a file); None when skipped by read-only mode."""
        if not self._writing(key):
            return None
        try:
            if isinstance(data, Path):
                return self.backend.upload(key, data, if_none_match=if_none_match)
            return self.backend.put(key, data, if_none_match=if_none_match, if_match=if_match)
        except AccessDenied as e:
            self._denied(key, e)
            return None

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        return self.backend.list(prefix)

    def delete(self, key: str) -> bool:
        """Delete one object; False when skipped by read-only mode."""
        if not self._writing(key):
            return False
        try:
            self.backend.delete(key)
        except AccessDenied as e:
            self._denied(key, e)
            return False
        return True

    # -- bundles -----------------------------------------------------------------------
    def publish_bundle(
        self,
        loc: BundleLocation,
        archive: Path,
        archive_name: str,
        manifest: bytes,
        *,
        replace: bool = False,
    ) -> str:
        """Publish atomically; returns ``published``, ``exists`` or ``skipped``, and with
        ``replace`` ``replaced`` where a manifest was there (its archive stays)."""
        what = f"bundle {loc.target_id}"
        if not self._writing(what):
            return "skipped"
        if not replace and self.has_bundle(loc):
            return "exists"
        try:
            try:
                self.backend.upload(loc.key(archive_name), archive, if_none_match=True)
            except PreconditionFailed:
                pass  # the same content is there already: its name is its hash
            if replace:
                return self._swap_manifest(loc, manifest)
            try:
                self.backend.put(loc.key(MANIFEST), manifest, if_none_match=True)
            except PreconditionFailed:
                self._drop_losing_archive(loc, archive_name)
                return "exists"
        except AccessDenied as e:
            self._denied(what, e)
            return "skipped"
        return "published"

    def _swap_manifest(self, loc: BundleLocation, manifest: bytes, attempts: int = 8) -> str:
        """Put ``manifest`` in place of whatever is there, in one conditional write."""
        for _ in range(attempts):
            # its ETag only: whatever is there (a forged manifest of any size) is replaced
            there = self.backend.head(loc.key(MANIFEST))
            try:
                if there is None:
                    self.backend.put(loc.key(MANIFEST), manifest, if_none_match=True)
                    return "published"
                self.backend.put(loc.key(MANIFEST), manifest, if_match=there.etag)
                return "replaced"
            except PreconditionFailed:
                continue  # another publisher moved it in between: read it again
        raise StoreError(
            f"{loc.prefix}/{MANIFEST} kept changing; gave up replacing it after {attempts} attempts"
        )

    def update_manifest(self, loc: BundleLocation, old: bytes, new: bytes) -> str:
        """Swap the manifest ``old`` for ``new`` (same archive: a note added to it, such
        as a verified precompile package) in one conditional write. ``updated``;
        ``changed`` when the manifest there is no longer ``old`` (replaced meanwhile:
        nothing is written); ``skipped`` on a read-only store."""
        what = f"manifest {loc.target_id}"
        if not self._writing(what):
            return "skipped"
        got = self.backend.get(loc.key(MANIFEST), max_bytes=MAX_MANIFEST_BYTES)
        if got is None or got[0] != old:
            return "changed"
        try:
            self.backend.put(loc.key(MANIFEST), new, if_match=got[1])
        except PreconditionFailed:
            return "changed"
        except AccessDenied as e:
            self._denied(what, e)
            return "skipped"
        return "updated"

    def _drop_losing_archive(self, loc: BundleLocation, archive_name: str) -> None:
        winner = self._archive_named(loc)
        if winner is None:
            return  # unreadable winner: leave the orphan for `store prune`
        if winner and winner != archive_name:
            self.backend.delete(loc.key(archive_name))

    def has_bundle(self, loc: BundleLocation) -> bool:
        return self.backend.head(loc.key(MANIFEST)) is not None

    def manifests(self, target_id: str, env_key: str) -> builtins.list[BundleLocation]:
        """Every published bundle of a target and env, newest manifest first."""
        found: builtins.list[ObjectInfo] = []
        for info in self.backend.list(f"bundles/{target_id}/{env_key}/"):
            parts = info.key.split("/")
            if parts[-1] == MANIFEST and len(parts) == _DEPTH:
                found.append(info)
        found.sort(key=lambda i: (i.modified, i.key), reverse=True)
        return [BundleLocation(target_id, env_key, i.key.split("/")[-2]) for i in found]

    def target_manifests(self, target_id: str) -> builtins.list[BundleLocation]:
        """Every published bundle of a target under any env key, newest manifest first
        (where a miss looks for the nearest: :mod:`gatekeeper.nearest`)."""
        found = [
            i
            for i in self.backend.list(f"bundles/{target_id}/")
            if i.key.split("/")[-1] == MANIFEST and len(i.key.split("/")) == _DEPTH
        ]
        found.sort(key=lambda i: (i.modified, i.key), reverse=True)
        return [BundleLocation(target_id, *i.key.split("/")[-3:-1]) for i in found]

    def read_manifest(self, loc: BundleLocation) -> bytes | None:
        """A manifest's bytes, unverified (hand them to bundle.verify_manifest)."""
        got = self.backend.get(loc.key(MANIFEST), max_bytes=MAX_MANIFEST_BYTES)
        return got[0] if got else None

    def unnamed_archives(self, b: StoredBundle) -> builtins.list[ObjectInfo]:
        """Archives in a published bundle's folder that its manifest does not name: left
        by a replace (or a lost race), orphans once past the grace a publish needs."""
        archives = [o for o in b.objects if o.key.rsplit("/", 1)[-1].startswith("bundle-")]
        if not b.complete or len(archives) < 2:
            return []
        named = self._archive_named(b.location)
        if named is None:
            return []  # unreadable: `store verify` reports it; prune guesses nothing
        return [o for o in archives if o.key.rsplit("/", 1)[-1] != named]

    def _archive_named(self, loc: BundleLocation) -> str | None:
        """The archive name the manifest at ``loc`` gives (unverified); None when there
        is none or it cannot be read as a manifest (too large, malformed)."""
        try:
            got = self.backend.get(loc.key(MANIFEST), max_bytes=MAX_MANIFEST_BYTES)
            name = json.loads(got[0])["archive"]["name"] if got else None
        except ObjectTooLarge:
            return None
        except (ValueError, KeyError, TypeError):
            return None
        return name if isinstance(name, str) else None

    def download(self, key: str, dest: Path, *, max_bytes: int) -> None:
        """The object into ``dest``; ``max_bytes`` (required: every download is read
        before it is verified): what its record says it has (an archive's manifest, a
        baseline's reference outputs), more is refused unread."""
        if not self.backend.download(key, dest, max_bytes=max_bytes):
            raise StoreError(f"{key} is missing from store {self.uri}")

    def bundles(self) -> Iterator[StoredBundle]:
        """Every bundle folder in the store, complete or not."""
        groups: dict[str, builtins.list[ObjectInfo]] = {}
        for info in self.backend.list("bundles/"):
            parts = info.key.split("/")
            if len(parts) == _DEPTH:
                groups.setdefault("/".join(parts[:6]), []).append(info)
        for prefix, infos in sorted(groups.items()):
            _, model, shapes, variant, env_key, code_hash = prefix.split("/")
            yield StoredBundle(
                BundleLocation(f"{model}/{shapes}/{variant}", env_key, code_hash),
                size=sum(i.size for i in infos),
                modified=max(i.modified for i in infos),
                complete=any(i.key.endswith("/" + MANIFEST) for i in infos),
                keys=tuple(sorted(i.key for i in infos)),
                objects=tuple(sorted(infos, key=lambda i: i.key)),
            )
