"""Bundles: a target's compile artifacts packed as one verified ``tar.zst``.

Archive members::

    cache/...        the whole inductor cache dir of the compile (C++ .so files, Triton
                     kernels, FX graph and AOTAutograd entries), minus its lock files
    megacache.bin    torch.compiler.save_cache_artifacts(), portable across cache paths
    <package>/...    each package's own members, under its name (``precompile/...``,
                     ``aot/model.pt2``); a deploy gets them only once ``check`` verified
                     the package (``compile.<package>.verified`` in the manifest): what
                     each holds and how it is installed is its kind's
                     (:mod:`gatekeeper.kinds.precompile`, :mod:`gatekeeper.kinds.aot`)

The manifest (JSON, stored beside the archive, never inside it) lists every member's
sha256 and size and the archive's own sha256; when a signing key is set it carries an
HMAC-SHA256 over everything else in it. Loading a bundle runs its code (pickles, shared
objects), so nothing is extracted before the manifest, the archive hash and then every
member verify, and nothing reaches the destination before the whole archive has.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import hmac
import json
import logging
import os
import re
import shutil
import tarfile
from pathlib import Path, PurePosixPath
from typing import Any

import zstandard
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from . import safefs
from .errors import BundleError, ConfigError
from .hashing import sha256_file
from .secrecy import secret

log = logging.getLogger("gatekeeper.bundle")

FORMAT = 1
MEGACACHE = "megacache.bin"
CACHE_PREFIX = "cache/"
SKIP_DIRS = {"locks"}
ARCHIVE_NAME = re.compile(
    r"bundle-[0-9a-f]{16}\.tar\.zst"
)  # inductor's lock files: meaningless in another process


SIGNATURE = r"^hmac-sha256:[0-9a-f]{64}$"
SHA256 = r"^[0-9a-f]{64}$"


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sha256: str = Field(pattern=SHA256)
    size: int = Field(ge=0)


class ArchiveEntry(FileEntry):
    name: str


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: int = FORMAT
    target: str
    env_key: str
    code_hash: str
    key: dict[str, Any]  # every component of the cache key (fingerprint.CacheKey.as_dict)
    files: dict[str, FileEntry]
    archive: ArchiveEntry
    compile: dict[str, Any]  # compile seconds, torch counters, graphs, graph breaks
    creator: dict[str, Any]
    created_at: str
    gatekeeper_version: str
    signature: str | None = Field(None, pattern=SIGNATURE)  # hmac-sha256:<64 hex>

    def signed_bytes(self) -> bytes:
        body = self.model_dump(exclude={"signature"})
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    def to_bytes(self) -> bytes:
        return json.dumps(self.model_dump(), indent=2, sort_keys=True).encode() + b"\n"


KEY_ENV = "GATEKEEPER_SIGNING_KEY"
REQUIRE_ENV = "GATEKEEPER_REQUIRE_SIGNATURE"  # the action's `require-signature` input


def signature_required(configured: bool = False) -> bool:
    """Whether only signed bundles may load: ``require_signature = true`` in the config,
    or ``GATEKEEPER_REQUIRE_SIGNATURE`` set to 1/true/yes (the action's input)."""
    flag = os.environ.get(REQUIRE_ENV, "").strip().lower()
    return configured or flag in ("1", "true", "yes", "on")


def signing_key(required: bool = False) -> bytes | None:
    """The HMAC key bundles are signed with and must carry (``GATEKEEPER_SIGNING_KEY``).

    With a signature required (``required``, or :func:`signature_required`) a key that is
    missing, empty or only blanks raises ConfigError: a deploy whose environment lost
    the secret must not load bundles unchecked."""
    key = secret(KEY_ENV)
    if key and key.strip():
        return key.encode()
    if required or signature_required():
        raise ConfigError(
            f"a signature is required (require_signature) but {KEY_ENV} is "
            f"{'empty' if key is not None else 'not set'}: no bundle can be verified, "
            "so none is loaded"
        )
    return None


_warned_unchecked = False


def _unchecked_signature(target: str) -> None:
    """Said once per process: signed manifests read where no key can check them."""
    global _warned_unchecked
    if not _warned_unchecked:
        _warned_unchecked = True
        log.warning(
            "%s: bundle is signed but %s is not set here: signatures are not checked "
            "(set the key, and require_signature = true to refuse unsigned bundles)",
            target,
            KEY_ENV,
        )


def _sign(data: bytes, key: bytes) -> str:
    return "hmac-sha256:" + hmac.new(key, data, hashlib.sha256).hexdigest()


def now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds")


# -- packing ---------------------------------------------------------------------------
def changed_files(old_dir: Path, new_dir: Path) -> dict[str, Path]:
    """Files of ``new_dir`` (a copy of ``old_dir`` that a process then wrote to) that
    are new or differ, by relative path; lock files excluded."""
    files: dict[str, Path] = {}
    for rel, path in safefs.plain_files(new_dir):  # a worker's: plain files only
        if "/" in rel and rel.split("/", 1)[0] in SKIP_DIRS:
            continue
        try:
            same = safefs.sha256_regular(old_dir / rel) == safefs.sha256_regular(path)
        except OSError:
            same = False
        if not same:
            files[rel] = path
    return files


def _members(cache_dir: Path, megacache: Path | None) -> dict[str, Path]:
    """The plain files of a compile's cache dir (never through a link: the worker wrote
    it) and its Mega-Cache blob, by archive name."""
    members: dict[str, Path] = {}
    for rel, path in safefs.plain_files(cache_dir):
        if rel.split("/", 1)[0] not in SKIP_DIRS or "/" not in rel:
            members[CACHE_PREFIX + rel] = path
    if megacache is not None:
        members[MEGACACHE] = megacache
    return members


def pack(
    cache_dir: Path,
    megacache: Path | None,
    dest_dir: Path,
    *,
    target: str,
    key: dict,
    compile_info: dict,
    creator: dict,
    version: str,
    signing_key: bytes | None,
    members: dict[str, Path] | None = None,
    only: set[str] | None = None,
) -> tuple[Path, Manifest]:
    """Pack a compile's cache dir (and Mega-Cache blob, and the packages' ``members``,
    archive name -> file) into ``dest_dir``; ``only``: just these files of the cache
    dir, by relative path (what a seeded compile used or wrote).

    The worker wrote every member: each is read once, as a plain file (a link, a FIFO
    or a device is refused: BundleError), and hashed as it goes into the archive. The
    archive is a new file of ``dest_dir`` (where the worker cannot write), renamed to
    its name. Returns the archive path (``bundle-<sha16>.tar.zst``) and its manifest.
    """
    found = _members(cache_dir, megacache)
    if only is not None:
        found = {
            name: path
            for name, path in found.items()
            if not name.startswith(CACHE_PREFIX) or name[len(CACHE_PREFIX) :] in only
        }
    found.update(members or {})
    files: dict[str, FileEntry] = {}
    part = dest_dir / f".bundle-{os.getpid()}.tar.zst.part"
    cctx = zstandard.ZstdCompressor(level=3, threads=-1)
    try:
        with (
            safefs.new_file(part) as raw,
            cctx.stream_writer(raw, closefd=False) as zw,
            tarfile.open(fileobj=zw, mode="w|", format=tarfile.PAX_FORMAT) as tar,
        ):
            for name, path in found.items():
                files[name] = _add(tar, name, path)
        digest = sha256_file(part)
        archive = dest_dir / f"bundle-{digest[:16]}.tar.zst"
        os.rename(part, archive)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    manifest = Manifest(
        target=target,
        env_key=key["env_key"],
        code_hash=key["code_hash"],
        key=key,
        files=files,
        archive=ArchiveEntry(name=archive.name, sha256=digest, size=archive.stat().st_size),
        compile=compile_info,
        creator=creator,
        created_at=now_iso(),
        gatekeeper_version=version,
    )
    return archive, sign(manifest, signing_key)


class _Hashing:
    """A file read once: what it gives tarfile is hashed on the way."""

    def __init__(self, f) -> None:
        self.f, self.h = f, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.h.update(data)
        return data


def _add(tar: tarfile.TarFile, name: str, path: Path) -> FileEntry:
    """``path`` (a worker's: a plain file, or BundleError) into ``tar`` as ``name``."""
    try:
        fd = safefs.open_regular(path)
    except OSError as e:
        raise BundleError(f"{name}: {e.strerror or e}; not packed") from None
    with os.fdopen(fd, "rb") as f:
        info = tarfile.TarInfo(name)
        info.size = os.fstat(fd).st_size
        info.mode = 0o644
        info.mtime = 0  # reproducible: content, not time, defines the archive
        src = _Hashing(f)
        tar.addfile(info, src)
    return FileEntry(sha256=src.h.hexdigest(), size=info.size)


def sign(manifest: Manifest, signing_key: bytes | None) -> Manifest:
    """``manifest`` signed with ``signing_key`` (unsigned without one)."""
    signature = _sign(manifest.signed_bytes(), signing_key) if signing_key else None
    return manifest.model_copy(update={"signature": signature})


def cold_seconds(manifest: Manifest) -> float | None:
    """The cold compile time of the bundle's graphs: a compile seeded with an earlier
    bundle records its ``state`` and the cold figure it knows (None when it compiled
    some graphs anew and reused others); older manifests' ``seconds`` were all cold."""
    info = manifest.compile
    value = info.get("cold_seconds") if "state" in info else info.get("seconds")
    return value if isinstance(value, (int, float)) else None


# -- verifying and extracting ----------------------------------------------------------
def verify_manifest(data: bytes, *, target: str, signing_key: bytes | None) -> Manifest:
    """Parse and authenticate a manifest; raises BundleError naming target and reason,
    and nothing else, whatever ``data`` holds: this is the one place a manifest is
    refused, and a caller that skips a refused manifest goes on to the next one."""
    try:
        return _verify_manifest(data, target=target, signing_key=signing_key)
    except BundleError:
        raise
    except Exception as e:  # any surprise in untrusted data is a refusal
        raise BundleError(
            f"{target}: bundle refused: manifest is unreadable ({type(e).__name__})"
        ) from None


def _verify_manifest(data: bytes, *, target: str, signing_key: bytes | None) -> Manifest:
    try:
        manifest = Manifest.model_validate_json(data)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise BundleError(
            f"{target}: bundle refused: manifest is malformed "
            f"({where + ': ' if where else ''}{err['msg']})"
        ) from None
    if manifest.format != FORMAT:
        raise BundleError(
            f"{target}: bundle refused: manifest format {manifest.format} is not {FORMAT}"
        )
    if manifest.target != target:
        raise BundleError(f"{target}: bundle refused: manifest is for {manifest.target}")
    if signing_key:
        if not manifest.signature:
            raise BundleError(f"{target}: bundle refused: unsigned, and a signing key is set")
        expected = _sign(manifest.signed_bytes(), signing_key)
        if not hmac.compare_digest(manifest.signature.encode(), expected.encode()):
            raise BundleError(f"{target}: bundle refused: signature does not verify")
    elif manifest.signature:
        _unchecked_signature(target)
    if not ARCHIVE_NAME.fullmatch(manifest.archive.name):
        raise BundleError(f"{target}: bundle refused: bad archive name {manifest.archive.name!r}")
    return manifest


def _check_member(info: tarfile.TarInfo, target: str) -> None:
    name = info.name
    parts = PurePosixPath(name).parts
    if (
        name.startswith("/")
        or PurePosixPath(name).is_absolute()
        or ".." in parts
        or "\\" in name
        or not parts
    ):
        raise BundleError(f"{target}: bundle refused: unsafe path {name!r} in archive")
    if info.issym() or info.islnk():
        raise BundleError(f"{target}: bundle refused: link {name!r} in archive")
    if not (info.isfile() or info.isdir()):
        raise BundleError(f"{target}: bundle refused: special file {name!r} in archive")


def extract(archive: Path, manifest: Manifest, staging: Path) -> None:
    """Verify ``archive`` against ``manifest`` and unpack it into the empty ``staging``.

    On any failure ``staging`` is removed, so nothing half-verified is left behind.
    """
    target = manifest.target
    try:
        if sha256_file(archive) != manifest.archive.sha256:
            raise BundleError(
                f"{target}: bundle refused: archive sha256 does not match "
                "its manifest (corrupted or tampered)"
            )
        seen: set[str] = set()
        dctx = zstandard.ZstdDecompressor()
        with (
            open(archive, "rb") as raw,
            dctx.stream_reader(raw) as zr,
            tarfile.open(fileobj=zr, mode="r|") as tar,
        ):
            for info in tar:
                _check_member(info, target)
                if info.isdir():
                    continue
                entry = manifest.files.get(info.name)
                if entry is None:
                    raise BundleError(
                        f"{target}: bundle refused: {info.name!r} is not in the manifest"
                    )
                if info.name in seen:
                    raise BundleError(f"{target}: bundle refused: {info.name!r} twice")
                if info.size != entry.size:  # before reading a byte of it
                    raise BundleError(
                        f"{target}: bundle refused: {info.name} is {info.size} bytes in the "
                        f"archive, {entry.size} in the manifest"
                    )
                seen.add(info.name)
                out = staging.joinpath(*PurePosixPath(info.name).parts)
                out.parent.mkdir(parents=True, exist_ok=True)
                h = hashlib.sha256()
                src = tar.extractfile(info)
                assert src is not None
                written = 0
                with open(out, "wb") as f:
                    while chunk := src.read(min(1 << 20, entry.size - written + 1)):
                        written += len(chunk)
                        if written > entry.size:
                            raise BundleError(
                                f"{target}: bundle refused: {info.name} is larger than "
                                "its manifest says"
                            )
                        h.update(chunk)
                        f.write(chunk)
                if written != entry.size or h.hexdigest() != entry.sha256:
                    raise BundleError(
                        f"{target}: bundle refused: {info.name} sha256 does not match the manifest"
                    )
        if missing := set(manifest.files) - seen:
            raise BundleError(
                f"{target}: bundle refused: {sorted(missing)[0]} is missing from the archive"
            )
    except (tarfile.TarError, zstandard.ZstdError, EOFError, OSError) as e:
        shutil.rmtree(staging, ignore_errors=True)
        raise BundleError(f"{target}: bundle refused: unreadable archive ({e})") from None
    except BundleError:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def install_cache(staging: Path, cache_dir: Path) -> int:
    """Copy a verified ``staging/cache`` tree into ``cache_dir``; returns files written
    (a package's members: :func:`install_tree`)."""
    return install_tree(staging / CACHE_PREFIX.rstrip("/"), cache_dir)


def install_tree(src_root: Path, cache_dir: Path) -> int:
    """Copy every file under ``src_root`` (a verified, extracted tree) to the same
    relative path in ``cache_dir``; returns files written.

    Each file lands by a rename from a new file beside it, so a process reading the
    cache concurrently never sees a torn file; a worker may have written the cache dir
    (a probe's, a deploy's service), so its folders are walked without following a link
    and a link or FIFO at a file's name is replaced, never written through
    (:mod:`gatekeeper.safefs`).
    """
    written = 0
    cache_dir.mkdir(parents=True, exist_ok=True)
    for rel, src in safefs.plain_files(src_root):
        folder, name = os.path.split(rel)
        fd = safefs.folder_fd(cache_dir, folder)
        try:
            if _same(src, name, fd):
                continue
            safefs.copy_new(src, name, mode=0o755 if name.endswith(".so") else 0o644, dir_fd=fd)
        finally:
            os.close(fd)
        written += 1
    return written


def _same(src: Path, name: str, folder: int) -> bool:
    """Whether the plain file ``name`` of the open ``folder`` holds ``src``'s bytes."""
    try:
        fd = safefs.open_regular(name, dir_fd=folder)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as f:
        if os.fstat(fd).st_size != src.stat().st_size:
            return False
        h = hashlib.sha256()
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest() == sha256_file(src)
