"""``check``'s measurement of one target, inside the worker: graph breaks, compile time,
parity, peak memory and interleaved latency (and, paired, the base version beside it).
Returns a :class:`Response` whose nested documents match :mod:`gatekeeper.results`."""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch._dynamo.utils import counters

from ..boundary import breadcrumbs
from ..boundary.protocol import MeasureRequest, Response
from ..config import ParityTolerance
from . import quant
from .calls import Inputs, entry
from .compiler import compile_kwargs, snapshot_counters
from .counters import (
    flops,
    inductor_metrics,
    instructions,
    record_inductor_metrics,
    reset_inductor_metrics,
)
from .graphs import Traced
from .kinds import Builder, Job, Refused, builder
from .memory import allocated, footprint, give_back, process_peak
from .model import build_base, build_recorded, same_inputs
from .parity import Later, Outputs, check_parity, read_reference, save_reference, vs_eager
from .placement import outgrows_cache, same_placement, share_identical
from .plan import before_build, fits
from .precision import autocast, check_precision, parity_tolerance, under_autocast
from .recompiles import start_counting
from .spill import spilled
from .task import fresh_frames, measure_calls
from .tf32 import accuracy_settings, bakes_tf32
from .timing import first_call


def eager_model(model: torch.nn.Module, paired: bool, cache: int | None = None) -> torch.nn.Module:
    """The module eager calls run on. Paired, a copy of the head's while its weights fit
    in twice the device's last-level cache (``cache``: its bytes, else
    :func:`~gatekeeper.worker.memory.last_level_cache`): eager runs in every round right
    after base and head, so on the head's own weights it would leave them hot in the
    caches for the head alone, and an identical head would read faster than its base
    (2-7% on a 20-layer MLP of 5 MiB, 1 or 2 threads: docs/gate.md). On a copy of its
    own neither side is favoured. Weights larger than that leave nothing of the start of
    the model in the cache by the next call: eager runs on the head's own, and the copy
    (a whole model's bytes) is not held."""
    if not paired:
        return model
    if outgrows_cache(model, cache):
        return model
    try:
        return copy.deepcopy(model)
    except Exception:  # FSDP2 refuses a deep copy: eager then runs on the head's own
        return model


@dataclass
class _Side:
    """One version of the target in this process: the head, or (paired) the base
    commit's, built by its own config from its own checkout."""

    req: MeasureRequest
    model: Any
    inputs: Inputs
    deps: dict
    graphs: dict = field(default_factory=dict)
    traced: Traced | None = None  # its compile records its graphs (else: explained)
    same_inputs: bool = True  # the base's inputs are the head's (outputs comparable)
    compiled: Callable[..., Any] | None = None
    checked: Callable[[], None] | None = None  # its build's check after the first calls
    moved: Callable[[], None] | None = None  # its build's, once its weights moved (Built)

    def call(self) -> Any:
        assert self.compiled is not None
        return self.inputs.call(self.compiled)

    def eager(self, device: str, precision: str) -> Callable[..., Any]:
        return under_autocast(entry(self.model, self.req.model.call), device, precision)

    def traced_graphs(self) -> None:
        """After its first compiled call: the graphs that call traced (a kind that
        records its trace; explained before the compile otherwise)."""
        if self.traced is not None:
            self.graphs = self.traced.graphs()

    def load(self) -> Path | None:
        """Its kind's package from the bundle (None: built anew)."""
        return Path(self.req.load.path) if self.req.load is not None else None


def measure(req: MeasureRequest) -> Response:
    if req.task == "train":
        from .train import measure_train

        return measure_train(req)
    device, kind = req.device, builder(req)
    tol = parity_tolerance(req.parity, req.precision)
    check_precision(device, req.precision)
    paired = req.paired_base is not None
    model, inputs, deps = build_recorded(
        req.model,
        req.shapes,
        req.base_path,
        device,
        req.quantize,
        judged=True,
        plan=before_build(req, paired=paired),
    )
    build_peak = process_peak(device)  # the imports' and the factory's own
    fits(model, req, paired=paired)
    head = _Side(req, model, inputs, deps)
    base_req = req.for_base() if req.paired_base is not None else None
    # the precision's autocast around every forward (none for fp32); fp64 runs without
    eager_fn = entry(eager_model(model, base_req is not None), req.model.call)
    eager = under_autocast(eager_fn, device, req.precision)

    def amp():
        return autocast(device, req.precision)

    # graphs and breaks: from the compile's own trace where the kind records it, else
    # explain(), which resets dynamo, so every model is explained before anything compiles
    head.traced = (
        Traced.of(compile_kwargs(req.model, req.mode, req.dynamic), req.base_path)
        if kind.traces
        else None
    )
    if head.traced is None:
        breadcrumbs.enter("explain")
        head.graphs = kind.graphs(model, req, inputs, amp)
    base = _build_base(kind, base_req, head, amp) if base_req is not None else None
    torch._dynamo.reset()
    counters.clear()
    record_inductor_metrics()
    reset_inductor_metrics()
    give_back()  # what explain() and the builds freed
    before_compile = allocated(device)
    breadcrumbs.enter("compile")
    start = time.perf_counter()
    try:  # regional: a compiled copy; aot: the bundle's package (or export + build one)
        made, built = kind.compiled(
            Job(model, inputs, req, keep_eager=True, load=head.load(), traced=head.traced)
        )
    except Refused as e:
        if base is not None:  # did the base commit's model export?
            e.info.update(kind.refused_base(base.model, base.inputs, base.req))
        return e.response(deps)
    prepared = time.perf_counter() - start  # aot: export, build and load the package
    head.compiled = under_autocast(made, device, req.precision)
    head.checked, head.moved = built.after_first_calls, built.moved
    baked = bakes_tf32(req.mode, req.model.options)
    with torch.no_grad():
        resp = _measured(kind, head, base, eager, tol, baked, prepared, before_compile, build_peak)
    return resp.model_copy(
        update={
            "export": built.export,
            "packages": {kind.package: built.package} if kind.package and built.package else {},
        }
    )


def _build_base(
    kind: Builder, base_req: MeasureRequest, head: _Side, amp: Callable[[], Any]
) -> _Side:
    """Paired: the base commit's target, as its own config defines it; the same inputs
    (the usual case) are the head's own objects, called alike."""
    with spilled(head.model) as spill:  # the head's weights out of memory while it builds
        base_model, base_inputs, base_deps = build_base(
            base_req.model,
            base_req.shapes,
            base_req.base_path,
            base_req.device,
            base_req.quantize,
            judged=True,
        )
        # one copy of what both hold
        share_identical(head.model, base_model, restore=spill.restore if spill else None)
    comparable = same_inputs(head.inputs, base_inputs)
    base = _Side(base_req, base_model, head.inputs if comparable else base_inputs, base_deps)
    base.same_inputs = comparable
    same_placement(head.model, base_model)  # before either is compiled
    # its own config says how it compiles: recorded as the head's only where it can be
    if head.traced is not None:
        kwargs = compile_kwargs(base_req.model, base_req.mode, base_req.dynamic)
        base.traced = Traced.of(kwargs, base_req.base_path)
    if base.traced is None:
        base.graphs = kind.graphs(base_model, base_req, base.inputs, amp)
    return base


def _measured(
    kind: Builder,
    head: _Side,
    base: _Side | None,
    eager: Callable[..., Any],
    tol: ParityTolerance,
    baked: bool,
    prepared: float,
    before_compile: int,
    build_peak: int | None = None,
) -> Response:
    """The head compiled (and, paired, the base): first call, work counters, parity
    and the timed calls."""
    req, device = head.req, head.req.device
    assert head.compiled is not None
    # CUDA graphs (reduce-overhead, max-autotune) reuse their output buffers on the
    # next call: keep a copy of what the first call returned (every leaf, a cache's
    # tensors included). Parity's settings for it (worker.tf32), the deploy's after.
    with accuracy_settings(device, baked):
        out, compile_seconds = first_call(head.compiled, head.inputs, device, kind.first_step)
    head.traced_graphs()
    cand = Outputs.of(out).kept()  # in a file of the scratch where large (worker.filed)
    del out
    if kind.ahead_of_time:
        compile_seconds += prepared
    for _ in range(2):
        head.call()
    if head.checked is not None:
        head.checked()
    cache = snapshot_counters()
    # what the compiled model keeps allocated (CUDA graph pools, static buffers), not
    # counting the copy of its first outputs kept for parity
    copy_bytes = sum(
        t.numel() * t.element_size() for t in cand.tensors() if t.device.type == "cuda"
    )
    held = allocated(device) - before_compile - copy_bytes
    breadcrumbs.enter("work counters")
    work = _work(kind, lambda: head.inputs.call(eager), head.call)
    paired, base_out = _compile_base(kind, base, baked) if base is not None else (None, None)
    vs_base = _vs_base(cand, base_out, paired, tol)
    del base_out
    parity, later = _parity(head, eager, cand, vs_base, tol, baked)
    outputs = cand.summary()
    save_reference(req.reference_out, cand, later.value())
    del cand, later  # not held through the timed rounds (logits: vocabulary x tokens)
    give_back()  # what the compiles and the float64 reference freed
    start_counting()  # recompiles from here on: the measured calls
    breadcrumbs.enter("measure")
    timed = base is not None and paired is not None
    memory, lat, prof = measure_calls(
        eager,
        head.compiled,
        head.inputs,
        req,
        head.graphs,
        base_fn=base.call if timed and base is not None else None,
        paired=paired,
        held=held,
        place_base_first=(lambda: _placed_again(base, head)) if timed and base else None,
    )
    return Response(
        ok=True,
        compile_seconds=compile_seconds,
        counters=cache,
        graphs=head.graphs,
        parity=parity,
        outputs=outputs,
        memory=footprint(memory, head.model, device, build_peak),
        latency=lat,
        cpu_samples=lat.pop("cpu", None),
        paired=paired,
        work=work,
        profile=prof,
        pid=os.getpid(),
        torch=torch.__version__,
        deps=head.deps,
        quantization=quant.figures(head.model),
    )


def _placed_again(first: _Side, second: _Side) -> None:
    """Halfway through the paired rounds: both sides' weights placed again
    (:func:`same_placement`), then each side's ``moved``: an AOTInductor package bound to
    the weights reads each at the address it had when bound, so it is bound again, or
    it reads the freed copies (a weight unmapped when freed: SIGSEGV in measure)."""
    same_placement(first.model, second.model)
    for side in (first, second):
        if side.moved is not None:
            side.moved()


def _work(kind: Builder, eager_call: Callable[[], Any], call: Callable[[], Any]) -> dict:
    """Deterministic work counters: kernels and bytes (where this process compiled
    them: an ahead-of-time kind's package counted them where it was built, if at all),
    FLOPs of the eager call, instructions of the compiled one."""
    return {
        **(inductor_metrics() if not kind.ahead_of_time else {}),
        "flops": flops(eager_call),
        "instructions": instructions(call),
    }


def _compile_base(kind: Builder, base: _Side, baked: bool) -> tuple[dict | None, Outputs | None]:
    """Paired: the base version compiled beside the head (its own package, for an
    ahead-of-time kind), its first call and work; (None, None) when the base cannot be
    built this way (this change makes it export: no base to time it with)."""
    req, device = base.req, base.req.device
    fresh_frames()
    give_back()  # what the head's compile freed
    breadcrumbs.enter("base compile")
    try:
        made, built = kind.compiled(
            Job(base.model, base.inputs, req, keep_eager=True, load=base.load(), traced=base.traced)
        )
    except Refused:
        return None, None
    base.compiled, base.moved = under_autocast(made, device, req.precision), built.moved
    with accuracy_settings(device, baked):
        first, seconds = first_call(base.compiled, base.inputs, device, f"base {kind.first_step}")
    base.traced_graphs()
    out = Outputs.of(first).kept()
    del first
    base.call()
    eager = base.eager(device, req.precision)
    paired = {
        "compile_seconds": seconds,
        "graphs": base.graphs,
        "deps": base.deps,
        "same_inputs": base.same_inputs,
        "work": _work(kind, lambda: base.inputs.call(eager), base.call),
        "quantization": quant.figures(base.model),
    }
    return paired, out


def _vs_base(
    cand: Outputs, base_out: Outputs | None, paired: dict | None, tol: ParityTolerance
) -> dict | None:
    """Paired: compiled vs the base commit's compiled outputs (same inputs: other inputs,
    other outputs), compared before eager's and the float64 reference's are made, so
    the base's are not held beside them (a vocabulary's logits each); None unpaired."""
    if paired is None:
        return None
    if base_out is not None and paired["same_inputs"]:
        return {"vs_baseline": check_parity(cand, base_out, None, tol)}
    return {}


def _parity(
    head: _Side,
    eager: Callable[..., Any],
    cand: Outputs,
    vs_base: dict | None,
    tol: ParityTolerance,
    baked: bool,
) -> tuple[dict, Later]:
    """Compiled vs eager, and vs the base commit's outputs (paired: ``vs_base``, from
    :func:`_vs_base`) or the baseline's stored reference outputs; and the float64
    reference (a :class:`Later`: computed by then only if a comparison needed it, else
    by its caller, held beside neither eager's outputs nor the baseline's)."""
    req = head.req
    breadcrumbs.enter("parity")
    vs, ref64 = vs_eager(
        cand, eager, head.model, head.inputs, req.model.call, req.device, tol, baked
    )
    parity = {"vs_eager": vs, **(vs_base or {})}
    if vs_base is None and req.baseline_reference:
        loaded = read_reference(req.baseline_reference)
        if loaded is not None:
            parity["vs_baseline"] = check_parity(cand, loaded[0], loaded[1], tol)
        del loaded
    return parity, ref64
