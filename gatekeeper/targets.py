"""Targets: one (model, shape set, mode, dynamic, task, precision, strategy, quantize)
each, with a stable readable id.

The id has exactly three '/'-separated parts — ``<model>/<shapes>/<variant>`` — e.g.
``mlp/b8/default``, ``gpt-block/b2-s64/max-autotune+dynamic``,
``gpt2/b4/default+train+bf16``, ``lm/b1-s32/default+generate``,
``gpt12/b1-s128/default+regional``, ``mlp/b8/default+int8wo+regional`` or
``mlp/b8/default+train+ws2``: the training task, a generation (docs/generation.md), an
autocast precision, a torchao quantization (``+int8wo``, ``+int8dq``, ``+fp8dq``,
``+int4wo``: :mod:`gatekeeper.quantize`), a distributed model's world size and a compile
strategy (an artifact kind, :mod:`gatekeeper.kinds`) join the third part with ``+`` so
every store path keeps its depth. Inference, float32, the float model and the default
kind (``whole``) are implicit, so the ids (and store paths) of targets from before they
existed are unchanged. The device is not in the id: it is part of the env key.

A config becomes targets in :func:`gatekeeper.project.expand`, which asks each kind
which (task, precision) of a model it applies to; this module imports no kind.

A ``dynamic`` model compiles once for all its shape sets: its targets share one bundle,
stored under :attr:`Target.bundle_id` (``<model>/dynamic/<variant>``), while each shape
set is still measured and reported under its own id.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any

from . import quantize
from .config import DEFAULT_STRATEGY, ModelConfig
from .errors import UsageError


def shapes_label(shape_set: dict[str, int]) -> str:
    """``{batch: 8}`` -> ``b8``; ``{seq: 64, batch: 2}`` -> ``b2-s64``; ``{}`` -> ``fixed``.

    Names are sorted (so the order they are written in does not matter) and shortened to
    their first letter unless two names share it.
    """
    if not shape_set:
        return "fixed"
    names = sorted(shape_set)
    short = len({k[0] for k in names}) == len(names)
    return "-".join(f"{k[0] if short else k}{shape_set[k]}" for k in names)


@dataclass(frozen=True)
class Target:
    model: ModelConfig
    shapes: tuple[tuple[str, int], ...]
    mode: str
    dynamic: bool
    task: str = "infer"  # infer | train
    precision: str = "fp32"  # fp32 | bf16 | fp16 (autocast)
    strategy: str = DEFAULT_STRATEGY  # the artifact kind's name (gatekeeper.kinds)
    quantize: str = quantize.NONE  # a torchao config's name (gatekeeper.quantize)

    @property
    def shape_set(self) -> dict[str, int]:
        return dict(self.shapes)

    @property
    def variant(self) -> str:
        return (
            self.mode
            + ("+dynamic" if self.dynamic else "")
            + (f"+{self.task}" if self.task != "infer" else "")
            + (f"+{self.precision}" if self.precision != "fp32" else "")
            + (f"+{quantize.SUFFIX[self.quantize]}" if self.quantized else "")
            + (f"+ws{self.world_size}" if self.world_size else "")
            + (f"+{self.strategy}" if self.strategy != DEFAULT_STRATEGY else "")
        )

    @property
    def quantized(self) -> bool:
        """Whether it is a torchao-quantized variant (the id's ``+int8wo`` ...)."""
        return self.quantize != quantize.NONE

    @property
    def twin(self) -> str:
        """The id of its float twin: the same target unquantized (its own id if float)."""
        if not self.quantized:
            return self.id
        return self.id.replace(f"+{quantize.SUFFIX[self.quantize]}", "", 1)

    def quantization(self) -> dict[str, Any] | None:
        """What its key and record say of its quantization (None: the float model)."""
        if not self.quantized:
            return None
        m = self.model
        return quantize.spec(
            self.quantize, quantize.options_of(m, self.quantize), m.quantize_modules
        )

    @property
    def world_size(self) -> int | None:
        """Its ranks, when the model is ``distributed`` (the id's ``+ws<N>``)."""
        d = self.model.distributed
        return d.world_size if d is not None else None

    @property
    def id(self) -> str:
        return f"{self.model.name}/{shapes_label(self.shape_set)}/{self.variant}"

    @property
    def bundle_id(self) -> str:
        """Where its bundle is stored: its id, or for a dynamic model one id for all its
        shape sets (one compile serves them all)."""
        if self.dynamic:
            return f"{self.model.name}/dynamic/{self.variant}"
        return self.id

    def describe(self) -> dict:
        """What is compiled, as plain data (goes into manifests and results)."""
        d = {
            "id": self.id,
            "model": self.model.name,
            "shapes": self.shape_set,
            "mode": self.mode,
            "dynamic": self.dynamic,
            "device": self.model.device,
        }
        if self.model.function is not None:
            d["function"] = self.model.function
        if self.model.call not in (None, "forward"):
            d["call"] = self.model.call
        if self.task != "infer":
            d["task"] = self.task
        if self.task == "generate":
            d["generate"] = self.model.generation.spec()
        if self.precision != "fp32":
            d["precision"] = self.precision
        if self.strategy != DEFAULT_STRATEGY:
            d["strategy"] = self.strategy
        if self.quantized:
            d["quantize"] = self.quantization()
        if self.model.distributed is not None:
            d["distributed"] = self.model.distributed.spec()
        return d


def quantizations(model: ModelConfig, task: str, precision: str) -> list[str]:
    """The model's ``quantize`` values of a (task, precision): every one for inference
    and generation in float32 (torchao quantizes float32 weights; its kernels set their
    own activation dtypes), only the float model for the others."""
    if task in ("infer", "generate") and precision == "fp32":
        return list(model.quantize)
    return [quantize.NONE] if quantize.NONE in model.quantize else []


def one_per_bundle(targets: list[Target]) -> list[Target]:
    """The first target of each bundle (a dynamic model's shape sets share one)."""
    firsts: dict[str, Target] = {}
    for t in targets:
        firsts.setdefault(t.bundle_id, t)
    return list(firsts.values())


def select(
    targets: list[Target], globs: list[str] | None = None, shard: str | None = None
) -> list[Target]:
    """Filter by ``--target`` globs (any may match), then keep one ``--shard i/n``."""
    if globs:
        chosen = [t for t in targets if any(fnmatch.fnmatchcase(t.id, g) for g in globs)]
        if not chosen:
            raise UsageError(
                f"no target matches {' '.join(globs)} (targets: {', '.join(t.id for t in targets)})"
            )
        targets = chosen
    if shard is not None:
        index, count = parse_shard(shard)
        targets = [
            t for n, t in enumerate(sorted(targets, key=lambda t: t.id)) if n % count == index - 1
        ]
    return targets


def parse_shard(shard: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in shard.split("/"))
    except ValueError:
        raise UsageError(f"--shard expects i/n, e.g. 1/4, got {shard!r}") from None
    if not 1 <= i <= n:
        raise UsageError(f"--shard {shard}: i must be between 1 and n")
    return i, n
