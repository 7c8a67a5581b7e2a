"""A project as gatekeeper runs it: its config read and checked against the schema and
the artifact kinds there are (:func:`load_config`), expanded into targets, each kind
asked which of a model's (task, precision) it compiles (:func:`expand`), and what the
config says each target is built from (:func:`definition`).

It sits above both :mod:`gatekeeper.config` (the schema) and :mod:`gatekeeper.kinds`
(the registry), which import neither each other nor this.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from . import kinds
from .config import Config, ModelConfig, read_config
from .errors import ConfigError
from .targets import Target, quantizations


def load_config(explicit: str | os.PathLike[str] | None = None, cwd: Path | None = None) -> Config:
    """The config ``explicit`` names, else ``gatekeeper.toml`` or ``pyproject.toml``'s
    ``[tool.gatekeeper]`` in ``cwd``, checked against the schema and the kinds: a model's
    ``strategies`` name kinds there are, and each kind's own checks pass (a
    :class:`~gatekeeper.errors.ConfigError` of one line naming the file and the field)."""
    return read_config(explicit, cwd, kinds=kinds)


def expand(config: Config) -> list[Target]:
    targets = [
        Target(model, tuple(shape_set.items()), mode, model.dynamic, task, precision, strategy, q)
        for model in config.models
        for shape_set in model.shapes
        for mode in model.modes
        for task in model.tasks
        for precision in model.precisions
        for strategy in strategies(model, task, precision)
        for q in quantizations(model, task, precision)
    ]
    ids = [t.id for t in targets]
    if dupes := sorted({i for i in ids if ids.count(i) > 1}):
        raise ConfigError(f"{config.path}: two shape sets give the same target id {dupes[0]}")
    return targets


def strategies(model: ModelConfig, task: str, precision: str = "fp32") -> list[str]:
    """The strategies of a model's ``task`` and ``precision``: those whose kind applies
    (a training step is compiled whole; ``aot`` exports the float32 forward: an
    AOTInductor package runs its own kernels, which a caller's autocast cannot change),
    else the default kind."""
    return kinds.applying(model, task, precision)


def definition(target: Target) -> dict[str, Any]:
    """What the config says ``target`` is built, compiled and measured from, as plain
    data: the model's fields (not its name, the axes that make its other targets, the
    fields other kinds own, or its gate overrides, which are rules) and the target's
    shape set. A pull request that changes one of them changes the target
    (gate.governing)."""
    skip = {"name", "gate", "shapes", "modes", "tasks", "precisions", "strategies", "pass_env"}
    skip |= {"quantize"} | (
        {"quantize_options", "quantize_modules"} if not target.quantized else set()
    )
    skip |= kinds.foreign(target.strategy)  # another kind's fields (regions, export)
    skip |= {"train"} if target.task != "train" else set()
    skip |= {"generate"} if target.task != "generate" else set()
    model = target.model.model_dump(mode="json", exclude=skip)
    return {**model, "shape_set": target.shape_set}
