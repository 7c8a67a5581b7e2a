"""``compile``: compile each target in a worker (a fresh process, an empty isolated cache
dir), pack the cache dir into a bundle, publish it to the store.

A target whose stored bundle still matches every dependency its worker recorded is
``exists`` (see :mod:`gatekeeper.key`); otherwise the worker compiles, and the code hash
is computed from what it recorded while building the model. ``--force`` replaces the
bundle at that key atomically (new archive first, then the manifest in one conditional
write; the old archive is left for ``store prune``).

**Seeded compiles.** When the store has a bundle of the same target and env for other
code (a ``partial``), the worker's cache dir starts as that bundle's, as ``warm`` would
restore it: inductor's content-addressed FX graph and AOTAutograd keys then decide what
still hits, so a comment-only change recompiles nothing and a one-layer change only
that layer's graphs. The bundle ships only the files the compile read, loaded or wrote
(the worker watches the cache dir: :class:`gatekeeper.worker.deps.CacheUse`); what it
never touched of the seed stays behind. ``--force`` and ``--cold`` start empty."""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from . import __version__, bundle
from .bundle import signing_key
from .config import Config
from .errors import BundleError, ObjectTooLarge, StoreError
from .key import Match, check_location, find_bundle, target_key
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
    status: str  # published | replaced | exists | skipped | error | not-exportable | unavailable
    env_key: str | None = None
    code_hash: str | None = None
    compile_seconds: float | None = None
    bundle_bytes: int | None = None
    counters: dict = field(default_factory=dict)
    precompile: dict | None = None  # recorded (entries, unguarded globals) or why not
    # the bundle whose cache dir the compile started from, and what it reused of it
    seed: dict | None = None
    export: dict | None = None  # aot: torch.export's outcome
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
    if target.strategy == "regional":
        return "a regional target compiles its blocks, and torch packages a whole forward"
    if target.strategy == "aot":
        return "an aot target ships its own AOTInductor package instead"
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


@dataclass
class Seed:
    """The cache dir a compile started from: a previous bundle's, restored."""

    match: Match
    files: dict[str, tuple[int, int]]  # relative path -> (size, mtime_ns) once restored


def _snapshot(cache_dir: Path) -> dict[str, tuple[int, int]]:
    """Every file of a cache dir (lock files aside) by relative path: size and mtime."""
    out: dict[str, tuple[int, int]] = {}
    if not cache_dir.is_dir():
        return out
    for dirpath, dirnames, filenames in os.walk(cache_dir):
        rel_dir = Path(dirpath).relative_to(cache_dir)
        dirnames[:] = [d for d in dirnames if not (rel_dir == Path(".") and d in bundle.SKIP_DIRS)]
        for name in filenames:
            path = Path(dirpath, name)
            if path.is_symlink() or not path.is_file():
                continue
            st = path.stat()
            out[(rel_dir / name).as_posix()] = (st.st_size, st.st_mtime_ns)
    return out


def _seed(target: Target, store: Store, match: Match, cache_dir: Path, tmp: Path) -> Seed | None:
    """Restore ``match``'s bundle (verified, its precompile package left out) into the
    empty ``cache_dir``; None, with a warning, when it cannot be: the compile is cold."""
    manifest = match.manifest
    staging = tmp / "seed"
    try:
        archive = tmp / manifest.archive.name
        store.download(
            match.location.key(manifest.archive.name), archive, max_bytes=manifest.archive.size
        )
        bundle.extract(archive, manifest, staging)
        archive.unlink()
        bundle.install_cache(staging, cache_dir, precompile=False)
    except (StoreError, BundleError, OSError) as e:
        log.warning(
            "%s: not seeded from bundle %s (%s); compiling cold",
            target.id,
            match.location.code_hash,
            e,
        )
        for path in (cache_dir, staging):
            _rmtree(path)
        return None
    finally:
        _rmtree(staging)
    return Seed(match, _snapshot(cache_dir))


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _shipped(
    cache_dir: Path, seed: Seed, used: list[str] | None, counters: dict
) -> tuple[set[str] | None, dict]:
    """What the bundle of a seeded compile carries: every file the compile wrote (new or
    changed since the seed) and every file of the seed it read, loaded or ran; None
    (everything) when what it used cannot be trusted. And the manifest's ``seed``."""
    now = _snapshot(cache_dir)
    written = {rel for rel, st in now.items() if seed.files.get(rel) != st}
    info: dict = {
        "code_hash": seed.match.location.code_hash,
        "files": len(seed.files),
        "fx_graphs_reused": counters.get("fxgraph_cache_hit", 0),
        "fx_graphs": counters.get("fxgraph_cache_hit", 0) + counters.get("fxgraph_cache_miss", 0),
        "aot_graphs_reused": counters.get("autograd_cache_hit", 0),
        "aot_graphs": counters.get("autograd_cache_hit", 0)
        + counters.get("autograd_cache_miss", 0),
    }
    why = None
    if used is None:
        why = "the worker could not tell which files it used"
    else:
        read = {rel for rel in used if rel in now}
        # inductor's counters say what hit: the entries it hit must be among what it read
        for kind, counter in (
            ("fxgraph/", "fxgraph_cache_hit"),
            ("aotautograd/", "autograd_cache_hit"),
        ):
            if counters.get(counter, 0) and not any(rel.startswith(kind) for rel in read):
                why = f"{counter} is {counters[counter]} but no {kind.rstrip('/')} entry was read"
    if why is not None:
        log.warning("shipping the whole cache dir: %s", why)
        info.update(kept=len(seed.files), dropped=0, whole=why)
        return None, info
    kept = {rel for rel in read if rel in seed.files and rel not in written}
    shipped = written | kept
    info.update(kept=len(kept), dropped=len(seed.files.keys() - shipped))
    return shipped, info


def compile_target(
    target: Target,
    config: Config,
    store: Store,
    *,
    force: bool = False,
    verbose: bool = False,
    cold: bool = False,
) -> CompileResult:
    """Compile and publish one target's bundle. Seeded from the newest bundle of the
    same target and env (other code) unless ``force`` or ``cold``."""
    key = target_key(target, config.base_dir)
    result = CompileResult(target.id, "error", key.env_key)
    match = None
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
        seed = None
        # an aot package is built from the exported program, not from the cache dir
        if match is not None and not cold and target.strategy != "aot":
            seed = _seed(target, store, match, cache_dir, Path(tmp))
        record = config.precompile_for(target.model) and _cannot_package(target) is None
        precompile_dir = Path(tmp, "precompile")
        aot = Path(tmp, "model.pt2") if target.strategy == "aot" else None
        request = Request.for_target(
            "compile",
            target,
            config,
            key.device,
            megacache_out=str(megacache) if aot is None else None,
            precompile_out=str(precompile_dir) if record else None,
            aot_out=str(aot) if aot is not None else None,
        )
        resp = run_or_fail(
            request,
            cache_dir=cache_dir,
            timeout=config.measure.timeout,
            verbose=verbose,
            label=target.id,
        )
        result.export = resp.export
        if not resp.ok and resp.kind in ("export", "unavailable"):  # a result, not an error
            result.status = "not-exportable" if resp.kind == "export" else "unavailable"
            result.error = resp.error
            return result
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
        only = None
        if seed is not None:
            only, result.seed = _shipped(cache_dir, seed, resp.cache_used, result.counters)
        aot_doc = None
        if aot is not None:  # the package is what deploys load: the cache dir stays here
            only = set()
            aot_doc = {
                "status": "packaged",
                "export": resp.export,
                "bytes": aot.stat().st_size,
                "verified": None,
            }
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
                **_cold_figure(resp.compile_seconds, result.counters, seed),
                **({"seed": result.seed} if result.seed else {}),
                **({"precompile": precompile} if precompile else {}),
                **({"aot": aot_doc} if aot_doc else {}),
            },
            creator=creator(),
            version=__version__,
            signing_key=signing_key(config.require_signature),
            precompile=package,
            only=only,
            aot=aot,
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


def _cold_figure(seconds: float | None, counters: dict, seed: Seed | None) -> dict:
    """The manifest's ``state`` (``cold``, ``warm`` or ``mixed``, by inductor's FX
    counters, as a check reads its own) and ``cold_seconds``: the compile's own time when
    it was cold; a warm seeded compile's graphs are the seed's, whose cold figure it
    keeps; a mixed one has none. (Old manifests have neither: their ``seconds`` is cold.)"""
    hit, miss = counters.get("fxgraph_cache_hit", 0), counters.get("fxgraph_cache_miss", 0)
    if seed is None or not hit:
        return {"state": "cold", "cold_seconds": seconds}
    if miss:
        return {"state": "mixed", "cold_seconds": None}
    return {"state": "warm", "cold_seconds": bundle.cold_seconds(seed.match.manifest)}


def reuse_note(seed: dict | None) -> str:
    """``, 3/3 FX graphs reused from bundle 1a2b`` (empty when not seeded)."""
    if not seed:
        return ""
    return (
        f", {seed['fx_graphs_reused']}/{seed['fx_graphs']} FX graphs reused from bundle "
        f"{seed['code_hash']}"
    )


def compile_all(
    targets: list[Target],
    config: Config,
    store: Store,
    *,
    force: bool = False,
    verbose: bool = False,
    cold: bool = False,
) -> list[CompileResult]:
    targets = one_per_bundle(targets)  # a dynamic model compiles once for its shape sets
    progress = Progress(len(targets))
    results = []
    for target in targets:
        with progress.step(target.id, "compiling") as step:
            r = compile_target(target, config, store, force=force, verbose=verbose, cold=cold)
            results.append(r)
            if r.status in ("error", "not-exportable", "unavailable"):
                step.done(f"error: {r.error}" if r.status == "error" else str(r.error))
            else:
                took = f", {r.compile_seconds:.1f} s" if r.compile_seconds else ""
                took += reuse_note(r.seed)
                if (r.precompile or {}).get("status") == "recorded":
                    took += ", precompile package recorded"
                step.done(f"{r.status}{took}")
    return results
