"""``whole``'s worker half: ``torch.compile`` of the whole model (its ``forward``, its
``call`` method, or the function)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...worker.calls import entry
from ...worker.compiler import compile_model
from ...worker.kinds import Builder, Built, Job


class Whole(Builder):
    name = "whole"
    traces = True

    def compiled(self, job: Job) -> tuple[Callable[..., Any], Built]:
        cfg, req = job.req.model, job.req
        fn = compile_model(
            entry(job.model, cfg.call), cfg, req.mode, req.dynamic, traced=job.traced
        )
        return fn, Built()


WHOLE = Whole()
