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
from dataclasses import dataclass, field
from pathlib import Path

from . import __version__, bundle, distributed, facts_cache, kinds
from .boundary import headers
from .boundary.client import run_or_fail
from .boundary.protocol import CompileRequest, PackageRef, Response
from .bundle import signing_key
from .config import Config
from .errors import BundleError, ObjectTooLarge, StoreError, WontFit
from .key import CacheKey, Match, check_location, find_bundle, refuse_unrunnable, target_key
from .progress import Progress
from .provenance import creator
from .scratch import scratch_dir
from .store import BundleLocation, Store
from .targets import Target, one_per_bundle

log = logging.getLogger("gatekeeper.compile")
MEGACACHE = "megacache.bin"


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
    # by package name: its manifest section (precompile: recorded, entries and unguarded
    # globals, or why not; aot: packaged)
    packages: dict[str, dict] = field(default_factory=dict)
    # the bundle whose cache dir the compile started from, and what it reused of it
    seed: dict | None = None
    export: dict | None = None  # a kind that exports: torch.export's outcome
    error: str | None = None
    error_kind: str | None = None  # config | compile | store

    def as_dict(self) -> dict:
        out = {}
        for k, v in self.__dict__.items():
            if k == "packages":
                out.update(v)  # each under its name, as the manifest's compile section
            elif v is not None and v != {}:
                out[k] = v
        return out


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
    """Restore ``match``'s bundle (verified, its packages left out) into the empty
    ``cache_dir``; None, with a warning, when it cannot be: the compile is cold."""
    manifest = match.manifest
    staging = tmp / "seed"
    try:
        archive = tmp / manifest.archive.name
        store.download(
            match.location.key(manifest.archive.name), archive, max_bytes=manifest.archive.size
        )
        bundle.extract(archive, manifest, staging)
        archive.unlink()
        bundle.install_cache(staging, cache_dir)
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
        # the ISA check lent to the worker: a compile needs it, read or not (its
        # process may have the answer from its server: boundary/headers.lent_isa_files)
        read = {rel for rel in [*used, *headers.lent_isa_files()] if rel in now}
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
    same target and env (other code) unless ``force`` or ``cold``, or its kind ships a
    package instead of the cache dir (built from scratch)."""
    key = target_key(target, config.base_dir)
    result = CompileResult(target.id, "error", key.env_key)
    match = None if force else _found(result, store, key, config)
    if result.status != "error" or result.error:  # it exists, or the store failed
        return result
    kind = kinds.of(target)
    facts = facts_cache.replaced()
    with scratch_dir("gk-compile-") as tmp:
        # the worker writes its cache dir and its outputs (out/) only; the bundle is
        # packed beside them, where it cannot write
        cache_dir, out = Path(tmp, "cache"), Path(tmp, "out")
        out.mkdir()
        seed = None
        if match is not None and not cold and kinds.ships_cache(kind):
            seed = _seed(target, store, match, cache_dir, Path(tmp))
        packages = kinds.packages_of(target, config)
        outs = {p.name: p.out(out) for p in packages if p.refusal(target) is None}
        request = CompileRequest.of(
            target,
            config,
            key.device,
            kind=kind,
            # a package a deploy loads instead: the cache dir (and its blob) stays here
            megacache_out=str(out / MEGACACHE) if kind.package is None else None,
            packages=[PackageRef.of(p, outs[p.name]) for p in packages if p.name in outs],
        )
        resp = run_or_fail(
            request,
            cache_dir=cache_dir,
            timeout=config.measure.timeout,
            verbose=verbose,
            label=target.id,
        )
        result.export = resp.export
        if not resp.ok and resp.fault == "memory":  # refused before any compile
            raise WontFit(f"{target.id}: {resp.error}")
        if not resp.ok and resp.fault in ("export", "unavailable"):  # a result, not an error
            result.status = "not-exportable" if resp.fault == "export" else "unavailable"
            result.error = resp.error
            return result
        if not resp.ok:
            result.error, result.error_kind = resp.error, resp.fault
            return result
        if facts_cache.replaced() != facts:  # the env key was made of facts found wrong
            key = target_key(target, config.base_dir)
        key = key.with_deps(resp.deps or {})  # the code hash of what was compiled
        result.code_hash = key.code_hash
        result.compile_seconds = resp.compile_seconds
        result.counters = resp.counters or {}
        members: dict[str, Path] = {}
        for p in packages:
            result.packages[p.name], files = p.pack(target, resp, outs.get(p.name), cache_dir)
            members.update(files)
            if p.name in outs and (reason := result.packages[p.name].get("reason")):
                log.warning("%s: no %s package: %s", target.id, p.title, reason)  # it tried
        only = None
        if seed is not None:
            only, result.seed = _shipped(cache_dir, seed, resp.cache_used, result.counters)
        if kind.package is not None:  # the package is what deploys load
            only = set()
        _publish(result, store, key, resp, Path(tmp), members, only, seed, config, force, target)
    return result


def _found(result: CompileResult, store: Store, key: CacheKey, config: Config) -> Match | None:
    """The stored bundle nearest ``key``: an exact hit makes ``result`` ``exists``; a
    store that fails, an error."""
    try:
        match, _ = find_bundle(store, key, signing_key=signing_key(config.require_signature))
    except StoreError as e:
        result.error, result.error_kind = str(e), "store"
        return None
    if match is not None and match.status == "hit":
        result.status, result.code_hash = "exists", match.key.code_hash
    return match


def _publish(
    result: CompileResult,
    store: Store,
    key: CacheKey,
    resp: Response,
    tmp: Path,
    members: dict[str, Path],
    only: set[str] | None,
    seed: Seed | None,
    config: Config,
    force: bool,
    target: Target,
) -> None:
    """Pack the compile's bundle and publish it at its key (a manifest already there
    that does not verify is replaced); what the worker left that no bundle holds (a
    link, a FIFO where a file should be) fails the target in one line."""
    result.env_key = key.env_key
    megacache = tmp / "out" / MEGACACHE
    try:
        archive, manifest = bundle.pack(
            tmp / "cache",
            megacache if os.path.lexists(megacache) else None,
            tmp,
            target=key.target_id,
            key=key.as_dict(),
            compile_info={
                "seconds": resp.compile_seconds,
                "counters": resp.counters,
                "torch": resp.torch,
                **_cold_figure(resp.compile_seconds, result.counters, seed),
                **({"seed": result.seed} if result.seed else {}),
                **distributed.manifest_section(target, resp),
                **result.packages,
            },
            creator=creator(),
            version=__version__,
            signing_key=signing_key(config.require_signature),
            members=members,
            only=only,
        )
    except BundleError as e:
        result.status, result.error, result.error_kind = "error", f"{target.id}: {e}", "compile"
        return
    result.bundle_bytes = manifest.archive.size
    loc = key.location()
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
    refuse_unrunnable(targets)  # a quantized config this machine cannot run: one line
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
                for p in kinds.packages():  # an add-on the target might have gone without
                    if not p.standalone and (r.packages.get(p.name) or {}).get("status") == p.ready:
                        took += f", {p.name} package {p.ready}"
                step.done(f"{r.status}{took}")
    return results
