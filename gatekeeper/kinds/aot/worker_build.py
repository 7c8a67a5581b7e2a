"""``aot``'s build, in the worker: ``torch.export.export`` (non-strict unless
``export.strict``; a dynamic model's named dimensions become ``dynamic_shapes``), then
``torch._inductor.aoti_compile_and_package`` with the mode's inductor options (and the
model's ``options``), loaded back the way :func:`gatekeeper.load_aot` loads it. A model
that does not export raises :class:`NotExportable`, carrying torch's reason and the
user's ``file:line``.

Its weights: in the package, or (``export.weights``: ``bound``, and ``auto`` for a model
of :data:`AUTO_BOUND_BYTES` or more) left out of it (``package_constants_in_so``
off, every constant kept a constant) and bound at load to the model's own tensors
(:func:`gatekeeper.runtime.load_package`); the package then records which constant is
which tensor of the model (:func:`record_weights`), and the custom ops of Python its
program calls (:func:`python_ops`).

The kind's builder (:mod:`gatekeeper.kinds.aot.worker`) builds an inference target's
package with it, and a generation's (:mod:`gatekeeper.kinds.aot.worker_generate`). The
worker's steps here (``export``, ``aoti_compile_and_package``, ``load package``) are
those :data:`gatekeeper.kinds.aot.STEPS` names.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ...aot_files import PYTHON_OPS, STORED_CONSTANTS, WEIGHTS_RECORD
from ...boundary import breadcrumbs
from ...config import ModelConfig
from ...runtime import load_package, package_loader
from ...worker.calls import Inputs, entry
from ...worker.deps import is_stdlib
from ...worker.fp64 import weight_bytes
from ...worker.kinds import Job, Refused

_TORCH_DIR = os.path.dirname(torch.__file__)
_GATEKEEPER_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_FILE_LINE = re.compile(r'File "([^"]+)", line (\d+)')
AUTO_BOUND_BYTES = 256 << 20  # export.weights = "auto": bound from this many bytes


class NotExportable(Refused):
    """torch.export refused the model: ``info`` is the result's ``export`` document."""


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
    from ...worker.graphs import _reason as headline

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
    if not kwargs and not inputs.kwargs:
        return tuple(args)
    kwargs = {**{k: None for k in inputs.kwargs}, **kwargs}  # plain values: no dims
    bound = inspect.signature(module.forward).bind(*args, **kwargs)
    return dict(bound.arguments)


def export(
    model: Any, inputs: Inputs, cfg: ModelConfig, dynamic: bool, base_dir: Path
) -> tuple[Any, dict]:
    """``torch.export.export`` of the target (NotExportable when torch refuses it)."""
    strict = cfg.export_settings.strict
    module = exported_module(model, cfg)
    return exporting(
        lambda: torch.export.export(
            module,
            inputs.args,
            inputs.kwargs or None,
            dynamic_shapes=dynamic_shapes(cfg, module, inputs) if dynamic else None,
            strict=strict,
        ),
        strict,
        base_dir,
    )


def exporting(run: Callable[[], Any], strict: bool, base_dir: Path) -> tuple[Any, dict]:
    """``run``'s exported program and the result's ``export`` document (NotExportable,
    with torch's reason and the user's ``file:line``, when torch refuses it)."""
    breadcrumbs.enter("export")
    start = time.perf_counter()
    try:
        program = run()
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


def binds_weights(cfg: ModelConfig, model: Any) -> bool:
    """Whether the package leaves its weights out (bound at load): ``export.weights``,
    where this torch's AOTInductor can (``package_constants_in_so``)."""
    import torch._inductor.config as inductor_config

    wanted = cfg.export_settings.weights
    if wanted == "auto":
        wanted = "bound" if weight_bytes(model) >= AUTO_BOUND_BYTES else "bundled"
    return wanted == "bound" and hasattr(inductor_config.aot_inductor, "package_constants_in_so")


def aot_package(program: Any, cfg: ModelConfig, mode: str, out: Path, bound: bool) -> float:
    """Build the AOTInductor package of ``program`` at ``out`` (without its weights:
    ``bound``); seconds it took."""
    from torch._inductor import aoti_compile_and_package

    breadcrumbs.enter("aoti_compile_and_package")
    start = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    options = inductor_options(cfg, mode)
    if bound:  # no weight in the .so, and none inlined into its code: all bound at load
        options |= {"aot_inductor.package_constants_in_so": False}
        options |= {"always_keep_tensor_constants": True}
    aoti_compile_and_package(program, package_path=str(out), inductor_configs=options)
    return time.perf_counter() - start


def record_weights(out: Path, module: Any, model: Any) -> int:
    """Into a package built without its weights: which of its constants is which
    tensor of ``model``'s state dict (by name, with the shape, stride, dtype and device
    it was built with), and, stored in it, those that are not in the state dict (a
    non-persistent buffer, a function's constants: what a deploy's checkpoint lacks).
    The bytes bound at load."""
    import io

    def at(root: Any, name: str) -> Any:
        for part in name.split("."):
            root = getattr(root, part, None)
        return root

    prefix = "" if module is model else "model."  # a method's or function's wrapper
    state = model.state_dict(keep_vars=True) if isinstance(model, torch.nn.Module) else {}
    constants, stored, bound = {}, {}, 0
    for fqn in package_loader(out).get_constant_fqns():
        t: torch.Tensor = at(module, fqn)
        if not isinstance(t, torch.Tensor):
            raise RuntimeError(f"the package's constant {fqn!r} is no tensor of the model")
        name: str | None = fqn.removeprefix(prefix)
        if not fqn.startswith(prefix) or state.get(str(name)) is not t:
            name = None
            stored[fqn] = t.detach().clone()
        else:
            bound += t.numel() * t.element_size()
        constants[fqn] = {
            "name": name,
            "shape": list(t.shape),
            "stride": list(t.stride()),
            "dtype": str(t.dtype).removeprefix("torch."),
            "device": t.device.type,
        }
    record = {"format": 1, "weights": "bound", "bytes": bound, "constants": constants}
    _add_member(out, WEIGHTS_RECORD, json.dumps(record, sort_keys=True).encode())
    if stored:
        blob = io.BytesIO()
        torch.save({k: v.cpu() for k, v in stored.items()}, blob)
        _add_member(out, STORED_CONSTANTS, blob.getvalue())
    return bound


def python_ops(program: Any) -> dict[str, str]:
    """The custom ops of Python (``torch.library.custom_op``) the exported program calls,
    each with the module that defines it: a package runs them through Python, so a
    process that loads it must have defined them (:func:`gatekeeper.runtime.load_package`
    imports the module)."""
    from torch._library import custom_ops

    found = {}
    for node in program.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            name = node.target._schema.name
            if (op := custom_ops.OPDEFS.get(name)) is not None:
                found[name] = op._init_fn.__module__
    return found


def _add_member(out: Path, name: str, data: bytes) -> None:
    """A file added to the ``.pt2`` archive ``out``, under its one top folder."""
    import zipfile

    with zipfile.ZipFile(out, "a") as z:
        root = z.namelist()[0].split("/")[0]
        z.writestr(f"{root}/{name}", data)


def load_timed(path: str | Path, model: Any = None) -> tuple[Callable[..., Any], float]:
    """The package loaded as a deploy loads it (:func:`gatekeeper.runtime.load_package`),
    a package without its weights bound to ``model``'s."""
    breadcrumbs.enter("load package")
    start = time.perf_counter()
    loaded = load_package(path, model=model)
    return loaded, time.perf_counter() - start


def package_of(program: Any, module: Any, model: Any, job: Job) -> tuple[Any, dict[str, Any]]:
    """The job's package loaded as a deploy loads it: the bundle's (``job.load``), else
    ``program``'s built (into ``job.out``, else a scratch file that lives as long as this
    process: torch loads it from there), without its weights where the config says
    (then ``module``'s constants are recorded as ``model``'s tensors); its document
    (``from``, seconds, bytes)."""
    req, path = job.req, job.load
    doc: dict[str, Any] = {"from": "bundle"}
    if path is None:
        path = job.out or Path(tempfile.mkdtemp(prefix="gk-aot-"), "model.pt2")
        bound = binds_weights(req.model, model)
        seconds = aot_package(program, req.model, req.mode, path, bound)
        doc = {"from": "compiled", "compile_seconds": seconds}
        if bound:
            record_weights(path, module, model)
        if ops := python_ops(program):
            _add_member(path, PYTHON_OPS, json.dumps(ops, sort_keys=True).encode())
            doc["python_ops"] = sorted(ops)
    fn, seconds = load_timed(path, model)
    doc.update(
        bytes=path.stat().st_size,
        load_seconds=seconds,
        weights=getattr(fn, "weights", None),
        weight_bytes=weight_bytes(model),
    )
    return fn, doc
