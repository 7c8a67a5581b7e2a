"""TF32 and reduced-precision reductions in the parity check (runs in the worker).

On an NVIDIA GPU of compute capability 8.0 or newer, float32 convolutions and matmuls
may run on TF32 tensor cores, which read "only the first 10 bits of the input mantissa"
(PyTorch's numerical-accuracy notes): ``torch.backends.cudnn.allow_tf32`` (on by
default) allows it for cuDNN's convolutions, ``torch.backends.cuda.matmul.allow_tf32``
(off by default) for cuBLAS's matmuls and inductor's Triton ones. Whether a kernel uses
it is the backend's choice, so eager and compiled can differ by TF32's error on an
unchanged model (inductor's channels-last convolutions take tensor-core kernels that an
NCHW eager one may not). PyTorch's accuracy runs (``benchmarks/dynamo/common.py``,
``--accuracy``) turn TF32 off for eager and compiled alike and judge the compiled model
by ``torch._dynamo.utils.same``: allclose, else no further from an fp64 reference than a
multiplier times eager's own error. The gate does the same where it can:

* :func:`precise`: the fp64 reference runs with TF32 and reduced-precision reductions
  off (for what a model computes in another dtype inside), every setting put back
  exactly after (Dynamo guards on cuBLAS's, inductor keys its cache on them).
* :func:`accuracy_settings`: the parity calls (the compiled model's first call and
  eager's) run with cuDNN's TF32 off. cuDNN reads that flag at every call and Dynamo
  does not guard on it, so the compiled model is neither recompiled nor re-keyed, and
  a CUDA-graph mode's first call (its warmup, before any capture) honours it too; the
  timed calls run under the deploy's settings. Not where inductor bakes the flag into
  the kernels it compiles (max-autotune's Triton convolutions read it at compile time),
  nor cuBLAS's (guarded: turning it off would recompile): both sides keep the deploy's.
* :func:`tf32_eager`: where TF32 stays allowed for the compiled model's kernels that
  way, eager's own error is also taken at TF32: eager with those operations' float32
  operands truncated to TF32's 10 mantissa bits, as the tensor cores read them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .calls import Inputs
from .outputs import Outputs

# (module, attribute) of the settings precise() turns off; each saved as it reads, the
# newer fp32_precision strings (torch >= 2.9) restored last, since setting a legacy flag
# rewrites them
_OFF = (
    ("cudnn", "allow_tf32"),
    ("matmul", "allow_tf32"),
    ("matmul", "allow_fp16_reduced_precision_reduction"),
    ("matmul", "allow_bf16_reduced_precision_reduction"),
)
_SPLIT_K = "_split_k"  # torch >= 2.10: a reduction flag is (allowed, split-K allowed)


def _backends() -> dict[str, Any]:
    return {"cudnn": torch.backends.cudnn, "matmul": torch.backends.cuda.matmul}


def _has(obj: Any, name: str) -> bool:
    try:
        getattr(obj, name)
    except (AttributeError, RuntimeError):
        return False
    return True


def _precision_strings() -> list[tuple[str, Any]]:
    """(label, object) of each ``fp32_precision`` setting this torch has (2.9 and newer)."""
    cudnn = torch.backends.cudnn
    found = [
        ("backends", torch.backends),
        ("matmul", torch.backends.cuda.matmul),
        ("cudnn", cudnn),
        ("cudnn.conv", getattr(cudnn, "conv", None)),
        ("cudnn.rnn", getattr(cudnn, "rnn", None)),
    ]
    return [(label, obj) for label, obj in found if obj is not None and _has(obj, "fp32_precision")]


def settings() -> dict[str, Any]:
    """The TF32 and reduced-precision settings, as :func:`precise` saves them."""
    out: dict[str, Any] = {}
    for where, name in _OFF:
        obj = _backends()[where]
        value = getattr(obj, name)
        if "reduction" in name and _has(obj, name + _SPLIT_K):
            value = (value, getattr(obj, name + _SPLIT_K))
        out[f"{where}.{name}"] = value
    for label, obj in _precision_strings():
        out[f"{label}.fp32_precision"] = obj.fp32_precision
    return out


def restore(saved: dict[str, Any]) -> None:
    """Put back what :func:`settings` saved."""
    for where, name in _OFF:
        setattr(_backends()[where], name, saved[f"{where}.{name}"])
    for label, obj in _precision_strings():
        obj.fp32_precision = saved[f"{label}.fp32_precision"]


@contextlib.contextmanager
def precise() -> Iterator[None]:
    """TF32 (cuDNN, cuBLAS) and reduced-precision reductions (fp16, bf16) off, then
    every setting put back exactly as it was."""
    saved = settings()
    try:
        for where, name in _OFF:
            setattr(_backends()[where], name, False)
        yield
    finally:
        restore(saved)


def tf32_capable(device: str) -> bool:
    """Whether ``device`` has TF32 tensor cores (CUDA, compute capability 8.0 or newer)."""
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(torch.device(device)) >= (8, 0)


def bakes_tf32(mode: str, options: dict[str, Any] | None) -> bool:
    """Whether inductor reads cuDNN's TF32 flag when it compiles (its Triton
    convolution templates, tried under max-autotune) rather than at each call."""
    if options:
        return bool(options.get("max_autotune") or options.get("max_autotune_gemm"))
    return mode.startswith("max-autotune")


@contextlib.contextmanager
def accuracy_settings(device: str, baked: bool) -> Iterator[None]:
    """The settings parity's calls run under: cuDNN's TF32 off on a TF32 GPU, as in
    PyTorch's accuracy runs, unless ``baked`` (:func:`bakes_tf32`); cuBLAS's and the
    reductions as the deploy set them."""
    if baked or not tf32_capable(device) or not torch.backends.cudnn.allow_tf32:
        yield
        return
    saved = settings()
    try:
        torch.backends.cudnn.allow_tf32 = False
        yield
    finally:
        restore(saved)


def tf32_in_force(device: str, baked: bool) -> tuple[bool, bool]:
    """(convolutions, matmuls): whether the compiled model's may run at TF32 under
    :func:`accuracy_settings` on ``device``."""
    if not tf32_capable(device):
        return False, False
    conv = baked and bool(torch.backends.cudnn.allow_tf32)
    return conv, bool(torch.backends.cuda.matmul.allow_tf32)


def to_tf32(t: torch.Tensor, nearest: bool = False) -> torch.Tensor:
    """A float32 tensor as a TF32 tensor core reads it: the first 10 of its 23 mantissa
    bits (the low 13 dropped, toward zero), or ``nearest``: rounded to the nearest such
    value, ties away from zero (what a kernel that converts first gets); Inf and NaN as
    they are."""
    bits = t.view(torch.int32) + (0x1000 if nearest else 0)
    return torch.where(torch.isfinite(t), (bits & -0x2000).view(torch.float32), t)


_CONV = {"convolution": (0, 1)}  # the operands a TF32 kernel reads so (not the bias)
_MATMUL = {
    "mm": (0, 1),
    "bmm": (0, 1),
    "addmm": (1, 2),
    "baddbmm": (1, 2),
    "addbmm": (1, 2),
    "_addmm_activation": (1, 2),
}


class _TF32(TorchDispatchMode):
    """Eager with the float32 operands of convolutions and/or matmuls read as TF32."""

    def __init__(self, conv: bool, matmul: bool, nearest: bool = False) -> None:
        super().__init__()
        self.ops = {**(_CONV if conv else {}), **(_MATMUL if matmul else {})}
        self.nearest = nearest

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        which = self.ops.get(func.overloadpacket.__name__)
        if which is not None:
            args = tuple(
                to_tf32(a, self.nearest)
                if i in which and isinstance(a, torch.Tensor) and a.dtype == torch.float32
                else a
                for i, a in enumerate(args)
            )
        return func(*args, **(kwargs or {}))


def tf32_eager(
    fn: Callable, inputs: Inputs, conv: bool, matmul: bool, nearest: bool = False
) -> Outputs | None:
    """Eager's outputs with TF32 where the compiled model's kernels may use it
    (``conv``, ``matmul``: :func:`tf32_in_force`; ``nearest``: see :func:`to_tf32`), or
    None where they may not (or it cannot run so)."""
    if not (conv or matmul):
        return None
    try:
        with torch.no_grad(), _TF32(conv, matmul, nearest):
            return Outputs.of(inputs.call(fn))
    except Exception:  # the rung is skipped, as without an fp64 reference
        return None
