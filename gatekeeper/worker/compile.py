"""``compile``, ``probe`` and ``deps``: torch.compile a target's model by its kind and
report what the compile did (runs in the worker)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ..boundary import breadcrumbs
from ..boundary.protocol import CompileRequest, DepsRequest, ProbeRequest, Response
from .calls import Inputs, entry
from .compiler import import_inductor, snapshot_counters
from .counters import record_inductor_metrics
from .deps import watching_cache
from .kinds import Job, Refused, builder, package_half
from .model import build_recorded
from .plan import before_build, fits
from .precision import check_precision, under_autocast
from .sweep import shape_sweep
from .timing import first_call


def deps(req: DepsRequest) -> Response:
    """The build alone, and what it was built from."""
    _, _, found = build_recorded(req.model, req.shapes, req.base_path, req.device)
    return Response(ok=True, deps=found, torch=torch.__version__)


def probe(req: ProbeRequest) -> Response:
    """The first compiled calls against the cache dir the parent restored, saving
    nothing: their time and counters show whether a warm start really was warm (a
    package warm served is loaded as a deploy loads it: its half set that up, or
    answered alone, :func:`gatekeeper.worker.__main__.handle`). ``eager``: the first
    eager call instead (the floor of a first compiled call)."""
    if req.eager and req.task == "infer":
        return _eager_floor(req)
    return _first_calls(req)[0]


def compile_target(req: CompileRequest) -> Response:
    """The first compiled calls, then the Mega-Cache blob, the add-on packages recorded
    (``precompile``), and which files of the cache dir the compile read or loaded
    (``cache_used``: a compile seeded with the previous bundle ships those and what it
    wrote, nothing else)."""
    cache_dir = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    own = builder(req).package
    with watching_cache(cache_dir) as use:
        resp, run = _first_calls(req, out=_path(req, own))
        if resp.ok and req.dynamic:
            # one bundle serves every shape set: whatever else they compile goes in it too
            breadcrumbs.enter("shape sweep")
            shape_sweep(req.model, req.base_path, req.device, run)
        resp = _save_megacache(req, resp)
    # the compiled model goes before a package records: its half builds its own (with
    # this one alive, a compile held two models: the 1B model's peak was 2.15x weights)
    del run
    used, known = use.used, not use.failed
    recorded = dict(resp.packages)
    for ref in req.packages if resp.ok else ():
        if ref.name == own:
            continue
        # recording copies the cache dir first: only what torch then reads in the copy
        # counts (it is the same file in the cache dir)
        with watching_cache(Path(ref.path), reads_only=True) as again:
            recorded[ref.name] = package_half(ref).record(req, Path(ref.path))
        used, known = used | again.used, known and not again.failed
    return resp.model_copy(
        update={"packages": recorded, "cache_used": sorted(used) if known else None}
    )


def _path(req: CompileRequest, name: str | None) -> Path | None:
    """Where the compile writes the package ``name`` (None: not asked for)."""
    return next((Path(r.path) for r in req.packages if r.name == name), None)


def _eager_floor(req: ProbeRequest) -> Response:
    model, inputs, found = build_recorded(
        req.model, req.shapes, req.base_path, req.device, req.quantize
    )
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
        deps=found,
    )


def _first_calls(
    req: CompileRequest | ProbeRequest, out: Path | None = None
) -> tuple[Response, Callable[[Inputs], None]]:
    """The compiled model's (or training step's) first calls, and a function that calls
    it on other inputs. ``out``: where the kind's own package goes."""
    megacache_load = None
    if isinstance(req, ProbeRequest) and req.megacache_in:  # PyTorch's recipe, to compare
        start = time.perf_counter()
        torch.compiler.load_cache_artifacts(Path(req.megacache_in).read_bytes())
        megacache_load = time.perf_counter() - start
    if req.task == "generate":  # the prefill and decode graphs of a generation
        from .generate import first_generations

        resp, gen = first_generations(req, out)
        return resp.model_copy(update={"megacache_load_seconds": megacache_load}), gen
    record_inductor_metrics()  # so the bundle's FX entries replay bytes accessed on hits
    if req.task == "train":
        from .train import compile_steps

        resp, cstep = compile_steps(req)

        def run_step(ins: Inputs) -> None:
            ins.call(cstep)

        return resp.model_copy(update={"megacache_load_seconds": megacache_load}), run_step
    planned = isinstance(req, CompileRequest)
    model, inputs, found = build_recorded(
        req.model,
        req.shapes,
        req.base_path,
        req.device,
        req.quantize,
        plan=before_build(req) if planned else None,
    )
    if planned:
        fits(model, req)
    check_precision(req.device, req.precision)
    imports = import_inductor()
    kind = builder(req)
    breadcrumbs.enter("compile")
    start = time.perf_counter()  # torch.compile() itself: a package loads in there
    try:  # an ahead-of-time kind exports and builds its package in here
        fn, built = kind.compiled(Job(model, inputs, req, out=out))
    except Refused as e:
        return e.response(found), lambda ins: None
    compiled = under_autocast(fn, req.device, req.precision)
    wrap = time.perf_counter() - start
    calls = []
    with torch.no_grad():
        for _ in range(3):  # cudagraph trees record on a later call; run until settled
            calls.append(first_call(compiled, inputs, req.device, kind.first_step)[1])
    if built.after_first_calls is not None:
        built.after_first_calls()
    calls[0] += wrap + imports
    resp = Response(
        ok=True,
        compile_seconds=calls[0],
        call_seconds=calls,
        import_seconds=imports,
        counters=snapshot_counters(),
        torch=torch.__version__,
        deps=found,
        export=built.export,
        packages={kind.package: built.package} if kind.package and built.package else {},
        megacache_load_seconds=megacache_load,
    )

    def run(ins: Inputs) -> None:
        with torch.no_grad():
            ins.call(compiled)

    return resp, run


def _save_megacache(req: CompileRequest, resp: Response) -> Response:
    """The Mega-Cache blob into ``megacache_out`` (torch >= 2.7)."""
    if not resp.ok:
        return resp
    megacache = None
    save = getattr(torch.compiler, "save_cache_artifacts", None)
    if req.megacache_out and save is not None:
        megacache = save()
        if megacache is not None:
            Path(req.megacache_out).write_bytes(megacache[0])
    return resp.model_copy(update={"megacache": megacache is not None})
