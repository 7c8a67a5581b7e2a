"""Caching precompile (torch 2.13, experimental), the worker's half: record Dynamo's own
package of a compiled model, so that a later process loads it inside ``torch.compile`` and skips
Dynamo and AOTAutograd; and check, in a fresh process, that what it loads computes what
eager computes before anyone serves it.

What torch does and does not do here (measured on 2.13.0, docs/precompile.md):

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
  counter was moved on first: :func:`gatekeeper.runtime.enable_precompile_loading`
  does that.
"""

from __future__ import annotations

import gc
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

from ...boundary import breadcrumbs
from ...boundary.protocol import dynamo_skipped
from ...errors import first_line
from ...runtime import enable_precompile_loading
from ...worker.calls import entry
from ...worker.compiler import compile_model, snapshot_counters
from ...worker.kinds import Loaded, PackageHalf
from ...worker.model import build_recorded
from ...worker.precision import under_autocast
from ...worker.sweep import shape_sweep

if TYPE_CHECKING:
    from ...boundary.protocol import CompileRequest, ProbeRequest, Response, VerifyRequest

_DROPPED = re.compile(r"guard on (G\['[^']+'\][^ ]*) is dropped with caching_precompile")
_BYPASS = re.compile(r"Detected a package bypass: (.*)")


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
    gc.collect()  # what Dynamo's caches held of the compile's own model goes before build
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


class PrecompileHalf(PackageHalf):
    name = "precompile"

    def record(self, req: CompileRequest, out: Path) -> dict[str, Any]:
        """Dynamo's package of the inference model, recorded into ``out`` (a copy of this
        compile's cache dir)."""
        breadcrumbs.enter("record precompile package")

        def build() -> Callable[[], None]:
            model, inputs, _ = build_recorded(
                req.model, req.shapes, req.base_path, req.device, req.quantize
            )
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

        return record(Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]), out, build)

    def probe(self, req: ProbeRequest) -> Response | None:
        """A deploy that loads verified packages: loading on, then the ordinary probe."""
        enable_precompile_loading()
        return None

    @contextmanager
    def loading(self, req: VerifyRequest, model: Any) -> Iterator[Loaded]:
        """Loading on, then ``torch.compile`` (the package loads in there): verified only
        when Dynamo was skipped."""
        enable_precompile_loading()
        counters.clear()
        with _torch_log() as log:
            start = time.perf_counter()  # the package loads inside torch.compile()
            compiled = under_autocast(
                compile_model(entry(model, req.model.call), req.model, req.mode, req.dynamic),
                req.device,
                req.precision,
            )
            loaded = Loaded(compiled, time.perf_counter() - start)
            yield loaded
        loaded.counters = counts = snapshot_counters()
        skipped = dynamo_skipped(counts)
        loaded.fields = {"dynamo": "skipped" if skipped else "traced"}
        if not skipped:
            said = next(
                (
                    ln
                    for ln in log.lines
                    if "dynamo cache" in ln.lower() or "Source code changes" in ln
                ),
                None,
            )
            loaded.failed = "Dynamo traced the model: the package did not load" + (
                f" ({' '.join(said.split())[:200]})" if said else ""
            )


PACKAGE = PrecompileHalf()
