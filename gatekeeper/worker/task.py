"""A target's calls measured alike for every task (a forward or a training step): peak
memory, interleaved latency, the profile, then the recompiles and the shape sweep; and,
paired, the frames compiled again for each half of the rounds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from .calls import Inputs
from .memory import give_back, peak_memory
from .profile import profile_calls
from .recompiles import on_purpose, recompiles
from .sweep import shape_sweep
from .team import current
from .timing import latency

if TYPE_CHECKING:
    from ..boundary.protocol import MeasureRequest


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
        give_back()  # the forgotten frames' memory
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
            "source": "cuda" if device.startswith("cuda") else "cpu",
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
