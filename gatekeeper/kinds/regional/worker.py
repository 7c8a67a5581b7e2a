"""``regional``'s worker half: PyTorch's regional compilation recipe. Each repeated block
is compiled in place (``nn.Module.compile``), the rest of the model runs eager. The
blocks share their class's ``forward``, so Dynamo traces one and reuses it for the
others (one FX graph for N layers), and a change to the code around them leaves their
graphs' cache keys alone. The blocks: the submodules the model's ``regions`` globs name
(``"layers.*"``, matched one dotted name part per glob part), or by default the
children of every ``nn.ModuleList`` that share a class with a sibling."""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ...config import ModelConfig
from ...errors import ConfigError
from ...worker.calls import Inputs, entry
from ...worker.compiler import compile_kwargs
from ...worker.kinds import Builder, Built, Job

if TYPE_CHECKING:
    from ...boundary.protocol import Build


def _matches(pattern: str, name: str) -> bool:
    import fnmatch

    parts, names = pattern.split("."), name.split(".")
    return len(parts) == len(names) and all(
        fnmatch.fnmatchcase(n, p) for p, n in zip(parts, names, strict=True)
    )


def find_regions(model: torch.nn.Module, cfg: ModelConfig) -> list[tuple[str, torch.nn.Module]]:
    """The blocks a regional target compiles, outermost first, by qualified name."""
    modules = [(n, m) for n, m in model.named_modules() if n]
    if cfg.regions:
        found = [(n, m) for n, m in modules if any(_matches(p, n) for p in cfg.regions)]
        if not found:
            children = ", ".join(n for n, _ in model.named_children()) or "none"
            raise ConfigError(
                f"regions: no submodule of model {cfg.name!r} matches "
                f"{', '.join(cfg.regions)} (its children: {children})"
            )
    else:
        found = []
        for name, mod in [("", model), *modules]:
            if isinstance(mod, torch.nn.ModuleList):
                classes = Counter(type(c) for c in mod)
                prefix = f"{name}." if name else ""
                found += [(f"{prefix}{i}", c) for i, c in enumerate(mod) if classes[type(c)] > 1]
        if not found:
            raise ConfigError(
                f'strategies: "regional" needs repeated blocks, and model {cfg.name!r} has '
                "no nn.ModuleList whose children share a class: name its blocks with "
                'regions = ["<submodule>", ...]'
            )
    names = [n for n, _ in found]
    return [(n, m) for n, m in found if not any(n.startswith(o + ".") for o in names if o != n)]


def torch_forward(block: torch.nn.Module) -> bool:
    """Whether ``block``'s forward is torch's own (``nn.Sequential``, ``nn.Linear``):
    Dynamo skips a frame of torch's files it starts in, so ``block.compile()`` of such
    a block captures no graph and the region runs eager."""
    return type(block).forward.__module__.split(".")[0] == "torch"


def traced(block: torch.nn.Module) -> Callable[..., Any]:
    """What Dynamo starts tracing a block at: the block itself, or for a block whose
    forward is torch's own a function of this file that calls it (Dynamo traces this
    frame and inlines torch's forward; blocks of one class still share one graph)."""
    if not torch_forward(block):
        return block
    forward = block.forward

    def region(*args: Any, **kwargs: Any) -> Any:
        return forward(*args, **kwargs)

    return region


# A block may be a graph of its own: a stock transformers decoder layer reads its own entry
# of the KV cache (``cache.layers[self.layer_idx]``: a generation's, and the cache a forward
# makes with ``use_cache`` at its default), and Dynamo guards on that index (one FX graph of
# inductor's serves them all: its cache hits the others). A graph per layer for a forward or
# a prefill, one for the decode, one more where a dynamic cache grows (its length goes
# dynamic), and the paired base commit's blocks beside them: 8 leaves room. Past Dynamo's
# limit (8 graphs per code object by default) the other layers run eager, without a word.
GRAPHS_PER_BLOCK = 8


def allow_graphs(count: int) -> None:
    """Let Dynamo keep at least ``count`` graphs of one code object (and in all)."""
    cfg = torch._dynamo.config
    # named cache_size_limit before torch 2.7
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    setattr(cfg, name, max(getattr(cfg, name), count))
    total = "accumulated_recompile_limit"
    if not hasattr(cfg, total):
        total = "accumulated_cache_size_limit"
    if hasattr(cfg, total):
        setattr(cfg, total, max(getattr(cfg, total), 2 * count))


def compile_regions(
    model: torch.nn.Module, cfg: ModelConfig, kwargs: dict[str, Any], called: set[str] | None = None
) -> list[tuple[str, torch.nn.Module]]:
    """Compile every block of ``model`` in place: ``module.compile(**kwargs)``, or its
    ``forward`` through :func:`traced` when that is torch's own, with room for
    :data:`GRAPHS_PER_BLOCK` graphs each. ``called``: each block's name is added when
    it first runs (a hook that then removes itself)."""
    blocks = find_regions(model, cfg)
    allow_graphs(GRAPHS_PER_BLOCK * len(blocks))
    for name, block in blocks:
        if called is not None:
            _note_first_call(block, name, called)
        if torch_forward(block):
            block.forward = torch.compile(traced(block), **kwargs)
        else:
            block.compile(**kwargs)
    return blocks


def _note_first_call(block: torch.nn.Module, name: str, called: set[str]) -> None:
    def hook(*_: Any) -> None:
        called.add(name)
        handle.remove()

    handle = block.register_forward_pre_hook(hook)


def uncalled(
    blocks: list[tuple[str, torch.nn.Module]],
    called: set[str],
    cfg: ModelConfig,
    by: str | None = None,
) -> None:
    """A config error where the model's first calls (``by``: else its call) did not
    run a block ``regions`` names, or (the default regions) ran none of its blocks: a
    block not called compiles nothing, and its part of the bundle would be empty
    without a word."""
    missed = [n for n, _ in blocks if n not in called]
    if missed and (cfg.regions or len(missed) == len(blocks)):
        names = ", ".join(missed[:3]) + (f" and {len(missed) - 3} more" if len(missed) > 3 else "")
        caller = by or cfg.call or "forward"
        raise ConfigError(
            f"regions: {names}: never called by {caller} of model {cfg.name!r}; "
            "a block the model does not call compiles nothing (name blocks it calls)"
        )


def block_inputs(
    model: torch.nn.Module, cfg: ModelConfig, inputs: Inputs, context: Callable[[], Any]
) -> list[tuple[torch.nn.Module, tuple, dict]]:
    """The first block of each class and the arguments one eager call passes it (what
    ``torch._dynamo.explain`` of a regional target looks at)."""
    firsts: dict[type, torch.nn.Module] = {}
    for _, block in find_regions(model, cfg):
        firsts.setdefault(type(block), block)
    seen: dict[int, tuple[tuple, dict]] = {}

    def grab(mod: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        seen.setdefault(id(mod), (args, kwargs))

    hooks = [b.register_forward_pre_hook(grab, with_kwargs=True) for b in firsts.values()]
    try:
        with torch.no_grad(), context():
            inputs.call(entry(model, cfg.call))
    finally:
        for h in hooks:
            h.remove()
    return [(b, *seen[id(b)]) for b in firsts.values() if id(b) in seen]


def regional_graphs(
    model: torch.nn.Module,
    cfg: ModelConfig,
    inputs: Inputs,
    base_dir: Path,
    context: Callable[[], Any],
) -> dict:
    """Graphs and breaks of a regional target: its blocks', one of each class."""
    from ...worker.graphs import graph_breaks

    total: dict = {"count": 0, "breaks": 0, "break_reasons": []}
    for block, args, kwargs in block_inputs(model, cfg, inputs, context):
        g = graph_breaks(traced(block), Inputs(args, kwargs), base_dir, context=context)
        total["count"] += g["count"]
        total["breaks"] += g["breaks"]
        total["break_reasons"] += g["break_reasons"]
    return total


def shared_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model``'s modules that shares its parameters and buffers: its blocks
    compile in place while the model stays eager, and the weights are held once (a
    deep copy held them twice)."""
    memo: dict[int, Any] = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    return copy.deepcopy(model, memo)


def compiled_in_place(
    target: torch.nn.Module, cfg: ModelConfig, kwargs: dict[str, Any], by: str | None = None
) -> Callable[[], None]:
    """Compile ``target``'s blocks (:func:`compile_regions`); the check to run once its
    first calls (``by``: what made them, else its call) ran: :func:`uncalled`."""
    called: set[str] = set()
    blocks = compile_regions(target, cfg, kwargs, called)
    return partial(uncalled, blocks, called, cfg, by)


class Regional(Builder):
    name = "regional"

    def compiled(self, job: Job) -> tuple[Callable[..., Any], Built]:
        cfg, req = job.req.model, job.req
        target = shared_copy(job.model) if job.keep_eager else job.model
        check = compiled_in_place(target, cfg, compile_kwargs(cfg, req.mode, req.dynamic))
        return entry(target, cfg.call), Built(after_first_calls=check)

    def graphs(self, model: Any, req: Build, inputs: Inputs, context: Callable[[], Any]) -> dict:
        """Its blocks', one of each class."""
        return regional_graphs(model, req.model, inputs, req.base_path, context)

    def generation(self, job: Job, kwargs: dict[str, Any]) -> tuple[Any, Built]:
        """A copy of the model sharing its weights, its blocks compiled, and the check
        that the first generation ran them."""
        target = shared_copy(job.model)
        check = compiled_in_place(target, job.req.model, kwargs, by="the generation")
        return target, Built(after_first_calls=check)


REGIONAL = Regional()
