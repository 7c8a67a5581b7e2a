"""``torch.compile`` as a model's config says, and torch's counters of what it did (runs
in the worker). The low end of the worker: it imports nothing of gatekeeper's above the
config's types, so every kind, action and step may use it."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch
from torch._dynamo.utils import counters

if TYPE_CHECKING:
    from ..config import ModelConfig
    from .graphs import Traced


def compile_kwargs(
    cfg: ModelConfig, mode: str, dynamic: bool, fullgraph: bool | None = None
) -> dict[str, Any]:
    """``torch.compile``'s arguments as configured (a regional target's blocks take the
    same)."""
    kwargs: dict[str, Any] = {
        "backend": cfg.backend,
        "fullgraph": cfg.fullgraph if fullgraph is None else fullgraph,
        "dynamic": dynamic,
    }
    if cfg.options:
        kwargs["options"] = cfg.options
    elif mode != "default":
        kwargs["mode"] = mode
    return kwargs


def compile_model(
    model: Any,
    cfg: ModelConfig,
    mode: str,
    dynamic: bool,
    fullgraph: bool | None = None,
    traced: Traced | None = None,
):
    """``torch.compile`` a model (or its method, a plain function, a training step
    function) as configured; ``fullgraph`` overrides the config's (a training step always
    breaks at backward); ``traced``: record the graphs it traces there, where it can."""
    kwargs = compile_kwargs(cfg, mode, dynamic, fullgraph)
    wrapped = traced.compile_kwargs(kwargs) if traced is not None else None
    return torch.compile(model, **(wrapped or kwargs))


def snapshot_counters() -> dict[str, int]:
    """The torch counters that say what the compile did (cache hits, graphs, breaks)."""
    inductor = dict(counters["inductor"])
    aot = dict(counters["aot_autograd"])
    return {
        "fxgraph_cache_hit": inductor.get("fxgraph_cache_hit", 0),
        "fxgraph_cache_miss": inductor.get("fxgraph_cache_miss", 0),
        "fxgraph_cache_bypass": inductor.get("fxgraph_cache_bypass", 0),
        "autograd_cache_hit": aot.get("autograd_cache_hit", 0),
        "autograd_cache_miss": aot.get("autograd_cache_miss", 0),
        "graphs": counters["stats"].get("unique_graphs", 0),
        "graph_breaks": sum(counters["graph_break"].values()),
        "frames": counters["frames"].get("ok", 0),
        # a loaded precompile package (Dynamo skipped): see kinds.precompile.worker
        "dynamo_cache_hit": counters["dynamo_cache"].get("dynamo_cache_hit", 0),
    }


def import_inductor() -> float:
    """Import inductor as ``torch.compile`` would on its first call, timed apart: every
    process that compiles pays it once, whatever its cache holds (about 1.5 s here)."""
    start = time.perf_counter()
    import torch._inductor.compile_fx  # noqa: F401

    return time.perf_counter() - start
