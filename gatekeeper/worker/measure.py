"""``check``'s measurement of one target, inside the worker: graph breaks, compile time,
parity, peak memory and interleaved latency (and, paired, the base version beside it).
Returns a :class:`Response` whose nested documents match :mod:`gatekeeper.results`."""
from __future__ import annotations

import os
from pathlib import Path

import torch
from torch._dynamo.utils import counters

from .compile import compile_model, snapshot_counters
from .graphs import graph_breaks
from .memory import peak_memory
from .model import build_base, build_recorded
from .parity import check_parity, flat_outputs, fp64_reference
from .protocol import Request, Response
from .timing import first_call, latency


def measure(req: Request) -> Response:
    cfg, base_dir, device = req.model, req.base_path, req.device
    assert req.budget is not None and req.parity is not None and req.reference_out
    tol = req.parity.model_dump()
    model, inputs, deps = build_recorded(cfg, req.shapes, base_dir, device)
    paired: dict | None = None
    base_dir_paired = Path(req.paired_base_dir) if req.paired_base_dir else None

    # explain() resets dynamo, so every model is explained before anything is compiled
    graphs = graph_breaks(model, inputs, base_dir)
    if base_dir_paired is not None:
        base_model, base_deps = build_base(cfg, req.shapes, base_dir_paired, device)
        base_graphs = graph_breaks(base_model, inputs, base_dir_paired)
    torch._dynamo.reset()
    counters.clear()

    compiled = compile_model(model, cfg, req.mode, req.dynamic)
    with torch.no_grad():
        out_compiled, compile_seconds = first_call(compiled, inputs, device)
        for _ in range(2):
            compiled(*inputs)
        cache = snapshot_counters()
        frames_after_compile = counters["frames"].get("ok", 0)
        base_fn, base_frames = None, 0
        if base_dir_paired is not None:
            base_compiled = compile_model(base_model, cfg, req.mode, req.dynamic)
            base_out, base_seconds = first_call(base_compiled, inputs, device)
            base_frames = counters["frames"].get("ok", 0) - frames_after_compile
            base_fn = lambda: base_compiled(*inputs)  # noqa: E731
            paired = {"compile_seconds": base_seconds, "graphs": base_graphs,
                      "deps": base_deps}

        out_eager = model(*inputs)
        cand, eager_flat = flat_outputs(out_compiled), flat_outputs(out_eager)
        ref64 = fp64_reference(model, inputs)
        parity = {"vs_eager": check_parity(cand, eager_flat, ref64, tol)}
        if base_dir_paired is not None:
            parity["vs_baseline"] = check_parity(cand, flat_outputs(base_out), None, tol)
        elif req.baseline_reference:
            base = torch.load(req.baseline_reference, weights_only=True)
            parity["vs_baseline"] = check_parity(cand, base["compiled"], base.get("fp64"), tol)
        torch.save({"compiled": [t.detach().cpu() if isinstance(t, torch.Tensor) else t
                                 for t in cand],
                    "fp64": [t.cpu() if isinstance(t, torch.Tensor) else t
                             for t in ref64] if ref64 is not None else None},
                   req.reference_out)

        memory = {"kind": "cuda" if device.startswith("cuda") else "rss",
                  "eager_peak_bytes": peak_memory(lambda: model(*inputs), device),
                  "compiled_peak_bytes": peak_memory(lambda: compiled(*inputs), device)}
        lat = latency(lambda: model(*inputs), lambda: compiled(*inputs), device,
                      req.budget.model_dump(), base=base_fn)
    # frames compiled after the head's first call, not counting the base model's own
    graphs["recompiles"] = counters["frames"].get("ok", 0) - frames_after_compile - base_frames
    if paired is not None:
        paired["samples"] = lat["samples"].pop("base")
    return Response(ok=True, compile_seconds=compile_seconds, counters=cache, graphs=graphs,
                    parity=parity, memory=memory, latency=lat, paired=paired, pid=os.getpid(),
                    torch=torch.__version__, deps=deps)
