"""``regional``: PyTorch's regional compilation recipe. Each repeated block is compiled
in place, the rest of the model runs eager; the blocks share their class's
``forward``, so one FX graph serves N layers, and a change to the code around them
leaves their graphs' cache keys alone. The blocks are the submodules ``regions`` names
(globs over dotted names), or by default the children of every ``nn.ModuleList`` that
share a class with a sibling (the worker's half: :mod:`gatekeeper.kinds.regional.worker`).
A generation compiles its blocks too: ``generate()`` (or the model's own loop) runs
eager around them (docs/generation.md)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from ..base import Kind

if TYPE_CHECKING:
    from ...config import ModelConfig


class Regional(Kind):
    name = "regional"
    worker = "gatekeeper.kinds.regional.worker:REGIONAL"
    owns = ("regions",)
    refusals = {
        "precompile": "a regional target compiles its blocks, and torch packages a whole forward"
    }

    def check_model(self, model: ModelConfig) -> str | None:
        if model.function is not None:
            return (
                "'strategies': \"regional\" compiles a module's repeated blocks; a "
                "'function' model has none (use whole or aot)"
            )
        regions = model.regions
        if regions is not None and (
            not regions or not all(re.fullmatch(r"[\w.*?\[\]-]+", r) for r in regions)
        ):
            return "'regions' must list submodule names or globs, e.g. [\"layers.*\"]"
        return None

    def applies(self, model: ModelConfig, task: str, precision: str) -> bool:
        return task in ("infer", "generate")  # a training step is compiled whole

    def spec(self, model: ModelConfig) -> dict[str, Any]:
        # None: every ModuleList's shared-class children
        return {"strategy": self.name, "regions": model.regions}


REGIONAL = Regional()
