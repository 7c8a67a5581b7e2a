"""Quantized variants inside the worker (docs/quantization.md): torchao's config applied
to the seeded float model before it is compiled, and what ``check`` judges it by: the
SQNR of the quantized model's eager output against its own float model's (same seed,
same inputs; ``torchao.quantization.utils.compute_error``) and the weight bytes of both.

torchao is imported here only, and only for a quantized target. Where a config cannot
run (no torchao, a device without its kernels) the parent usually said so first
(:func:`gatekeeper.quantize.refusal`); what only torchao can tell (its int4 kernels on a
GPU) is a config error here, one line.
"""

from __future__ import annotations

import fnmatch
import weakref
from typing import Any

import torch

from ..config import ModelConfig
from ..errors import ConfigError, first_line
from ..quantize import CONFIG_CLASS, INSTALL, MIN_TORCHAO, NONE, options_of, torchao_version
from .calls import Inputs, entry
from .fp64 import weight_bytes
from .outputs import Outputs

# what each quantized module was judged by, measured when it was quantized
_figures: weakref.WeakKeyDictionary[torch.nn.Module, dict[str, Any]] = weakref.WeakKeyDictionary()


def _config(cfg: ModelConfig, name: str) -> Any:
    """torchao's config object for ``name``, with the model's arguments for it."""
    where = f"models.{cfg.name}.quantize"
    try:
        import torchao.quantization as tq
    except ImportError as e:
        raise ConfigError(
            f"{where}: {name} needs torchao>={MIN_TORCHAO} ({INSTALL}): {first_line(e)}"
        ) from None
    options = options_of(cfg, name)
    try:
        return getattr(tq, CONFIG_CLASS[name])(**options)
    except (TypeError, ValueError, AssertionError) as e:
        raise ConfigError(f"{where}_options.{name}: {first_line(e)}") from None


def _filter(cfg: ModelConfig) -> Any:
    """Which modules are quantized: ``quantize_modules``' globs over submodule names
    (of the linear layers: what these configs quantize), else torchao's default."""
    globs = cfg.quantize_modules
    if globs is None:
        return None

    def chosen(module: torch.nn.Module, fqn: str) -> bool:
        return isinstance(module, torch.nn.Linear) and any(
            fnmatch.fnmatchcase(fqn, g) for g in globs
        )

    return chosen


def apply(model: Any, inputs: Inputs, cfg: ModelConfig, name: str, judged: bool = False) -> Any:
    """``model`` quantized in place with the torchao config ``name`` (``none``: as it
    is). ``judged``: first record its float output and weight bytes, then the quantized
    model's, for :func:`figures`."""
    if name == NONE:
        return model
    config = _config(cfg, name)
    float_out = _eager(model, inputs, cfg) if judged else None
    float_bytes = weight_bytes(model)
    import torchao.quantization as tq

    filter_fn = _filter(cfg)
    if filter_fn is not None and not any(filter_fn(m, n) for n, m in model.named_modules()):
        raise ConfigError(
            f"models.{cfg.name}.quantize_modules: no linear layer of "
            f"{type(model).__name__} matches {', '.join(cfg.quantize_modules or [])}"
        )
    try:
        tq.quantize_(model, config, **({"filter_fn": filter_fn} if filter_fn else {}))
    except (AssertionError, ImportError, NotImplementedError, RuntimeError) as e:
        raise ConfigError(
            f"models.{cfg.name}.quantize: {name} cannot run on this machine: {first_line(e)}"
        ) from None
    if judged:
        assert float_out is not None
        _figures[model] = {
            "config": name,
            "options": options_of(cfg, name),
            "modules": cfg.quantize_modules,
            "torchao": torchao_version(),
            "sqnr_db": sqnr(float_out, _eager(model, inputs, cfg)),
            "weight_bytes": weight_bytes(model),
            "float_weight_bytes": float_bytes,
        }
    return model


def figures(model: Any) -> dict[str, Any] | None:
    """What :func:`apply` measured of ``model`` (None: not a judged quantized model)."""
    return _figures.get(model) if isinstance(model, torch.nn.Module) else None


def _eager(model: Any, inputs: Inputs, cfg: ModelConfig) -> Outputs:
    with torch.no_grad():
        return Outputs.of(inputs.call(entry(model, cfg.call))).cloned()


def sqnr(reference: Outputs, quantized: Outputs) -> float | None:
    """SQNR in dB of ``quantized``'s floating-point leaves against ``reference``'s, all
    leaves as one signal (torchao's ``compute_error``); None when there are none."""
    from torchao.quantization.utils import compute_error

    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    for k, r in reference.leaves.items():
        q = quantized.leaves.get(k)
        if isinstance(r, torch.Tensor) and r.is_floating_point() and isinstance(q, torch.Tensor):
            if q.shape == r.shape:
                pairs.append((r, q))
    if not pairs:
        return None
    ref = torch.cat([r.detach().float().flatten().cpu() for r, _ in pairs])
    got = torch.cat([q.detach().float().flatten().cpu() for _, q in pairs])
    if torch.equal(ref, got):
        return float("inf")
    return float(compute_error(ref, got))
