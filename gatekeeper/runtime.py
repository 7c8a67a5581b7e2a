"""The parent's one door to torch: the facts of this machine's torch that key a bundle
(:func:`torch_facts`, :func:`resolve_device`), the inductor cache dir and Mega-Cache
blobs a warm start fills (:func:`default_cache_dir`, :func:`load_megacache`), loading
verified precompile packages in this process (:func:`enable_precompile_loading`), and
the AOTInductor package a deploy loads (:func:`load_aot`). The rest of the parent (CLI,
store, gate, report, GitHub, dashboard) asks these functions and never imports torch;
only the worker subprocess compiles (``tests/test_runtime.py`` holds the line).

A deploy's AOTInductor package, which ``gatekeeper warm`` installs once verified:
:func:`load_aot` loads it with torch's C++ loader, without Dynamo, AOTAutograd, inductor
or the model's Python code (where that loader is missing,
``torch._inductor.aoti_load_package``, which imports inductor: about 2 s).

Every torch import is inside a function: importing this module (and the CLI, the gate,
the store, the report) never imports torch.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import facts_cache
from .aot_files import AOT_HOME as AOT_HOME
from .aot_files import AOT_MEMBER as AOT_MEMBER
from .aot_files import INFO as INFO
from .aot_files import MANIFEST as MANIFEST
from .aot_files import PACKAGE as PACKAGE
from .aot_files import (
    PYTHON_OPS,
    STORED_CONSTANTS,
    WEIGHTS_RECORD,
    check_package,
    inductor_cache_dir,
    loadable,
    package_dir,
    package_member,
)
from .aot_files import AotUnavailable as AotUnavailable
from .errors import GatekeeperError, UsageError

if TYPE_CHECKING:
    from .config import Config


MESH_ENV = "GATEKEEPER_DEVICE_MESH"  # set in a distributed target's ranks


def device_mesh() -> Any:
    """The device mesh of a distributed model's ranks, for its factory: its config's
    ``distributed.mesh`` (``{dp = 1, tp = 2}``: a 2-D mesh with those dimension names),
    else one dimension over every rank (``gatekeeper.device_mesh()``)."""
    spec = os.environ.get(MESH_ENV)
    if not spec:
        raise GatekeeperError(
            "gatekeeper.device_mesh() is for the factory of a model with distributed set, "
            "called in its ranks"
        )
    from torch.distributed.device_mesh import init_device_mesh

    doc = json.loads(spec)
    if not doc["mesh"]:
        return init_device_mesh(doc["device"], (doc["world_size"],))
    names, sizes = tuple(doc["mesh"]), tuple(doc["mesh"].values())
    return init_device_mesh(doc["device"], sizes, mesh_dim_names=names)


def resolve_device(device: str) -> str:
    """``auto`` → ``cuda`` where torch sees a CUDA device, else ``cpu`` (remembered by
    :mod:`gatekeeper.facts_cache` when ``cpu``); a configured ``cuda`` without one is a
    config error."""
    from .errors import ConfigError

    if device == "auto":
        if facts_cache.recall("auto") == "cpu":
            return "cpu"
        import torch

        if torch.cuda.is_available():
            return "cuda"
        facts_cache.remember("auto", "cpu")
        return "cpu"
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"device {device!r} is configured but no CUDA device is available")
    return device


def torch_facts(device: str) -> dict[str, Any]:
    """What torch says about this machine that decides whether compiled artifacts can
    be reused here: its build, and the GPU or the CPU's capability and threads (the
    CPU's remembered by :mod:`gatekeeper.facts_cache`)."""
    cpu = not device.startswith("cuda")
    if cpu and _cpu_facts(remembered := facts_cache.recall("facts:cpu")):
        return dict(remembered)
    if cpu:
        measured = measured_cpu_facts()
        facts_cache.remember("facts:cpu", measured)
        return measured
    import torch

    facts: dict[str, Any] = {"torch": torch.__version__, "torch_git": torch.version.git_version}
    props = torch.cuda.get_device_properties(torch.device(device).index or 0)
    facts.update(gpu_facts(props, torch.version.cuda, torch.version.hip))
    return facts


def measured_cpu_facts() -> dict[str, Any]:
    """:func:`torch_facts` of the CPU, asked of this process's torch (never remembered
    ones)."""
    import torch

    return {
        "torch": torch.__version__,
        "torch_git": torch.version.git_version,
        "device": "cpu",
        "cpu_capability": torch.backends.cpu.get_cpu_capability().lower(),
        "threads": torch.get_num_threads(),
    }


def confirm_facts(worker: dict[str, Any] | None) -> None:
    """After a worker answered: remembered facts of the CPU that the worker's torch
    contradicts (``worker``: what it said before any model code ran) are replaced by
    what this process's torch says, with a warning (:func:`gatekeeper.facts_cache.confirm`)."""
    facts_cache.confirm("facts:cpu", worker, _cpu_facts, measured_cpu_facts)


def _cpu_facts(doc: Any) -> bool:
    """Whether a remembered answer has the shape :func:`torch_facts` gives of a CPU."""
    if not isinstance(doc, dict) or doc.get("device") != "cpu":
        return False
    strings = ("torch", "torch_git", "cpu_capability")
    return set(doc) == {*strings, "device", "threads"} and (
        all(isinstance(doc[k], str) for k in strings) and type(doc["threads"]) is int
    )


def gpu_facts(props: Any, cuda: str | None, hip: str | None) -> dict[str, Any]:
    """The GPU's part of :func:`torch_facts`: its name and compute capability (from
    ``torch.cuda.get_device_properties``: ``name``, ``major``, ``minor``) and the CUDA
    or ROCm runtime torch was built with. Apart so that recorded facts of a real GPU
    (tests/data/cuda_facts.json) drive it on a machine without one."""
    return {
        "device": "cuda",
        "gpu": props.name,
        "capability": f"{props.major}.{props.minor}",
        "cuda": cuda,
        "hip": hip,
    }


def default_cache_dir() -> Path:
    """The inductor cache dir this process (and a deploy with the same env) will use, as
    inductor computes it."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir())


def load_megacache(blob: bytes) -> None:
    """Load a Mega-Cache blob (``torch.compiler.load_cache_artifacts``)."""
    import torch

    torch.compiler.load_cache_artifacts(blob)


# the environment of a service that loads precompile packages
# (gatekeeper.kinds.precompile): torch loads packages inside torch.compile
PRECOMPILE_ENV = "TORCH_CACHING_PRECOMPILE"
# inductor trusts the CPU's flags for its vector ISA (the key pins them) instead of
# building and loading a probe library in a subprocess (about 0.5 s per process)
ISA_ENV = "TORCHINDUCTOR_VEC_ISA_OK"


def enable_precompile_loading(skip_isa_probe: bool = False) -> None:
    """Load precompile packages in this process from now on (call before
    ``torch.compile``). A guard that fails after a load then recompiles cleanly.

    ``skip_isa_probe``: trust the CPU's flags for inductor's vector ISA instead of
    building and loading a probe library in a subprocess (~0.5 s per process): the key
    pins those flags, and a served package's kernels are built already. Only for a
    process whose every warm target is served from its package: the setting is part of
    inductor's FX graph key, so an FX cache entry compiled without it misses."""
    import torch
    import torch._dynamo.bytecode_transformation as bt

    torch._dynamo.config.caching_precompile = True
    if skip_isa_probe and os.environ.get(ISA_ENV) is None:  # the user's own word wins
        import torch._inductor.config as inductor_config

        inductor_config.cpp.vec_isa_ok = True
    # torch 2.13 installs the package's __builtins_dict___0 into the module's globals;
    # a recompile in the same module would claim that name again and assert
    bt.unique_id("__gatekeeper_precompile")


class AotModel:
    """A loaded AOTInductor package, called like the model: ``model(*args, **kwargs)``.
    Inputs are flattened as ``torch.export`` saw them; outputs come back in the
    structure the model returned (tuple, dict, a transformers ``ModelOutput``, ...).
    ``weights``: what its weights are (``bundled`` in the package, or ``bound`` at load
    to the deploy's own tensors, which it keeps alive: no copy)."""

    def __init__(self, loader: Any, path: Path, info: dict | None = None) -> None:
        import torch.utils._pytree as pytree

        self._loader = loader
        self.path = path
        self.info = info or {}
        self.weights = "bundled"
        self._bound: dict[str, Any] = {}
        self._rebind: Callable[[], dict[str, Any]] | None = None
        in_spec, out_spec = loader.get_call_spec()
        self._in_spec = pytree.treespec_loads(in_spec)
        self._out_spec = _output_spec(out_spec, path)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch
        import torch.utils._pytree as pytree

        kwargs_spec = _child(self._in_spec, 1) if self._in_spec.num_children == 2 else None
        if kwargs and kwargs_spec is not None:  # in the order export saw them
            kwargs = {k: kwargs[k] for k in kwargs_spec.context if k in kwargs}
        flat = pytree.tree_leaves((args, kwargs))
        tensors = [x for x in flat if isinstance(x, torch.Tensor)]
        return pytree.tree_unflatten(self._loader.run(tensors), self._out_spec)

    def rebind(self) -> None:
        """Bind a package built without its weights to them again, read anew from the
        model (or the mapping) it was loaded with: after their memory moved
        (``param.data = ...``, a module's ``to()`` that copies, a parameter replaced).
        The package's kernels read each weight at the address it had when bound (torch's
        AOTInductor keeps that address: no copy), so until then they read the weights'
        old memory, freed once nothing else holds it. Nothing for a package that holds
        its own weights."""
        if self._rebind is not None:
            self._bound = self._rebind()

    def __repr__(self) -> str:
        return f"AotModel({str(self.path)!r}, weights={self.weights!r})"


def _output_spec(text: str, path: Path) -> Any:
    """The package's output structure. Its types (transformers' ``ModelOutput``
    classes, ...) must be registered with torch's pytree: the modules that define them
    are imported first (a verified package names them; its own code runs anyway)."""
    import importlib

    import torch.utils._pytree as pytree

    names = set(re.findall(r'"type":\s*"([\w.]+)"', text))
    for name in sorted(names - set(pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE)):
        module = name.rpartition(".")[0]
        while module:
            try:
                importlib.import_module(module)
                break
            except ImportError:
                module = module.rpartition(".")[0]
    try:
        return pytree.treespec_loads(text)
    except (NotImplementedError, ValueError, KeyError) as e:
        missing = sorted(names - set(pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE))
        raise GatekeeperError(
            f"{path}: its outputs are of types torch's pytree does not know here "
            f"({', '.join(missing) or e}): import the module that registers them "
            "before gatekeeper.load_aot"
        ) from None


# The C++ loader's constructor is no stable API; its arguments, newest first: (path, model
# name, run single-threaded, runners, device index: -1 = as built), as torch 2.13 takes
# them; without the device index, as releases before it did; (path, model name), as 2.6
# does. pybind11 refuses the others with a TypeError before anything is loaded.
LOADER_ARGS = (("model", False, 1, -1), ("model", False, 1), ("model",))


def _child(spec: Any, index: int) -> Any:
    """A TreeSpec's child: ``child(i)`` in newer torch (``children_specs`` in older
    releases, 2.6 among them; deprecated since)."""
    child = getattr(spec, "child", None)
    return child(index) if child is not None else spec.children_specs[index]


def package_loader(path: str | os.PathLike[str]) -> Any:
    """torch's C++ loader of a ``.pt2``, as this torch's constructor takes it."""
    import torch

    aoti = torch._C._aoti.AOTIModelPackageLoader
    for args in LOADER_ARGS:
        try:
            return aoti(str(path), *args)
        except TypeError as e:  # pybind11: this torch has another constructor
            if "incompatible constructor arguments" not in str(e) or args == LOADER_ARGS[-1]:
                raise
    raise AssertionError("unreachable")


def load_package(
    path: str | os.PathLike[str],
    info: dict | None = None,
    *,
    model: Any = None,
    weights: Mapping[str, Any] | None = None,
) -> AotModel:
    """Load a ``.pt2`` AOTInductor package with torch's C++ loader (falling back to
    ``torch._inductor.aoti_load_package`` where torch has none). A package built without
    its weights gets them bound here: the tensors of ``model`` (a module) or of
    ``weights`` (a mapping of its names, as ``named_parameters``/``state_dict`` name
    them), used in place."""
    import torch

    record = package_member(path, WEIGHTS_RECORD)
    _define_python_ops(path)
    if getattr(getattr(torch._C, "_aoti", None), "AOTIModelPackageLoader", None) is None:
        from torch._inductor import aoti_load_package  # pragma: no cover - every torch has it

        loader = aoti_load_package(str(path)).loader  # pragma: no cover
    else:
        loader = package_loader(path)
    loaded = AotModel(loader, Path(path), info)
    if record is not None:
        import io

        shown = (info or {}).get("target") or str(path)
        blob = package_member(path, STORED_CONSTANTS)
        stored = {} if blob is None else torch.load(io.BytesIO(blob), weights_only=True)
        wanted = json.loads(record)["constants"]
        loaded._rebind = functools.partial(_bind, loader, wanted, stored, shown, model, weights)
        loaded.rebind()
        loaded.weights = "bound"
    return loaded


def _define_python_ops(path: str | os.PathLike[str]) -> None:
    """The custom ops of Python the package's program calls, defined before it loads (a
    stock Mixtral's ``transformers::grouped_mm_fallback``): each op's module imported,
    where it lies in the package the op's namespace names."""
    import importlib

    from torch._library import custom_ops

    recorded = package_member(path, PYTHON_OPS)
    for op, module in (json.loads(recorded) if recorded else {}).items():
        if op not in custom_ops.OPDEFS and module.split(".")[0] == op.split("::")[0]:
            importlib.import_module(module)


def _bind(
    loader: Any, wanted: dict, stored: dict, path: str, model: Any, weights: Any
) -> dict[str, Any]:
    """The package's constants, each the deploy's tensor (checked against the shape,
    stride, dtype and device it was built with), bound without a copy; those it stores
    itself (``stored``, on the CPU) from there."""
    import torch

    if model is None and weights is None and any(c.get("name") for c in wanted.values()):
        raise UsageError(
            f"{path}: the package holds no weights (built with export.weights = "
            '"bound"): pass the deploy\'s own, load_aot(..., model=<the live module>) '
            "or weights=<its state_dict>"
        )
    bound = {}
    for fqn, c in wanted.items():
        name = c.get("name")
        t = stored.get(fqn) if name is None else _tensor_of(model, weights, name)
        if name is None and t is not None:  # stored in the package, on the CPU
            t = t.to(c["device"])
        built = (tuple(c["shape"]), tuple(c["stride"]), c["dtype"], c["device"])
        have = None
        if isinstance(t, torch.Tensor):
            have = (tuple(t.shape), t.stride(), str(t.dtype).removeprefix("torch."), t.device.type)
        if have != built:
            said = "missing" if have is None else f"shape/stride/dtype/device {have}"
            raise UsageError(
                f"{path}: weight {name or fqn!r} is {said}; the package was built with {built}"
            )
        bound[fqn] = t
    try:
        loader.load_constants(bound, False, True, True)  # user-managed: no copy
    except TypeError:  # an older torch without user-managed constants: it copies
        loader.load_constants(bound, False, True)
    return bound


def _tensor_of(model: Any, weights: Any, name: str) -> Any:
    """The tensor ``name`` of the deploy's weights mapping, or of its module (a
    parameter, a buffer, or a plain tensor attribute)."""
    if weights is not None:
        return weights.get(name)
    obj = model
    for part in name.split("."):
        obj = getattr(obj, part, None)
    return obj


def load_aot(
    config: Config | str | os.PathLike[str] | None,
    target: str,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    model: Any = None,
    weights: Mapping[str, Any] | None = None,
) -> AotModel:
    """The callable of ``target``'s AOTInductor package, as ``gatekeeper warm`` installed
    it (verified by a ``check``, for this code)::

        import gatekeeper
        model = gatekeeper.load_aot("gatekeeper.toml", "mlp/b1/default+aot")
        out = model(x)

    ``target`` is an ``+aot`` target's id (or that id without ``+aot``); ``cache_dir``
    (default: the one inductor would use) is where ``warm`` installed it. A package
    built without its weights (``export.weights``) runs on the deploy's own: ``model``
    (the live module) or ``weights`` (its state dict), bound in place. Raises
    :class:`AotUnavailable` when no verified package is installed there (the service
    then compiles as before); the config (a path or a loaded Config) is read only
    then, to tell a target that does not exist (UsageError) from a missing package.
    Imports torch, not inductor."""
    return verified_aot(config, target, cache_dir=cache_dir).load(model=model, weights=weights)


class VerifiedAot:
    """A target's installed package as verified: a private copy (a 0700 folder of this
    process's, in its temp dir) of the bytes whose sha256 was checked, held open.
    :meth:`load` loads that open file, so what runs is what was verified, whatever
    happens to the installed file, or to the copy's name, meanwhile."""

    def __init__(self, target: str, installed: Path, copy: Path, info: dict, fd: int) -> None:
        self.target, self.installed, self.copy, self.info = target, installed, copy, info
        self.sha256, self._fd = str(info.get("sha256")), fd

    def load(self, *, model: Any = None, weights: Mapping[str, Any] | None = None) -> AotModel:
        import shutil

        try:  # torch's loader extracts the archive: the copy is not needed afterwards
            path = loadable(self.copy, self._fd, self.sha256)
            loaded = load_package(path, self.info, model=model, weights=weights)
            loaded.path = self.installed
            return loaded
        finally:
            os.close(self._fd)
            shutil.rmtree(self.copy.parent, ignore_errors=True)


def verified_aot(
    config: Config | str | os.PathLike[str] | None,
    target: str,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
) -> VerifiedAot:
    """``target``'s installed package, verified (see :func:`load_aot`) into a private
    copy; loaded by :meth:`VerifiedAot.load`."""
    from .kinds import get, target_id

    wanted = target_id(get("aot"), target)
    where = package_dir(Path(cache_dir) if cache_dir else inductor_cache_dir(), wanted)
    try:  # the config is read only to say what is wrong: a deploy's load stays light
        info = json.loads((where / INFO).read_text())
    except FileNotFoundError:
        _aot_target(config, wanted)  # a target that does not exist is a usage error
        raise AotUnavailable(
            f"{wanted}: no AOTInductor package installed in {where.parents[2]} "
            "(run gatekeeper warm; it installs only packages a check verified)"
        ) from None
    except (OSError, ValueError) as e:
        raise AotUnavailable(f"{wanted}: unreadable {where / INFO}: {e}") from None
    if not isinstance(info, dict) or info.get("target") != wanted:
        raise AotUnavailable(f"{wanted}: {where / INFO} is not this target's")
    if info.get("verified") is not True:
        raise AotUnavailable(f"{wanted}: the package installed in {where} is not verified")
    copy, fd = check_package(wanted, where, info)
    return VerifiedAot(wanted, where / PACKAGE, copy, info, fd)


def _aot_target(config: Config | str | os.PathLike[str] | None, wanted: str) -> None:
    """A UsageError unless ``wanted`` is an aot target of the config."""
    from . import kinds
    from .config import Config
    from .errors import UsageError
    from .project import expand, load_config

    cfg = config if isinstance(config, Config) else load_config(config)
    found = expand(cfg)
    if wanted in [t.id for t in found]:
        return
    aot = ", ".join(t.id for t in found if kinds.of(t) is kinds.get("aot"))
    hint = aot or 'none: add "aot" to a model\'s strategies'
    raise UsageError(
        f"{wanted}: not an aot target of {cfg.path or 'the config'} (aot targets: {hint})"
    )
