"""Parity: does the compiled model compute what eager (or the baseline) computed?"""
from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

LOW_PRECISION = (torch.float16, torch.bfloat16)
RMSE_MULTIPLIER = 3.0  # compiled may be this many times further from fp64 than eager is


def flat_outputs(out: Any) -> list:
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
                    for t in flat_outputs(m64(*args))]
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
