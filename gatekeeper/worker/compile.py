"""torch.compile a target's model and report what the compile did (runs in the worker)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
from torch._dynamo.utils import counters

from ..config import ModelConfig
from . import steps
from .calls import Inputs, entry
from .counters import record_inductor_metrics
from .deps import watching_cache
from .model import build_recorded
from .protocol import Request, Response
from .strategy import NotExportable, compiled
from .task import check_precision, shape_sweep, under_autocast
from .timing import first_call


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
    model: Any, cfg: ModelConfig, mode: str, dynamic: bool, fullgraph: bool | None = None
):
    """``torch.compile`` a model (or its method, a plain function, a training step
    function) as configured; ``fullgraph`` overrides the config's (a training step always
    breaks at backward)."""
    return torch.compile(model, **compile_kwargs(cfg, mode, dynamic, fullgraph))


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
        # a loaded precompile package (Dynamo skipped): see worker.precompile
        "dynamo_cache_hit": counters["dynamo_cache"].get("dynamo_cache_hit", 0),
    }


def _import_inductor() -> float:
    """Import inductor as ``torch.compile`` would on its first call, timed apart: every
    process that compiles pays it once, whatever its cache holds (about 1.5 s here)."""
    start = time.perf_counter()
    import torch._inductor.compile_fx  # noqa: F401

    return time.perf_counter() - start


def compiled_for(
    req: Request,
    model: Any,
    inputs: Inputs,
    *,
    keep_eager: bool = False,
    aot_out: str | None = None,
) -> tuple[Any, dict]:
    """The request's target compiled by its strategy (see :mod:`.strategy`)."""
    return compiled(
        model,
        inputs,
        req.model,
        mode=req.mode,
        dynamic=req.dynamic,
        strategy=req.strategy,
        base_dir=req.base_path,
        shapes=req.shapes,
        device=req.device,
        keep_eager=keep_eager,
        aot_in=req.aot_in,
        aot_out=aot_out,
    )


def _compile(req: Request) -> Response:
    if req.action == "deps":
        _, _, deps = build_recorded(req.model, req.shapes, req.base_path, req.device)
        return Response(ok=True, deps=deps, torch=torch.__version__)
    if req.eager and req.task == "infer":  # the floor of a first compiled call: no compile
        model, inputs, deps = build_recorded(req.model, req.shapes, req.base_path, req.device)
        with torch.no_grad():
            seconds = first_call(
                under_autocast(entry(model, req.model.call), req.device, req.precision),
                inputs,
                req.device,
            )[1]
        return Response(
            ok=True,
            compile_seconds=seconds,
            call_seconds=[seconds],
            counters=snapshot_counters(),
            torch=torch.__version__,
            deps=deps,
        )
    if req.precompile:  # probe: what a deploy that loads verified packages gets
        from .precompile import enable_loading

        enable_loading()
    megacache_load = None
    if req.megacache_in:  # PyTorch's documented recipe, for comparison
        start = time.perf_counter()
        torch.compiler.load_cache_artifacts(Path(req.megacache_in).read_bytes())
        megacache_load = time.perf_counter() - start
    record_inductor_metrics()  # so the bundle's FX entries replay bytes accessed on hits
    if req.task == "train":
        from .train import compile_steps

        resp, cstep = compile_steps(req)

        def run(ins: Inputs) -> None:
            ins.call(cstep)

    else:
        model, inputs, deps = build_recorded(req.model, req.shapes, req.base_path, req.device)
        check_precision(req.device, req.precision)
        imports = _import_inductor()
        steps.enter("compile")
        start = time.perf_counter()  # torch.compile() itself: a package loads in there
        try:  # an aot target exports and builds its package in here
            fn, done = compiled_for(req, model, inputs, aot_out=req.aot_out)
        except NotExportable as e:
            return Response(
                ok=False,
                kind="export",
                error=e.says(),
                export=e.info,
                deps=deps,
                torch=torch.__version__,
            )
        compiled = under_autocast(fn, req.device, req.precision)
        wrap = time.perf_counter() - start
        calls = []
        step = "package first call" if req.strategy == "aot" else "first call"
        with torch.no_grad():
            for _ in range(3):  # cudagraph trees record on a later call; run until settled
                calls.append(first_call(compiled, inputs, req.device, step)[1])
        calls[0] += wrap + imports
        resp = Response(
            ok=True,
            compile_seconds=calls[0],
            call_seconds=calls,
            import_seconds=imports,
            counters=snapshot_counters(),
            torch=torch.__version__,
            deps=deps,
            export=done.get("export"),
            aot=done.get("aot"),
        )

        def run(ins: Inputs) -> None:
            with torch.no_grad():
                ins.call(compiled)

    if req.action == "compile" and req.dynamic:
        # one bundle serves every shape set: whatever else they compile goes in it too
        steps.enter("shape sweep")
        shape_sweep(req.model, req.base_path, req.device, run)
    megacache = None
    save = getattr(torch.compiler, "save_cache_artifacts", None)  # torch >= 2.7
    if req.megacache_out and save is not None:
        megacache = save()
        if megacache is not None:
            Path(req.megacache_out).write_bytes(megacache[0])
    return resp.model_copy(
        update={"megacache": megacache is not None, "megacache_load_seconds": megacache_load}
    )


def compile_target(req: Request) -> Response:
    """``compile``: the first compiled calls, then the Mega-Cache blob, and which files of
    the cache dir the compile read or loaded (``cache_used``: a compile seeded with the
    previous bundle ships those and what it wrote, nothing else). ``probe``: the same
    calls against the cache dir the parent restored, saving nothing: their time and
    counters show whether a warm start really was warm. ``deps``: the build alone."""
    if req.action != "compile":
        return _compile(req)
    cache_dir = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    with watching_cache(cache_dir) as use:
        resp = _compile(req)
    used, known = use.used, not use.failed
    precompile = None
    if req.precompile_out:
        # recording copies the cache dir first: only what torch then reads in the copy
        # counts (it is the same file in the cache dir)
        with watching_cache(Path(req.precompile_out), reads_only=True) as again:
            precompile = _record_precompile(req)
        used, known = used | again.used, known and not again.failed
    return resp.model_copy(
        update={"precompile": precompile, "cache_used": sorted(used) if known else None}
    )


def _record_precompile(req: Request) -> dict:
    """Dynamo's package of the inference model, recorded into ``precompile_out`` (a
    copy of this compile's cache dir: see :mod:`gatekeeper.worker.precompile`)."""
    from .precompile import record

    steps.enter("record precompile package")

    def build():
        model, inputs, _ = build_recorded(req.model, req.shapes, req.base_path, req.device)
        compiled = under_autocast(
            compile_model(entry(model, req.model.call), req.model, req.mode, req.dynamic),
            req.device,
            req.precision,
        )

        def calls() -> None:
            with torch.no_grad():
                for _ in range(2):
                    inputs.call(compiled)
                if req.dynamic:  # the one package serves every shape set
                    shape_sweep(
                        req.model, req.base_path, req.device, lambda ins: ins.call(compiled)
                    )

        return calls

    assert req.precompile_out is not None  # compile_target records only when asked
    return record(Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]), Path(req.precompile_out), build)
