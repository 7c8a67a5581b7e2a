"""``compile``: compile each target in a worker (a fresh process, an empty isolated cache
dir), pack the cache dir into a bundle, publish it to the store.

A target whose stored bundle still matches every dependency its worker recorded is
``exists`` (see :mod:`gatekeeper.key`); otherwise the worker compiles, and the code hash
is computed from what it recorded while building the model. ``--force`` replaces the
bundle at that key atomically (new archive first, then the manifest in one conditional
write; the old archive is left for ``store prune``)."""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from . import __version__, bundle
from .bundle import signing_key
from .config import Config
from .errors import BundleError, ObjectTooLarge, StoreError
from .key import check_location, find_bundle, target_key
from .progress import Progress
from .provenance import creator
from .store import BundleLocation, Store
from .targets import Target, one_per_bundle
from .worker.launch import run_or_fail
from .worker.protocol import Request

log = logging.getLogger("gatekeeper.compile")


def _usable(store: Store, loc: BundleLocation) -> bool:
    """Whether the manifest already at ``loc`` may stand. One that does not verify (with a
    signing key: unsigned or forged) or names another key must not block the trusted
    bundle forever: it is replaced."""
    try:
        data = store.read_manifest(loc)
        if data is None:
            return True
        manifest = bundle.verify_manifest(data, target=loc.target_id, signing_key=signing_key())
        check_location(manifest, loc)
    except (BundleError, ObjectTooLarge) as e:
        log.warning("%s; publishing a valid one in its place", e)
        return False
    return True


@dataclass
class CompileResult:
    target: str
    status: str  # published | replaced | exists | skipped | error
    env_key: str | None = None
    code_hash: str | None = None
    compile_seconds: float | None = None
    bundle_bytes: int | None = None
    counters: dict = field(default_factory=dict)
    precompile: dict | None = None  # recorded (entries, unguarded globals) or why not
    error: str | None = None
    error_kind: str | None = None  # config | compile | store

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None and v != {}}


def _cannot_package(target: Target) -> str | None:
    """Why torch (2.13) cannot give ``target`` a package that loads; None when it can."""
    if target.task != "infer":
        return (
            "a training step cannot be packaged (torch bypasses packaging for the "
            "optimizer step's graph)"
        )
    if target.precision != "fp32":
        # measured: the package loads, and its guards fail on every call under autocast
        return (
            "a package recorded under autocast never loads (torch records its input "
            "guards without the Autocast dispatch key, so every call misses them)"
        )
    return None


def _precompile(
    target: Target, config: Config, recorded: dict | None, cache_dir: Path, precompile_dir: Path
) -> tuple[dict | None, dict[str, Path]]:
    """The manifest's ``precompile`` section and the files the package adds to the
    cache dir. ``verified`` stays null until a ``check`` has loaded it and compared."""
    if not config.precompile_for(target.model):
        return None, {}
    if reason := _cannot_package(target):
        return {"status": "unavailable", "reason": reason}, {}
    if not recorded or recorded.get("status") != "recorded":
        reason = (recorded or {}).get("reason") or "the worker recorded no package"
        return {"status": "unavailable", "reason": reason}, {}
    files = bundle.changed_files(cache_dir, precompile_dir)
    return {**recorded, "files": len(files), "verified": None}, files


def compile_target(
    target: Target, config: Config, store: Store, *, force: bool = False, verbose: bool = False
) -> CompileResult:
    key = target_key(target, config.base_dir)
    result = CompileResult(target.id, "error", key.env_key)
    try:
        if not force:
            match, _ = find_bundle(store, key, signing_key=signing_key(config.require_signature))
            if match is not None and match.status == "hit":
                result.status, result.code_hash = "exists", match.key.code_hash
                return result
    except StoreError as e:
        result.error, result.error_kind = str(e), "store"
        return result
    with tempfile.TemporaryDirectory(prefix="gk-compile-") as tmp:
        cache_dir, megacache = Path(tmp, "cache"), Path(tmp, "megacache.bin")
        record = config.precompile_for(target.model) and _cannot_package(target) is None
        precompile_dir = Path(tmp, "precompile")
        request = Request.for_target(
            "compile",
            target,
            config,
            key.device,
            megacache_out=str(megacache),
            precompile_out=str(precompile_dir) if record else None,
        )
        resp = run_or_fail(
            request,
            cache_dir=cache_dir,
            timeout=config.measure.timeout,
            verbose=verbose,
            label=target.id,
        )
        if not resp.ok:
            result.error, result.error_kind = resp.error, resp.kind
            return result
        key = key.with_deps(resp.deps or {})  # the code hash of what was compiled
        result.code_hash = key.code_hash
        loc = key.location()
        result.compile_seconds = resp.compile_seconds
        result.counters = resp.counters or {}
        precompile, package = _precompile(
            target, config, resp.precompile, cache_dir, precompile_dir
        )
        result.precompile = precompile
        if record and precompile and precompile.get("reason"):  # it tried and failed
            log.warning("%s: no precompile package: %s", target.id, precompile["reason"])
        archive, manifest = bundle.pack(
            cache_dir,
            megacache if megacache.is_file() else None,
            Path(tmp),
            target=key.target_id,
            key=key.as_dict(),
            compile_info={
                "seconds": resp.compile_seconds,
                "counters": resp.counters,
                "torch": resp.torch,
                **({"precompile": precompile} if precompile else {}),
            },
            creator=creator(),
            version=__version__,
            signing_key=signing_key(config.require_signature),
            precompile=package,
        )
        result.bundle_bytes = manifest.archive.size
        try:
            result.status = store.publish_bundle(
                loc, archive, archive.name, manifest.to_bytes(), replace=force
            )
            if result.status == "exists" and not _usable(store, loc):
                result.status = store.publish_bundle(
                    loc, archive, archive.name, manifest.to_bytes(), replace=True
                )
        except StoreError as e:
            result.status, result.error, result.error_kind = "error", str(e), "store"
    return result


def compile_all(
    targets: list[Target],
    config: Config,
    store: Store,
    *,
    force: bool = False,
    verbose: bool = False,
) -> list[CompileResult]:
    targets = one_per_bundle(targets)  # a dynamic model compiles once for its shape sets
    progress = Progress(len(targets))
    results = []
    for target in targets:
        with progress.step(target.id, "compiling") as step:
            r = compile_target(target, config, store, force=force, verbose=verbose)
            results.append(r)
            if r.status == "error":
                step.done(f"error: {r.error}")
            else:
                took = f", {r.compile_seconds:.1f} s cold" if r.compile_seconds else ""
                if (r.precompile or {}).get("status") == "recorded":
                    took += ", precompile package recorded"
                step.done(f"{r.status}{took}")
    return results
