"""The model in float64 without a float64 copy of it: each module's own floating-point
parameters and buffers are cast to float64 for the duration of that module's forward,
and put back as it returns (:func:`in_float64`). At most the float64 tensors of one
chain of nested modules exist at once (a layer's, not the model's), where
``copy.deepcopy(model).double()`` held twice an fp32 model's bytes (four times a bf16
one's) on the model's device. The arithmetic is the same: every op sees the float64
tensors the cast model would have held.

A parameter some code reads outside its own module's forward (a parent that calls
``F.linear(h, self.embed.weight)``) is still in its own dtype there: that forward fails
on mixed dtypes, and :mod:`gatekeeper.worker.parity` falls back to the whole-model
copy where the model is small enough that the copy cannot matter
(``COPY_LIMIT``)."""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves, tree_map

from . import filed

__all__ = [
    "BLOCK",
    "COPY_LIMIT",
    "Float64Kernels",
    "in_float64",
    "plain",
    "running_bytes",
    "weight_bytes",
]

#: a model whose forward cannot run module by module in float64 is copied whole up to
#: this many bytes of weights (beyond, its RMSE rung is skipped, never a big copy)
COPY_LIMIT = 256 << 20

#: an ``nn.Linear`` whose weight takes more than this in float64 (a causal LM's output
#: layer: 2048 x 32000 is 0.52 GB) computes block by block of its output features, each
#: block's rows cast to float64 for its product only: at most this much float64 weight;
#: an ``nn.Embedding`` as large casts only the rows it looks up. 8 MiB, as a parity
#: comparison's chunk. The float64 reference of a Qwen2-0.5B (a 151,936 x 896 output
#: layer) peaks this far above its 148 MiB of logits over 128 tokens: 34 MiB with blocks
#: of 4 MiB, 57 MiB of 8, 80 MiB of 16, 117 MiB of 64 (docs/scale.md)
BLOCK = 8 << 20

#: a large linear layer's float64 output this large on the CPU lies in a file
#: (:func:`_linear_by_blocks`)
FILED_FROM = 32 << 20


def weight_bytes(model: object) -> int:
    """Bytes of a module's parameters and buffers, each storage once (a tied weight
    counts once), a tensor subclass's by its own size; 0 for a plain function."""
    if not isinstance(model, nn.Module):
        return 0
    seen: set[tuple[int, int]] = set()
    total = 0
    for t in [*model.parameters(), *model.buffers()]:
        data = t.data if isinstance(t, nn.Parameter) else t
        data = getattr(data, "_local_tensor", data)  # a DTensor: this rank's shard
        try:
            storage = data.untyped_storage()
            # a storage by its address; one without (the meta device's: all at 0) by itself
            key = (storage.data_ptr() or storage._cdata, int(data.storage_offset()))
        except Exception:  # a subclass without a storage of its own here
            key = (id(t), 0)
        if key in seen:
            continue
        seen.add(key)
        total += tensor_bytes(data)
    return total


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes a tensor holds: a tensor subclass (torchao's quantized weights) by its
    inner tensors (``__tensor_flatten__``), a plain tensor by its elements."""
    flatten = getattr(type(t), "__tensor_flatten__", None)
    if type(t) not in (torch.Tensor, torch.nn.Parameter) and flatten is not None:
        names, _ = t.__tensor_flatten__()  # type: ignore[attr-defined]
        return sum(tensor_bytes(getattr(t, n)) for n in names)
    return t.numel() * t.element_size()


def plain(model: nn.Module) -> bool:
    """Whether every parameter and buffer is a plain tensor (not a DTensor or another
    subclass, whose dtype a module-by-module cast would go behind the back of)."""
    return all(
        type(t.data if isinstance(t, nn.Parameter) else t) is torch.Tensor
        for t in [*model.parameters(), *model.buffers()]
    )


def _runs(module: nn.Module) -> bool:
    """Whether a module has a forward of its own (a container such as ``ModuleList``
    or ``ParameterList`` is never called: its parent reads what it holds)."""
    return type(module).forward is not nn.Module.forward


def _holders(model: nn.Module) -> dict[nn.Module, list[tuple[nn.Module, str, bool]]]:
    """For each module that runs, the tensors to cast while it runs: its own floating
    parameters and buffers, and those of the containers below it that never run
    (``(holder, name, is_parameter)``)."""
    parent: dict[nn.Module, nn.Module] = {}
    for m in model.modules():
        for child in m.children():
            parent.setdefault(child, m)
    out: dict[nn.Module, list[tuple[nn.Module, str, bool]]] = {}
    for m in model.modules():
        owner = m
        while not _runs(owner) and owner in parent:
            owner = parent[owner]
        own = [(m, n, True) for n, p in m._parameters.items() if p is not None]
        own += [(m, n, False) for n, b in m._buffers.items() if b is not None]
        floating = [h for h in own if getattr(h[0], h[1]).is_floating_point()]
        if floating:
            out.setdefault(owner, []).extend(floating)
    return out


def _by_parts(module: nn.Module) -> Callable[..., torch.Tensor] | None:
    """The float64 forward of a module whose weight is larger than :data:`BLOCK` in
    float64 and need not be cast whole (None for any other): a plain ``nn.Linear``
    computes a block of output features at a time; an ``nn.Embedding`` or a subclass
    of it (Gemma 3's scaled embedding; no ``max_norm``, which rewrites its weight) runs
    its own forward with the rows it looks up cast (:func:`_embedding_rows`)."""
    if type(module) is nn.Linear and module.weight.numel() * 8 > BLOCK:
        return functools.partial(_linear_by_blocks, module)
    if isinstance(module, nn.Embedding) and module.max_norm is None:
        if module.weight.numel() * 8 > BLOCK:
            return functools.partial(_embedding_rows, module)
    return None


def running_bytes(module: nn.Module) -> int:
    """Bytes of float64 weights ``module`` holds while it runs in float64: its own
    floating parameters and buffers; at most :data:`BLOCK` and the bias for a large
    linear layer, none for a large embedding (its rows are activations)."""
    own = [t for t in [*module._parameters.values(), *module._buffers.values()] if t is not None]
    total = sum(t.numel() * 8 for t in own if t.is_floating_point())
    if _by_parts(module) is None:
        return total
    if isinstance(module, nn.Linear):
        return min(total, BLOCK + (0 if module.bias is None else module.bias.numel() * 8))
    return 0


def _linear_by_blocks(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` in float64, a block of output features at a time. An output of
    :data:`FILED_FROM` bytes or more on the CPU (a causal LM's logits: 148 MiB in
    float64 for 128 tokens of a 152k-word vocabulary) lies in a file of the scratch
    (:func:`gatekeeper.worker.filed.empty`), each token's row handed back as far as it
    is written: the reference's logits are not resident beside the first call's."""
    w, b = module.weight, module.bias
    x = x.to(torch.float64)
    rows = max(1, BLOCK // (w.shape[1] * 8))
    shape = (*x.shape[:-1], w.shape[0])
    big = x.device.type == "cpu" and math.prod(shape) * 8 >= FILED_FROM
    in_file = filed.empty(shape, torch.float64) if big else None
    out = (
        in_file if in_file is not None else torch.empty(shape, dtype=torch.float64, device=x.device)
    )
    lines = [] if in_file is None else list(in_file.view(-1, w.shape[0]))
    for i in range(0, w.shape[0], rows):
        part = None if b is None else b[i : i + rows].to(torch.float64)
        out[..., i : i + rows] = F.linear(x, w[i : i + rows].to(torch.float64), part)
        for line in lines:  # each token's row, as far as it is written
            filed.let_go(line, 0, min(i + rows, w.shape[0]) * 8)
    return out


class _Lookup(TorchFunctionMode):
    """Within it, ``weight`` acts as if it were float64 without a float64 copy of it:
    ``F.embedding`` on it looks the rows up in its own ``table`` and returns them cast,
    its dtype reads float64, and its shape and device read as they are; any other use
    (one that reads its values) gets the whole table in float64, cast once."""

    _AS_THEY_ARE = {"shape", "device", "ndim", "layout", "is_cuda", "is_cpu", "requires_grad"}

    def __init__(self, weight: torch.Tensor, table: torch.Tensor) -> None:
        super().__init__()
        self.weight, self.table = weight, table
        self.whole: torch.Tensor | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.embedding and len(args) > 1 and args[1] is self.weight:
            return func(args[0], self.table, *args[2:], **kwargs).to(torch.float64)
        if not any(a is self.weight for a in tree_leaves((args, kwargs))):
            return func(*args, **kwargs)
        prop = getattr(getattr(func, "__self__", None), "__name__", None)  # a property's
        if prop == "dtype":
            return torch.float64
        if prop in self._AS_THEY_ARE:
            return func(*args, **kwargs)
        if self.whole is None:
            self.whole = self.table.to(torch.float64)
        swapped = tree_map(lambda a: self.whole if a is self.weight else a, (args, kwargs))
        return func(*swapped[0], **swapped[1])


def _embedding_rows(module: nn.Embedding, *args: Any, **kwargs: Any) -> torch.Tensor:
    """An embedding's own forward in float64 (``nn.Embedding``'s lookup, or a subclass's,
    e.g. Gemma 3's rows times a scale it holds) without its table in float64 (a
    262,144-word vocabulary's, 1.34 GB at Gemma-3-270M's size: more than the model's fp32
    weights): its weight acts as a float64 one (:class:`_Lookup`: the lookup casts the
    rows it finds) and its other tensors (the scale) are cast for the call, as the
    float64 model's are. The same numbers as the float64 copy's."""
    weight = module.weight
    own = {n: t for n, t in [*module._parameters.items(), *module._buffers.items()]
           if t is not None and n != "weight" and t.is_floating_point()}  # fmt: skip
    try:
        for name, t in own.items():
            setattr(module, name, nn.Parameter(t.double(), t.requires_grad) if name in
                    module._parameters else t.double())  # fmt: skip
        with _Lookup(weight, weight.data):
            return type(module).forward(module, *args, **kwargs)
    finally:
        for name, t in own.items():
            setattr(module, name, t)


def _grouped_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    offs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``torch._grouped_mm`` in float64, a group at a time (its kernels take bfloat16,
    float16 and float32 only). The groups are ``offs``' ends along the 2D operand's
    sliced dimension: ``a``'s rows (2D x 3D: a mixture of experts' tokens, sorted by
    expert), ``b``'s columns (3D x 2D) or the shared inner dimension (2D x 2D); 3D x 3D
    is a batched product. Rows or columns past ``offs[-1]`` are ignored (zeros).
    ``out_dtype`` is the float64 model's own: the result stays float64."""
    a, b = a.to(torch.float64), b.to(torch.float64)
    if a.dim() == 3 and b.dim() == 3:
        out = torch.bmm(a, b)
    else:
        assert offs is not None, "grouped_mm of a 2D operand takes offs"
        ends = [int(e) for e in offs.tolist()]
        spans = list(zip([0, *ends[:-1]], ends, strict=True))
        if a.dim() == 2 and b.dim() == 3:
            out = a.new_zeros(a.shape[0], b.shape[-1])
            for g, (s, e) in enumerate(spans):
                out[s:e] = a[s:e] @ b[g]
        elif a.dim() == 3:
            out = a.new_zeros(a.shape[1], b.shape[-1])
            for g, (s, e) in enumerate(spans):
                out[:, s:e] = a[g] @ b[:, s:e]
        else:
            out = a.new_zeros(len(spans), a.shape[0], b.shape[-1])
            for g, (s, e) in enumerate(spans):
                out[g] = a[:, s:e] @ b[s:e]
    return out if bias is None else out + bias.to(torch.float64)


_GROUPED_MM = getattr(torch, "_grouped_mm", None)  # absent before torch 2.8


class Float64Kernels(TorchFunctionMode):
    """Within it, an op with no float64 kernel computes in float64 by other ops:
    ``torch._grouped_mm`` (``F.grouped_mm``), by which transformers runs a mixture of
    experts (Mixtral, Qwen-MoE), a group at a time (:func:`_grouped_mm`). Any other op,
    or one not given float64 operands, runs as it is."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _GROUPED_MM:
            operands = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            if any(t.dtype == torch.float64 for t in operands):
                return _grouped_mm(*args, **kwargs)
        return func(*args, **kwargs)


@contextlib.contextmanager
def in_float64(model: nn.Module) -> Iterator[None]:
    """Within it, each module of ``model`` computes in float64 (see the module
    docstring); on the way out every tensor is the one it was, whatever was raised."""
    holders = _holders(model)
    parts = {m: f for m in holders if (f := _by_parts(m)) is not None}
    for m in parts:  # its own weight and bias stay as they are: cast a part at a time
        holders[m] = [h for h in holders[m] if h[0] is not m]
    undo: list[list[tuple[nn.Module, str, bool, torch.Tensor]]] = []

    def cast(module: nn.Module, *_: object) -> None:
        done = []
        for holder, name, is_param in holders[module]:
            t = getattr(holder, name)
            if t.dtype == torch.float64:  # cast already (a tied weight, an outer module)
                continue
            if is_param:
                done.append((holder, name, True, t.data))
                t.data = t.data.double()
            else:
                done.append((holder, name, False, t))
                holder._buffers[name] = t.double()
        undo.append(done)

    def restore(*_: object) -> None:
        for holder, name, is_param, old in reversed(undo.pop() if undo else []):
            if is_param:
                getattr(holder, name).data = old
            else:
                holder._buffers[name] = old

    handles = []
    try:
        for module in holders:
            handles.append(module.register_forward_pre_hook(cast))
            handles.append(module.register_forward_hook(restore, always_call=True))
        for m, forward in parts.items():
            m.forward = forward
        yield
    finally:
        for m in parts:
            m.__dict__.pop("forward", None)
        for h in handles:
            h.remove()
        while undo:
            restore()
