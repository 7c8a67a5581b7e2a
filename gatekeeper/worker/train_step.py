"""A training step: ``zero_grad(set_to_none=True)``, forward, loss, ``backward()``,
``optimizer.step()``, one function compiled whole with ``torch.compile``. Eager and
compiled each run their own deep copy of the model and optimizer from the same seeded
weights; :func:`copy_state` puts both in the same state (in place: the compiled step's
guards keep their tensors) before they are timed.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from ..config import ModelConfig, TrainConfig
from ..errors import ConfigError
from .calls import Inputs, entry, loss_inputs
from .fp64 import Float64Kernels
from .model import build_model, load_callable
from .outputs import plain_tensor
from .precision import DTYPES, device_type


def _first_float(out: Any) -> int | None:
    for i, leaf in enumerate(tree_flatten(out)[0]):
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
            return i
    return None


def make_loss(cfg: ModelConfig, base_dir: Path, sample_out: Any) -> Callable:
    """The configured ``train.loss`` or, by default, the mean of squares of the first
    floating-point output (low-precision outputs upcast to float32). It is called with
    the outputs and the inputs (:func:`gatekeeper.worker.calls.loss_inputs`)."""
    train = cfg.training
    if train.loss:
        fn = load_callable(train.loss, base_dir)
        return lambda out, inputs: fn(out, inputs)
    index = _first_float(sample_out)
    if index is None:
        raise ConfigError(
            f'tasks: "train" needs a floating-point output for the default '
            f"loss, and model {cfg.name!r} returns none (set train.loss)"
        )

    def loss(out: Any, inputs: Any) -> torch.Tensor:
        t = tree_flatten(out)[0][index]
        if t.dtype in (torch.float16, torch.bfloat16):
            t = t.float()
        return (t * t).mean()

    return loss


def make_optimizer(model: torch.nn.Module, train: TrainConfig) -> torch.optim.Optimizer:
    cls = getattr(torch.optim, train.optimizer)
    try:
        return cls(model.parameters(), lr=train.lr, **train.kwargs)
    except (TypeError, ValueError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(
            f"train: torch.optim.{train.optimizer} rejects its arguments "
            f"{ {'lr': train.lr, **train.kwargs} }: {first}"
        ) from None


def make_step(
    forward: Callable,
    opt: torch.optim.Optimizer,
    loss_fn: Callable,
    device: str,
    precision: str,
) -> Callable:
    """One training step as one function (what ``torch.compile`` compiles whole);
    ``forward`` is the model (or the method of it that is trained)."""
    dtype, dev = DTYPES[precision], device_type(device)
    if dtype is None:

        def step(*args: Any, **kwargs: Any) -> torch.Tensor:
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(forward(*args, **kwargs), loss_inputs(args, kwargs))
            loss.backward()
            opt.step()
            return loss  # detached outside: a detach here is one more graph
    else:

        def step(*args: Any, **kwargs: Any) -> torch.Tensor:
            opt.zero_grad(set_to_none=True)
            with torch.autocast(dev, dtype=dtype):
                loss = loss_fn(forward(*args, **kwargs), loss_inputs(args, kwargs))
            loss.backward()
            opt.step()
            return loss  # detached outside: a detach here is one more graph

    return step


class Trainer:
    """A model, its optimizer and its step function (eager or compiled)."""

    def __init__(
        self,
        model: torch.nn.Module,
        cfg: ModelConfig,
        loss_fn: Callable,
        device: str,
        precision: str,
    ) -> None:
        self.model = model.train()
        self.opt = make_optimizer(self.model, cfg.training)
        forward = entry(self.model, cfg.call)
        self.step = make_step(forward, self.opt, loss_fn, device, precision)

    @classmethod
    def copy_of(
        cls,
        model: torch.nn.Module,
        cfg: ModelConfig,
        loss_fn: Callable,
        device: str,
        precision: str,
        base_dir: Path,
    ) -> Trainer:
        """A trainer of a copy of ``model``: a deep copy, or, for a model that refuses
        one (FSDP2's), the factory's model built again (seeded: the same weights)."""
        try:
            fresh = copy.deepcopy(model)
        except Exception:
            fresh = build_model(cfg, base_dir, device)
        return cls(fresh, cfg, loss_fn, device, precision)

    def tensors(self) -> list[torch.Tensor]:
        """Everything a step reads and writes: parameters, buffers, optimizer state."""
        out = list(self.model.parameters()) + list(self.model.buffers())
        for p in self.model.parameters():
            out += [
                v
                for _, v in sorted(self.opt.state.get(p, {}).items())
                if isinstance(v, torch.Tensor)
            ]
        return out

    def outputs(self, losses: list[torch.Tensor]) -> dict:
        """What training parity compares: the updated parameters (first: they say which
        layer stopped learning) and the loss trajectory."""
        return {
            "params": {
                n: plain_tensor(p.detach()).clone() for n, p in self.model.named_parameters()
            },
            "loss": torch.stack(
                [x.detach().float() if x.dtype != torch.float64 else x for x in losses]
            ),
        }


def copy_state(src: Trainer, dst: Trainer) -> None:
    """``dst`` takes ``src``'s parameters, buffers and optimizer state, copied in place so
    a compiled step keeps the tensors its guards know."""
    a, b = src.tensors(), dst.tensors()
    if len(a) != len(b):
        return
    with torch.no_grad():
        for s, d in zip(a, b, strict=True):
            if s.shape == d.shape:
                d.copy_(s)


def run_steps(step: Callable, inputs: Inputs, steps: int) -> list[torch.Tensor]:
    return [inputs.call(step) for _ in range(steps)]


def fp64_trajectory(
    model: torch.nn.Module, cfg: ModelConfig, loss_fn: Callable, inputs: Inputs, device: str
) -> dict | None:
    """The eager training run in float64 (no autocast), or None where it cannot run; an
    op with no float64 kernel (a mixture of experts' grouped_mm) computed by others, its
    backward through them (:class:`~gatekeeper.worker.fp64.Float64Kernels`)."""
    try:
        t = Trainer(copy.deepcopy(model).double(), cfg, loss_fn, device, "fp32")
        with Float64Kernels():
            return t.outputs(run_steps(t.step, inputs.double(), cfg.training.steps))
    except Exception:  # fp32-only kernels: the RMSE rung is skipped
        return None


def name_task(check: dict, steps: int) -> dict:
    """A training parity check's detail names the task and what differs."""
    if check.get("passed"):
        return check
    detail = check.get("detail") or check.get("method", "")
    first = detail.split(";")[0]  # the first leaf that differs names what differs
    what = (
        "loss trajectory"
        if "['loss']" in first
        else "parameters"
        if "['params']" in first
        else "outputs"
    )
    return {**check, "detail": f"train: {what} after {steps} steps differ: {detail}"}
