"""Measure one target inside the worker subprocess: graph breaks, compile time, parity,
peak memory and interleaved latency. Returns plain data matching gatekeeper.results."""
from __future__ import annotations

import copy
import math
import os
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch._dynamo.utils import counters
from torch.utils._pytree import tree_flatten

from . import stats
from .config import ModelConfig
from .model import build_model, make_inputs

LOW_PRECISION = (torch.float16, torch.bfloat16)
RMSE_MULTIPLIER = 3.0  # compiled may be this many times further from fp64 than eager is
SAMPLE_SECONDS = 0.002  # aim for at least this much work in one timing sample


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# -- graph breaks --------------------------------------------------------------------------
def graph_breaks(model: torch.nn.Module, inputs: tuple, base_dir: Path) -> dict:
    """Graphs and graph breaks with their reasons and the user's file:line."""
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(*inputs)
    reasons = []
    for r in explained.break_reasons:
        frame = r.user_stack[-1] if r.user_stack else None
        file = None
        if frame is not None:
            file = frame.filename
            try:
                file = Path(file).resolve().relative_to(base_dir.resolve()).as_posix()
            except ValueError:
                pass
        reasons.append({"reason": _reason(r.reason), "file": file,
                        "line": frame.lineno if frame else None})
    return {"count": explained.graph_count, "breaks": len(reasons), "break_reasons": reasons}


def _reason(text: str) -> str:
    """A break's reason in one line: its headline and, when torch gives one, the
    explanation (which names the culprit, e.g. `print`)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    head = lines[0] if lines else "unknown"
    why = next((ln.split(":", 1)[1].strip() for ln in lines[1:]
                if ln.startswith("Explanation:")), "")
    return (f"{head}: {why}" if why else head)[:300]


# -- parity ------------------------------------------------------------------------------
def _flat(out: Any) -> list:
    leaves, _ = tree_flatten(out)
    return leaves


def fp64_reference(model: torch.nn.Module, inputs: tuple) -> list | None:
    """The eager model's outputs computed in float64, or None where it cannot run so."""
    try:
        m64 = copy.deepcopy(model).double()
        args = tuple(a.double() if isinstance(a, torch.Tensor) and a.is_floating_point()
                     else a for a in inputs)
        with torch.no_grad():
            return [t.detach() if isinstance(t, torch.Tensor) else t
                    for t in _flat(m64(*args))]
    except Exception:  # a model with fp32-only kernels: the RMSE test is skipped
        return None


def _rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    return math.sqrt(torch.mean((a.double() - b.double()) ** 2).item()) if a.numel() else 0.0


def check_parity(candidate: list, other: list, ref64: list | None, tol: dict) -> dict:
    """Is ``candidate`` the same computation as ``other``? Per output tensor: allclose,
    else the fp64-reference RMSE test (no further from fp64 than RMSE_MULTIPLIER times
    ``other`` is), else — for fp16/bf16 outputs only — cosine similarity. NaN/Inf fails."""
    if len(candidate) != len(other):
        return {"passed": False, "method": "shape",
                "detail": f"{len(candidate)} outputs, expected {len(other)}"}
    order = ["allclose", "fp64-rmse", "cosine"]
    method, max_abs, worst_rmse, min_cos = "allclose", 0.0, 0.0, 1.0
    for i, (c, o) in enumerate(zip(candidate, other)):
        if not isinstance(c, torch.Tensor):
            if c != o:
                return {"passed": False, "method": "failed", "detail": f"output {i} differs"}
            continue
        if not isinstance(o, torch.Tensor) or c.shape != o.shape:
            return {"passed": False, "method": "shape",
                    "detail": f"output {i}: shape {tuple(c.shape)}, expected "
                              f"{tuple(o.shape) if isinstance(o, torch.Tensor) else o}"}
        c, o = c.detach().cpu(), o.detach().cpu()
        if not c.is_floating_point():
            if not torch.equal(c, o):
                return {"passed": False, "method": "failed", "detail": f"output {i} differs"}
            continue
        if not torch.isfinite(c).all():
            return {"passed": False, "method": "nan-inf",
                    "detail": f"output {i} has NaN or Inf"}
        diff = (c.double() - o.double()).abs()
        max_abs = max(max_abs, diff.max().item() if diff.numel() else 0.0)
        worst_rmse = max(worst_rmse, _rmse(c, o))
        cos = torch.nn.functional.cosine_similarity(c.double().flatten(), o.double().flatten(),
                                                    dim=0).item() if c.numel() else 1.0
        min_cos = min(min_cos, cos)
        if torch.allclose(c.float(), o.float(), atol=tol["atol"], rtol=tol["rtol"]):
            continue
        ref = ref64[i] if ref64 is not None and i < len(ref64) else None
        if isinstance(ref, torch.Tensor) and ref.shape == c.shape:
            ref = ref.cpu()
            if _rmse(c, ref) <= RMSE_MULTIPLIER * _rmse(o, ref) + 1e-12:
                method = max(method, "fp64-rmse", key=order.index)
                continue
        if c.dtype in LOW_PRECISION and cos >= tol["cosine"]:
            method = "cosine"
            continue
        return {"passed": False, "method": "failed", "max_abs_err": max_abs,
                "rmse": worst_rmse, "cosine": min_cos,
                "detail": f"output {i}: max |diff| {diff.max().item():.3g} beyond "
                          f"atol {tol['atol']:g} / rtol {tol['rtol']:g}"}
    return {"passed": True, "method": method, "max_abs_err": max_abs, "rmse": worst_rmse,
            "cosine": min_cos}


# -- memory ------------------------------------------------------------------------------
def _rss_bytes(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def peak_memory(fn: Callable[[], Any], device: str) -> int | None:
    """Peak memory while running ``fn`` a few times: CUDA allocator peak, else growth of
    the peak resident set (VmHWM, reset through /proc/self/clear_refs)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    before = _rss_bytes("VmRSS")
    for _ in range(3):
        fn()
    peak = _rss_bytes("VmHWM")
    return None if before is None or peak is None else max(0, peak - before)


# -- latency -----------------------------------------------------------------------------
class Reference:
    """A fixed workload (matmul + tanh) timed between the model's samples: dividing by it
    cancels much of the machine's drift between processes."""

    def __init__(self, device: str) -> None:
        gen = torch.Generator().manual_seed(1234)
        self.x = torch.randn(128, 128, generator=gen).to(device)
        self.w = (torch.randn(128, 128, generator=gen) / 12).to(device)

    def __call__(self) -> None:
        x = self.x
        for _ in range(4):
            x = torch.tanh(x @ self.w)


def _timed(fn: Callable[[], Any], loops: int, device: str) -> float:
    sync(device)
    start = time.perf_counter()
    for _ in range(loops):
        fn()
    sync(device)
    return (time.perf_counter() - start) / loops


def _loops(one_call: float) -> int:
    """Calls per sample: a power of two giving at least SAMPLE_SECONDS of work."""
    return min(2 ** max(0, math.ceil(math.log2(SAMPLE_SECONDS / one_call))), 4096)


def _round_order(names: list[str], k: int) -> list[str]:
    """The order of round ``k``. Alone, the order flips every round (E C R, R C E, ...):
    no model always runs first, right after the other's caches were warmed, or last.
    Paired, base and head take the first two places and swap them every round (B H E R,
    H B E R, ...): each sees exactly the neighbours the other sees. (Flipping the whole
    round put base after base every other round and the head always in the middle; the
    head then read about 2% slower than an identical base.)"""
    if "base" not in names:
        return names if k % 2 == 0 else names[::-1]
    pair = ["base", "compiled"] if k % 2 == 0 else ["compiled", "base"]
    return pair + [n for n in names if n not in pair]


def latency(eager: Callable[[], Any], compiled: Callable[[], Any], device: str,
            budget: dict, base: Callable[[], Any] | None = None) -> dict:
    """Warm up, then time eager, compiled and the reference interleaved (see
    :func:`_round_order`) until ``min_time`` seconds have passed or ``max_samples``
    rounds were taken.

    In paired mode ``base`` (the base version, compiled) is timed in each round too,
    next to the head's compiled sample, so each (base, compiled) pair shares the
    machine's state of that moment."""
    ref = Reference(device)
    fns = {"eager": eager, "compiled": compiled, "reference": ref}
    if base is not None:
        fns = {"base": base, **fns}
    for _ in range(budget["warmup"]):
        for fn in fns.values():
            fn()
    one = max(max(_timed(fn, 1, device) for name, fn in fns.items() if name != "reference"),
              1e-7)
    loops = _loops(one)
    ref_loops = _loops(max(_timed(ref, 1, device), 1e-7))  # same sample length as the model's
    samples: dict[str, list[float]] = {name: [] for name in fns}
    start = time.perf_counter()
    while (time.perf_counter() - start < budget["min_time"] or len(samples["eager"]) < 5) \
            and len(samples["eager"]) < budget["max_samples"]:
        for name in _round_order(list(fns), len(samples["eager"])):
            samples[name].append(_timed(fns[name], ref_loops if name == "reference" else loops,
                                        device))

    def summary(xs: list[float]) -> dict:
        s = stats.summarize(xs)
        return {"n": s.n, "mean": s.mean, "p50": s.median, "p95": s.p95, "p99": s.p99,
                "min": s.min, "max": s.max, "stdev": s.stdev}

    e, c = summary(samples["eager"]), summary(samples["compiled"])
    return {"eager": e, "compiled": c, "reference": summary(samples["reference"]),
            "speedup": e["p50"] / c["p50"], "throughput": 1.0 / c["p50"],
            "inner_loops": loops, "samples": samples}


def load_base(cfg: ModelConfig, req: dict, device: str) -> tuple[torch.nn.Module, Path]:
    """Paired mode: the base version's model, built from its own checkout."""
    from .model import other_version

    base_dir = Path(req["paired"]["base_dir"])
    refs = [cfg.factory] + ([cfg.inputs_factory] if cfg.inputs_factory else [])
    with other_version(base_dir, [r.split(":")[0] for r in refs]):
        return build_model(cfg, base_dir, device), base_dir


def first_call(compiled: Callable, inputs: tuple, device: str) -> tuple[Any, float]:
    sync(device)
    start = time.perf_counter()
    out = compiled(*inputs)
    sync(device)
    return out, time.perf_counter() - start


# -- the whole measurement ---------------------------------------------------------------
def measure(req: dict, compile_model: Callable, snapshot_counters: Callable) -> dict:
    cfg = ModelConfig.model_validate(req["model"])
    base_dir, device = Path(req["base_dir"]), req["device"]
    model = build_model(cfg, base_dir, device)
    inputs = make_inputs(cfg, req["shapes"], base_dir, device)
    paired = req.get("paired")

    # explain() resets dynamo, so every model is explained before anything is compiled
    graphs = graph_breaks(model, inputs, base_dir)
    if paired:
        base_model, base_src = load_base(cfg, req, device)
        base_graphs = graph_breaks(base_model, inputs, base_src)
    torch._dynamo.reset()
    counters.clear()

    compiled = compile_model(model, cfg, req["mode"], req["dynamic"])
    with torch.no_grad():
        out_compiled, compile_seconds = first_call(compiled, inputs, device)
        for _ in range(2):
            compiled(*inputs)
        cache = snapshot_counters()
        frames_after_compile = counters["frames"].get("ok", 0)
        base_fn, base_frames = None, 0
        if paired:
            base_compiled = compile_model(base_model, cfg, req["mode"], req["dynamic"])
            base_out, base_seconds = first_call(base_compiled, inputs, device)
            base_frames = counters["frames"].get("ok", 0) - frames_after_compile
            base_fn = lambda: base_compiled(*inputs)  # noqa: E731
            paired = {"compile_seconds": base_seconds, "graphs": base_graphs}

        out_eager = model(*inputs)
        cand, eager_flat = _flat(out_compiled), _flat(out_eager)
        ref64 = fp64_reference(model, inputs)
        parity = {"vs_eager": check_parity(cand, eager_flat, ref64, req["parity"])}
        if paired:
            parity["vs_baseline"] = check_parity(cand, _flat(base_out), None, req["parity"])
        elif req.get("baseline_reference"):
            base = torch.load(req["baseline_reference"], weights_only=True)
            parity["vs_baseline"] = check_parity(cand, base["compiled"], base.get("fp64"),
                                                 req["parity"])
        torch.save({"compiled": [t.detach().cpu() if isinstance(t, torch.Tensor) else t
                                 for t in cand],
                    "fp64": [t.cpu() if isinstance(t, torch.Tensor) else t
                             for t in ref64] if ref64 is not None else None},
                   req["reference_out"])

        memory = {"kind": "cuda" if device.startswith("cuda") else "rss",
                  "eager_peak_bytes": peak_memory(lambda: model(*inputs), device),
                  "compiled_peak_bytes": peak_memory(lambda: compiled(*inputs), device)}
        lat = latency(lambda: model(*inputs), lambda: compiled(*inputs), device,
                      req["budget"], base=base_fn)
    # frames compiled after the head's first call, not counting the base model's own
    graphs["recompiles"] = counters["frames"].get("ok", 0) - frames_after_compile - base_frames
    if paired:
        paired["samples"] = lat["samples"].pop("base")
    return {"ok": True, "compile_seconds": compile_seconds, "counters": cache,
            "graphs": graphs, "parity": parity, "memory": memory, "latency": lat,
            "paired": paired, "pid": os.getpid()}
