"""How a target's model is compiled: its strategy (runs in the worker).

* ``whole``: ``torch.compile(model)`` (:func:`gatekeeper.worker.compile.compile_model`).
* ``regional``: PyTorch's regional compilation recipe: each repeated block is compiled
  in place (``nn.Module.compile``), the rest of the model runs eager. The blocks share
  their class's ``forward``, so Dynamo traces one and reuses it for the others (one FX
  graph for N layers), and a change to the code around them leaves their graphs' cache
  keys alone. The blocks: the submodules the model's ``regions`` globs name
  (``"layers.*"``, matched one dotted name part per glob part), or by default the
  children of every ``nn.ModuleList`` that share a class with a sibling.
* ``aot``: ``torch.export.export`` (non-strict unless ``export.strict``; a dynamic
  model's named dimensions become ``dynamic_shapes``), then
  ``torch._inductor.aoti_compile_and_package`` with the mode's inductor options (and the
  model's ``options``), loaded back the way :func:`gatekeeper.load_aot` loads it. A
  model that does not export raises :class:`NotExportable`, carrying torch's reason and
  the user's ``file:line``.
"""

from __future__ import annotations

import copy
import os
import re
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..config import ExportConfig, ModelConfig
from ..errors import ConfigError
from . import steps
from .calls import Inputs, entry
from .deps import is_stdlib

_TORCH_DIR = os.path.dirname(torch.__file__)
_GATEKEEPER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FILE_LINE = re.compile(r'File "([^"]+)", line (\d+)')


class NotExportable(Exception):
    """torch.export refused the model: ``info`` is the result's ``export`` document."""

    def __init__(self, info: dict) -> None:
        super().__init__(info.get("reason") or "not exportable")
        self.info = info

    def says(self) -> str:
        where = f"{self.info['file']}:{self.info['line']}" if self.info.get("file") else "?"
        return f"not exportable: {self.info.get('reason')} at {where}"


# -- regional ---------------------------------------------------------------------------
def _matches(pattern: str, name: str) -> bool:
    import fnmatch

    parts, names = pattern.split("."), name.split(".")
    return len(parts) == len(names) and all(
        fnmatch.fnmatchcase(n, p) for p, n in zip(parts, names, strict=True)
    )


def find_regions(model: torch.nn.Module, cfg: ModelConfig) -> list[tuple[str, torch.nn.Module]]:
    """The blocks a regional target compiles, outermost first, by qualified name."""
    modules = [(n, m) for n, m in model.named_modules() if n]
    if cfg.regions:
        found = [(n, m) for n, m in modules if any(_matches(p, n) for p in cfg.regions)]
        if not found:
            children = ", ".join(n for n, _ in model.named_children()) or "none"
            raise ConfigError(
                f"regions: no submodule of model {cfg.name!r} matches "
                f"{', '.join(cfg.regions)} (its children: {children})"
            )
    else:
        found = []
        for name, mod in [("", model), *modules]:
            if isinstance(mod, torch.nn.ModuleList):
                classes = Counter(type(c) for c in mod)
                prefix = f"{name}." if name else ""
                found += [(f"{prefix}{i}", c) for i, c in enumerate(mod) if classes[type(c)] > 1]
        if not found:
            raise ConfigError(
                f'strategies: "regional" needs repeated blocks, and model {cfg.name!r} has '
                "no nn.ModuleList whose children share a class: name its blocks with "
                'regions = ["<submodule>", ...]'
            )
    names = [n for n, _ in found]
    return [(n, m) for n, m in found if not any(n.startswith(o + ".") for o in names if o != n)]


def compile_regions(
    model: torch.nn.Module, cfg: ModelConfig, kwargs: dict[str, Any]
) -> list[tuple[str, torch.nn.Module]]:
    """Compile every block of ``model`` in place (``module.compile(**kwargs)``)."""
    blocks = find_regions(model, cfg)
    for _, block in blocks:
        block.compile(**kwargs)
    return blocks


def block_inputs(
    model: torch.nn.Module, cfg: ModelConfig, inputs: Inputs, context: Callable[[], Any]
) -> list[tuple[torch.nn.Module, tuple, dict]]:
    """The first block of each class and the arguments one eager call passes it (what
    ``torch._dynamo.explain`` of a regional target looks at)."""
    firsts: dict[type, torch.nn.Module] = {}
    for _, block in find_regions(model, cfg):
        firsts.setdefault(type(block), block)
    seen: dict[int, tuple[tuple, dict]] = {}

    def grab(mod: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        seen.setdefault(id(mod), (args, kwargs))

    hooks = [b.register_forward_pre_hook(grab, with_kwargs=True) for b in firsts.values()]
    try:
        with torch.no_grad(), context():
            inputs.call(entry(model, cfg.call))
    finally:
        for h in hooks:
            h.remove()
    return [(b, *seen[id(b)]) for b in firsts.values() if id(b) in seen]


def regional_graphs(
    model: torch.nn.Module,
    cfg: ModelConfig,
    inputs: Inputs,
    base_dir: Path,
    context: Callable[[], Any],
) -> dict:
    """Graphs and breaks of a regional target: its blocks', one of each class."""
    from .graphs import graph_breaks

    total: dict = {"count": 0, "breaks": 0, "break_reasons": []}
    for block, args, kwargs in block_inputs(model, cfg, inputs, context):
        g = graph_breaks(block, Inputs(args, kwargs), base_dir, context=context)
        total["count"] += g["count"]
        total["breaks"] += g["breaks"]
        total["break_reasons"] += g["break_reasons"]
    return total


# -- aot --------------------------------------------------------------------------------
def _user_file(path: str) -> bool:
    full = os.path.abspath(path)
    return not (
        full.startswith(_TORCH_DIR + os.sep)
        or full.startswith(_GATEKEEPER_DIR + os.sep)
        or is_stdlib(full)
        or path.startswith("<")
    )


def _where(e: BaseException, base_dir: Path) -> tuple[str | None, int | None]:
    """The user's line that export failed at: the innermost frame of the user's code in
    the traceback (non-strict export runs it), else the last the message names (strict
    export traces it, and says where)."""
    frames = [
        (f.filename, f.lineno)
        for f in traceback.extract_tb(e.__traceback__)
        if f.lineno and _user_file(f.filename)
    ]
    if not frames:
        frames = [(f, int(n)) for f, n in _FILE_LINE.findall(str(e)) if _user_file(f)]
    if not frames:
        return None, None
    file, line = frames[-1]
    try:
        file = Path(file).resolve().relative_to(base_dir.resolve()).as_posix()
    except ValueError:
        pass
    return file, line


def _reason(e: BaseException) -> str:
    from .graphs import _reason as headline

    text = str(e).strip()
    return headline(text) if text else type(e).__name__


def example_shapes(cfg: ModelConfig, shapes: dict[str, int], dynamic: bool) -> dict[str, int]:
    """The shape set a dynamic model is exported with: its largest (a size-1 example
    would be specialised to 1), else the target's own."""
    if not dynamic:
        return shapes
    return max(cfg.shapes, key=lambda s: (sum(s.values()), sorted(s.items())))


class _Entry(torch.nn.Module):
    """A method of a module, or a plain function, as a module whose ``forward`` it is:
    what ``torch.export`` takes."""

    def __init__(self, model: Any, call: str | None) -> None:
        super().__init__()
        if isinstance(model, torch.nn.Module):
            self.model = model
        self._fn = entry(model, call)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(*args, **kwargs)


def exported_module(model: Any, cfg: ModelConfig) -> torch.nn.Module:
    """What is exported: the module itself, or its ``call`` method or the ``function``
    wrapped as a module's ``forward``."""
    if isinstance(model, torch.nn.Module) and cfg.call in (None, "forward"):
        return model
    return _Entry(model, cfg.call)


def _dims(spec: Any, dims: dict[str, Any]) -> Any:
    from torch.export import Dim

    shape = getattr(spec, "shape", None)
    if shape is None:  # a plain value
        return None
    return {
        axis: dims.setdefault(d, Dim(d)) for axis, d in enumerate(shape) if isinstance(d, str)
    } or None


def dynamic_shapes(cfg: ModelConfig, module: torch.nn.Module, inputs: Inputs) -> Any:
    """``torch.export``'s ``dynamic_shapes`` of a dynamic model: each named dimension of
    the inputs one ``Dim`` (shared by every input that names it); an inputs factory's
    tensors get ``Dim.AUTO`` on every axis. Keyword inputs: by the forward's parameter
    names."""
    import inspect

    from torch.export import Dim

    def auto(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return {axis: Dim.AUTO for axis in range(value.dim())}
        if isinstance(value, (list, tuple)):
            return type(value)(auto(v) for v in value)
        if isinstance(value, dict):
            return {k: auto(v) for k, v in value.items()}
        return None

    if cfg.inputs is None:
        args, kwargs = auto(inputs.args), auto(inputs.kwargs)
    else:
        dims: dict[str, Any] = {}
        if isinstance(cfg.inputs, dict):
            args, kwargs = (), {k: _dims(v, dims) for k, v in cfg.inputs.items()}
        else:
            args, kwargs = tuple(_dims(v, dims) for v in cfg.inputs), {}
    if not kwargs:
        return tuple(args)
    bound = inspect.signature(module.forward).bind(*args, **kwargs)
    return dict(bound.arguments)


def export(
    model: Any, inputs: Inputs, cfg: ModelConfig, dynamic: bool, base_dir: Path
) -> tuple[Any, dict]:
    """``torch.export.export`` of the target (NotExportable when torch refuses it)."""
    strict = (cfg.export or ExportConfig()).strict
    steps.enter("export")
    start = time.perf_counter()
    module = exported_module(model, cfg)
    try:
        program = torch.export.export(
            module,
            inputs.args,
            inputs.kwargs or None,
            dynamic_shapes=dynamic_shapes(cfg, module, inputs) if dynamic else None,
            strict=strict,
        )
    except Exception as e:  # whatever torch raises, the model did not export
        file, line = _where(e, base_dir)
        raise NotExportable(
            {
                "exportable": False,
                "reason": _reason(e),
                "file": file,
                "line": line,
                "strict": strict,
            }
        ) from None
    return program, {
        "exportable": True,
        "strict": strict,
        "seconds": time.perf_counter() - start,
    }


def inductor_options(cfg: ModelConfig, mode: str) -> dict[str, Any]:
    """The inductor options of ``mode`` (or the model's ``options``) for an AOTInductor
    compile: max-autotune autotunes; CUDA graphs (a JIT runtime's) do not apply."""
    if cfg.options:
        return dict(cfg.options)
    from torch._inductor import list_mode_options

    opts = dict(list_mode_options(mode))
    opts.pop("triton.cudagraphs", None)
    return opts


def aot_package(program: Any, cfg: ModelConfig, mode: str, out: Path) -> float:
    """Build the AOTInductor package of ``program`` at ``out``; seconds it took."""
    from torch._inductor import aoti_compile_and_package

    steps.enter("aoti_compile_and_package")
    start = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    aoti_compile_and_package(
        program, package_path=str(out), inductor_configs=inductor_options(cfg, mode)
    )
    return time.perf_counter() - start


def load(path: str | Path) -> tuple[Callable[..., Any], float]:
    """The package loaded as a deploy loads it (:func:`gatekeeper.runtime.load_package`)."""
    from ..runtime import load_package

    steps.enter("load package")
    start = time.perf_counter()
    model = load_package(path)
    return model, time.perf_counter() - start


# -- the compiled callable of a target ----------------------------------------------------
def compiled(
    model: Any,
    inputs: Inputs,
    cfg: ModelConfig,
    *,
    mode: str,
    dynamic: bool,
    strategy: str,
    base_dir: Path,
    shapes: dict[str, int],
    device: str,
    keep_eager: bool = False,
    aot_in: str | None = None,
    aot_out: str | None = None,
) -> tuple[Callable[..., Any], dict]:
    """The target's compiled model and what its strategy did: ``{"regions": [...]}``,
    or for aot ``{"export": {...}, "aot": {"from": "bundle"|"compiled", ...}}``.
    ``keep_eager``: ``model`` must stay eager (a regional target compiles a copy)."""
    from .compile import compile_kwargs, compile_model

    if strategy == "whole":
        return compile_model(entry(model, cfg.call), cfg, mode, dynamic), {}
    if strategy == "regional":
        target = copy.deepcopy(model) if keep_eager else model
        blocks = compile_regions(target, cfg, compile_kwargs(cfg, mode, dynamic))
        return entry(target, cfg.call), {"regions": [n for n, _ in blocks]}
    info: dict = {"export": None, "aot": {}}
    if aot_in is None:
        example = inputs
        if dynamic:  # exported with its largest shape set: no size-1 specialisation
            from .model import make_inputs

            example = make_inputs(cfg, example_shapes(cfg, shapes, True), base_dir, device)
        program, info["export"] = export(model, example, cfg, dynamic, base_dir)
        # (a scratch package lives as long as this process: torch loads it from there)
        out = Path(aot_out) if aot_out else Path(tempfile.mkdtemp(prefix="gk-aot-"), "model.pt2")
        info["aot"]["compile_seconds"] = aot_package(program, cfg, mode, out)
        fn, seconds = load(out)
        info["aot"].update({"from": "compiled", "bytes": out.stat().st_size})
    else:
        fn, seconds = load(aot_in)
        info["aot"]["from"] = "bundle"
    info["aot"]["load_seconds"] = seconds
    return fn, info


def inductor_imported() -> bool:
    return "torch._inductor" in sys.modules
