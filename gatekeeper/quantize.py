"""Quantized variants (torchao), the parent's side: the names of a model's ``quantize``
values, their id suffixes, torchao's config class for each, the SQNR floors, what a
target's key and record say of it, and why one cannot run here (docs/quantization.md).

No torch and no torchao here: torchao's version is read from its installed metadata;
the worker (:mod:`gatekeeper.worker.quant`) imports torchao and applies the config.
"""

from __future__ import annotations

import importlib.metadata
import re
from typing import Any, Literal, get_args

Quantize = Literal["none", "int8-weight-only", "int8-dynamic", "float8-dynamic", "int4-weight-only"]
Quantized = Literal["int8-weight-only", "int8-dynamic", "float8-dynamic", "int4-weight-only"]
NONE = "none"
QUANTIZED: tuple[str, ...] = get_args(Quantized)
# the id's suffix (``mlp/b8/default+int8wo``): weight-only (wo), dynamic activations (dq)
SUFFIX = {
    "int8-weight-only": "int8wo",
    "int8-dynamic": "int8dq",
    "float8-dynamic": "fp8dq",
    "int4-weight-only": "int4wo",
}
# torchao.quantization's config class for each
CONFIG_CLASS = {
    "int8-weight-only": "Int8WeightOnlyConfig",
    "int8-dynamic": "Int8DynamicActivationInt8WeightConfig",
    "float8-dynamic": "Float8DynamicActivationFloat8WeightConfig",
    "int4-weight-only": "Int4WeightOnlyConfig",
}
# SQNR (dB) of the quantized model's output vs its float model's below which a target is
# regressed: torchao's own test thresholds (> 20 dB int8 and float8, ~18 dB int4)
SQNR_FLOOR: dict[Quantized, float] = {
    "int8-weight-only": 20.0,
    "int8-dynamic": 20.0,
    "float8-dynamic": 20.0,
    "int4-weight-only": 18.0,
}
MIN_TORCHAO = "0.17"
INSTALL = "pip install 'gatekeeper[quant]'"
# what each config needs of the device, beyond torchao itself
_NEEDS = {
    "float8-dynamic": "a CUDA GPU of compute capability 8.9 or newer (H100, L4, RTX 40xx)",
    "int4-weight-only": "a CUDA GPU and torchao's int4 kernels (mslk >= 1.0)",
}


def _release(version: str) -> tuple[int, ...]:
    """``0.18.0.dev1+cu126`` -> ``(0, 18, 0)``."""
    return tuple(int(x) for x in re.findall(r"\d+", version.split("+")[0])[:3])


def torchao_version() -> str | None:
    """The installed torchao's version (None: not installed), without importing it."""
    try:
        return importlib.metadata.version("torchao")
    except importlib.metadata.PackageNotFoundError:
        return None


def options_of(model: Any, name: str) -> dict[str, Any]:
    """A model's keyword arguments for the torchao config ``name`` (none: its defaults)."""
    return dict(model.quantize_options.get(name, {}))


def spec(name: str, options: dict[str, Any], modules: list[str] | None) -> dict[str, Any]:
    """What a quantized target's key and record say of its quantization: the config,
    torchao's class and the arguments given to it, the modules it applies to, torchao's
    version."""
    return {
        "config": name,
        "class": CONFIG_CLASS[name],
        "options": dict(sorted(options.items())),
        "modules": modules,
        "torchao": torchao_version(),
    }


def refusal(name: str, facts: dict[str, Any]) -> str | None:
    """Why a ``name`` target cannot run where ``facts`` (the env key's facts) say it
    runs: torchao missing or too old for it, or a device the config has no kernels for;
    None when it can."""
    found = torchao_version()
    if found is None:
        return f"{name} needs torchao>={MIN_TORCHAO}, which is not installed ({INSTALL})"
    if _release(found) < _release(MIN_TORCHAO):
        return f"{name} needs torchao>={MIN_TORCHAO}, found torchao {found} ({INSTALL})"
    torch_version = str(facts.get("torch", "")).split("+")[0]
    if torch_version and _release(torch_version) < (2, 11):
        return f"{name}: torchao {found} needs torch>=2.11, found torch {torch_version}"
    if name not in _NEEDS:
        return None
    device = facts.get("device")
    if name == "float8-dynamic" and device == "cuda" and not facts.get("hip"):
        major, _, minor = str(facts.get("capability", "0.0")).partition(".")
        if (int(major), int(minor or 0)) >= (8, 9):
            return None
        return f"{name} needs {_NEEDS[name]}; this GPU is {facts.get('capability')}"
    if name == "int4-weight-only" and device == "cuda":
        return None  # its kernels' absence is the worker's one line
    return f"{name} needs {_NEEDS[name]}; this target runs on {device}"


def check_model(model: Any) -> str | None:
    """Why a model's ``quantize`` fields cannot be (a config error), None when they can."""
    if unused := set(model.quantize_options) - set(model.quantize):
        return f"quantize_options: {sorted(unused)[0]} is not in 'quantize'"
    if model.quantize_modules is not None and model.quantize == [NONE]:
        return "'quantize_modules' is set but 'quantize' has only \"none\""
    if model.quantize != [NONE] and model.function is not None:
        return "'quantize': a 'function' model has no weights to quantize (use a factory)"
    if model.quantize != [NONE] and model.distributed is not None:
        return "'quantize': a distributed model cannot be quantized (drop one of them)"
    return None


def twin_id(target_id: str) -> str | None:
    """The float twin of a quantized target's id (``mlp/b8/default+int8wo+regional`` ->
    ``mlp/b8/default+regional``); None for a float target's."""
    head, _, variant = target_id.rpartition("/")
    parts = variant.split("+")
    kept = [p for p in parts if p not in SUFFIX.values()]
    return f"{head}/{'+'.join(kept)}" if len(kept) < len(parts) else None
