"""One target's check, in its stages:

1. **warm**: restore the target's bundle (and, paired, the base version's, and the shape
   sweep's other shape sets') into the measurement's cache dir, as a deploy's warm start
   would, but no package: a kind whose deploys load a package gets it staged aside, to
   be measured only when the bundle is this code's;
2. **baseline**: the stored baseline's reference outputs (not when the inputs changed);
3. **measure**: one worker measures everything (:mod:`gatekeeper.worker.measure`);
4. **verify**: each package the bundle carries, once, when parity passed
   (:mod:`gatekeeper.check.verify`);
5. **assemble**: the worker's answer and what only the parent knows, as a
   :class:`~gatekeeper.results.TargetResult`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import kinds, safefs
from ..boundary.client import run_or_fail
from ..boundary.protocol import BaseSide, MeasureRequest, PackageRef, Response
from ..bundle import now_iso, signing_key
from ..config import Config, ParityTolerance
from ..errors import StoreError, WontFit
from ..gate.governing import INPUT_FIELDS, governing
from ..hashing import sha256_bytes
from ..key import CacheKey, target_key
from ..project import definition, expand
from ..results import (
    MAX_RESULTS_BYTES,
    Baseline,
    BaseTarget,
    CacheStatus,
    Export,
    Paired,
    ReferenceOutputs,
    TargetResult,
    reference_name,
    trace_name,
)
from ..scratch import scratch_dir
from ..store import Store, baselines
from ..targets import Target
from ..warm import WarmResult, settle, warm_target
from .paired import Mode, PairedBase
from .verify import Restored, verify_packages

log = logging.getLogger("gatekeeper.check")
TRACE_CAP = MAX_RESULTS_BYTES  # what merge copies of a trace, at most


@dataclass(frozen=True)
class Plan:
    """How a run measures: where its files go (``out_dir``), whose baseline it compares
    with (``base_ref``), in which mode, whether from a cold compile, and the shard it
    is (``i/n``, recorded in the results)."""

    out_dir: Path
    base_ref: str
    mode: Mode
    cold: bool = False
    verbose: bool = False
    shard: str | None = None


@dataclass
class Side:
    """One version of the target: the head's, or paired the base commit's (its own
    definition, its own checkout, its own key)."""

    target: Target
    config: Config
    key: CacheKey
    warmed: WarmResult | None = None
    stage: Path | None = None  # where its kind's package is staged

    def package(self) -> PackageRef | None:
        """The package its measurement loads: this code's bundle's (a ``hit``); a
        ``partial`` bundle's package is another version's model, so it is built anew."""
        own = kinds.of(self.target).package
        if own is None or self.stage is None or self.warmed is None:
            return None
        if self.warmed.status != "hit":
            return None
        path = own.staged(self.warmed, self.stage, self.stage)
        return PackageRef.of(own, path) if path is not None else None


@dataclass
class Check:
    """What one target's check has found so far, stage by stage."""

    head: Side
    base: Side | None
    recorded: BaseTarget | None  # paired: what the results record of the base's target
    out_dir: Path
    verbose: bool
    reference: Path  # where this run's reference outputs go
    # the Chrome trace of the target's compiled call, gzipped (Perfetto and
    # chrome://tracing open it); paired: ``.base.json.gz`` beside it
    trace: Path
    verdicts: dict[str, dict] = field(default_factory=dict)


def check_target(
    target: Target, config: Config, store: Store, plan: Plan, paired: PairedBase | None = None
) -> TargetResult:
    base_target, recorded = paired.side(target) if paired else (None, None)
    head = Side(target, config, target_key(target, config.base_dir))
    # the base version is built from its own definition, and its dependencies are
    # checked against the base checkout's files
    base = None
    if paired is not None and base_target is not None:
        base = Side(base_target, paired.config, target_key(base_target, paired.base_dir))
    out = plan.out_dir
    check = Check(
        head,
        base,
        recorded,
        out,
        plan.verbose,
        reference=out / reference_name(target.id),
        trace=out / trace_name(target.id),
    )
    with scratch_dir("gk-check-") as tmp:
        if not plan.cold:  # the measurement is of the ordinary warm start
            warm(check, store, Path(tmp))
        baseline, base_reference = (
            (None, None)  # new in this change: nothing of the base's to compare with
            if recorded is not None and not recorded.defined
            else stored_baseline(store, target, head.key, plan.base_ref, Path(tmp, "base.pt"))
        )
        # the base's rules judge the change: their parity tolerances too
        rules = config.gate_for(target.model)
        tolerance = governing(rules, recorded, baseline).rules.parity
        resp = measure(check, tolerance, base_reference, paired, Path(tmp))
    if not resp.ok and resp.fault == "memory":  # refused before any compile
        raise WontFit(f"{target.id}: {resp.error}")
    if resp.ok:
        check.verdicts = verify(check, store, resp)
    return assemble(check, resp, paired)


# -- 1. warm --------------------------------------------------------------------------------
def siblings(target: Target, config: Config) -> list[Target]:
    """The same model, mode, task, precision and strategy at its other shape sets, each
    with its own bundle (a dynamic model's share one: none)."""
    return [
        t
        for t in expand(config)
        if t.model.name == target.model.name
        and t.bundle_id != target.bundle_id
        and (t.mode, t.task, t.precision, t.strategy)
        == (target.mode, target.task, target.precision, target.strategy)
    ]


def warm(check: Check, store: Store, tmp: Path) -> None:
    """Restore the target's bundle (and, paired, the base version's, and the shape
    sweep's other shape sets') into ``tmp/cache``: the ordinary warm start, no package
    (a kind's own package is staged aside, for the measurement to load)."""
    cache_dir = tmp / "cache"
    config = check.head.config
    sign = signing_key(config.require_signature)
    for side, stage in ((check.head, tmp / "package"), (check.base, tmp / "package-base")):
        if side is None:
            continue
        if kinds.of(side.target).package is not None:
            side.stage = stage
        side.warmed = warm_target(
            side.target,
            side.config,
            store,
            cache_dir,  # the base version's artifacts, into the same cache
            megacache=False,
            signing_key=sign,
            cache_key=side.key,
            serve="never",  # no package may reach the measurement (the base's never)
            stage=side.stage,
        )
    if config.measure.shape_sweep:
        # the shape sweep runs the model's other shape sets: their bundles too, so a
        # recompile it counts is a cache hit, not a cold compile
        for other in siblings(check.head.target, config):
            warm_target(other, config, store, cache_dir, megacache=False, signing_key=sign)


# -- 2. baseline ----------------------------------------------------------------------------
def stored_baseline(
    store: Store, target: Target, key: CacheKey, base_ref: str, dest: Path
) -> tuple[Baseline | None, Path | None]:
    """The stored baseline and its reference outputs (None when the target's inputs
    changed since: other inputs give other outputs); a store fault is a warning."""
    try:
        base = baselines.fetch(store, baselines.BaselineKey(target.id, key.env_key, base_ref))
        if base is None:
            return None, None
        old, new = base.result.definition, definition(target)
        if old is not None and any(old.get(f) != new.get(f) for f in INPUT_FIELDS):
            return base, None
        return base, baselines.fetch_reference(store, base, dest)
    except StoreError as e:
        log.warning("%s: baseline outputs unavailable: %s", target.id, e)
        return None, None


# -- 3. measure -----------------------------------------------------------------------------
def measure(
    check: Check,
    tolerance: ParityTolerance,
    base_reference: Path | None,
    paired: PairedBase | None,
    tmp: Path,
) -> Response:
    """One worker measures the target (and, paired, the base version beside it), its
    outputs written in its own folder (``tmp/out``), then copied where the results
    name them (:func:`collect`)."""
    head, base = check.head, check.base
    out = tmp / "out"
    out.mkdir()
    kind, config = kinds.of(head.target), head.config
    request = MeasureRequest.of(
        head.target,
        config,
        head.key.device,
        kind=kind,
        budget=config.measure,
        parity=tolerance,
        baseline_reference=str(base_reference) if base_reference else None,
        reference_out=str(out / "reference.pt"),
        paired_base=BaseSide.of(base.target, paired.base_dir, base.package())
        if paired is not None and base is not None
        else None,
        trace_out=str(out / TRACE),
        # paired: the base's rules judge the change (gate.governing); the rounds go on
        # while they cannot decide it
        decide_at=base.config.gate_for(base.target.model).latency_regression
        if paired is not None and base is not None
        else None,
        # a package serves the shape it was built for (a dynamic one: all of them)
        sweep=config.measure.shape_sweep and kinds.ships_cache(kind),
        load=head.package(),
    )
    resp = run_or_fail(
        request,
        cache_dir=tmp / "cache",
        timeout=config.measure.timeout,
        verbose=check.verbose,
        label=head.target.id,
    )
    return collect(check, resp, out) if resp.ok else resp


TRACE = "trace.json.gz"
BASE_TRACE = "trace.base.json.gz"


def collect(check: Check, resp: Response, out: Path) -> Response:
    """The worker's outputs (plain files of its folder, never through a link) copied
    to the run's ``--out``: its reference outputs, and its traces where it wrote them;
    a failure naming what it left instead."""
    base_trace = check.trace.with_name(check.trace.name.replace(".json.gz", ".base.json.gz"))
    wanted: list[tuple[Path, Path, int | None]] = [(out / "reference.pt", check.reference, None)]
    wanted += [(out / TRACE, check.trace, TRACE_CAP), (out / BASE_TRACE, base_trace, TRACE_CAP)]
    for src, dest, cap in wanted:
        if src != out / "reference.pt" and not os.path.lexists(src):
            continue
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            safefs.copy_new(src, dest, cap)
        except OSError as e:
            why = e.strerror or str(e)
            return Response.failure("compile", f"{check.head.target.id}: {src.name}: {why}")
    return resp


# -- 4. verify ------------------------------------------------------------------------------
def verify(check: Check, store: Store, resp: Response) -> dict[str, dict]:
    """Each package of the bundle this check measured, verified once (when the
    measurement's parity passed): the verdicts by package name."""
    head = check.head
    parity = (resp.parity.vs_eager, resp.parity.vs_baseline) if resp.parity else ()
    if head.warmed is None or not all(c.passed for c in parity if c is not None):
        return {}
    restored = Restored(head.target, head.config, store, head.key, head.warmed)
    return verify_packages(restored, check.reference, verbose=check.verbose)


# -- 5. assemble ----------------------------------------------------------------------------
def assemble(check: Check, resp: Response, paired: PairedBase | None) -> TargetResult:
    """The target's result: what the worker measured, and what only the parent knows
    (the code hash of what was built, the rules and definition, the verdicts)."""
    head, target = check.head, check.head.target
    warmed = head.warmed
    # the code hash of what the worker built (its recorded dependencies)
    code = (
        head.key.with_deps(resp.deps).code_hash
        if resp.deps is not None
        else (warmed.code_hash if warmed and warmed.code_hash else "unknown")
    )
    ident: dict[str, Any] = {
        "target": target.id,
        "model": target.model.name,
        "env_key": head.key.env_key,
        "code_hash": code,
        "device": head.key.device,
        "rules": head.config.gate_for(target.model),
        "definition": definition(target),
        "base_target": check.recorded,
    }
    if not resp.ok and resp.fault == "unavailable":  # the kind's own death, here
        return TargetResult(**ident, status="unavailable", error=resp.error, measured_at=now_iso())
    if not resp.ok and resp.fault == "export":
        return TargetResult(
            **ident,
            status="not-exportable",
            error=resp.error,
            export=Export.model_validate(resp.export) if resp.export else None,
            measured_at=now_iso(),
        )
    if not resp.ok:
        return TargetResult(**ident, status="error", error=resp.error)
    pair = _pair(check, paired, resp)
    return _measured(check, resp, ident, pair)


def _pair(check: Check, paired: PairedBase | None, resp: Response) -> Paired | None:
    """Paired: the base version as the worker measured it, with what only the parent
    knows (its ref, commit and code hash)."""
    measured = resp.paired
    if paired is None or check.base is None or measured is None:
        return None
    if measured.profile is not None:
        trace = check.trace
        base_trace = trace.with_name(trace.name.replace(".json.gz", ".base.json.gz"))
        measured.profile.trace = os.path.relpath(base_trace, check.out_dir)
    return Paired(
        base_ref=paired.ref,
        base_commit=paired.commit,
        code_hash=check.base.key.with_deps(measured.deps).code_hash
        if measured.deps is not None
        else "unknown",
        compile_seconds=measured.compile_seconds,
        graphs=measured.graphs,
        samples=measured.samples,
        work=measured.work,
        profile=measured.profile,
        same_inputs=measured.same_inputs,
        quantization=measured.quantization,
        generation=measured.generation,
    )


def _measured(check: Check, resp: Response, ident: dict, pair: Paired | None) -> TargetResult:
    """The result of a measurement that ran (``resp.ok``)."""
    head, out_dir = check.head, check.out_dir
    own = kinds.of(head.target).package
    counters = resp.counters or {}
    status: CacheStatus = head.warmed.status if head.warmed is not None else "cold"
    cache_status = settle(status, counters)
    # a kind whose deploys load its package is warm when it loaded its bundle's
    loaded = (resp.packages.get(own.name) or {}).get("from") == "bundle" if own else None
    data = check.reference.read_bytes()
    # every package's, whatever its kind: what the measurement loaded, and its verdict
    packages = {
        name: doc
        for name in sorted({*resp.packages, *check.verdicts})
        if (doc := {**resp.packages.get(name, {}), **check.verdicts.get(name, {})})
    }
    return TargetResult(
        **ident,
        status="ok",
        measured_at=now_iso(),
        mode="paired" if pair else "stored",
        compile={
            "seconds": resp.compile_seconds,
            "warm": loaded if loaded is not None else cache_status in ("hit", "partial", "stale"),
            "cache": cache_status,
            "cold_seconds": head.warmed.cold_compile_seconds if head.warmed else None,
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
        export=Export.model_validate(resp.export) if resp.export else None,
        profile=resp.profile.model_copy(update={"trace": os.path.relpath(check.trace, out_dir)})
        if resp.profile
        else None,
        ranks=resp.ranks,
        quantization=resp.quantization,
        generation=resp.generation,
        reference=ReferenceOutputs(
            file=os.path.relpath(check.reference, out_dir),
            sha256=sha256_bytes(data),
            size=len(data),
        ),
        packages=packages,
    )
