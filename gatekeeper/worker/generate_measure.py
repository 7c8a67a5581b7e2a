"""``check``'s measurement of a generate target, inside the worker (docs/generation.md).

What an inference target reports, of whole generations: the compile (the first
compiled generation compiles the prefill and the decode step; its time and its first
token's), graphs and breaks, work counters, parity (by tokens, and the prefill's logits
up the ladder: :mod:`gatekeeper.worker.generate_parity`), peak memory (the KV cache
allocated in the call included), the timed rounds (:mod:`gatekeeper.worker.generate_timing`:
end-to-end latency, TTFT and TPOT round by round), the profile; and the compiles of
steady decode: counted from the first decode step's end, each one a regression with
the guard that failed. Paired, the base commit's model generates beside it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch._dynamo.utils import counters

from ..boundary import breadcrumbs
from ..boundary.protocol import MeasureRequest, Response
from ..config import ParityTolerance
from ..generation import Side
from . import quant
from .compiler import snapshot_counters
from .counters import (
    flops,
    inductor_metrics,
    instructions,
    record_inductor_metrics,
    reset_inductor_metrics,
)
from .fp64 import weight_bytes
from .generate import HFLoop, Loop, Run, describe, loop_of
from .generate_parity import Generated, check, prefill_fp64
from .generate_timing import PER_ROUND, generation_rounds, side_figures
from .graphs import _reason
from .kinds import Refused, builder
from .memory import footprint, give_back, peak_memory, process_peak
from .model import build_base, build_recorded, make_inputs, same_inputs
from .outputs import Outputs
from .parity import read_reference, save_reference
from .placement import same_placement, share_identical
from .plan import fits
from .precision import check_precision, parity_tolerance
from .profile import profile_calls
from .recompiles import on_purpose, recompiles, start_counting
from .spill import spilled
from .task import compile_again, fresh_frames

# a decode step reads every weight once: gpt-fast's bandwidth is weight bytes x tokens/s.
# The devices' peak memory bandwidth, bytes per second (their data sheets).
PEAK_BANDWIDTH = {"A100": 2.0e12, "H100": 3.35e12, "H200": 4.8e12}


def _graphs(before: dict[str, int] | None = None, loop: Loop | None = None) -> dict[str, Any]:
    """Graphs Dynamo compiled and the breaks it took (since ``before``), with their
    reasons as torch counts them; an ahead-of-time kind's, which Dynamo does not count,
    as the kind says them (aot: its one exported program)."""
    if loop is not None and (kind := builder(loop.req)).ahead_of_time:
        return kind.graphs(loop.model, loop.req, loop.inputs, contextlib.nullcontext)
    now = snapshot_counters()
    was = before or {}
    reasons = [{"reason": _reason(str(r))} for r in counters["graph_break"]]
    return {
        "count": now["graphs"] - was.get("graphs", 0),
        "breaks": now["graph_breaks"] - was.get("graph_breaks", 0),
        "break_reasons": reasons if before is None else [],
    }


def _first(loop: Loop, inputs: Any) -> Run:
    """The first compiled generation, with its scores; from the end of its first decode
    step (its second token), every compile is counted (:func:`recompiles`). A dynamic
    cache grows every step: its second decode step compiles the graph of any length
    (automatic dynamic shapes), and counting starts after it."""
    settled = 3 if isinstance(loop, HFLoop) and loop.req.model.generation.cache == "dynamic" else 2

    def at(tokens: int) -> None:
        if tokens == settled:
            start_counting()

    breadcrumbs.enter("first generation")
    return loop.run(inputs, scores=True, at=at)


def _work(loop: Loop, inputs: Any) -> dict:
    """Kernels and bytes accessed of what this process compiled, FLOPs of an eager
    generation, instructions of a compiled one."""
    return {
        **inductor_metrics(),
        "flops": flops(lambda: loop.run(inputs, compiled=False)),
        "instructions": instructions(lambda: loop.run(inputs)),
    }


def _bandwidth(model: Any, device: str, tokens_per_s: float) -> dict[str, Any]:
    """On a GPU: the decode's bandwidth (weight bytes x steps per second) and its
    fraction of the device's recorded peak."""
    if not device.startswith("cuda"):
        return {}
    moved = weight_bytes(model)
    gbs = moved * tokens_per_s / 1e9
    name = torch.cuda.get_device_name(torch.device(device))
    peak = next((v for k, v in PEAK_BANDWIDTH.items() if k in name), None)
    return {
        "bytes_per_step": moved,
        "bandwidth_gbs": gbs,
        "peak_fraction": gbs * 1e9 / peak if peak else None,
    }


class _Base:
    """Paired: the base commit's model, built by its own config from its own checkout."""

    def __init__(self, req: MeasureRequest, head_inputs: Any) -> None:
        model, inputs, self.deps = build_base(
            req.model, req.shapes, req.base_path, req.device, req.quantize, judged=True
        )
        self.same = same_inputs(head_inputs, inputs)
        self.model, self.inputs = model, head_inputs if self.same else inputs
        self.loop = loop_of(model, req, self.inputs, load=_package(req))

    def compile(self) -> tuple[dict, Run] | None:
        """Compiled beside the head (its compiles made on purpose: not the head's
        recompiles); its first generation and figures. None: the kind cannot build the
        base's (this change makes it export: no base to time it with)."""
        fresh_frames()
        give_back()
        breadcrumbs.enter("base compile")
        before = snapshot_counters()
        with on_purpose():
            try:
                self.loop.compile()
            except Refused:
                return None
            first = self.loop.run(self.inputs, scores=True)
            self.loop.checked()
            graphs = _graphs(before, self.loop)
            work = _work(self.loop, self.inputs)
        paired = {
            "compile_seconds": first.e2e,
            "graphs": graphs,
            "deps": self.deps,
            "same_inputs": self.same,
            "work": work,
            "quantization": quant.figures(self.model),
        }
        return paired, first

    def figures(self, req: MeasureRequest, paired: dict, lat: dict, gen: dict) -> None:
        """Into ``paired``: the base's profile, its per-round samples and its
        generation's figures."""
        trace = req.trace_out.replace(".json.gz", ".base.json.gz") if req.trace_out else None
        paired["profile"] = profile_calls(
            lambda: self.loop.run(self.inputs), req.device, calls=3, trace=trace
        )
        paired["samples"] = lat["samples"].pop("base")
        paired["generation"] = describe(
            self.loop, compiled=gen["base"], samples=gen["samples"]["base"]
        )


def _fresh() -> None:
    """Before the head's compile: Dynamo's frames and counters, inductor's metrics and
    the memory the builds freed, all from zero."""
    torch._dynamo.reset()
    counters.clear()
    record_inductor_metrics()
    reset_inductor_metrics()
    give_back()


def _package(req: MeasureRequest) -> Path | None:
    """The bundle's package of the target's kind, where the check restored one."""
    return Path(req.load.path) if req.load is not None else None


def measure_generate(req: MeasureRequest) -> Response:
    device = req.device
    tol = parity_tolerance(req.parity, req.precision)
    check_precision(device, req.precision)
    model, inputs, deps = build_recorded(
        req.model, req.shapes, req.base_path, device, req.quantize, judged=True
    )
    build_peak = process_peak(device)  # the imports' and the factory's own
    fits(model, req, paired=req.paired_base is not None)
    # a second prompt of the same shape (transformers compares generations so)
    other = make_inputs(req.model, req.shapes, req.base_path, device, seed=req.model.seed + 1)
    head = loop_of(model, req, inputs, load=_package(req))
    base = None
    if req.paired_base is not None:
        with spilled(model) as spill:  # the head's weights out of memory while it builds
            base = _Base(req.for_base(), inputs)
            share_identical(model, base.model, restore=spill.restore if spill else None)
        same_placement(model, base.model)  # before either is compiled
    _fresh()
    breadcrumbs.enter("compile")
    start = time.perf_counter()
    try:  # aot: the bundle's package loaded (or export + build one)
        head.compile()
    except Refused as e:
        return e.response(deps)
    prepared = time.perf_counter() - start
    first = _first(head, inputs)
    head.checked()
    cache, graphs = snapshot_counters(), _graphs(loop=head)
    breadcrumbs.enter("parity")
    cand = Generated.of([first, head.run(other, scores=True)])
    memory = {
        "source": "cuda" if device.startswith("cuda") else "cpu",
        "eager_peak_bytes": peak_memory(lambda: head.run(inputs, compiled=False), device),
        "compiled_peak_bytes": peak_memory(lambda: head.run(inputs), device),
    }
    breadcrumbs.enter("work counters")
    work = _work(head, inputs)
    paired, base_first = (base.compile() if base is not None else None) or (None, None)
    if paired is None:
        base = None
    parity = _parity(req, head, cand, [inputs, other], tol, base_first, paired)
    give_back()
    lat, gen = _timed(req, head, inputs, base)
    count, guards = recompiles()
    graphs.update(recompiles=count, recompile_guards=guards)
    prof = profile_calls(lambda: head.run(inputs), device, calls=3, trace=req.trace_out)
    if base is not None and paired is not None:
        base.figures(req, paired, lat, gen)
    generation = describe(
        head,
        compiled=gen["compiled"],
        eager=gen["eager"],
        samples=gen["samples"]["compiled"],
        first_generate_s=first.e2e + prepared,
        first_token_s=first.ttft + prepared,
        decode_recompiles=count,
        decode_recompile_guards=guards,
        tokens=(parity["vs_eager"].get("detail") or "").removeprefix("tokens: "),
        **_bandwidth(model, device, gen["compiled"].tokens_per_s),
    )
    return Response(
        ok=True,
        compile_seconds=first.e2e + prepared,
        **head.built_docs(),
        counters=cache,
        graphs=graphs,
        parity=parity,
        outputs=cand.outputs().summary(),
        memory=footprint(memory, model, device, build_peak),
        latency=lat,
        paired=paired,
        work=work,
        profile=prof,
        pid=os.getpid(),
        torch=torch.__version__,
        deps=deps,
        generation=generation,
        quantization=quant.figures(model),
    )


def _parity(
    req: MeasureRequest,
    head: Loop,
    cand: Generated,
    prompts: list[Any],
    tol: ParityTolerance,
    base_first: Run | None,
    paired: dict | None,
) -> dict:
    """Compiled vs eager (the same two prompts on eager's dynamic cache), and vs the
    base commit's generation (paired, same inputs) or the baseline's stored one; this
    run's saved as the target's reference outputs."""
    eager = Generated.of([head.run(p, compiled=False, scores=True) for p in prompts])
    ref64 = prefill_fp64(head.model, prompts)
    parity = {"vs_eager": check(cand, eager, tol, ("compiled", "eager"), ref64)}
    if paired is not None:
        if base_first is not None and paired["same_inputs"]:
            one = Generated.of([base_first])
            mine = Generated(cand.tokens[:1], cand.top_idx[:1], cand.top_val[:1], cand.logits[:1])
            parity["vs_baseline"] = check(mine, one, tol, ("this", "the base commit"))
    elif req.baseline_reference and (loaded := read_reference(req.baseline_reference)):
        stored = Generated.read(loaded[0])
        fp64 = (loaded[1] or {}).get("output['logits']")
        if stored is not None:
            parity["vs_baseline"] = check(cand, stored, tol, ("this", "the baseline"), fp64)
    save_reference(
        req.reference_out,
        cand.outputs(),
        None if ref64 is None else Outputs.of({"logits": ref64}),
    )
    return parity


def _timed(
    req: MeasureRequest, head: Loop, inputs: Any, base: _Base | None
) -> tuple[dict, dict[str, Any]]:
    """The timed rounds (paired: in two mirrored halves, each on frames compiled again,
    as every target's: :func:`gatekeeper.worker.task.compile_again`), and each side's
    figures and per-round samples."""
    breadcrumbs.enter("measure")
    runs: dict[str, Callable[[], Run]] = {
        "eager": lambda: head.run(inputs, compiled=False),
        "compiled": lambda: head.run(inputs),
    }
    halfway = None
    if base is not None:
        runs = {"base": lambda: base.loop.run(base.inputs), **runs}
        compile_again(runs["compiled"], runs["base"])()
        again = compile_again(runs["base"], runs["compiled"])

        def halfway() -> None:
            same_placement(base.model, head.model)
            for loop in (base.loop, head):  # a package bound to the weights binds them again
                loop.moved()
            again()

    lat, per = generation_rounds(runs, req.device, req.budget, halfway, req.decide_at)
    batch = head.prompt[0]
    sides = {n: Side(**side_figures(per, n, batch)) for n in runs}
    samples = {n: {k: per[k][n] for k in PER_ROUND} for n in runs}
    return lat, {**sides, "samples": samples}
