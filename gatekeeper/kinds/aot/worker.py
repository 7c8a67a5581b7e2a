"""``aot``'s worker half, the kind's builder: an inference target's package (the model
exported and built, :mod:`gatekeeper.kinds.aot.worker_build`, or the bundle's loaded),
and a generation's (:mod:`gatekeeper.kinds.aot.worker_generate`). A model whose forward
takes ``use_cache`` is called with ``use_cache=False`` in every call of an inference
target (eager too): a KV cache object in the output is no tensor a package can return.

Its package's half (probe, verification) is :mod:`gatekeeper.kinds.aot.worker_package`.
The worker's steps (``export``, ``aoti_compile_and_package``, ``load package``,
``package first call``) are those :data:`gatekeeper.kinds.aot.STEPS` names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...worker.calls import Inputs
from ...worker.kinds import Builder, Built, Job
from ...worker.model import ADDED_KWARGS
from .worker_build import NotExportable, example_shapes, export, exported_module, package_of

if TYPE_CHECKING:
    from ...boundary.protocol import Build

CACHE_OFF = (
    "use_cache=False in every call of this target: a KV cache in the output is not "
    "a tensor an AOTInductor package can return"
)


class Aot(Builder):
    name = "aot"
    package = "aot"
    ahead_of_time = True
    call_kwargs = {"use_cache": False}  # CACHE_OFF says why

    def compiled(self, job: Job) -> tuple[Callable[..., Any], Built]:
        """The bundle's package (``load``), else the model exported and its package built
        (into ``out``, else a scratch file that lives as long as this process: torch
        loads it from there) and loaded."""
        req, built = job.req, Built()
        cfg, model = req.model, job.model
        program = None
        if job.load is None:
            example = job.inputs
            if req.dynamic:  # exported with its largest shape set: no size-1 specialisation
                from ...worker.model import make_inputs

                shapes = example_shapes(cfg, req.shapes, True)
                example = make_inputs(cfg, shapes, req.base_path, req.device)
            program, built.export = export(model, example, cfg, req.dynamic, req.base_path)
        fn, built.package = package_of(program, exported_module(model, cfg), model, job)
        built.moved = getattr(fn, "rebind", None)  # its kernels keep each weight's address
        if ADDED_KWARGS.get("use_cache") is False:
            built.package["note"] = CACHE_OFF
        return fn, built

    def generation(self, job: Job, kwargs: dict[str, Any]) -> tuple[Any, Built]:
        """A transformers causal LM's forward over a static KV cache, exported and
        packaged (:mod:`gatekeeper.kinds.aot.worker_generate`)."""
        from .worker_generate import packaged_generation

        return packaged_generation(job)

    def graphs(self, model: Any, req: Build, inputs: Inputs, context: Callable[[], Any]) -> dict:
        """An exported program: one graph, no break (a model that breaks does not export)."""
        return {"count": 1, "breaks": 0, "break_reasons": []}

    def refused_base(self, model: Any, inputs: Inputs, req: Build) -> dict[str, Any]:
        """Did the base commit's model export?"""
        try:
            export(model, inputs, req.model, req.dynamic, req.base_path)
        except NotExportable:
            return {"base_exportable": False}
        return {"base_exportable": True}


AOT = Aot()
