"""Build a target's model and its seeded inputs (runs inside the worker subprocess), and
record what they are built from (:mod:`gatekeeper.worker.deps`)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from ..boundary import breadcrumbs
from ..config import ModelConfig
from ..errors import ConfigError
from ..inputs import InputSpec
from .calls import Inputs
from .deps import recording

# the user's modules (hashed by content) that recorded builds in this process imported:
# paired mode's base version must import its own copies of every one of them
_user_modules: set[str] = set()
# keyword arguments this worker's target kind adds to every call of the model (eager,
# compiled, exported) where the forward takes them and its inputs do not give them
# (:attr:`gatekeeper.worker.kinds.Builder.call_kwargs`), and those it did add
CALL_KWARGS: dict[str, Any] = {}
ADDED_KWARGS: dict[str, Any] = {}


# this worker's torch's CPU facts, taken before the first model code is imported (the
# parent checks what it remembered against them: gatekeeper.runtime.confirm_facts)
FACTS: dict[str, Any] = {}


def load_callable(ref: str, base_dir: Path) -> Callable[..., Any]:
    if not FACTS and "torch" in sys.modules:
        from ..runtime import measured_cpu_facts

        FACTS.update(measured_cpu_facts())
    module_name, _, attr = ref.partition(":")
    if str(base_dir) not in sys.path:
        sys.path.insert(0, str(base_dir))
    if os.getcwd() not in sys.path:  # then the current directory, last
        sys.path.append(os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as e:  # the user's module may raise anything on import
        raise ConfigError(
            f"factory {ref!r}: importing {module_name!r} failed: {type(e).__name__}: {e}"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"factory {ref!r}: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"factory {ref!r} is not callable")
    return obj


def _file_under(module: Any, root: str) -> bool:
    path = getattr(module, "__file__", None)
    if not path:
        return False
    path = os.path.abspath(path)
    return path.startswith(root.rstrip(os.sep) + os.sep)


@contextmanager
def other_version(base_dir: Path, module_names: list[str]) -> Iterator[None]:
    """Import the user's modules from another checkout (paired mode's base version).

    Taken out of ``sys.modules`` while the base model is built: the factories' top-level
    packages and every module of the user's that a recorded build imported (a sibling
    module outside the factory's package, a dotted path's parents), wherever they were
    loaded from; that checkout goes first on ``sys.path``. Afterwards whatever was
    imported from that checkout goes and everything is put back: the base model's
    classes keep their own module globals, the head's are untouched. (An import done
    lazily inside ``forward`` would see the head's modules.)
    """
    tops = {name.split(".")[0] for name in module_names}

    def mine(name: str) -> bool:
        return name.split(".")[0] in tops or name in _user_modules

    saved = {k: v for k, v in sys.modules.items() if mine(k)}
    for k in saved:
        del sys.modules[k]
    before = set(sys.modules)
    root = os.path.abspath(str(base_dir))
    sys.path.insert(0, str(base_dir))
    try:
        yield
    finally:
        sys.path.remove(str(base_dir))
        for k in [
            k
            for k in sys.modules
            if mine(k) or (k not in before and _file_under(sys.modules[k], root))
        ]:
            del sys.modules[k]
        sys.modules.update(saved)


def _call(ref: str, fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ConfigError(f"factory {ref!r} raised {type(e).__name__}: {first}") from None


def build_model(cfg: ModelConfig, base_dir: Path, device: str) -> Any:
    """The module ``factory`` returns (on ``device``, in eval mode), or the function
    ``function`` names."""
    torch.manual_seed(cfg.seed)
    if cfg.function is not None:
        return load_callable(cfg.function, base_dir)
    model = _call(cfg.builder, load_callable(cfg.builder, base_dir))
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(
            f"factory {cfg.builder!r} returned {type(model).__name__}, not a torch.nn.Module"
        )
    if cfg.call is not None and not callable(getattr(model, cfg.call, None)):
        raise ConfigError(
            f"call: {type(model).__name__} (from factory {cfg.builder!r}) has no method "
            f"{cfg.call!r}"
        )
    return model.to(device).eval()


class _OnMeta(torch.overrides.TorchFunctionMode):
    """Every tensor a factory function makes (``torch.empty``, ``randn``...) on the meta
    device, even where the code names another: entered first, it sees each call after
    any ``torch.device(...)`` block of the factory's own has set its device."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        from torch.utils._device import _device_constructors

        kwargs = dict(kwargs or {})
        if func in _device_constructors():
            kwargs["device"] = "meta"
        return func(*args, **kwargs)


def on_meta(cfg: ModelConfig, base_dir: Path) -> torch.nn.Module | None:
    """The factory's model with its tensors on the meta device (no memory for its
    weights): what the plan (:mod:`gatekeeper.worker.plan`) estimates from before the
    real build, so a model too big is refused before its weights exist. None where it
    cannot be had (the model is then planned once built): a function target, a factory
    that fails there (it copies a tensor off the meta device, reads a value...) or
    returns no module."""
    if cfg.function is not None:
        return None
    torch.manual_seed(cfg.seed)
    try:
        factory = load_callable(cfg.builder, base_dir)
        with _OnMeta():
            model = factory()
    except Exception:  # the real build says what is wrong, in its own words
        return None
    return model if isinstance(model, torch.nn.Module) else None


def _tensor(
    spec: InputSpec, shape_set: dict[str, int], gen: torch.Generator, device: str
) -> torch.Tensor:
    shape = [shape_set[d] if isinstance(d, str) else d for d in spec.shape]
    dtype = getattr(torch, spec.dtype)
    if dtype == torch.bool:
        return (torch.rand(shape, generator=gen) < 0.5).to(device)
    if dtype.is_floating_point:
        t = torch.randn(shape, generator=gen, dtype=torch.float32)
        if spec.low is not None or spec.high is not None:
            lo = spec.low if spec.low is not None else -1.0
            hi = spec.high if spec.high is not None else 1.0
            t = torch.rand(shape, generator=gen) * (hi - lo) + lo
        return t.to(dtype).to(device)
    lo = int(spec.low) if spec.low is not None else 0
    hi = int(spec.high) if spec.high is not None else 100
    return torch.randint(lo, hi, shape, generator=gen, dtype=dtype).to(device)


def make_inputs(
    cfg: ModelConfig,
    shape_set: dict[str, int],
    base_dir: Path,
    device: str,
    seed: int | None = None,
) -> Inputs:
    """Seeded inputs: the same seed and shape set give the same tensors everywhere.
    Positional (``inputs`` as a list), keyword (``inputs`` as a table), or whatever the
    inputs factory returns (see :meth:`Inputs.of`); plain values pass as they are."""
    seed = cfg.seed if seed is None else seed
    if cfg.inputs_factory:
        torch.manual_seed(seed)
        made = _call(
            cfg.inputs_factory, load_callable(cfg.inputs_factory, base_dir), dict(shape_set)
        )
        return Inputs.of(made, f"inputs_factory {cfg.inputs_factory!r}").to(device)
    gen = torch.Generator().manual_seed(seed)

    def one(item: Any) -> Any:
        return _tensor(item, shape_set, gen, device) if isinstance(item, InputSpec) else item

    if isinstance(cfg.inputs, dict):  # keyword inputs, drawn in the order written
        return Inputs((), {name: one(item) for name, item in cfg.inputs.items()})
    return Inputs(tuple(one(item) for item in cfg.inputs or []))


def build_recorded(
    cfg: ModelConfig,
    shape_set: dict[str, int],
    base_dir: Path,
    device: str,
    quantize: str = "none",
    judged: bool = False,
    plan: Callable[[torch.nn.Module], None] | None = None,
) -> tuple[Any, Inputs, dict]:
    """The model (or function), its inputs, and what they were built from (the key's
    dependencies); ``quantize``: the float model quantized by that torchao config
    (``judged``: its SQNR and weights measured, :func:`gatekeeper.worker.quant.figures`).
    ``plan``: called first with the factory's model on the meta device, where it builds
    there (:func:`on_meta`): it raises to stop before the real build."""
    refs = [cfg.builder] + ([cfg.inputs_factory] if cfg.inputs_factory else [])
    breadcrumbs.enter("build model")
    with recording(base_dir) as rec:
        if plan is not None and (planned := on_meta(cfg, base_dir)) is not None:
            plan(planned)
            del planned
            breadcrumbs.enter("build model")
        model = build_model(cfg, base_dir, device)
        inputs = make_inputs(cfg, shape_set, base_dir, device)
    rec.note(model, *inputs.values(), refs=refs)
    inputs = _with_call_kwargs(model, cfg.call, inputs)
    deps = rec.finish()
    _user_modules.update(deps["modules"])
    if quantize != "none":
        from . import quant

        breadcrumbs.enter("quantize")
        model = quant.apply(model, inputs, cfg, quantize, judged)
    return model, inputs, deps


def _with_call_kwargs(model: Any, call: str | None, inputs: Inputs) -> Inputs:
    if not CALL_KWARGS or not isinstance(model, torch.nn.Module):
        return inputs
    import inspect

    from .calls import entry

    fn = entry(model, call)
    try:
        takes = inspect.signature(fn.forward if fn is model else fn).parameters
    except (TypeError, ValueError):  # no signature to read
        return inputs
    added = {k: v for k, v in CALL_KWARGS.items() if k in takes and k not in inputs.kwargs}
    ADDED_KWARGS.update(added)
    return Inputs(inputs.args, {**inputs.kwargs, **added}) if added else inputs


def build_base(
    cfg: ModelConfig,
    shape_set: dict[str, int],
    base_dir: Path,
    device: str,
    quantize: str = "none",
    judged: bool = False,
) -> tuple[Any, Inputs, dict]:
    """Paired mode: the base version's model and inputs, built by the base commit's own
    config (``cfg``) from its own checkout, and what they were built from."""
    refs = [cfg.builder] + ([cfg.inputs_factory] if cfg.inputs_factory else [])
    with other_version(base_dir, [r.split(":")[0] for r in refs]):
        return build_recorded(cfg, shape_set, base_dir, device, quantize, judged)


def same_inputs(a: Inputs, b: Inputs) -> bool:
    """Whether two calls' inputs are the same values (tensors equal in dtype, shape and
    every element): only then can the base's outputs be compared with the head's."""

    def same(x: Any, y: Any) -> bool:
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            return (
                isinstance(x, torch.Tensor)
                and isinstance(y, torch.Tensor)
                and (x.dtype, x.shape, x.device) == (y.dtype, y.shape, y.device)
                and bool(torch.equal(x, y))
            )
        if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
            return type(x) is type(y) and len(x) == len(y) and all(map(same, x, y))
        if isinstance(x, dict) and isinstance(y, dict):
            return x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)
        try:
            return bool(x == y)
        except Exception:  # an object whose == does not give a bool
            return x is y

    return same(a.args, b.args) and same(a.kwargs, b.kwargs)
