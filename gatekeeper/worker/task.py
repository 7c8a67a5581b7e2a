"""What a target runs, besides the plain float32 forward: autocast precisions, the
training step, and the shape sweep that counts recompiles (runs in the worker).

* **Precision**: ``bf16``/``fp16`` run the forward (and a training step's forward and
  loss) under ``torch.autocast(device_type, dtype)``, entered around the compiled call as
  a service would. A dtype autocast cannot use on the device is a config error.
* **Training step**: ``zero_grad(set_to_none=True)``, forward, loss, ``backward()``,
  ``optimizer.step()``: one function, compiled whole with ``torch.compile``. Eager and
  compiled each run their own deep copy of the model and optimizer from the same
  seeded weights; :func:`copy_state` puts both in the same state (in place: the compiled
  step's guards keep their tensors) before they are timed.
* **Shape sweep**: after the first compile, one process runs every shape set of the
  model in turn; each recompile is counted with the guard that failed, as torch reports
  it (``get_compilation_metrics()[i].recompile_reason``).
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._pytree import tree_flatten

from ..config import ModelConfig, ParityTolerance, TrainConfig
from ..errors import ConfigError
from .calls import Inputs, entry, loss_inputs
from .memory import peak_memory
from .model import build_model, load_callable
from .outputs import plain_tensor
from .profile import profile_calls
from .team import current
from .timing import latency

if TYPE_CHECKING:
    from ..boundary.protocol import MeasureRequest

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
# allclose tolerances for outputs computed under autocast: a few units in the last place
# of the low-precision dtype (bf16 eps 7.8e-3, fp16 eps 9.8e-4); the fp64-reference RMSE
# and cosine rungs of the ladder still apply beyond them
LOW_PRECISION_TOL = {"bf16": 1.6e-2, "fp16": 2e-3}


def device_type(device: str) -> str:
    return device.split(":")[0]


def check_precision(device: str, precision: str) -> None:
    """A config error when autocast cannot run ``precision`` on ``device``."""
    dtype = DTYPES[precision]
    if dtype is None:
        return
    dev = device_type(device)
    if dev == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise ConfigError(
            f"precisions: bf16 is not supported on {torch.cuda.get_device_name(device)}"
        )
    # autocast warns and disables itself for a dtype the device does not support
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autocast(dev, dtype=dtype):
            enabled = torch.is_autocast_enabled(dev)
    if not enabled or any("not supported" in str(w.message) for w in caught):
        raise ConfigError(
            f"precisions: {precision} autocast is not supported on {dev} "
            f"by torch {torch.__version__}"
        )


def autocast(device: str, precision: str) -> contextlib.AbstractContextManager:
    dtype = DTYPES[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type(device), dtype=dtype)


def under_autocast(fn: Callable, device: str, precision: str) -> Callable:
    """``fn`` called under the precision's autocast (``fn`` itself for fp32)."""
    if DTYPES[precision] is None:
        return fn

    def call(*args: Any, **kwargs: Any) -> Any:
        with autocast(device, precision):
            return fn(*args, **kwargs)

    return call


def parity_tolerance(tol: ParityTolerance, precision: str) -> ParityTolerance:
    """The tolerances for a precision: allclose loosened to the autocast dtype's scale."""
    loose = LOW_PRECISION_TOL.get(precision)
    if loose is None:
        return tol
    return tol.model_copy(update={"atol": max(tol.atol, loose), "rtol": max(tol.rtol, loose)})


# -- training ---------------------------------------------------------------------------
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
    """The eager training run in float64 (no autocast), or None where it cannot run."""
    try:
        t = Trainer(copy.deepcopy(model).double(), cfg, loss_fn, device, "fp32")
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


# -- recompiles ---------------------------------------------------------------------------
# the compiles made on purpose (:func:`on_purpose`) since :func:`start_counting` (held,
# so that no other record can take an id of theirs)
_ON_PURPOSE: list[Any] = []


def start_counting() -> None:
    """From now on, every compile torch records is counted (see :func:`recompiles`)."""
    from torch._dynamo.utils import clear_compilation_metrics

    clear_compilation_metrics()
    _ON_PURPOSE.clear()


@contextlib.contextmanager
def on_purpose() -> Iterator[None]:
    """The compiles torch records inside are not counted by :func:`recompiles`."""
    from torch._dynamo.utils import get_compilation_metrics

    held = get_compilation_metrics()  # alive, so that no new record takes an id
    before = {id(m) for m in held}
    yield
    _ON_PURPOSE.extend(m for m in get_compilation_metrics() if id(m) not in before)


def recompiles() -> tuple[int, list[str]]:
    """Recompiles since :func:`start_counting`, and the guard that failed for each; the
    compiles made :func:`on_purpose` are not counted."""
    from torch._dynamo.utils import get_compilation_metrics

    skip = {id(m) for m in _ON_PURPOSE}
    reasons = [_recompile_reason(m) for m in get_compilation_metrics() if id(m) not in skip]
    said = [" ".join(r.split())[:300] for r in reasons if r]
    return len(said), said


def _recompile_reason(m: Any) -> str | None:
    """Why torch recompiled a frame (None: it was a first compile). A torch whose
    metrics name no reason (2.6) says a recompile by the frame's earlier entries."""
    if hasattr(m, "recompile_reason"):
        return m.recompile_reason
    if getattr(m, "cache_size", 0):
        return f"a guard failed in {m.co_name} (torch {torch.__version__} names no reason)"
    return None


def shape_sweep(
    cfg: ModelConfig, base_dir: Path, device: str, call: Callable[[Inputs], Any]
) -> dict:
    """Every shape set of the model, in turn, through ``call`` (the compiled model or
    step): the recompiles they cause, with the guards torch names."""
    from torch._dynamo.utils import counters

    from .model import make_inputs

    start_counting()
    before = dict(counters["inductor"])
    for shape_set in cfg.shapes:
        call(make_inputs(cfg, shape_set, base_dir, device))
    count, guards = recompiles()
    fx = {
        k: counters["inductor"].get(k, 0) - before.get(k, 0)
        for k in ("fxgraph_cache_hit", "fxgraph_cache_miss")
    }
    return {"shape_sets": len(cfg.shapes), "recompiles": count, "guards": guards, **fx}


def fresh_frames() -> None:
    """Paired, before the base is compiled: forget the head's compiled frames and zero
    inductor's counters, so that the base compiles every frame it runs and its kernels
    and bytes accessed count all of them, as the head's do. Frames of code both sides
    run (a training step, a library's function after a graph break) would otherwise be
    the head's compiles, reused by the base when their guards pass, and missing from its
    counts (an unchanged training step read +48% bytes accessed against its base).
    :func:`compile_again` compiles both sides again before they are timed."""
    from .counters import reset_inductor_metrics

    torch._dynamo.reset()
    reset_inductor_metrics()


def compile_again(*calls: Callable[[], object]) -> Callable[[], None]:
    """Paired: forget every compiled frame, then compile each side again from the
    caches the first compiles filled, in the order given.

    How fast a compiled frame's guards are checked depends on where in memory its
    guard tree was built, and whichever side is compiled first in a phase of the process
    is checked slower: an identical head compiled before its base read +1.0%, compiled
    after it -1.0% to -1.8% (docs/statistics.md). The timed rounds are therefore taken
    in two halves, each on frames compiled again: the head first for the first half,
    the base first for the second (:func:`measure_calls` does both, for forwards and
    training steps alike). Parity, compile times and counters come from the first
    compiles. Its compiles are not counted as recompiles (two training steps share one
    code object, so the second side's compile is a recompile of the first's frame)."""

    def again() -> None:
        torch._dynamo.reset()
        with on_purpose():
            for call in calls:
                call()

    return again


def measure_calls(
    eager: Callable[..., Any],
    compiled: Callable[..., Any],
    inputs: Inputs,
    req: MeasureRequest,
    graphs: dict,
    *,
    base_fn: Callable[[], Any] | None = None,
    paired: dict | None = None,
    held: int = 0,
    before_timing: Callable[[], Any] | None = None,
    place_base_first: Callable[[], Any] | None = None,
) -> tuple[dict, dict, Any]:
    """Peak memory, interleaved latency and the profile of a target's calls (a forward or
    a training step, called on ``inputs``), the same for every task; then the recompiles
    of the measured calls and the shape sweep go into ``graphs``. With ``base_fn`` the
    base commit's calls are timed in the same rounds, and its profile and samples go into
    ``paired``. ``before_timing`` runs right before the timed calls (a training step
    puts eager and compiled back into the same state there).

    Paired, the timed rounds come in two halves that mirror each other: each starts
    from frames compiled again (:func:`compile_again`), the head first for the first
    half and the base first for the second, and ``place_base_first`` (the sides'
    weights copied into new memory, the base's first: the worker placed the head's
    first) runs before the second half's compiles. Nothing else runs between a half's
    compiles and its rounds: the peak memory is measured before, since the profiler
    that measures it, run on the head's fresh frames, made the head alone slower in the
    first half (docs/statistics.md)."""
    device = req.device

    def eager_fn():
        return inputs.call(eager)

    def compiled_fn():
        return inputs.call(compiled)

    # paired, the frames these calls compile are forgotten before the timed rounds
    with on_purpose() if base_fn is not None else contextlib.nullcontext():
        if base_fn is not None:  # the head's frames were forgotten for the base's compile
            compiled_fn()  # (fresh_frames): compiled again here, not inside the peak
        memory = {
            "kind": "cuda" if device.startswith("cuda") else "cpu",
            "eager_peak_bytes": peak_memory(eager_fn, device),
            "compiled_peak_bytes": peak_memory(compiled_fn, device, held=max(held, 0)),
        }
    halfway = None
    if base_fn is not None:
        compile_again(compiled_fn, base_fn)()
        again = compile_again(base_fn, compiled_fn)

        def halfway() -> None:
            if place_base_first is not None:
                place_base_first()
            again()

    if before_timing is not None:
        before_timing()
    lat = latency(eager_fn, compiled_fn, device, req.budget, base_fn, halfway, req.decide_at)
    # A distributed target's ranks run no profiler: beside gloo's threads it corrupted
    # the heap (glibc "unaligned fastbin chunk", SIGABRT) in 1 of 7 runs of a tensor-
    # parallel MLP on torch 2.13 CPU, and in none of 17 without it.
    profiled = current() is None
    prof = profile_calls(compiled_fn, device, trace=req.trace_out) if profiled else None
    if base_fn is not None and paired is not None:
        paired["profile"] = (
            profile_calls(
                base_fn,
                device,
                trace=req.trace_out.replace(".json.gz", ".base.json.gz") if req.trace_out else None,
            )
            if profiled
            else None
        )
        paired["samples"] = lat["samples"].pop("base")
    graphs["recompiles"], graphs["recompile_guards"] = recompiles()
    if req.sweep:
        graphs["sweep"] = shape_sweep(
            req.model, req.base_path, device, lambda ins: ins.call(compiled)
        )
    return memory, lat, prof
