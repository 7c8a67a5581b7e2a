"""Caching precompile (torch 2.13, experimental): record Dynamo's own package of a
compiled model, so that a later process loads it inside ``torch.compile`` and skips
Dynamo and AOTAutograd; and check, in a fresh process, that what it loads computes what
eager computes before anyone serves it.

What torch does and does not do here (measured on 2.13.0, see the README):

* ``torch._dynamo.config.caching_precompile`` records a package at every compile;
  ``torch.compiler.save_cache_artifacts()`` writes it to ``<cache dir>/dynamo/<key>/entry``
  (key: the forward's qualified name and first line). On CPU the entry still needs the
  C++ kernels of the cache dir beside it.
* Recording puts a fresh backend id in AOTAutograd's key, so its AOT entries never hit
  in another process: it records into a *copy* of the compile's cache dir, and only what
  the copy gained ships, apart from the plain bundle.
* On load torch checksums the source lines it traced, but drops ID, closure and
  dict-version guards: a changed module-level alias loads the old graph silently. Hence
  the parity check before a package is served.
* A guard that fails after a load recompiles, and that recompile crashes on a name
  clash in the module's globals (``__builtins_dict___0``) unless the per-process name
  counter was moved on first: :func:`enable_loading` does that.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch._dynamo.utils import counters

from ..errors import first_line
from .protocol import ISA_ENV

if TYPE_CHECKING:
    from .protocol import Request, Response

_DROPPED = re.compile(r"guard on (G\['[^']+'\][^ ]*) is dropped with caching_precompile")
_BYPASS = re.compile(r"Detected a package bypass: (.*)")


def enable_loading(skip_isa_probe: bool = False) -> None:
    """Load precompile packages in this process from now on (call before
    ``torch.compile``). A guard that fails after a load then recompiles cleanly.

    ``skip_isa_probe``: trust the CPU's flags for inductor's vector ISA instead of
    building and loading a probe library in a subprocess (~0.5 s per process): the key
    pins those flags, and a served package's kernels are built already. Only for a
    process whose every warm target is served from its package: the setting is part of
    inductor's FX graph key, so an FX cache entry compiled without it misses."""
    import torch._dynamo.bytecode_transformation as bt

    torch._dynamo.config.caching_precompile = True
    if skip_isa_probe and os.environ.get(ISA_ENV) is None:  # the user's own word wins
        import torch._inductor.config as inductor_config

        inductor_config.cpp.vec_isa_ok = True
    # torch 2.13 installs the package's __builtins_dict___0 into the module's globals;
    # a recompile in the same module would claim that name again and assert
    bt.unique_id("__gatekeeper_precompile")


class _Log(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(record.getMessage())
        except Exception:  # a log line we cannot format says nothing
            pass


@contextmanager
def _torch_log() -> Iterator[_Log]:
    """torch's log lines while inside: torch's logging stops ``torch._dynamo``'s records
    at that logger, so the handler goes there as well as on ``torch``."""
    handler = _Log()
    loggers = [logging.getLogger(name) for name in ("torch", "torch._dynamo")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def record(cache_dir: Path, out_dir: Path, build: Callable[[], Callable[[], Any]]) -> dict:
    """Record the precompile package of what ``build`` compiles (it returns the first
    call to make) into ``out_dir``, a copy of ``cache_dir`` (the compile's, already
    warm: inductor's FX graphs hit, so only Dynamo and AOTAutograd run again).

    Returns ``{"status": "recorded", "entries": [...], "unguarded": [...]}`` or
    ``{"status": "unavailable", "reason": ...}``; never raises for the model's sake."""
    if not hasattr(torch._dynamo.config, "caching_precompile"):  # an older torch
        return {"status": "unavailable", "reason": f"torch {torch.__version__} cannot package"}
    shutil.copytree(cache_dir, out_dir, dirs_exist_ok=True, ignore=shutil.ignore_patterns("locks"))
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(out_dir)  # inductor reads it per lookup
    torch._dynamo.reset()
    torch._dynamo.config.caching_precompile = True
    try:
        with _torch_log() as log:
            try:
                build()()
                torch.compiler.save_cache_artifacts()
            except Exception as e:  # torch cannot package this model
                bypass = next((m.group(1) for ln in log.lines if (m := _BYPASS.search(ln))), None)
                return {
                    "status": "unavailable",
                    "reason": f"torch could not package it: {bypass or first_line(e)}",
                }
        entries = sorted(p.parent.name for p in out_dir.glob("dynamo/*/entry"))
        if not entries:
            return {"status": "unavailable", "reason": "torch wrote no precompile entry"}
        # module globals whose identity torch no longer guards (it drops those guards
        # when it packages): a change to one is what only the parity check can see
        unguarded = sorted(
            {
                m.group(1)
                for ln in log.lines
                if (m := _DROPPED.search(ln))
                and not m.group(1).startswith(("G['__import_", "G['__builtins"))
            }
        )
        return {"status": "recorded", "entries": entries, "unguarded": unguarded}
    finally:
        torch._dynamo.config.caching_precompile = False
        torch._dynamo.reset()
        if before is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = before


def verify(req: Request) -> Response:
    """``precompile``: in this fresh process, load the package the parent restored,
    make the first call, and compare it with eager and with the reference outputs of
    the check that asked (the ordinary compiled path). Verified only when Dynamo was
    skipped and every comparison passed."""
    from .calls import entry
    from .compile import compile_model, snapshot_counters
    from .model import build_recorded
    from .parity import Outputs, check_parity, read_reference, vs_eager
    from .protocol import Response, dynamo_skipped
    from .task import check_precision, parity_tolerance, under_autocast
    from .tf32 import accuracy_settings, bakes_tf32
    from .timing import first_call

    assert req.parity is not None
    enable_loading()
    counters.clear()
    check_precision(req.device, req.precision)
    model, inputs, deps = build_recorded(req.model, req.shapes, req.base_path, req.device)
    tol = parity_tolerance(req.parity.model_dump(), req.precision)
    with _torch_log() as log:
        start = time.perf_counter()  # the package loads inside torch.compile()
        compiled = under_autocast(
            compile_model(entry(model, req.model.call), req.model, req.mode, req.dynamic),
            req.device,
            req.precision,
        )
        wrap = time.perf_counter() - start
        baked = bakes_tf32(req.mode, req.model.options)
        with torch.no_grad(), accuracy_settings(req.device, baked):
            out, seconds = first_call(compiled, inputs, req.device)
            seconds += wrap
            cand = Outputs.of(out)
    counts = snapshot_counters()
    skipped = dynamo_skipped(counts)
    eager = under_autocast(entry(model, req.model.call), req.device, req.precision)
    vs, _ = vs_eager(cand, eager, model, inputs, req.model.call, req.device, tol, baked)
    parity = {"vs_eager": vs}
    if req.reference_in:
        loaded = read_reference(req.reference_in)
        if loaded is not None:
            parity["vs_reference"] = check_parity(cand, loaded[0], loaded[1], tol)
    failed = [k for k, v in parity.items() if not v.get("passed")]
    reason = None
    if not skipped:
        said = next(
            (ln for ln in log.lines if "dynamo cache" in ln.lower() or "Source code changes" in ln),
            None,
        )
        reason = "Dynamo traced the model: the package did not load" + (
            f" ({' '.join(said.split())[:200]})" if said else ""
        )
    elif failed:
        detail = parity[failed[0]].get("detail") or parity[failed[0]].get("method")
        reason = f"the package's outputs differ {failed[0].replace('_', ' ')}: {detail}"
    return Response(
        ok=True,
        compile_seconds=seconds,
        counters=counts,
        package_parity=parity,
        torch=torch.__version__,
        deps=deps,
        precompile={
            "dynamo": "skipped" if skipped else "traced",
            "verified": skipped and not failed,
            "reason": reason,
            "first_call_seconds": seconds,
        },
    )
