"""``check``'s measurement of a training target, inside the worker.

What the inference measurement reports, per step: graphs and breaks of the step,
compile time (the first compiled step compiles forward, backward and optimizer),
parity, peak memory (activations included), interleaved eager vs compiled step latency,
work counters, profile, recompiles and the shape sweep.

Parity: eager and compiled each train their own copy of the same seeded model with
their own optimizer for ``train.steps`` steps on the same inputs; the loss trajectory
and the updated parameters are compared (the inference ladder: allclose, then the
float64 eager run's RMSE, then cosine for autocast), and saved as this target's
reference outputs, so the next run compares with the baseline's too.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch
from torch._dynamo.utils import counters

from .calls import Inputs, entry
from .compile import compile_model, snapshot_counters
from .counters import (
    flops,
    inductor_metrics,
    instructions,
    record_inductor_metrics,
    reset_inductor_metrics,
)
from .graphs import graph_breaks
from .model import build_base, build_recorded, same_inputs
from .parity import Outputs, check_parity, read_reference, save_reference
from .protocol import Request, Response
from .task import (
    Trainer,
    autocast,
    check_precision,
    copy_state,
    fp64_trajectory,
    fresh_frames,
    make_loss,
    measure_calls,
    name_task,
    parity_tolerance,
    run_steps,
    start_counting,
)
from .timing import first_call


def prepare(req: Request, base_dir: Path, model: torch.nn.Module, inputs: Inputs):
    """The loss function, from one eager forward's outputs (a config error when the
    default loss finds no floating-point output)."""
    check_precision(req.device, req.precision)
    with torch.no_grad(), autocast(req.device, req.precision):
        sample = inputs.call(entry(model, req.model.call))
    return make_loss(req.model, base_dir, sample)


def compile_steps(req: Request) -> tuple[Response, Callable]:
    """``compile``/``probe`` of a training target: whole compiled steps (the AOTAutograd
    entry is written only once the backward has run), forward, backward and optimizer.
    Also returns the compiled step."""
    cfg, device = req.model, req.device
    model, inputs, deps = build_recorded(cfg, req.shapes, req.base_path, device)
    loss_fn = prepare(req, req.base_path, model, inputs)
    record_inductor_metrics()
    trainer = Trainer.copy_of(model, cfg, loss_fn, device, req.precision)
    cstep = compile_model(trainer.step, cfg, req.mode, req.dynamic, fullgraph=False)
    calls = [first_call(cstep, inputs, device)[1] for _ in range(max(2, cfg.training.steps))]
    return Response(
        ok=True,
        compile_seconds=calls[0],
        call_seconds=calls,
        counters=snapshot_counters(),
        torch=torch.__version__,
        deps=deps,
    ), cstep


def measure_train(req: Request) -> Response:
    cfg, base_dir, device = req.model, req.base_path, req.device
    assert req.budget is not None and req.parity is not None and req.reference_out
    tol = parity_tolerance(req.parity.model_dump(), req.precision)
    steps = cfg.training.steps
    model, inputs, deps = build_recorded(cfg, req.shapes, base_dir, device)
    loss_fn = prepare(req, base_dir, model, inputs)

    def new(m):
        return Trainer.copy_of(m, cfg, loss_fn, device, req.precision)

    # paired: the base commit's target, as its own config defines it (its optimizer,
    # loss and steps too)
    base_req = req.for_base() if req.paired_base is not None else None

    # explain() runs the step and resets dynamo: on throwaway copies, before compiling
    graphs = graph_breaks(new(model).step, inputs, base_dir, grad=True)
    if base_req is not None:
        base_cfg, base_path = base_req.model, base_req.base_path
        base_model, base_inputs, base_deps = build_base(
            base_cfg, base_req.shapes, base_path, device
        )
        same = same_inputs(inputs, base_inputs)
        base_inputs = inputs if same else base_inputs
        comparable = same and base_cfg.training == cfg.training
        base_loss = prepare(base_req, base_path, base_model, base_inputs)

        def new_base(m):
            return Trainer.copy_of(m, base_cfg, base_loss, device, req.precision)

        base_graphs = graph_breaks(new_base(base_model).step, base_inputs, base_path, grad=True)
    torch._dynamo.reset()
    counters.clear()
    record_inductor_metrics()
    reset_inductor_metrics()

    eager, comp = new(model), new(model)
    cstep = compile_model(comp.step, cfg, req.mode, req.dynamic, fullgraph=False)
    first, compile_seconds = first_call(cstep, inputs, device)
    losses = [first] + run_steps(cstep, inputs, steps - 1)
    cache = snapshot_counters()
    work: dict[str, int | str | None] = {
        **inductor_metrics(),
        "flops": flops(lambda: inputs.call(new(model).step)),
    }
    cand = Outputs.of(comp.outputs(losses))
    ref64 = fp64_trajectory(model, cfg, loss_fn, inputs, device)
    ref64_leaves = Outputs.of(ref64).leaves if ref64 is not None else None
    parity = {
        "vs_eager": name_task(
            check_parity(
                cand,
                Outputs.of(eager.outputs(run_steps(eager.step, inputs, steps))),
                ref64_leaves,
                tol,
            ),
            steps,
        )
    }

    work["instructions"] = instructions(lambda: inputs.call(cstep))
    paired, base_fn = None, None
    if base_req is not None:
        fresh_frames()
        base = new_base(base_model)
        base_step = compile_model(
            base.step, base_cfg, base_req.mode, base_req.dynamic, fullgraph=False
        )
        base_first, base_seconds = first_call(base_step, base_inputs, device)
        base_losses = [base_first] + run_steps(base_step, base_inputs, steps - 1)
        if comparable:  # other inputs or another step give other outputs
            base_out = Outputs.of(base.outputs(base_losses))
            parity["vs_baseline"] = name_task(check_parity(cand, base_out, None, tol), steps)

        def base_fn():
            return base_inputs.call(base_step)

        paired = {
            "compile_seconds": base_seconds,
            "graphs": base_graphs,
            "deps": base_deps,
            "same_inputs": comparable,
            "work": {
                **inductor_metrics(),
                "flops": flops(lambda: base_inputs.call(new_base(base_model).step)),
                "instructions": instructions(base_fn),
            },
        }
    elif req.baseline_reference:
        loaded = read_reference(req.baseline_reference)
        if loaded is not None:
            parity["vs_baseline"] = name_task(check_parity(cand, *loaded, tol), steps)
    save_reference(req.reference_out, cand, Outputs.of(ref64) if ref64 is not None else None)

    start_counting()  # recompiles from here on: the measured steps
    memory, lat, prof = measure_calls(
        eager.step,
        cstep,
        inputs,
        req,
        graphs,
        base_fn=base_fn,
        paired=paired,
        before_timing=lambda: copy_state(eager, comp),
    )  # both timed from the same state
    return Response(
        ok=True,
        compile_seconds=compile_seconds,
        counters=cache,
        graphs=graphs,
        parity=parity,
        memory=memory,
        latency=lat,
        paired=paired,
        work=work,
        profile=prof,
        pid=os.getpid(),
        torch=torch.__version__,
        deps=deps,
    )
