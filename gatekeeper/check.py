"""``check``: measure each target in a worker (a fresh process), warm from the store when
it can; paired mode measures the base commit's model beside it."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import __version__, bundle
from .bundle import now_iso, signing_key
from .config import Config
from .errors import BundleError, StoreError
from .hashing import sha256_bytes
from .key import CacheKey, target_key
from .paired import Mode, checkout
from .progress import Progress
from .provenance import creator
from .results import (
    CacheStatus,
    Export,
    Paired,
    ReferenceOutputs,
    Results,
    TargetResult,
    reference_name,
    trace_name,
)
from .store import Store, baselines
from .targets import Target, expand
from .warm import WarmResult, service_env, settle, warm_target
from .worker.launch import run_or_fail
from .worker.protocol import Request

log = logging.getLogger("gatekeeper.check")


def reference_path(out_dir: Path, target_id: str) -> Path:
    return out_dir / reference_name(target_id)


def trace_path(out_dir: Path, target_id: str) -> Path:
    """The Chrome trace of the target's compiled call, gzipped (Perfetto and
    chrome://tracing open it); paired: ``.base.json.gz`` beside it."""
    return out_dir / trace_name(target_id)


@dataclass(frozen=True)
class PairedBase:
    """Where paired mode's base version was checked out."""

    ref: str
    commit: str
    base_dir: Path  # the config's folder inside the base worktree

    @classmethod
    def of(cls, mode: Mode, base_dir: Path) -> PairedBase:
        return cls(mode.base_ref, mode.base_commit, base_dir)


def siblings(target: Target, config: Config) -> list[Target]:
    """The same model, mode, task, precision and strategy at its other shape sets, each with its
    own bundle (a dynamic model's share one: none)."""
    return [
        t
        for t in expand(config)
        if t.model.name == target.model.name
        and t.bundle_id != target.bundle_id
        and (t.mode, t.task, t.precision, t.strategy)
        == (target.mode, target.task, target.precision, target.strategy)
    ]


def check_target(
    target: Target,
    config: Config,
    store: Store,
    *,
    out_dir: Path,
    base_ref: str,
    cold: bool = False,
    verbose: bool = False,
    paired: PairedBase | None = None,
) -> TargetResult:
    key = target_key(target, config.base_dir)
    with tempfile.TemporaryDirectory(prefix="gk-check-") as tmp:
        cache_dir = Path(tmp, "cache")
        cache_status: CacheStatus = "cold"
        warmed = None
        # an +aot target measures the bundle's AOTInductor package (what deploys load)
        aot_dir = Path(tmp, "aot") if target.strategy == "aot" else None
        base_aot_dir = Path(tmp, "aot-base") if target.strategy == "aot" else None
        base_warmed = None
        # the base version's dependencies are checked against the base checkout's files
        base_key = target_key(target, paired.base_dir) if paired else None
        if not cold:  # the measurement is of the ordinary warm start: no package
            warmed = warm_target(
                target,
                config,
                store,
                cache_dir,
                megacache=False,
                signing_key=signing_key(config.require_signature),
                cache_key=key,
                precompile="never",
                aot_dir=aot_dir,
            )
            cache_status = warmed.status
            if base_key is not None:  # the base version's artifacts, into the same cache
                base_warmed = warm_target(
                    target,
                    config,
                    store,
                    cache_dir,
                    megacache=False,
                    signing_key=signing_key(config.require_signature),
                    cache_key=base_key,
                    aot_dir=base_aot_dir,
                )
            if config.measure.shape_sweep:
                # the shape sweep runs the model's other shape sets: their bundles too,
                # so a recompile it counts is a cache hit, not a cold compile
                for other in siblings(target, config):
                    warm_target(
                        other,
                        config,
                        store,
                        cache_dir,
                        megacache=False,
                        signing_key=signing_key(config.require_signature),
                    )
        base_reference = None
        try:
            base = baselines.fetch(store, baselines.BaselineKey(target.id, key.env_key, base_ref))
            if base is not None:
                base_reference = baselines.fetch_reference(store, base, Path(tmp, "base.pt"))
        except StoreError as e:
            log.warning("%s: baseline outputs unavailable: %s", target.id, e)
        ref_out = reference_path(out_dir, target.id)
        ref_out.parent.mkdir(parents=True, exist_ok=True)
        trace = trace_path(out_dir, target.id)
        trace.parent.mkdir(parents=True, exist_ok=True)
        request = Request.for_target(
            "measure",
            target,
            config,
            key.device,
            budget=config.measure,
            parity=config.gate_for(target.model).parity,
            baseline_reference=str(base_reference) if base_reference else None,
            reference_out=str(ref_out),
            paired_base_dir=str(paired.base_dir) if paired else None,
            trace_out=str(trace),
            # a package serves the shape it was exported for (a dynamic one: all of them)
            sweep=config.measure.shape_sweep and target.strategy != "aot",
            aot_in=_package(aot_dir, warmed),
            base_aot_in=_package(base_aot_dir, base_warmed),
        )
        resp = run_or_fail(
            request,
            cache_dir=cache_dir,
            timeout=config.measure.timeout,
            verbose=verbose,
            label=target.id,
        )
    # the code hash of what the worker built (its recorded dependencies)
    code = (
        key.with_deps(resp.deps).code_hash
        if resp.deps is not None
        else (warmed.code_hash if warmed and warmed.code_hash else "unknown")
    )
    ident = {
        "target": target.id,
        "model": target.model.name,
        "env_key": key.env_key,
        "code_hash": code,
        "device": key.device,
    }
    if not resp.ok and resp.kind == "unavailable":  # this torch's AOTInductor, here
        return TargetResult(**ident, status="unavailable", error=resp.error, measured_at=now_iso())
    if not resp.ok and resp.kind == "export":
        return TargetResult(
            **ident,
            status="not-exportable",
            error=resp.error,
            export=Export.model_validate(resp.export) if resp.export else None,
            measured_at=now_iso(),
        )
    if not resp.ok:
        return TargetResult(**ident, status="error", error=resp.error)
    precompile = aot = None
    checks = (resp.parity.vs_eager, resp.parity.vs_baseline) if resp.parity else ()
    if warmed is not None and all(c.passed for c in checks if c is not None):
        if target.strategy == "aot":
            aot = verify_aot(target, config, store, key, warmed, ref_out, verbose=verbose)
        else:
            precompile = verify_precompile(
                target, config, store, key, warmed, ref_out, verbose=verbose
            )
    if target.strategy == "aot":
        aot = {**(resp.aot or {}), **(aot or {})}
    counters = resp.counters or {}
    cache_status = settle(cache_status, counters)
    data = ref_out.read_bytes()
    pair = None
    if paired and base_key and resp.paired:
        measured = resp.paired
        if measured.profile is not None:
            base_trace = trace.with_name(trace.name.replace(".json.gz", ".base.json.gz"))
            measured.profile.trace = os.path.relpath(base_trace, out_dir)
        pair = Paired(
            base_ref=paired.ref,
            base_commit=paired.commit,
            code_hash=base_key.with_deps(measured.deps).code_hash
            if measured.deps is not None
            else "unknown",
            compile_seconds=measured.compile_seconds,
            graphs=measured.graphs,
            samples=measured.samples,
            work=measured.work,
            profile=measured.profile,
        )
    return TargetResult(
        **ident,
        status="ok",
        measured_at=now_iso(),
        mode="paired" if pair else "stored",
        compile={
            "seconds": resp.compile_seconds,
            # an aot target is warm when it loaded its bundle's package
            "warm": (resp.aot or {}).get("from") == "bundle"
            if target.strategy == "aot"
            else cache_status in ("hit", "partial", "stale"),
            "cache": cache_status,
            "cold_seconds": warmed.cold_compile_seconds if warmed else None,
            **{
                k: counters[k]
                for k in (
                    "fxgraph_cache_hit",
                    "fxgraph_cache_miss",
                    "autograd_cache_hit",
                    "autograd_cache_miss",
                )
            },
        },
        graphs=resp.graphs,
        latency=resp.latency,
        memory=resp.memory,
        parity=resp.parity.model_copy(update={"outputs": resp.outputs}) if resp.parity else None,
        paired=pair,
        work=resp.work,
        precompile=precompile,
        export=Export.model_validate(resp.export) if resp.export else None,
        aot=aot or None,
        profile=resp.profile.model_copy(update={"trace": os.path.relpath(trace, out_dir)})
        if resp.profile
        else None,
        reference=ReferenceOutputs(
            file=os.path.relpath(ref_out, out_dir), sha256=sha256_bytes(data), size=len(data)
        ),
    )


def _package(aot_dir: Path | None, warmed: WarmResult | None) -> str | None:
    """The AOTInductor package the measurement loads: this code's bundle's (a ``hit``);
    a ``partial`` bundle's package is another version's model, so it compiles anew."""
    if aot_dir is None or warmed is None or warmed.status != "hit":
        return None
    package = aot_dir / "model.pt2"
    return str(package) if package.is_file() else None


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
    verdict = (
        resp.aot
        if resp.ok and resp.aot
        else {"verified": False, "reason": f"loading it failed: {resp.error}"}
    )
    check = {
        "reason": verdict.get("reason"),
        "first_call_seconds": verdict.get("first_call_seconds"),
        "load_seconds": verdict.get("load_seconds"),
        "at": now_iso(),
        "torch": resp.torch,
        "gatekeeper_version": __version__,
    }
    verified = bool(verdict.get("verified"))
    if not verified:
        log.warning(
            "%s: AOTInductor package not verified, never served: %s", target.id, check["reason"]
        )
    stored = _store_verdict(
        target, config, store, warmed, "aot", {**info, "verified": verified, "check": check}
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
    verdict = (
        resp.precompile
        if resp.ok and resp.precompile
        else {"verified": False, "reason": f"loading it failed: {resp.error}"}
    )
    check = {
        "dynamo": verdict.get("dynamo"),
        "reason": verdict.get("reason"),
        "first_call_seconds": verdict.get("first_call_seconds"),
        "at": now_iso(),
        "torch": resp.torch,
        "gatekeeper_version": __version__,
    }
    verified = bool(verdict.get("verified"))
    if not verified:
        log.warning(
            "%s: precompile package not verified, never served: %s", target.id, check["reason"]
        )
    written = _store_verdict(
        target, config, store, warmed, "precompile", {**info, "verified": verified, "check": check}
    )
    return {"verified": verified, **check, "now": True, "stored": written}


def check_all(
    targets: list[Target],
    config: Config,
    store: Store,
    *,
    out_dir: Path,
    base_ref: str,
    mode: Mode,
    cold: bool = False,
    verbose: bool = False,
    shard: str | None = None,
) -> Results:
    """Measure ``targets`` in ``mode`` (see gatekeeper.paired.choose_mode)."""
    sys.stderr.write(f"gatekeeper: {mode.reason}\n")
    if mode.name == "paired":
        with checkout(mode.base_commit, config.base_dir) as base_dir:
            results = _check_all(
                targets,
                config,
                store,
                out_dir=out_dir,
                base_ref=base_ref,
                cold=cold,
                verbose=verbose,
                paired=PairedBase.of(mode, base_dir),
            )
    else:
        results = _check_all(
            targets,
            config,
            store,
            out_dir=out_dir,
            base_ref=base_ref,
            cold=cold,
            verbose=verbose,
            paired=None,
        )
    results.shard = shard
    results.mode, results.mode_reason = mode.name, mode.reason
    return results


def _runnable_others() -> int | None:
    """Processes other than this one wanting a CPU right now (least of a few looks)."""
    counts = []
    for _ in range(5):
        try:
            text = Path("/proc/stat").read_text()
        except OSError:
            return None
        running = next(
            (int(ln.split()[1]) for ln in text.splitlines() if ln.startswith("procs_running")), None
        )
        if running is None:
            return None
        counts.append(running - 1)
        time.sleep(0.05)
    return min(counts)


def warn_if_busy() -> None:
    """Timings on a busy machine are noise: torch's OpenMP threads wait at every barrier
    for a thread the OS has descheduled (a 30 µs op became 4 ms on 2 busy cores here)."""
    others, cores = _runnable_others(), os.cpu_count() or 1
    if others:
        log.warning(
            "%d other process(es) are using the CPU (%d cores): latency will be "
            "noisy; run one measurement per runner at a time",
            others,
            cores,
        )


def _check_all(
    targets: list[Target],
    config: Config,
    store: Store,
    *,
    out_dir: Path,
    base_ref: str,
    cold: bool,
    verbose: bool,
    paired: PairedBase | None,
) -> Results:
    warn_if_busy()
    progress = Progress(len(targets))
    results = []
    for target in targets:
        with progress.step(target.id, "measuring" + (" paired" if paired else "")) as step:
            r = check_target(
                target,
                config,
                store,
                out_dir=out_dir,
                base_ref=base_ref,
                cold=cold,
                verbose=verbose,
                paired=paired,
            )
            results.append(r)
            if r.status in ("not-exportable", "unavailable"):
                step.done(str(r.error))
            elif r.latency is None or r.compile is None:
                step.done(f"error: {r.error}")
            else:
                step.done(
                    f"p50 {r.latency.compiled.p50 * 1e3:.3f} ms, "
                    f"speedup {r.latency.speedup:.2f}x, cache {r.compile.cache}"
                )
    return Results(
        created_at=now_iso(),
        gatekeeper_version=__version__,
        creator=creator(),
        base_ref=base_ref,
        targets=results,
    )
