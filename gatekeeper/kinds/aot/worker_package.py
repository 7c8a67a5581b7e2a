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

from ...boundary import breadcrumbs
from ...runtime import WEIGHTS_RECORD, load_package, package_member
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

        if req.task == "generate":
            return self._generation(req, Path(path), imports)
        inputs = make_inputs(req.model, req.shapes, req.base_path, req.device)
        own = None  # a package without its weights: the deploy's model, built untimed
        if package_member(path, WEIGHTS_RECORD) is not None:
            own = build_model(req.model, req.base_path, req.device)
        breadcrumbs.enter("load package")
        start = time.perf_counter()
        model = load_package(path, model=own)
        loaded = time.perf_counter() - start
        breadcrumbs.enter("package first call")
        with torch.no_grad():
            inputs.call(model)
        first = time.perf_counter() - start
        return Response(
            ok=True,
            compile_seconds=first,
            call_seconds=[first],
            import_seconds=imports,
            counters={},
            torch=torch.__version__,
            packages={
                self.name: {
                    "load_seconds": loaded,
                    "first_call_seconds": first,
                    "inductor_imported": "torch._inductor" in sys.modules,
                }
            },
        )

    def _generation(self, req: ProbeRequest, path: Path, imports: float) -> Response:
        """A deploy's first generation on the package (:mod:`.worker_generate`), as
        docs/generation.md's deploy makes it: the package loaded (bound to the model's
        weights, built untimed, where it has none), the prefill, then the configured
        new tokens' decode steps; the first token's time and the generation's. Nothing
        here imports Dynamo or inductor."""
        import torch

        from ...boundary.protocol import Response
        from ...generation import Generation
        from ...worker.model import build_model, make_inputs
        from .worker_generate import PackagedLM, eos_of

        own = None  # a package without its weights: the deploy's model, built untimed
        if package_member(path, WEIGHTS_RECORD) is not None:
            own = build_model(req.model, req.base_path, req.device)
        ids = make_inputs(req.model, req.shapes, req.base_path, req.device).kwargs["input_ids"]
        new = req.model.generation.new_tokens
        times: list[float] = []
        breadcrumbs.enter("load package")
        start = time.perf_counter()
        step = load_package(path, model=own)
        loaded = time.perf_counter() - start
        breadcrumbs.enter("package first call")
        clock = SimpleNamespace(put=lambda _: times.append(time.perf_counter()))
        with torch.no_grad():
            PackagedLM(step, eos_of(own)).generate(ids, max_new_tokens=new, streamer=clock)
        first = time.perf_counter() - start
        return Response(
            ok=True,
            compile_seconds=first,
            call_seconds=[first],
            import_seconds=imports,
            counters={},
            torch=torch.__version__,
            generation=Generation(
                batch=ids.shape[0],
                prompt=ids.shape[1],
                new_tokens=new,
                cache="static",
                loop="generate",
                first_generate_s=first,
                first_token_s=times[1] - start,  # the first is the prompt's hand-over
            ),
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


PACKAGE = AotPackageHalf()
