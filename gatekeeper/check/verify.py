"""The one check a bundle's package must pass before ``warm`` serves it to a deploy,
whatever its kind (a precompile package, an aot target's AOTInductor package): a fresh
worker loads it as a deploy would (:mod:`gatekeeper.worker.verify`) and compares its
first outputs with eager and with ``check``'s own; the verdict goes into the bundle's
manifest (``compile.<package>``, re-signed, one conditional write) and into
results.json. Once per bundle: a verdict already there is reported."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from .. import __version__, bundle, kinds
from ..boundary.client import run_or_fail
from ..boundary.protocol import PackageRef, Response, VerifyRequest
from ..bundle import now_iso, signing_key
from ..config import Config
from ..errors import BundleError, StoreError
from ..key import CacheKey
from ..scratch import scratch_dir
from ..store import Store
from ..targets import Target
from ..warm import WarmResult, warm_target

log = logging.getLogger("gatekeeper.check")


@dataclass(frozen=True)
class Restored:
    """A bundle a check restored for a target: what ``warm`` found of it, where, and
    under which key and config."""

    target: Target
    config: Config
    store: Store
    key: CacheKey
    warmed: WarmResult


def verify_packages(restored: Restored, reference: Path, *, verbose: bool = False) -> dict:
    """Every package of the restored bundle, verified (verdicts by name): each must pass
    before ``warm`` serves it. A fresh worker loads it as a deploy would and compares
    its first outputs with eager and with this check's (``reference``). A package with
    nothing to verify (not this code's bundle, no package, or replaced in between) has
    no verdict."""
    manifest = restored.warmed.manifest
    if manifest is None:
        return {}
    found = {}
    for package in kinds.packages():
        if package.present(manifest):
            verdict = _verify(package, restored, reference, verbose)
            if verdict is not None:
                found[package.name] = verdict
    return found


def _verify(
    package: kinds.Package, restored: Restored, reference: Path, verbose: bool
) -> dict | None:
    target, config, key, warmed = restored.target, restored.config, restored.key, restored.warmed
    manifest = warmed.manifest
    info = package.info(manifest)
    if warmed.status != "hit" or info.get("status") != package.ready:
        return None
    if info.get("verified") is not None:
        return {"verified": info["verified"], **(info.get("check") or {}), "now": False}
    with scratch_dir(f"gk-{package.name}-") as tmp:
        cache_dir, stage = Path(tmp, "cache"), Path(tmp, "package")
        again = warm_target(
            target,
            config,
            restored.store,
            cache_dir,
            megacache=False,
            signing_key=signing_key(config.require_signature),
            cache_key=key,
            serve=package.serve_when_verifying,
            stage=stage,
        )
        where = package.staged(again, stage, cache_dir)
        if where is None or again.manifest != manifest:
            return None  # replaced in between: the next check verifies the new one
        request = VerifyRequest.of(
            target,
            config,
            key.device,
            kind=kinds.of(target),
            package=PackageRef.of(package, where),
            parity=config.gate_for(target.model).parity,
            reference_in=str(reference),
        )
        resp = run_or_fail(  # in the environment of the deploy that serves it
            request,
            cache_dir=cache_dir,
            timeout=config.measure.timeout,
            verbose=verbose,
            label=f"{target.id} ({package.name} package)",
            env=package.verify_env(again),
        )
    return _conclude(package, restored, info, resp)


def _conclude(package: kinds.Package, restored: Restored, info: dict, resp: Response) -> dict:
    """A package's verdict (the worker's, with the package's fields; loading it failed
    when there is none) into the bundle's manifest and into results.json."""
    verdict = resp.packages.get(package.name) if resp.ok else None
    if not verdict:
        verdict = {"verified": False, "reason": f"loading it failed: {resp.error}"}
    check = {
        **{name: verdict.get(name) for name in package.verdict_fields},
        "at": now_iso(),
        "torch": resp.torch,
        "gatekeeper_version": __version__,
    }
    verified = bool(verdict.get("verified"))
    if not verified:
        log.warning(
            "%s: %s package not verified, never served: %s",
            restored.target.id,
            package.title,
            check["reason"],
        )
    doc = {**info, "verified": verified, "check": check}
    stored = _store_verdict(restored, package.name, doc)
    return {"verified": verified, **check, "now": True, "stored": stored}


def _store_verdict(restored: Restored, section: str, doc: dict) -> str:
    """Write a package's verdict into the bundle's manifest (``compile.<section>``),
    re-signed, by one conditional write; says how it went."""
    target, store, warmed = restored.target, restored.store, restored.warmed
    manifest = warmed.manifest
    key = signing_key(restored.config.require_signature)
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
