"""A model's outputs as plain data: the one place the worker walks what a model returned.

:meth:`Outputs.of` flattens any output into ``structure`` (container path -> its type)
and ``leaves`` (leaf path -> a tensor or a plain value). Parity compares two of them leaf
by leaf, the reference file stores them (tensors, strings and numbers only, so it loads
with ``torch.load(weights_only=True)``), the FLOPs and memory figures count their
tensors, and the first call's outputs are copied through them.

What is understood, and how a path names a leaf:

* a tensor is a leaf; ``None``, ``bool``, ``int``, ``float``, ``str`` are plain leaves,
  compared by equality; ``torch.dtype``, ``torch.device``, an enum member, a class or a
  function are plain leaves by name (``"torch.float32"``);
* a mapping (``dict``, ``OrderedDict``, transformers' ``ModelOutput``) by its keys:
  ``output['logits']``, type ``CausalLMOutputWithPast{cache,logits}`` (keys as a set);
* a list or tuple (a named tuple too) by position: ``output[0]``, type ``tuple[2]``;
* a dataclass by its fields: ``output.hidden``;
* any other object (transformers' cache classes: ``DynamicCache``, ``StaticCache``,
  ``EncoderDecoderCache``, their layers, SSM and hybrid states) by its attributes, as
  ``vars()`` lists them: ``output['cache'].layers[1].keys``, type
  ``DynamicCache(layer_class_to_replicate,layers,offloading)``;
* a type registered with torch's pytree (and none of the above) by its children.

Anything else (an ``nn.Module``, an object without attributes, a cycle) raises
:class:`UnreadableOutput` naming the type and the path: the target is an error, never a
false parity failure.
"""

from __future__ import annotations

import dataclasses
import enum
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

MAX_DEPTH = 32  # deeper than any model output; a self-referencing object stops here
PLAIN = (type(None), bool, int, float, str)


class UnreadableOutput(Exception):
    """An output gatekeeper cannot compare (its type and path are in the message)."""


@dataclass
class Outputs:
    """A model's outputs as ``structure`` (container path -> its type, e.g. ``tuple[2]``,
    ``dict{hidden,logits}``) and ``leaves`` (leaf path -> tensor or plain value).
    ``structure`` is None for a reference saved before structures were recorded: then
    leaves are compared in order."""

    structure: dict[str, str] | None
    leaves: dict[str, Any]

    @classmethod
    def of(cls, out: Any) -> Outputs:
        structure: dict[str, str] = {}
        leaves: dict[str, Any] = {}
        _walk(out, "output", structure, leaves, ())
        return cls(structure, leaves)

    def tensors(self) -> list[torch.Tensor]:
        return [v for v in self.leaves.values() if isinstance(v, torch.Tensor)]

    def cloned(self) -> Outputs:
        """A copy whose tensors are detached clones (a CUDA graph's next replay
        overwrites the buffers it returned)."""
        return Outputs(self.structure, {k: _clone(v) for k, v in self.leaves.items()})

    def kept(self) -> Outputs:
        """:meth:`cloned`, each large CPU tensor copied into a file of the scratch
        (:func:`gatekeeper.worker.filed.copy`) rather than the heap: parity reads it a
        chunk at a time and the reference file is written from it, so the first call's
        outputs are not resident beside eager's, the float64 reference's or the next
        call's (a 152k-word vocabulary's logits over 128 tokens: 78 MB each)."""
        from .filed import copy

        def kept(v: Any) -> Any:
            if not isinstance(v, torch.Tensor):
                return v
            t = plain_tensor(v).detach()
            filed = copy(t)
            return filed if filed is not None else t.clone()

        return Outputs(self.structure, {k: kept(v) for k, v in self.leaves.items()})

    def to_cpu(self) -> Outputs:
        return Outputs(
            self.structure,
            {
                k: plain_tensor(v).detach().cpu() if isinstance(v, torch.Tensor) else v
                for k, v in self.leaves.items()
            },
        )

    def summary(self) -> dict[str, Any]:
        """What the report shows of them: the top-level type, leaf and tensor counts,
        and each container that is not a plain dict, list or tuple (a cache, a
        ModelOutput) with its path."""
        tensors = self.tensors()
        types = self.structure or {}
        special = {
            path: name
            for path, name in types.items()
            if not name.startswith(("dict{", "list[", "tuple["))
        }
        return {
            "structure": types.get("output", "tensor" if "output" in self.leaves else "?"),
            "leaves": len(self.leaves),
            "tensors": len(tensors),
            "elements": sum(t.numel() for t in tensors),
            "containers": dict(list(special.items())[:12]),
        }


def plain_tensor(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor of a distributed model's output: a DTensor's whole value (a
    collective: every rank calls it alike), an async collective's result waited for."""
    if type(t) is torch.Tensor:
        return t
    full = getattr(t, "full_tensor", None)
    if callable(full):
        t = full()
    wait = getattr(t, "wait", None)
    if callable(wait) and type(t) is not torch.Tensor:
        t = wait()
    return t


def _clone(v: Any) -> Any:
    return plain_tensor(v).detach().clone() if isinstance(v, torch.Tensor) else v


def _plain(obj: Any) -> Any:
    """A plain leaf's stored value (a string for names), or the object itself."""
    if isinstance(obj, PLAIN):
        return obj
    if isinstance(obj, (torch.dtype, torch.device)):
        return str(obj)
    if isinstance(obj, enum.Enum):
        return f"{type(obj).__name__}.{obj.name}"
    if isinstance(obj, type):
        return f"class {obj.__module__}.{obj.__qualname__}"
    if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
        return f"function {getattr(obj, '__module__', None)}.{obj.__qualname__}"
    return obj


def _is_plain(obj: Any) -> bool:
    return isinstance(obj, PLAIN) or _plain(obj) is not obj


def _container(obj: Any, names: list[str], brackets: str) -> str:
    return f"{type(obj).__name__}{brackets[0]}{','.join(sorted(names))}{brackets[1]}"


def _walk(
    obj: Any,
    path: str,
    structure: dict[str, str],
    leaves: dict[str, Any],
    parents: tuple[int, ...],
) -> None:
    if isinstance(obj, torch.Tensor):
        leaves[path] = obj
        return
    if _is_plain(obj):
        leaves[path] = _plain(obj)
        return
    try:  # numpy scalars and arrays, if a model returns them
        import numpy as np

        if isinstance(obj, np.generic):
            leaves[path] = obj.item()
            return
        if isinstance(obj, np.ndarray):
            leaves[path] = torch.from_numpy(obj)
            return
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    if id(obj) in parents or len(parents) >= MAX_DEPTH:
        raise UnreadableOutput(
            f"{path}: cannot compare an output of type {_type_name(obj)}: it refers back "
            f"to itself (or nests deeper than {MAX_DEPTH} levels)"
        )
    within = (*parents, id(obj))
    if isinstance(obj, Mapping):
        structure[path] = _container(obj, [str(k) for k in obj], "{}")
        for k, v in obj.items():
            _walk(v, f"{path}[{k!r}]", structure, leaves, within)
        return
    if isinstance(obj, (list, tuple)):
        structure[path] = f"{type(obj).__name__}[{len(obj)}]"
        for i, v in enumerate(obj):
            _walk(v, f"{path}[{i}]", structure, leaves, within)
        return
    if isinstance(obj, torch.nn.Module):
        raise UnreadableOutput(
            f"{path}: cannot compare an output of type {_type_name(obj)} (a module, not data)"
        )
    if dataclasses.is_dataclass(obj):
        names = [f.name for f in dataclasses.fields(obj)]
        structure[path] = _container(obj, names, "()")
        for name in names:
            _walk(getattr(obj, name), f"{path}.{name}", structure, leaves, within)
        return
    attrs = _attributes(obj)
    if attrs is not None:
        structure[path] = _container(obj, list(attrs), "()")
        for name, v in attrs.items():
            _walk(v, f"{path}.{name}", structure, leaves, within)
        return
    children = _pytree_children(obj)
    if children is not None:
        structure[path] = _container(obj, [str(i) for i in range(len(children))], "<>")
        for i, v in enumerate(children):
            _walk(v, f"{path}<{i}>", structure, leaves, within)
        return
    raise UnreadableOutput(
        f"{path}: cannot compare an output of type {_type_name(obj)} "
        "(not a tensor, number, string, mapping, sequence, dataclass or object with "
        "attributes)"
    )


def _type_name(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _attributes(obj: Any) -> dict[str, Any] | None:
    """An object's attributes as ``vars()`` lists them (a transformers cache: its layers;
    a layer: its key and value tensors, or an SSM layer's states), sorted by name; None
    for an object that has none (no ``__dict__``)."""
    try:
        attrs = vars(obj)
    except TypeError:
        return None
    if not isinstance(attrs, dict) or not attrs:
        return None
    return {k: attrs[k] for k in sorted(attrs)}


def _pytree_children(obj: Any) -> list[Any] | None:
    """The children of a type registered with torch's pytree (one level)."""
    from torch.utils import _pytree as pytree

    node = pytree.SUPPORTED_NODES.get(type(obj))
    if node is None:
        return None
    try:
        children, _ = node.flatten_fn(obj)
    except Exception:  # a registration that cannot flatten this object
        return None
    return list(children)
