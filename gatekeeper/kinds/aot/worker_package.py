"""The ``aot`` kind's AOTInductor package in a fresh worker, loaded the way a deploy
loads it (:func:`gatekeeper.runtime.load_package`, torch's C++ loader):

* ``probe`` (``warm --probe``): ``import torch`` timed apart, then the package loaded and
  its first call made: what a service pays after ``gatekeeper warm``; and whether that
  imported inductor (it should not).
* ``verify`` (``check``'s verification): the first call's outputs compared with eager's
  and with the check's own outputs (:mod:`gatekeeper.worker.verify`).

A package built without its weights runs on the model's own, bound as a deploy binds
them (``load_aot(..., model=...)``): the check verifies it that way.

Nothing here imports torch before the probe has timed that import.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from ...aot_files import WEIGHTS_RECORD, package_member
from ...boundary import breadcrumbs
from ...generation import Generation
from ...runtime import load_package
from ...worker.kinds import Loaded, PackageHalf

if TYPE_CHECKING:
    from ...boundary.protocol import ProbeRequest, Response, VerifyRequest


class AotPackageHalf(PackageHalf):
    name = "aot"

    def probe(self, req: ProbeRequest) -> Response | None:
        """``import torch`` timed apart, then the package warm installed loaded and its
        first call made, without inductor (unless torch's C++ loader is missing)."""
        from ...boundary.protocol import Response

        start = time.perf_counter()
        import torch

        imports = time.perf_counter() - start
        path = req.load.path if req.load else None
        if not path or not Path(path).is_file():
            return Response.failure(
                "compile",
                "no AOTInductor package installed here (warm installs only a verified "
                "package of this code: see its aot status)",
            )
        from ...worker.model import build_model, make_inputs

        inputs = make_inputs(req.model, req.shapes, req.base_path, req.device)
        own = None  # a package without its weights: the deploy's model, built untimed
        if package_member(path, WEIGHTS_RECORD) is not None:
            own = build_model(req.model, req.base_path, req.device)
        breadcrumbs.enter("load package")
        start = time.perf_counter()
        model = load_package(path, model=own)
        loaded = time.perf_counter() - start
        breadcrumbs.enter("package first call")
        generation = None
        with torch.no_grad():
            if req.task == "generate":
                generation = _first_generation(req, model, own, inputs.kwargs["input_ids"], start)
            else:
                inputs.call(model)
        first = time.perf_counter() - start
        return Response(
            ok=True,
            compile_seconds=first,
            call_seconds=[first],
            import_seconds=imports,
            counters={},
            torch=torch.__version__,
            generation=generation and generation.model_copy(update={"first_generate_s": first}),
            packages={
                self.name: {
                    "load_seconds": loaded,
                    "first_call_seconds": first,
                    "inductor_imported": "torch._inductor" in sys.modules,
                }
            },
        )

    @contextmanager
    def loading(self, req: VerifyRequest, model: Any) -> Iterator[Loaded]:
        breadcrumbs.enter("load package")
        start = time.perf_counter()
        package = load_package(req.package.path, model=model)  # its weights, where bound
        seconds = time.perf_counter() - start
        fields = {"load_seconds": seconds, "weights": package.weights}
        yield Loaded(package, seconds, "package first call", fields=fields)


def _first_generation(
    req: ProbeRequest, step: Any, model: Any, ids: Any, start: float
) -> Generation:
    """A deploy's first generation on the package (:mod:`.worker_generate`), as
    docs/generation.md's deploy makes it: the prefill, then the configured new tokens'
    decode steps; its first token's time since ``start``. Nothing here imports Dynamo
    or inductor."""
    from .worker_generate import PackagedLM, eos_of

    new = req.model.generation.new_tokens
    times: list[float] = []
    clock = SimpleNamespace(put=lambda _: times.append(time.perf_counter()))
    PackagedLM(step, eos_of(model)).generate(ids, max_new_tokens=new, streamer=clock)
    return Generation(
        batch=ids.shape[0],
        prompt=ids.shape[1],
        new_tokens=new,
        cache="static",
        loop="generate",
        first_token_s=times[1] - start,  # the first is the prompt's hand-over
    )


PACKAGE = AotPackageHalf()
