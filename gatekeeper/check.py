"""``check``: measure each target in a worker (a fresh process), warm from the store when
it can; paired mode measures the base commit's model beside it, as the base commit's
own config defines it (gatekeeper.paired.base_config)."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from . import __version__
from .bundle import now_iso, signing_key
from .config import Config
from .errors import ConfigError, StoreError
from .gate.governing import INPUT_FIELDS, governing
from .hashing import sha256_bytes
from .key import CacheKey, target_key
from .paired import Mode, base_config, checkout
from .progress import Progress
from .provenance import creator
from .results import (
    Baseline,
    BaseTarget,
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
from .verify import verify_aot, verify_precompile
from .warm import WarmResult, settle, warm_target
from .worker.launch import run_or_fail
from .worker.protocol import BaseSide, Request, Response

log = logging.getLogger("gatekeeper.check")


def reference_path(out_dir: Path, target_id: str) -> Path:
    return out_dir / reference_name(target_id)


def trace_path(out_dir: Path, target_id: str) -> Path:
    """The Chrome trace of the target's compiled call, gzipped (Perfetto and
    chrome://tracing open it); paired: ``.base.json.gz`` beside it."""
    return out_dir / trace_name(target_id)


@dataclass(frozen=True)
class PairedBase:
    """Paired mode's base version: where it was checked out, and its own config."""

    ref: str
    commit: str
    base_dir: Path  # the config's folder inside the base worktree
    config: Config  # the base commit's config, loaded from there
    targets: dict[str, Target]  # its targets, by id

    @classmethod
    def of(cls, mode: Mode, base_dir: Path, config: Config) -> PairedBase:
        """Raises ConfigError when the base's config does not expand into targets."""
        by_id = {t.id: t for t in expand(config)}
        return cls(mode.base_ref, mode.base_commit, base_dir, config, by_id)

    def removed(self, head: Config) -> list[str]:
        """The base's targets that the head's config no longer defines."""
        return sorted(set(self.targets) - {t.id for t in expand(head)})

    def side(self, target: Target) -> tuple[Target | None, BaseTarget]:
        """The base's target of the same id (None: new in this change), and what the
        results record of it."""
        base = self.targets.get(target.id)
        if base is None:
            return None, BaseTarget(defined=False)
        rules = self.config.gate_for(base.model)
        return base, BaseTarget(defined=True, rules=rules, definition=base.definition())


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


@dataclass
class _Warmed:
    """What was restored into a measurement's cache dir."""

    head: WarmResult | None = None
    base: WarmResult | None = None
    aot_dir: Path | None = None  # an +aot target measures its bundle's package
    base_aot_dir: Path | None = None

    @property
    def status(self) -> CacheStatus:
        return self.head.status if self.head is not None else "cold"


def _warm(
    target: Target,
    config: Config,
    store: Store,
    tmp: Path,
    key: CacheKey,
    base: tuple[Target, Config, CacheKey] | None,
) -> _Warmed:
    """Restore the target's bundle (and, paired, the base version's, and the shape
    sweep's other shape sets') into ``tmp/cache``: the ordinary warm start, no package."""
    aot = target.strategy == "aot"
    w = _Warmed(aot_dir=tmp / "aot" if aot else None)
    w.base_aot_dir = tmp / "aot-base" if aot else None
    cache_dir, sign = tmp / "cache", signing_key(config.require_signature)
    w.head = warm_target(
        target,
        config,
        store,
        cache_dir,
        megacache=False,
        signing_key=sign,
        cache_key=key,
        precompile="never",
        aot_dir=w.aot_dir,
    )
    if base is not None:  # the base version's artifacts, into the same cache
        base_target, base_cfg, base_key = base
        w.base = warm_target(
            base_target,
            base_cfg,
            store,
            cache_dir,
            megacache=False,
            signing_key=sign,
            cache_key=base_key,
            precompile="never",  # the base's package must never reach the measurement
            aot_dir=w.base_aot_dir,
        )
    if config.measure.shape_sweep:
        # the shape sweep runs the model's other shape sets: their bundles too, so a
        # recompile it counts is a cache hit, not a cold compile
        for other in siblings(target, config):
            warm_target(other, config, store, cache_dir, megacache=False, signing_key=sign)
    return w


def _stored_baseline(
    store: Store, target: Target, key: CacheKey, base_ref: str, dest: Path
) -> tuple[Baseline | None, Path | None]:
    """The stored baseline and its reference outputs (None when the target's inputs
    changed since: other inputs give other outputs); a store fault is a warning."""
    try:
        base = baselines.fetch(store, baselines.BaselineKey(target.id, key.env_key, base_ref))
        if base is None:
            return None, None
        old, new = base.result.definition, target.definition()
        if old is not None and any(old.get(f) != new.get(f) for f in INPUT_FIELDS):
            return base, None
        return base, baselines.fetch_reference(store, base, dest)
    except StoreError as e:
        log.warning("%s: baseline outputs unavailable: %s", target.id, e)
        return None, None


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
    rules = config.gate_for(target.model)
    base_target, recorded = paired.side(target) if paired else (None, None)
    # the base version is built from its own definition, and its dependencies are
    # checked against the base checkout's files
    base_side = None
    if paired is not None and base_target is not None:
        base_side = (base_target, paired.config, target_key(base_target, paired.base_dir))
    base_key = base_side[2] if base_side else None
    with tempfile.TemporaryDirectory(prefix="gk-check-") as tmp:
        # the measurement is of the ordinary warm start
        warmed = _Warmed() if cold else _warm(target, config, store, Path(tmp), key, base_side)
        baseline, base_reference = (
            (None, None)  # new in this change: nothing of the base's to compare with
            if recorded is not None and not recorded.defined
            else _stored_baseline(store, target, key, base_ref, Path(tmp, "base.pt"))
        )
        # the base's rules judge the change: their parity tolerances too
        tolerance = governing(rules, recorded, baseline).rules.parity
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
            parity=tolerance,
            baseline_reference=str(base_reference) if base_reference else None,
            reference_out=str(ref_out),
            paired_base=BaseSide.of(
                base_target, paired.base_dir, _package(warmed.base_aot_dir, warmed.base)
            )
            if paired and base_target
            else None,
            trace_out=str(trace),
            # a package serves the shape it was exported for (a dynamic one: all of them)
            sweep=config.measure.shape_sweep and target.strategy != "aot",
            aot_in=_package(warmed.aot_dir, warmed.head),
        )
        resp = run_or_fail(
            request,
            cache_dir=Path(tmp, "cache"),
            timeout=config.measure.timeout,
            verbose=verbose,
            label=target.id,
        )
    # the code hash of what the worker built (its recorded dependencies)
    code = (
        key.with_deps(resp.deps).code_hash
        if resp.deps is not None
        else (warmed.head.code_hash if warmed.head and warmed.head.code_hash else "unknown")
    )
    ident = {
        "target": target.id,
        "model": target.model.name,
        "env_key": key.env_key,
        "code_hash": code,
        "device": key.device,
        "rules": rules,
        "definition": target.definition(),
        "base_target": recorded,
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
    pair = _pair(paired, base_key, resp, trace_path(out_dir, target.id), out_dir)
    return _measured(target, config, store, key, resp, warmed, ident, out_dir, verbose, pair)


def _pair(
    paired: PairedBase | None,
    base_key: CacheKey | None,
    resp: Response,
    trace: Path,
    out_dir: Path,
) -> Paired | None:
    """Paired: the base version as the worker measured it, with what only the parent
    knows (its ref, commit and code hash)."""
    measured = resp.paired
    if paired is None or base_key is None or measured is None:
        return None
    if measured.profile is not None:
        base_trace = trace.with_name(trace.name.replace(".json.gz", ".base.json.gz"))
        measured.profile.trace = os.path.relpath(base_trace, out_dir)
    return Paired(
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
        same_inputs=measured.same_inputs,
    )


def _measured(
    target: Target,
    config: Config,
    store: Store,
    key: CacheKey,
    resp: Response,
    warmed: _Warmed,
    ident: dict,
    out_dir: Path,
    verbose: bool,
    pair: Paired | None,
) -> TargetResult:
    """The result of a measurement that ran (``resp.ok``)."""
    ref_out, trace = reference_path(out_dir, target.id), trace_path(out_dir, target.id)
    precompile = aot = None
    checks = (resp.parity.vs_eager, resp.parity.vs_baseline) if resp.parity else ()
    head = warmed.head
    if head is not None and all(c.passed for c in checks if c is not None):
        if target.strategy == "aot":
            aot = verify_aot(target, config, store, key, head, ref_out, verbose=verbose)
        else:
            precompile = verify_precompile(
                target, config, store, key, head, ref_out, verbose=verbose
            )
    if target.strategy == "aot":
        aot = {**(resp.aot or {}), **(aot or {})}
    counters = resp.counters or {}
    cache_status = settle(warmed.status, counters)
    data = ref_out.read_bytes()
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
            "cold_seconds": head.cold_compile_seconds if head else None,
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
    """Measure ``targets`` in ``mode`` (see gatekeeper.paired.choose_mode). Paired, the
    base side of each target is the base commit's own definition of it, from the base
    commit's config; a base config that does not load is one line, and the run is
    measured in stored mode instead."""
    sys.stderr.write(f"gatekeeper: {mode.reason}\n")
    measure = partial(_check_all, targets, config, store, out_dir=out_dir, base_ref=base_ref)
    results, removed = None, []
    if mode.name == "paired":
        with checkout(mode.base_commit, config.base_dir) as base_dir:
            try:
                paired = PairedBase.of(mode, base_dir, base_config(config, base_dir))
            except ConfigError as e:
                mode = Mode("stored", f"stored mode: {e}")
                sys.stderr.write(f"gatekeeper: {mode.reason}\n")
            else:
                removed = paired.removed(config)
                results = measure(cold=cold, verbose=verbose, paired=paired)
    if results is None:
        results = measure(cold=cold, verbose=verbose, paired=None)
    results.shard = shard
    results.mode, results.mode_reason = mode.name, mode.reason
    results.removed = removed
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
