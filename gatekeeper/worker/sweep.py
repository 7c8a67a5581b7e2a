"""The shape sweep: after the first compile, one process runs every shape set of the
model in turn, and the recompiles they cause are counted (:mod:`gatekeeper.worker.recompiles`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import ModelConfig
from .calls import Inputs
from .recompiles import recompiles, start_counting


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
