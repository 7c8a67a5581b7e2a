"""``whole``'s worker half: ``torch.compile`` of the whole model (its ``forward``, its
``call`` method, or the function)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..calls import entry
from ..compiler import compile_model
from .base import Builder, Built

if TYPE_CHECKING:
    from ..calls import Inputs
    from ..protocol import Build


class Whole(Builder):
    name = "whole"

    def compiled(
        self,
        model: Any,
        inputs: Inputs,
        req: Build,
        *,
        keep_eager: bool = False,
        out: Path | None = None,
        load: Path | None = None,
    ) -> tuple[Callable[..., Any], Built]:
        cfg = req.model
        return compile_model(entry(model, cfg.call), cfg, req.mode, req.dynamic), Built()


WHOLE = Whole()
