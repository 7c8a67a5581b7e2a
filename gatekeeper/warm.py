"""Warm start: restore each target's verified bundle into the inductor cache dir.

``gatekeeper warm`` runs it before a deploy starts; ``gatekeeper.warm_start()`` runs it
inside the service's own process. A store that cannot be reached or a bundle that does
not verify is a warning and a ``miss`` — the service then compiles cold, it never
crashes and never loads what did not verify.

A ``hit`` is a bundle whose recorded dependencies all still match this checkout
(:func:`gatekeeper.key.find_bundle`); a manifest found under another key than it names
is refused. ``--probe`` (and ``check``) then see whether inductor agrees: a key hit
whose FX graphs all miss is ``stale``, never a hit.

A bundle's precompile package (Dynamo's own, see :mod:`gatekeeper.worker.precompile`)
is installed only when the bundle is an exact ``hit`` and a ``check`` verified the
package; otherwise the plain cache is installed and any package a previous warm left at
the same place is removed, so the deploy can never load one that was not verified.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from . import bundle
from .bundle import signing_key
from .config import Config, load_config
from .errors import BundleError, StoreError
from .key import CacheKey, find_bundle, target_key
from .results import CacheStatus
from .runtime import default_cache_dir, load_megacache, resolve_device
from .store import Store, open_store
from .targets import Target, expand, select
from .worker.protocol import ISA_ENV, PRECOMPILE_ENV

log = logging.getLogger("gatekeeper.warm")


@dataclass
class WarmResult:
    target: str
    status: CacheStatus  # hit | partial | miss (| stale: a probe saw every graph miss)
    env_key: str | None = None
    code_hash: str | None = None
    bundle_code_hash: str | None = None
    files: int = 0
    seconds: float = 0.0
    cold_compile_seconds: float | None = None  # what the bundle's compile took, cold
    bundle_bytes: int | None = None
    reason: str | None = None
    # served | installed (not loaded: see hold_packages) | unverified | rejected |
    # unavailable | shadowed (None: the bundle has none)
    precompile: str | None = None
    precompile_reason: str | None = None
    # an +aot target's AOTInductor package: served (installed for gatekeeper.load_aot) |
    # unverified | rejected | missing (the bundle has none)
    aot: str | None = None
    aot_reason: str | None = None
    manifest: Any = field(default=None, repr=False)  # the verified manifest, not output
    location: Any = field(default=None, repr=False)  # where it was found, not output

    def as_dict(self) -> dict:
        return {
            k: v
            for k, v in self.__dict__.items()
            if v is not None and k not in ("manifest", "location")
        }


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


Precompile = Literal["verified", "any", "never"]


def _precompile(
    result: WarmResult,
    manifest: bundle.Manifest,
    entries: set[str],
    hit: bool,
    want: Precompile,
    served: set[str],
) -> bool:
    """Whether to install the bundle's precompile package (its ``entries``, the
    ``dynamo/<key>`` folders); says why in ``result``."""
    info = bundle.precompile_info(manifest)
    if not entries:
        if info:
            result.precompile, result.precompile_reason = info.get("status"), info.get("reason")
        return False
    check = info.get("check") or {}
    if want == "never":
        return False
    if want == "verified":
        if not hit:
            result.precompile = "unverified"
            result.precompile_reason = "the bundle is another version's: its package is not served"
            return False
        if info.get("verified") is not True:
            result.precompile = "rejected" if info.get("verified") is False else "unverified"
            result.precompile_reason = check.get("reason") or "no check has verified it yet"
            return False
    if taken := entries & served:
        result.precompile = "shadowed"
        result.precompile_reason = (
            f"another target's package already serves {sorted(taken)[0]} in this cache dir"
        )
        return False
    result.precompile = "served"
    return True


def warm_target(
    target: Target,
    config: Config,
    store: Store,
    cache_dir: Path,
    *,
    signing_key: bytes | None,
    megacache: bool = True,
    cache_key: CacheKey | None = None,
    precompile: Precompile = "verified",
    served: set[str] | None = None,
    aot_dir: Path | None = None,
) -> WarmResult:
    """Restore one target's bundle into ``cache_dir``; ``megacache`` also loads the
    Mega-Cache blob into this process (skip it when another process will compile).
    ``cache_key`` (default: the target's from the config's folder) also says which
    checkout's files the recorded dependencies are checked against. ``precompile``:
    install the bundle's precompile package when verified (a deploy), also unverified
    (the check that verifies it), or never (a measurement); ``served`` collects the
    package folders installed so far into this cache dir. An ``+aot`` target's
    AOTInductor package goes to ``aot_dir`` when given (a check measures or verifies
    it), and for a deploy (``precompile="verified"``) where :func:`gatekeeper.load_aot`
    finds it, only when the bundle is an exact ``hit`` and verified."""
    start = time.monotonic()
    ck = cache_key or target_key(target, config.base_dir)
    result = WarmResult(target.id, "miss", ck.env_key)
    try:
        match, reason = find_bundle(store, ck, signing_key=signing_key)
        if match is None:
            result.reason = reason
            return result
        manifest = match.manifest
        result.cold_compile_seconds = bundle.cold_seconds(manifest)
        result.bundle_bytes = manifest.archive.size
        with tempfile.TemporaryDirectory(prefix="gk-warm-") as tmp:
            archive = Path(tmp, manifest.archive.name)
            store.download(
                match.location.key(manifest.archive.name), archive, max_bytes=manifest.archive.size
            )
            staging = Path(tmp, "staging")
            bundle.extract(archive, manifest, staging)
            served = set() if served is None else served
            entries = bundle.precompile_entries(manifest)
            serve = _precompile(
                result, manifest, entries, match.status == "hit", precompile, served
            )
            if not serve:  # never leave a package of another version where torch looks
                for entry in entries - served:
                    shutil.rmtree(cache_dir / entry, ignore_errors=True)
            result.files = bundle.install_cache(staging, cache_dir, precompile=serve)
            if serve:
                served |= entries
            package = staging / bundle.AOT_PACKAGE
            if aot_dir is not None and package.is_file():
                aot_dir.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(package, aot_dir / package.name)
            if target.strategy == "aot" and precompile == "verified":
                install_aot(result, manifest, match, package, cache_dir)
            blob = staging / bundle.MEGACACHE
            if megacache and blob.is_file():
                load_megacache(blob.read_bytes())
    except (StoreError, BundleError) as e:
        log.warning("%s; %s will compile cold", e, target.id)
        result.reason = str(e)
        return result
    finally:
        result.seconds = time.monotonic() - start
        if target.strategy == "aot" and precompile == "verified" and result.aot is None:
            # no bundle (or a bad one): no package of another version stays installed
            from .runtime import package_dir

            shutil.rmtree(package_dir(cache_dir, target.id), ignore_errors=True)
            result.aot, result.aot_reason = "missing", "no bundle to serve it from"
    result.status, result.reason = match.status, match.why
    result.code_hash = match.key.code_hash
    result.bundle_code_hash = match.location.code_hash
    result.manifest, result.location = manifest, match.location
    return result


def install_aot(
    result: WarmResult, manifest: bundle.Manifest, match: Any, package: Path, cache_dir: Path
) -> None:
    """A deploy's AOTInductor package: installed where :func:`gatekeeper.load_aot` finds
    it when the bundle is this code's (``hit``) and a check verified the package;
    otherwise any package an earlier warm left there is removed, so a service never
    loads one that was not verified for this code."""
    from .runtime import INFO, MANIFEST, package_dir

    dest = package_dir(cache_dir, result.target)
    info = bundle.aot_info(manifest)
    check = info.get("check") or {}
    if not package.is_file():
        result.aot, result.aot_reason = "missing", info.get("reason") or "the bundle has none"
    elif match.status != "hit":
        result.aot = "unverified"
        result.aot_reason = "the bundle is another version's: its package is not served"
    elif info.get("verified") is not True:
        result.aot = "rejected" if info.get("verified") is False else "unverified"
        result.aot_reason = check.get("reason") or "no check has verified it yet"
    else:
        dest.mkdir(parents=True, exist_ok=True)
        (dest / INFO).unlink(missing_ok=True)  # never a verdict beside another package
        fd, tmp = tempfile.mkstemp(prefix=".gk-", dir=dest)
        os.close(fd)
        try:
            shutil.copyfile(package, tmp)
            os.replace(tmp, dest / package.name)
        except BaseException:
            os.unlink(tmp)
            raise
        doc = {
            "target": result.target,
            "code_hash": manifest.code_hash,
            "env_key": manifest.env_key,
            "sha256": manifest.files[bundle.AOT_PACKAGE].sha256,
            "verified": True,
            "check": check,
        }
        (dest / MANIFEST).write_bytes(manifest.to_bytes())  # its signature, for load_aot
        (dest / INFO).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        result.aot = "served"
        return
    shutil.rmtree(dest, ignore_errors=True)


def cold(targets: list[Target], e: BaseException) -> list[WarmResult]:
    """Best effort's last word: every target a miss, said once."""
    reason = _reason(e)
    log.warning("warm start failed: %s; every target will compile cold", reason)
    return [WarmResult(t.id, "miss", reason=reason) for t in targets]


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
    served: set[str] = set()
    for t in targets:
        try:
            results.append(warm_target(t, config, store, cache, signing_key=key, served=served))
        except Exception as e:  # best effort: the deploy compiles cold
            log.warning("%s; %s will compile cold", _reason(e), t.id)
            results.append(WarmResult(t.id, "miss", reason=_reason(e)))
    stuck = drop_unserved_packages(cache, served)
    hold_packages(results, stuck=stuck)
    return results


def drop_unserved_packages(cache_dir: Path, served: set[str]) -> str | None:
    """Remove every precompile package (``dynamo/<key>``) in ``cache_dir`` that this
    warm did not serve: one an earlier deploy left for a target that now misses, or
    that is no longer warmed, must not load (torch finds a package by the forward's
    name, not by the code it was verified for). Returns the first one that could not
    be removed, None when none is left."""
    root = cache_dir / "dynamo"
    try:
        entries = [p for p in root.iterdir()] if root.is_dir() else []
    except OSError:
        return str(root)
    for entry in entries:
        name = f"dynamo/{entry.name}"
        if name in served:
            continue
        try:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        except OSError as e:
            log.warning("cannot remove the stale precompile package %s: %s", entry, e)
            return name
    return None


def service_env(results: list[WarmResult]) -> dict[str, str]:
    """What a service process must have in its environment to load the packages warm
    installed: all or nothing. Only when every target warm found is served from its
    own verified package: ``TORCH_CACHING_PRECOMPILE=1`` (torch loads packages inside
    ``torch.compile``) and ``TORCHINDUCTOR_VEC_ISA_OK=1`` (no ISA probe: the key pins
    the CPU's flags and a package's kernels are built). Either setting costs a target
    without a package its warm start (the first changes AOTAutograd's keys, the second
    is in the FX graph key), and torch would hand a ``shadowed`` target the package of
    another target of its model; :func:`hold_packages` says so on the served ones."""
    if any(r.precompile == "served" for r in results) and _unpackaged(results) is None:
        return {PRECOMPILE_ENV: "1", ISA_ENV: "1"}
    return {}


def _unpackaged(results: list[WarmResult]) -> WarmResult | None:
    """The first target warmed (found or missed) that is not served from a package of
    its own; None when every one is. A miss counts: that target compiles cold, and
    turning packages on would let torch load whatever package it finds for it. A found
    +aot target never runs torch.compile: the setting cannot cost it anything."""
    return next(
        (
            r
            for r in results
            if r.precompile != "served"
            and not (r.target.endswith("+aot") and r.status in ("hit", "partial"))
        ),
        None,
    )


def hold_packages(results: list[WarmResult], *, stuck: str | None = None) -> None:
    """When :func:`service_env` turns packages off, say why on each installed one.
    ``stuck``: a package this warm did not serve that could not be removed (then no
    package may load: torch would find that one too)."""
    held = _unpackaged(results)
    if held is None and stuck is None:
        return
    for r in results:
        if r.precompile != "served":
            continue
        r.precompile = "installed"
        if held is None:
            r.precompile_reason = (
                f"not loaded: the stale package {stuck} in this cache dir could not be removed"
            )
            continue
        why = (
            f"missed ({held.reason or 'no bundle'})"
            if held.status == "miss"
            else f"has no package of its own ({held.precompile or 'none'})"
        )
        r.precompile_reason = (
            f"not loaded: {held.target} is warmed too and {why}; turning packages on "
            "would cost it its cache hits (warm it for a service of its own to load "
            "this one)"
        )


def probe(
    target: Target,
    config: Config,
    cache_dir: Path,
    *,
    verbose: bool = False,
    env: dict[str, str] | None = None,
):
    """The first compiled call of ``target`` in a new process on ``cache_dir``: its time
    and FX graph cache hits show whether the warm start really is warm. ``env``: the
    service's (:func:`service_env`); with packages loading, did Dynamo run?"""
    from .runtime import PACKAGE, package_dir
    from .worker.launch import run_or_fail
    from .worker.protocol import Request

    request = Request.for_target(
        "probe",
        target,
        config,
        resolve_device(target.model.device),
        precompile=(env or {}).get(PRECOMPILE_ENV) == "1",
        # an +aot target: the package warm installed, loaded as gatekeeper.load_aot does
        aot_in=str(package_dir(cache_dir, target.id) / PACKAGE)
        if target.strategy == "aot"
        else None,
    )
    return run_or_fail(
        request,
        cache_dir=cache_dir,
        timeout=config.measure.timeout,
        verbose=verbose,
        label=target.id,
        env=env,
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
    if env := service_env(results):
        try:  # this process loads the verified packages its torch.compile calls find
            from .worker.precompile import enable_loading

            enable_loading(skip_isa_probe=ISA_ENV in env)
        except Exception as e:  # best effort: a normal warm start
            log.warning("precompile packages not enabled: %s", _reason(e))
    return results


__all__ = ["WarmResult", "service_env", "settle", "warm_start", "warm_targets"]
