"""``check``'s measurement of one target, inside the worker: graph breaks, compile time,
parity, peak memory and interleaved latency (and, paired, the base version beside it).
Returns a :class:`Response` whose nested documents match :mod:`gatekeeper.results`."""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path

import torch
from torch._dynamo.utils import counters

from . import steps
from .calls import Inputs, entry
from .compile import compiled_for, snapshot_counters
from .counters import (
    flops,
    inductor_metrics,
    instructions,
    record_inductor_metrics,
    reset_inductor_metrics,
)
from .graphs import graph_breaks
from .memory import allocated
from .model import build_base, build_recorded, same_inputs
from .parity import Outputs, check_parity, read_reference, save_reference, vs_eager
from .protocol import Request, Response
from .strategy import NotExportable, export, regional_graphs
from .task import (
    autocast,
    check_precision,
    fresh_frames,
    measure_calls,
    parity_tolerance,
    start_counting,
    under_autocast,
)
from .tf32 import accuracy_settings, bakes_tf32
from .timing import first_call


def eager_model(model: torch.nn.Module, paired: bool) -> torch.nn.Module:
    """The module eager calls run on. Paired, a copy of the head's: eager runs in every
    round right after base and head, so on the head's own weights it would leave them
    hot in the CPU's caches for the head alone, and an identical head would read faster
    than its base (2-7% on a 20-layer MLP, 1 or 2 threads: docs/gate.md). On a copy of
    its own neither side is favoured."""
    return copy.deepcopy(model) if paired else model


def same_placement(first: object, second: object) -> None:
    """Paired: give the head's and the base's weights memory of the same kind. Built
    one after the other, they are not: the head's tensors are allocated first, into an
    allocator that has served little yet, and the base's after the head was built,
    explained and copied, from an allocator in another state (glibc serves large
    blocks by ``mmap`` until frees raise its threshold, then from the heap). With 2
    threads an identical head read slower than its base: a median of +1.7% over 48
    unchanged pull requests, +1.0% over 45 with this (docs/statistics.md). Each side's
    parameters and buffers are copied into new memory, alternately, ``first``'s before
    ``second``'s (head, base, head, base, ... before the first compiles; base first
    again halfway through the timed rounds, so that neither side is always placed
    first), so both draw on the same allocator state. Only tensors that own their whole
    storage move (a tied weight keeps its tie; a view keeps its base); the model's own
    objects are kept."""
    if not isinstance(first, torch.nn.Module) or not isinstance(second, torch.nn.Module):
        return

    def movable(m: torch.nn.Module) -> list[torch.Tensor]:
        seen: dict[int, list[torch.Tensor]] = {}
        for t in [*m.parameters(), *m.buffers()]:
            seen.setdefault(t.untyped_storage().data_ptr(), []).append(t)
        return [
            ts[0]
            for ts in seen.values()
            if len(ts) == 1
            and ts[0].storage_offset() == 0
            and ts[0].untyped_storage().nbytes() == ts[0].numel() * ts[0].element_size()
        ]

    with torch.no_grad():
        firsts, seconds = movable(first), movable(second)
        for i in range(max(len(firsts), len(seconds))):
            for ts in (firsts, seconds):
                if i < len(ts):
                    ts[i].data = ts[i].data.clone()


def measure(req: Request) -> Response:
    if req.task == "train":
        from .train import measure_train

        return measure_train(req)
    cfg, base_dir, device = req.model, req.base_path, req.device
    assert req.budget is not None and req.parity is not None and req.reference_out
    tol = parity_tolerance(req.parity.model_dump(), req.precision)
    check_precision(device, req.precision)
    model, inputs, deps = build_recorded(cfg, req.shapes, base_dir, device)
    # paired: the base commit's target, as its own config defines it
    base_req = req.for_base() if req.paired_base is not None else None
    base_dir_paired = base_req.base_path if base_req is not None else None
    # the precision's autocast around every forward (none for fp32); fp64 runs without
    eager_fn = entry(eager_model(model, base_dir_paired is not None), cfg.call)
    eager = under_autocast(eager_fn, device, req.precision)

    def amp():
        return autocast(device, req.precision)

    paired: dict | None = None

    # explain() resets dynamo, so every model is explained before anything is compiled
    steps.enter("explain")
    graphs = _graphs(model, cfg, req, inputs, base_dir, amp)
    if base_req is not None and base_dir_paired is not None:
        base_cfg = base_req.model
        base_model, base_inputs, base_deps = build_base(
            base_cfg, base_req.shapes, base_dir_paired, device
        )
        # the same inputs (the usual case) are the head's own objects, called alike
        comparable = same_inputs(inputs, base_inputs)
        base_inputs = inputs if comparable else base_inputs
        same_placement(model, base_model)  # before either is compiled
        base_fn_eager = entry(base_model, base_cfg.call)
        base_graphs = _graphs(base_model, base_cfg, base_req, base_inputs, base_dir_paired, amp)
    torch._dynamo.reset()
    counters.clear()
    record_inductor_metrics()
    reset_inductor_metrics()

    before_compile = allocated(device)
    steps.enter("compile")
    start = time.perf_counter()
    try:  # regional: a compiled copy; aot: the bundle's package (or export + build one)
        made, done = compiled_for(req, model, inputs, keep_eager=True)
    except NotExportable as e:
        info = dict(e.info)
        if base_req is not None:  # did the base commit's model export?
            try:
                export(base_model, base_inputs, base_cfg, base_req.dynamic, base_req.base_path)
                info["base_exportable"] = True
            except NotExportable:
                info["base_exportable"] = False
        return Response(
            ok=False, kind="export", error=e.says(), export=info, deps=deps, torch=torch.__version__
        )
    prepared = time.perf_counter() - start  # aot: export, build and load the package
    compiled = under_autocast(made, device, req.precision)
    baked = bakes_tf32(req.mode, cfg.options)
    with torch.no_grad():
        # CUDA graphs (reduce-overhead, max-autotune) reuse their output buffers on the
        # next call: keep a copy of what the first call returned (every leaf, a cache's
        # tensors included). Parity's settings for it (worker.tf32), the deploy's after.
        with accuracy_settings(device, baked):
            out_compiled, compile_seconds = first_call(compiled, inputs, device, _first(req))
        cand = Outputs.of(out_compiled).cloned()
        del out_compiled
        if req.strategy == "aot":
            compile_seconds += prepared
        for _ in range(2):
            inputs.call(compiled)
        cache = snapshot_counters()
        # what the compiled model keeps allocated (CUDA graph pools, static buffers),
        # not counting the copy of its first outputs kept for parity
        copy_bytes = sum(
            t.numel() * t.element_size() for t in cand.tensors() if t.device.type == "cuda"
        )
        held = allocated(device) - before_compile - copy_bytes
        steps.enter("work counters")
        work = {
            # an aot package's kernels were counted where it was built, if at all
            **(inductor_metrics() if req.strategy != "aot" else {}),
            "flops": flops(lambda: inputs.call(eager)),
            "instructions": instructions(lambda: inputs.call(compiled)),
        }
        base_fn = base_made = None

        def compiled_fn():
            return inputs.call(compiled)

        if base_req is not None:
            fresh_frames()
            steps.enter("base compile")
            try:
                base_made, _ = compiled_for(base_req, base_model, base_inputs, keep_eager=True)
            except NotExportable:  # this change makes it export: no base to time it with
                base_dir_paired = None
        if base_dir_paired is not None and base_made is not None:
            base_compiled = under_autocast(base_made, device, req.precision)
            with accuracy_settings(device, baked):
                base_first, base_seconds = first_call(
                    base_compiled, base_inputs, device, f"base {_first(req)}"
                )
            base_out = Outputs.of(base_first).cloned()
            del base_first
            base_inputs.call(base_compiled)

            def base_fn():
                return base_inputs.call(base_compiled)

            paired = {
                "compile_seconds": base_seconds,
                "graphs": base_graphs,
                "deps": base_deps,
                "same_inputs": comparable,
                "work": {
                    **(inductor_metrics() if req.strategy != "aot" else {}),
                    "flops": flops(
                        lambda: base_inputs.call(
                            under_autocast(base_fn_eager, device, req.precision)
                        )
                    ),
                    "instructions": instructions(base_fn),
                },
            }

        steps.enter("parity")
        vs, ref64 = vs_eager(cand, eager, model, inputs, cfg.call, device, tol, baked)
        parity = {"vs_eager": vs}
        if paired is not None:
            if comparable:  # other inputs give other outputs: nothing to compare
                parity["vs_baseline"] = check_parity(cand, base_out, None, tol)
        elif req.baseline_reference:
            loaded = read_reference(req.baseline_reference)
            if loaded is not None:
                parity["vs_baseline"] = check_parity(cand, loaded[0], loaded[1], tol)
        save_reference(req.reference_out, cand, ref64)
        start_counting()  # recompiles from here on: the measured calls
        steps.enter("measure")

        memory, lat, prof = measure_calls(
            eager,
            compiled,
            inputs,
            req,
            graphs,
            base_fn=base_fn,
            paired=paired,
            held=held,
            place_base_first=None if base_fn is None else lambda: same_placement(base_model, model),
        )
    return Response(
        ok=True,
        compile_seconds=compile_seconds,
        counters=cache,
        graphs=graphs,
        parity=parity,
        outputs=cand.summary(),
        memory=memory,
        latency=lat,
        paired=paired,
        work=work,
        profile=prof,
        pid=os.getpid(),
        torch=torch.__version__,
        deps=deps,
        export=done.get("export"),
        aot=done.get("aot") or None,
    )


def _first(req: Request) -> str:
    """The step of a compiled model's first call: an aot target's is its package's."""
    return "package first call" if req.strategy == "aot" else "first call"


def _graphs(model, cfg, req: Request, inputs: Inputs, base_dir: Path, amp) -> dict:
    """What the strategy compiles, explained: the whole model, a regional target's
    blocks (one of each class), or an exported program (one graph, no break: a model
    that breaks does not export)."""
    if req.strategy == "regional":
        return regional_graphs(model, cfg, inputs, base_dir, amp)
    if req.strategy == "aot":
        return {"count": 1, "breaks": 0, "break_reasons": []}
    return graph_breaks(entry(model, cfg.call), inputs, base_dir, context=amp)
