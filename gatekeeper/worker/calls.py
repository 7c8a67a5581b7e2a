"""What the worker calls and with what: a target's inputs as positional and keyword
arguments (:class:`Inputs`), and the callable that is compiled and measured
(:func:`entry`: the module itself, one of its methods, or a plain function).

Every place the worker calls a model (compile, probe, measure, the paired base, graph
breaks, FLOPs, memory, timing, profile, the fp64 reference, the shape sweep, the
training step, precompile record and verify) goes through :meth:`Inputs.call`, so
keyword inputs and non-tensor values reach the model the same way everywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


def _map(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``fn`` applied to the tensors of a value (nested in lists, tuples and dicts)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_map(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map(v, fn) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class Inputs:
    """A call's positional ``args`` and keyword ``kwargs``."""

    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, value: Any, where: str = "inputs_factory") -> Inputs:
        """An inputs factory's return value: a tuple (or list) of positional arguments,
        a dict of keyword arguments, a pair ``(args, kwargs)`` (a tuple or list, then a
        dict), or a single value (one positional argument)."""
        if isinstance(value, Inputs):
            return value
        if isinstance(value, dict):
            return cls((), _named(value, where))
        if (
            isinstance(value, tuple)
            and not hasattr(value, "_fields")
            and len(value) == 2
            and isinstance(value[0], (tuple, list))
            and isinstance(value[1], dict)
        ):
            return cls(tuple(value[0]), _named(value[1], where))
        if isinstance(value, (tuple, list)) and not hasattr(value, "_fields"):
            return cls(tuple(value))
        return cls((value,))

    def call(self, fn: Callable[..., Any]) -> Any:
        return fn(*self.args, **self.kwargs)

    def map(self, fn: Callable[[torch.Tensor], Any]) -> Inputs:
        """The same inputs with ``fn`` applied to every tensor."""
        return Inputs(_map(self.args, fn), _map(self.kwargs, fn))

    def to(self, device: str) -> Inputs:
        return self.map(lambda t: t.to(device))

    def double(self) -> Inputs:
        """Floating-point tensors in float64 (the fp64 reference's inputs)."""
        return self.map(lambda t: t.double() if t.is_floating_point() else t)

    def values(self) -> list[Any]:
        return [*self.args, *self.kwargs.values()]

    def for_loss(self) -> Any:
        return loss_inputs(self.args, self.kwargs)


def loss_inputs(args: tuple, kwargs: dict) -> Any:
    """What a ``train.loss`` function receives as ``inputs``: the tuple of positional
    inputs; the dict of keyword inputs when there are only those; the pair ``(args,
    kwargs)`` when there are both."""
    if not kwargs:
        return args
    if not args:
        return kwargs
    return (args, kwargs)


def _named(kwargs: dict, where: str) -> dict[str, Any]:
    from ..errors import ConfigError

    bad = [k for k in kwargs if not isinstance(k, str) or not k.isidentifier()]
    if bad:
        raise ConfigError(f"{where}: keyword input {bad[0]!r} is not an identifier")
    return dict(kwargs)


def entry(model: Any, call: str | None) -> Callable[..., Any]:
    """What is compiled and measured: the module itself (its ``forward``), its method
    ``call``, or, for a ``function`` target, the function ``model`` is."""
    if call is None or call == "forward":
        return model
    return getattr(model, call)
