"""The checks a bundle's package must pass before ``warm`` serves it (a precompile
package, an ``+aot`` target's AOTInductor package): a fresh worker loads it and compares
its first outputs with eager and with ``check``'s own; the verdict goes into the
bundle's manifest (re-signed, one conditional write) and into results.json."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from . import __version__, bundle
from .bundle import now_iso, signing_key
from .config import Config
from .errors import BundleError, StoreError
from .key import CacheKey
from .store import Store
from .targets import Target
from .warm import WarmResult, service_env, warm_target
from .worker.launch import run_or_fail
from .worker.protocol import Request, Response

log = logging.getLogger("gatekeeper.check")


def verify_aot(
    target: Target,
    config: Config,
    store: Store,
    key: CacheKey,
    warmed: WarmResult,
    reference: Path,
    *,
    verbose: bool = False,
) -> dict | None:
    """The check an ``+aot`` target's AOTInductor package must pass before ``warm``
    serves it: a fresh worker loads it the way :func:`gatekeeper.load_aot` does and
    compares its first outputs with eager and with this check's outputs
    (``reference``). The verdict goes into the bundle's manifest (re-signed, one
    conditional write) and into results.json. Once per bundle."""
    manifest = warmed.manifest
    info = bundle.aot_info(manifest) if manifest is not None else {}
    if warmed.status != "hit" or info.get("status") != "packaged":
        return None
    if info.get("verified") is not None:
        return {"verified": info["verified"], **(info.get("check") or {}), "now": False}
    with tempfile.TemporaryDirectory(prefix="gk-aot-") as tmp:
        again = warm_target(
            target,
            config,
            store,
            Path(tmp, "cache"),
            megacache=False,
            signing_key=signing_key(config.require_signature),
            cache_key=key,
            precompile="never",
            aot_dir=Path(tmp, "aot"),
        )
        package = Path(tmp, "aot", "model.pt2")
        if again.manifest != manifest or not package.is_file():
            return None  # replaced in between: the next check verifies the new one
        request = Request.for_target(
            "aot",
            target,
            config,
            key.device,
            parity=config.gate_for(target.model).parity,
            reference_in=str(reference),
            aot_in=str(package),
        )
        resp = run_or_fail(
            request,
            cache_dir=Path(tmp, "cache"),
            timeout=config.measure.timeout,
            verbose=verbose,
            label=f"{target.id} (aot package)",
        )
    fields = ("reason", "first_call_seconds", "load_seconds")
    return _conclude(target, config, store, warmed, "aot", info, resp, resp.aot, fields)


def _conclude(
    target: Target,
    config: Config,
    store: Store,
    warmed: WarmResult,
    section: str,
    info: dict,
    resp: Response,
    verdict: dict | None,
    fields: tuple[str, ...],
) -> dict:
    """A package's verdict (the worker's ``verdict``, with its ``fields``; loading it
    failed when there is none) into the bundle's manifest and into results.json."""
    if not (resp.ok and verdict):
        verdict = {"verified": False, "reason": f"loading it failed: {resp.error}"}
    check = {
        **{name: verdict.get(name) for name in fields},
        "at": now_iso(),
        "torch": resp.torch,
        "gatekeeper_version": __version__,
    }
    verified = bool(verdict.get("verified"))
    if not verified:
        what = "AOTInductor" if section == "aot" else section
        log.warning(
            "%s: %s package not verified, never served: %s", target.id, what, check["reason"]
        )
    stored = _store_verdict(
        target, config, store, warmed, section, {**info, "verified": verified, "check": check}
    )
    return {"verified": verified, **check, "now": True, "stored": stored}


def _store_verdict(
    target: Target, config: Config, store: Store, warmed: WarmResult, section: str, doc: dict
) -> str:
    """Write a package's verdict into the bundle's manifest (``compile.<section>``),
    re-signed, by one conditional write; says how it went."""
    manifest = warmed.manifest
    key = signing_key(config.require_signature)
    if manifest.signature and not key:
        # re-writing it unsigned would make every signed deploy refuse the bundle
        log.warning(
            "%s: %s verdict not stored: the bundle is signed and GATEKEEPER_SIGNING_KEY "
            "is not set here",
            target.id,
            section,
        )
        return "unsigned"
    updated = bundle.sign(
        manifest.model_copy(update={"compile": {**manifest.compile, section: doc}}),
        key,
    )
    try:
        old = store.read_manifest(warmed.location)
        if (
            old is not None
            and bundle.verify_manifest(old, target=manifest.target, signing_key=key) == manifest
        ):
            return store.update_manifest(warmed.location, old, updated.to_bytes())
        return "changed"
    except (StoreError, BundleError) as e:
        log.warning("%s: %s verdict not stored: %s", target.id, section, e)
        return "error"


def verify_precompile(
    target: Target,
    config: Config,
    store: Store,
    key: CacheKey,
    warmed: WarmResult,
    reference: Path,
    *,
    verbose: bool = False,
) -> dict | None:
    """The check a precompile package must pass before ``warm`` serves it: a fresh
    worker loads it from the bundle (Dynamo should not run) and compares its first
    outputs with eager and with this check's own compiled outputs (``reference``).
    The verdict goes into the bundle's manifest (re-signed, one conditional write) and
    into results.json. Runs once per bundle: a verdict already there is reported."""
    manifest = warmed.manifest
    info = bundle.precompile_info(manifest) if manifest is not None else {}
    if warmed.status != "hit" or info.get("status") != "recorded":
        return None
    if info.get("verified") is not None:
        return {"verified": info["verified"], **(info.get("check") or {}), "now": False}
    with tempfile.TemporaryDirectory(prefix="gk-precompile-") as tmp:
        cache_dir = Path(tmp, "cache")
        again = warm_target(
            target,
            config,
            store,
            cache_dir,
            megacache=False,
            signing_key=signing_key(config.require_signature),
            cache_key=key,
            precompile="any",
        )
        if again.precompile != "served" or again.manifest != manifest:
            return None  # replaced in between: the next check verifies the new one
        request = Request.for_target(
            "precompile",
            target,
            config,
            key.device,
            parity=config.gate_for(target.model).parity,
            reference_in=str(reference),
        )
        # in the environment of the deploy that serves it (warm's service_env)
        resp = run_or_fail(
            request,
            cache_dir=cache_dir,
            timeout=config.measure.timeout,
            verbose=verbose,
            label=f"{target.id} (precompile)",
            env=service_env([again]),
        )
    fields = ("dynamo", "reason", "first_call_seconds")
    return _conclude(
        target, config, store, warmed, "precompile", info, resp, resp.precompile, fields
    )
