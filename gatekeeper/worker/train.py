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
from typing import Any

import torch
from torch._dynamo.utils import counters

from ..boundary.protocol import Build, CompileRequest, MeasureRequest, ProbeRequest, Response
from ..config import ModelConfig, ParityTolerance
from .calls import Inputs, entry
from .compiler import compile_kwargs, compile_model, snapshot_counters
from .counters import (
    flops,
    inductor_metrics,
    instructions,
    record_inductor_metrics,
    reset_inductor_metrics,
)
from .graphs import Traced, graph_breaks
from .memory import footprint
from .model import build_base, build_recorded, same_inputs
from .parity import Outputs, check_parity, read_reference, save_reference
from .plan import before_build, fits
from .precision import autocast, check_precision, parity_tolerance
from .recompiles import start_counting
from .task import fresh_frames, measure_calls
from .timing import first_call
from .train_step import Trainer, copy_state, fp64_trajectory, make_loss, name_task, run_steps


def prepare(req: Build, base_dir: Path, model: torch.nn.Module, inputs: Inputs):
    """The loss function, from one eager forward's outputs (a config error when the
    default loss finds no floating-point output)."""
    check_precision(req.device, req.precision)
    with torch.no_grad(), autocast(req.device, req.precision):
        sample = inputs.call(entry(model, req.model.call))
    return make_loss(req.model, base_dir, sample)


def compile_steps(req: CompileRequest | ProbeRequest) -> tuple[Response, Callable]:
    """``compile``/``probe`` of a training target: whole compiled steps (the AOTAutograd
    entry is written only once the backward has run), forward, backward and optimizer.
    Also returns the compiled step."""
    cfg, device = req.model, req.device
    planned = isinstance(req, CompileRequest)
    plan = before_build(req, trainers=1) if planned else None
    model, inputs, deps = build_recorded(cfg, req.shapes, req.base_path, device, plan=plan)
    if planned:
        fits(model, req, trainers=1)
    loss_fn = prepare(req, req.base_path, model, inputs)
    record_inductor_metrics()
    trainer = Trainer.copy_of(model, cfg, loss_fn, device, req.precision, req.base_path)
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


def measure_train(req: MeasureRequest) -> Response:
    cfg, base_dir, device = req.model, req.base_path, req.device
    tol = parity_tolerance(req.parity, req.precision)
    steps = cfg.training.steps
    two = req.paired_base is not None
    plan = before_build(req, paired=two, trainers=2)
    model, inputs, deps = build_recorded(cfg, req.shapes, base_dir, device, plan=plan)
    fits(model, req, paired=two, trainers=2)
    loss_fn = prepare(req, base_dir, model, inputs)

    def new(m):
        return Trainer.copy_of(m, cfg, loss_fn, device, req.precision, base_dir)

    # graphs and breaks from the compile's own trace; else explain(), which runs the
    # step and resets dynamo: on throwaway copies, before compiling
    traced = Traced.of(compile_kwargs(cfg, req.mode, req.dynamic, False), base_dir)
    graphs = {} if traced else graph_breaks(new(model).step, inputs, base_dir, grad=True)
    # paired: the base commit's target, as its own config defines it (its optimizer,
    # loss and steps too)
    base = _BaseSteps.build(req.for_base(), inputs) if req.paired_base is not None else None
    torch._dynamo.reset()
    counters.clear()
    record_inductor_metrics()
    reset_inductor_metrics()

    eager, comp = new(model), new(model)
    cstep = compile_model(comp.step, cfg, req.mode, req.dynamic, fullgraph=False, traced=traced)
    first, compile_seconds = first_call(cstep, inputs, device)
    graphs = traced.graphs() if traced else graphs
    losses = [first] + run_steps(cstep, inputs, steps - 1)
    cache = snapshot_counters()
    work: dict[str, int | str | None] = {
        **inductor_metrics(),
        "flops": flops(lambda: inputs.call(new(model).step)),
    }
    cand = Outputs.of(comp.outputs(losses))
    ref64 = fp64_trajectory(model, cfg, loss_fn, inputs, device)
    ref64_leaves = Outputs.of(ref64).leaves if ref64 is not None else None
    eager_out = Outputs.of(eager.outputs(run_steps(eager.step, inputs, steps)))
    parity = {"vs_eager": name_task(check_parity(cand, eager_out, ref64_leaves, tol), steps)}
    work["instructions"] = instructions(lambda: inputs.call(cstep))
    paired = None
    if base is not None:
        paired, vs_base = base.measure(cand, tol, cfg)
        if vs_base is not None:
            parity["vs_baseline"] = vs_base
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
        base_fn=base.call if base is not None else None,
        paired=paired,
        before_timing=lambda: copy_state(eager, comp),
    )  # both timed from the same state
    return Response(
        ok=True,
        compile_seconds=compile_seconds,
        counters=cache,
        graphs=graphs,
        parity=parity,
        memory=footprint(memory, model, device),
        latency=lat,
        cpu_samples=lat.pop("cpu", None),
        paired=paired,
        work=work,
        profile=prof,
        pid=os.getpid(),
        torch=torch.__version__,
        deps=deps,
    )


class _BaseSteps:
    """Paired: the base commit's training step, built by its own config (its optimizer,
    loss and steps too) from its own checkout; its graphs from its compile's own trace
    (explained before anything compiles where that cannot record them)."""

    def __init__(
        self, req: MeasureRequest, model: torch.nn.Module, inputs: Inputs, deps: dict, same: bool
    ) -> None:
        self.req, self.model, self.inputs, self.deps, self.same = req, model, inputs, deps, same
        self.loss = prepare(req, req.base_path, model, inputs)
        kwargs = compile_kwargs(req.model, req.mode, req.dynamic, False)
        self.traced = Traced.of(kwargs, req.base_path)
        self.graphs = (
            {} if self.traced else graph_breaks(self.new().step, inputs, req.base_path, grad=True)
        )
        self.step: Callable | None = None

    @classmethod
    def build(cls, req: MeasureRequest, head_inputs: Inputs) -> _BaseSteps:
        model, inputs, deps = build_base(req.model, req.shapes, req.base_path, req.device)
        same = same_inputs(head_inputs, inputs)
        return cls(req, model, head_inputs if same else inputs, deps, same)

    def new(self) -> Trainer:
        return Trainer.copy_of(
            self.model,
            self.req.model,
            self.loss,
            self.req.device,
            self.req.precision,
            self.req.base_path,
        )

    def call(self) -> Any:
        assert self.step is not None
        return self.inputs.call(self.step)

    def measure(
        self, cand: Outputs, tol: ParityTolerance, head: ModelConfig
    ) -> tuple[dict, dict | None]:
        """Compile the base's step beside the head's; its figures (``paired``) and its
        parity check against the head (None: other inputs or another step give other
        outputs)."""
        req, cfg = self.req, self.req.model
        fresh_frames()
        trainer = self.new()
        self.step = compile_model(
            trainer.step, cfg, req.mode, req.dynamic, fullgraph=False, traced=self.traced
        )
        first, seconds = first_call(self.step, self.inputs, req.device)
        if self.traced:
            self.graphs = self.traced.graphs()
        steps = head.training.steps  # the head's: what its parity compares
        losses = [first] + run_steps(self.step, self.inputs, steps - 1)
        comparable = self.same and cfg.training == head.training
        vs = None
        if comparable:
            out = Outputs.of(trainer.outputs(losses))
            vs = name_task(check_parity(cand, out, None, tol), steps)
        paired = {
            "compile_seconds": seconds,
            "graphs": self.graphs,
            "deps": self.deps,
            "same_inputs": comparable,
            "work": {
                **inductor_metrics(),
                "flops": flops(lambda: self.inputs.call(self.new().step)),
                "instructions": instructions(self.call),
            },
        }
        return paired, vs
