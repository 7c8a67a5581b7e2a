"""The precision a target runs at: ``bf16``/``fp16`` run the forward (and a training
step's forward and loss) under ``torch.autocast(device_type, dtype)``, entered around the
compiled call as a service would. A dtype autocast cannot use on the device is a config
error.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ..config import ParityTolerance
from ..errors import ConfigError

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
# allclose tolerances for outputs computed under autocast: a few units in the last place
# of the low-precision dtype (bf16 eps 7.8e-3, fp16 eps 9.8e-4); the fp64-reference RMSE
# and cosine rungs of the ladder still apply beyond them
LOW_PRECISION_TOL = {"bf16": 1.6e-2, "fp16": 2e-3}


def device_type(device: str) -> str:
    return device.split(":")[0]


def check_precision(device: str, precision: str) -> None:
    """A config error when autocast cannot run ``precision`` on ``device``."""
    dtype = DTYPES[precision]
    if dtype is None:
        return
    dev = device_type(device)
    if dev == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise ConfigError(
            f"precisions: bf16 is not supported on {torch.cuda.get_device_name(device)}"
        )
    # autocast warns and disables itself for a dtype the device does not support
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autocast(dev, dtype=dtype):
            enabled = torch.is_autocast_enabled(dev)
    if not enabled or any("not supported" in str(w.message) for w in caught):
        raise ConfigError(
            f"precisions: {precision} autocast is not supported on {dev} "
            f"by torch {torch.__version__}"
        )


def autocast(device: str, precision: str) -> contextlib.AbstractContextManager:
    dtype = DTYPES[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type(device), dtype=dtype)


def under_autocast(fn: Callable, device: str, precision: str) -> Callable:
    """``fn`` called under the precision's autocast (``fn`` itself for fp32)."""
    if DTYPES[precision] is None:
        return fn

    def call(*args: Any, **kwargs: Any) -> Any:
        with autocast(device, precision):
            return fn(*args, **kwargs)

    return call


def parity_tolerance(tol: ParityTolerance, precision: str) -> ParityTolerance:
    """The tolerances for a precision: allclose loosened to the autocast dtype's scale."""
    loose = LOW_PRECISION_TOL.get(precision)
    if loose is None:
        return tol
    return tol.model_copy(update={"atol": max(tol.atol, loose), "rtol": max(tol.rtol, loose)})
