"""Warm start: restore each target's verified bundle into the inductor cache dir.

``gatekeeper warm`` runs it before a deploy starts; ``gatekeeper.warm_start()`` runs it
inside the service's own process. A store that cannot be reached or a bundle that does
not verify is a warning and a ``miss`` — the service then compiles cold, it never
crashes and never loads what did not verify.

A ``hit`` is a bundle whose recorded dependencies all still match this checkout
(:func:`gatekeeper.key.find_bundle`); a manifest found under another key than it names
is refused. ``--probe`` (and ``check``) then see whether inductor agrees: a key hit
whose FX graphs all miss is ``stale``, never a hit.

A bundle's packages (a precompile package, an aot target's AOTInductor package) are each
installed by their kind (:meth:`gatekeeper.kinds.Package.warm`): for a deploy only when
the bundle is an exact ``hit`` and a ``check`` verified the package; otherwise any
package a previous warm left at the same place is removed, so the deploy can never load
one that was not verified.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import bundle, distributed, kinds
from .bundle import signing_key
from .config import Config
from .errors import BundleError, StoreError
from .key import CacheKey, find_bundle, target_key
from .nearest import nearest, says
from .project import expand, load_config
from .results import CacheStatus
from .runtime import default_cache_dir, load_megacache
from .scratch import scratch_dir
from .store import Store, open_store
from .targets import Target, select
from .warmed import PackageState, WarmResult

log = logging.getLogger("gatekeeper.warm")


def _result(target_id: str, env_key: str | None = None, reason: str | None = None) -> WarmResult:
    """A target's ``miss``, with a state for every package, so that ``r.precompile``
    reads None, not an AttributeError, for a package it never met."""
    packages = {p.name: PackageState() for p in kinds.packages()}
    return WarmResult(target_id, "miss", env_key, reason=reason, packages=packages)


def settle(status: CacheStatus, counters: dict | None) -> CacheStatus:
    """A key ``hit`` whose FX graphs all missed in inductor is ``stale``."""
    c = counters or {}
    if (
        status == "hit"
        and c.get("fxgraph_cache_hit", 0) == 0
        and c.get("fxgraph_cache_miss", 0) > 0
    ):
        return "stale"
    return status


def warm_target(
    target: Target,
    config: Config,
    store: Store,
    cache_dir: Path,
    *,
    signing_key: bytes | None,
    megacache: bool = True,
    cache_key: CacheKey | None = None,
    serve: kinds.base.Serve = "verified",
    claimed: set[str] | None = None,
    stage: Path | None = None,
) -> WarmResult:
    """Restore one target's bundle into ``cache_dir``; ``megacache`` also loads the
    Mega-Cache blob into this process (skip it when another process will compile).
    ``cache_key`` (default: the target's from the config's folder) also says which
    checkout's files the recorded dependencies are checked against. ``serve``: install
    the bundle's packages for a deploy when verified (``verified``), also unverified
    (``any``: the check that verifies one), or never (a measurement); ``claimed``
    collects the cache-dir paths packages installed so far into this cache dir;
    ``stage``: where a check wants the package it measures or verifies."""
    start = time.monotonic()
    ck = cache_key or target_key(target, config.base_dir)
    result = _result(target.id, ck.env_key)
    own = kinds.of(target).package
    try:
        match, reason = find_bundle(store, ck, signing_key=signing_key)
        if match is None:
            result.nearest = nearest(store, ck, signing_key=signing_key)
            result.reason = f"{reason}; {says(result.nearest)}"
            return result
        manifest = match.manifest
        if split := distributed.would_split(manifest, target):
            result.reason = split
            return result
        result.cold_compile_seconds = bundle.cold_seconds(manifest)
        result.bundle_bytes = manifest.archive.size
        with scratch_dir("gk-warm-") as tmp:
            archive = Path(tmp, manifest.archive.name)
            store.download(
                match.location.key(manifest.archive.name), archive, max_bytes=manifest.archive.size
            )
            staging = Path(tmp, "staging")
            bundle.extract(archive, manifest, staging)
            result.files = bundle.install_cache(staging, cache_dir)
            w = kinds.Warming(
                result,
                manifest,
                match.status == "hit",
                staging,
                cache_dir,
                serve,
                set() if claimed is None else claimed,
                stage,
                target.id,
            )
            for package in kinds.packages():
                if package is own or package.present(manifest):
                    package.warm(w)
            blob = staging / bundle.MEGACACHE
            if megacache and blob.is_file():
                load_megacache(blob.read_bytes())
    except (StoreError, BundleError) as e:
        log.warning("%s; %s will compile cold", e, target.id)
        result.reason = str(e)
        return result
    finally:
        result.seconds = time.monotonic() - start
        if own is not None:  # found or not: no package of another version stays
            own.settle(result, cache_dir, serve)
    result.status, result.reason = match.status, match.why
    result.code_hash = match.key.code_hash
    result.bundle_code_hash = match.location.code_hash
    result.manifest, result.location = manifest, match.location
    return result


def cold(targets: list[Target], e: BaseException) -> list[WarmResult]:
    """Best effort's last word: every target a miss, said once."""
    reason = _reason(e)
    log.warning("warm start failed: %s; every target will compile cold", reason)
    return [_result(t.id, reason=reason) for t in targets]


def _reason(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text if isinstance(e, (StoreError, BundleError)) else f"{type(e).__name__}: {text}"


def warm_targets(
    targets: list[Target], config: Config, store: Store, cache_dir: Path | None = None
) -> list[WarmResult]:
    """Warm every target; best effort: any failure (the store, the network, a full or
    unwritable cache disk, a bug) is a warning and a ``miss``, never an exception."""
    try:
        if cache_dir is not None:
            # inductor reads this on every lookup: the Mega-Cache load lands there too
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(cache_dir).absolute())
        cache = default_cache_dir()
        key = signing_key(config.require_signature)
    except Exception as e:  # best effort
        return cold(targets, e)
    results: list[WarmResult] = []
    claimed: set[str] = set()
    for t in targets:
        try:
            results.append(warm_target(t, config, store, cache, signing_key=key, claimed=claimed))
        except Exception as e:  # best effort: the deploy compiles cold
            log.warning("%s; %s will compile cold", _reason(e), t.id)
            results.append(_result(t.id, reason=_reason(e)))
    for package in kinds.packages():
        package.finish(results, cache, claimed)
    return results


def lend_headers(results: list[WarmResult], build: bool = False) -> int:
    """After a hit, the shared precompiled headers (``build``: built first if this
    machine has none yet) copied where the service's inductor looks for them (its temp
    dir), so its first call loads the cached kernels without building one (about 10
    CPU-seconds on a CPU): :mod:`gatekeeper.boundary.headers`. The number copied."""
    import tempfile

    from .boundary import headers
    from .boundary.spawn import headers_worker

    if not any(r.status == "hit" for r in results):
        return 0
    where = headers.ensure(headers_worker) if build else headers.ready()
    return headers.lend(where, Path(tempfile.gettempdir()), os.environ, copy=True)


def service_env(results: list[WarmResult]) -> dict[str, str]:
    """What a service process must have in its environment to load the packages warm
    served (each package's word: :meth:`gatekeeper.kinds.Package.service_env`)."""
    env: dict[str, str] = {}
    for package in kinds.packages():
        env.update(package.service_env(results))
    return env


@dataclass
class Probe:
    """What ``warm --probe`` saw of one target: its first call in a fresh process on the
    warmed cache dir (and the calls after it: a CUDA-graph mode records on one), the
    speedup over the bundle's cold compile, inductor's cache hits, and whether Dynamo
    ran (only a loaded package skips it); or why it failed."""

    first_call_seconds: float | None = None
    # a generate target: its first generation's first token (the call is the generation)
    first_token_seconds: float | None = None
    call_seconds: list[float] | None = None
    import_torch_seconds: float | None = None  # a package loaded alone: import torch apart
    speedup: float | None = None
    fxgraph_cache_hit: int | None = None
    fxgraph_cache_miss: int | None = None
    # a training step's backward and optimizer come through AOTAutograd
    autograd_cache_hit: int | None = None
    autograd_cache_miss: int | None = None
    dynamo: str | None = None  # skipped | traced
    inductor_imported: bool | None = None
    probe_error: str | None = None
    # a distributed target's: each rank's first call and FX cache hits and misses
    ranks: list[dict[str, Any]] | None = None
    note: str = ""  # the progress line

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None and k != "note"}


def probe(
    target: Target,
    config: Config,
    cache_dir: Path,
    result: WarmResult,
    *,
    verbose: bool = False,
    env: dict[str, str] | None = None,
) -> Probe:
    """The first compiled call of ``target`` in a new process on ``cache_dir``: its time
    and FX graph cache hits show whether the warm start really is warm (a hit whose FX
    graphs all miss makes ``result`` stale). ``env``: the service's
    (:func:`service_env`); a package a deploy loads is loaded as it does: did Dynamo
    run?"""
    from .boundary.client import run_or_fail
    from .boundary.protocol import PackageRef, ProbeRequest
    from .runtime import resolve_device

    own = kinds.of(target).package
    load = None
    candidates = [own] if own is not None else [p for p in kinds.packages() if not p.standalone]
    for package in candidates:
        if (path := package.probe_load(target.id, cache_dir, env or {})) is not None:
            load = PackageRef.of(package, path)
            break
    request = ProbeRequest.of(
        target, config, resolve_device(target.model.device), kind=kinds.of(target), load=load
    )
    resp = run_or_fail(
        request,
        cache_dir=cache_dir,
        timeout=config.measure.timeout,
        verbose=verbose,
        label=target.id,
        env=env,
    )
    return _read_probe(result, resp)


def _all_ranks(resp: Any) -> str:
    """``, 2 ranks`` after a distributed target's probe (every rank made its first call)."""
    return f", {len(resp.ranks)} ranks" if resp.ranks else ""


def _read_probe(result: WarmResult, resp: Any) -> Probe:
    from .boundary.protocol import dynamo_skipped

    first, cold = resp.compile_seconds, result.cold_compile_seconds
    speedup = cold / first if cold and first else None
    token = resp.generation.first_token_s if resp.ok and resp.generation is not None else None
    said = (
        f"first token {token:.2f} s, generation {first:.2f} s" if token else f"{first or 0:.2f} s"
    )
    alone = next(iter(resp.packages.items()), None) if resp.ok else None
    if alone is not None and first is not None:  # a package loaded as a deploy loads it
        name, doc = alone
        return Probe(
            first_call_seconds=first,
            first_token_seconds=token,
            import_torch_seconds=resp.import_seconds,
            speedup=speedup,
            dynamo="skipped",
            inductor_imported=doc.get("inductor_imported"),
            note=f"{said} (import torch {resp.import_seconds or 0:.2f} s apart), "
            f"{kinds.package(name).title} package",
        )
    if not (resp.ok and first is not None and resp.counters):
        return Probe(probe_error=resp.error, note=f"error: {resp.error}")
    c = resp.counters
    result.status = settle(result.status, c)  # a hit whose graphs all miss
    split = distributed.split_note(resp)
    if split and result.status == "hit":
        result.status = "partial"
    dynamo = "skipped" if dynamo_skipped(c) else "traced"
    for package in kinds.packages():
        package.probed(result, dynamo)
    stale = ", stale: every FX graph missed" if result.status == "stale" else ""
    return Probe(
        first_call_seconds=first,
        first_token_seconds=token,
        call_seconds=resp.call_seconds,
        speedup=speedup,
        fxgraph_cache_hit=c["fxgraph_cache_hit"],
        fxgraph_cache_miss=c["fxgraph_cache_miss"],
        autograd_cache_hit=c.get("autograd_cache_hit", 0),
        autograd_cache_miss=c.get("autograd_cache_miss", 0),
        dynamo=dynamo,
        ranks=[
            {
                "rank": r.rank,
                "first_call_seconds": r.compile_seconds,
                "fxgraph_cache_hit": r.fxgraph_cache_hit,
                "fxgraph_cache_miss": r.fxgraph_cache_miss,
            }
            for r in resp.ranks
        ]
        if resp.ranks
        else None,
        note=f"{said}, dynamo {dynamo}{stale}{split}{_all_ranks(resp)}",
    )


def warm_start(
    config: Config | str | os.PathLike | None = None,
    *,
    store: Store | str | None = None,
    targets: list[str] | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> list[WarmResult]:
    """Restore this process's inductor cache from the store before compiling.

    Call it at the top of a service entrypoint, before the first ``torch.compile``d
    call::

        import gatekeeper
        gatekeeper.warm_start("gatekeeper.toml", targets=["my-model/*"])

    ``config`` is a path (default: ``gatekeeper.toml`` or ``pyproject.toml`` here) or a
    loaded Config; ``store`` overrides the configured store (a URI or a Store);
    ``targets`` are globs over target ids (default: all). Once the config is read and
    the targets chosen (a missing config or a bad glob raises ConfigError/UsageError),
    it never raises: a store that cannot be opened or read (an unknown AWS profile, a
    malformed endpoint URL, a missing bucket), a bad bundle, a full cache disk — each is
    a warning and a ``miss``, and no temporary file is left behind.
    """
    cfg = config if isinstance(config, Config) else load_config(config)
    selected = select(expand(cfg), targets)
    if not isinstance(store, Store):
        try:
            store = open_store(
                store or cfg.store,
                read_only=True,
                endpoint_url=cfg.endpoint_url,
                base_dir=cfg.base_dir,
            )
        except Exception as e:  # best effort
            return cold(selected, e)
    results = warm_targets(selected, cfg, store, Path(cache_dir) if cache_dir else None)
    lend_headers(results)
    if env := service_env(results):  # this process loads what warm served
        for package in kinds.packages():
            package.in_process(env)
    return results


__all__ = [
    "PackageState",
    "Probe",
    "WarmResult",
    "lend_headers",
    "service_env",
    "settle",
    "warm_start",
    "warm_targets",
]
