"""The parent's one door to torch: the facts of this machine's torch that key a bundle
(:func:`torch_facts`, :func:`resolve_device`), the inductor cache dir and Mega-Cache
blobs a warm start fills (:func:`default_cache_dir`, :func:`load_megacache`), loading
verified precompile packages in this process (:func:`enable_precompile_loading`), and
the AOTInductor package a deploy loads (:func:`load_aot`). The rest of the parent (CLI,
store, gate, report, GitHub, dashboard) asks these functions and never imports torch;
only the worker subprocess compiles (``tests/test_runtime.py`` holds the line).

Loading an AOTInductor package for a deploy:

``gatekeeper warm`` installs each verified ``+aot`` package (a ``.pt2`` that
``torch._inductor.aoti_compile_and_package`` built from ``torch.export``'s program) into
the inductor cache dir a service will use, under ``gatekeeper/aot/<target>/``.
:func:`load_aot` returns a callable for it. It loads the package with torch's C++ loader
(``torch._C._aoti.AOTIModelPackageLoader``), which needs neither Dynamo, AOTAutograd,
inductor nor the model's Python code: a service's first call then costs what eager's
does. Where that loader is missing it falls back to ``torch._inductor.aoti_load_package``
(which imports inductor, about 2 s).

Every torch import is inside a function: importing this module (and the CLI, the gate,
the store, the report) never imports torch.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import GatekeeperError

if TYPE_CHECKING:
    from .config import Config

AOT_HOME = Path("gatekeeper", "aot")  # inside the inductor cache dir
PACKAGE = "model.pt2"
AOT_MEMBER = f"aot/{PACKAGE}"  # the package in an aot bundle's archive
INFO = "package.json"  # what warm installed: target, code hash, sha256, the check's verdict
MANIFEST = "manifest.json"  # the bundle's signed manifest, as warm verified it


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
    """``auto`` → ``cuda`` where torch sees a CUDA device, else ``cpu``; a configured
    ``cuda`` without one is a config error."""
    import torch

    from .errors import ConfigError

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} is configured but no CUDA device is available")
    return device


def torch_facts(device: str) -> dict[str, Any]:
    """What torch says about this machine that decides whether compiled artifacts can
    be reused here: its build, and the GPU or the CPU's capability and threads."""
    import torch

    facts: dict[str, Any] = {"torch": torch.__version__, "torch_git": torch.version.git_version}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device).index or 0)
        facts.update(gpu_facts(props, torch.version.cuda, torch.version.hip))
    else:
        facts.update(
            device="cpu",
            cpu_capability=torch.backends.cpu.get_cpu_capability().lower(),
            threads=torch.get_num_threads(),
        )
    return facts


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


class AotUnavailable(GatekeeperError):
    """No verified AOTInductor package is installed for the target: the service compiles
    (``torch.compile``) as it would without one."""


def inductor_cache_dir() -> Path:
    """The inductor cache dir of this process, as inductor computes it (without
    importing inductor): ``$TORCHINDUCTOR_CACHE_DIR``, else ``<tmp>/torchinductor_<user>``."""
    explicit = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if explicit:
        return Path(explicit)
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container): inductor's fallback
        user = "unknown"
    user = re.sub(r'[\\/:*?"<>|]', "_", user)
    return Path(tempfile.gettempdir(), f"torchinductor_{user}")


def package_dir(cache: Path, target_id: str) -> Path:
    """Where ``warm`` installs a target's package inside a cache dir."""
    return cache / AOT_HOME / target_id.replace("/", "__")


class AotModel:
    """A loaded AOTInductor package, called like the model: ``model(*args, **kwargs)``.
    Inputs are flattened as ``torch.export`` saw them; outputs come back in the
    structure the model returned (tuple, dict, ...)."""

    def __init__(self, loader: Any, path: Path, info: dict | None = None) -> None:
        import torch.utils._pytree as pytree

        self._loader = loader
        self.path = path
        self.info = info or {}
        in_spec, out_spec = loader.get_call_spec()
        self._in_spec = pytree.treespec_loads(in_spec)
        self._out_spec = pytree.treespec_loads(out_spec)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch
        import torch.utils._pytree as pytree

        kwargs_spec = _child(self._in_spec, 1) if self._in_spec.num_children == 2 else None
        if kwargs and kwargs_spec is not None:  # in the order export saw them
            kwargs = {k: kwargs[k] for k in kwargs_spec.context if k in kwargs}
        flat = pytree.tree_leaves((args, kwargs))
        tensors = [x for x in flat if isinstance(x, torch.Tensor)]
        return pytree.tree_unflatten(self._loader.run(tensors), self._out_spec)

    def __repr__(self) -> str:
        return f"AotModel({str(self.path)!r})"


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


def load_package(path: str | os.PathLike[str], info: dict | None = None) -> AotModel:
    """Load a ``.pt2`` AOTInductor package with torch's C++ loader, as this torch's
    constructor takes it (falling back to ``torch._inductor.aoti_load_package`` where
    torch has none)."""
    import torch

    aoti = getattr(getattr(torch._C, "_aoti", None), "AOTIModelPackageLoader", None)
    if aoti is None:  # pragma: no cover - every torch gatekeeper supports has it
        from torch._inductor import aoti_load_package

        return AotModel(aoti_load_package(str(path)).loader, Path(path), info)
    for args in LOADER_ARGS:
        try:
            loader = aoti(str(path), *args)
            break
        except TypeError as e:  # pybind11: this torch has another constructor
            if "incompatible constructor arguments" not in str(e) or args == LOADER_ARGS[-1]:
                raise
    return AotModel(loader, Path(path), info)


def load_aot(
    config: Config | str | os.PathLike[str] | None,
    target: str,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
) -> AotModel:
    """The callable of ``target``'s AOTInductor package, as ``gatekeeper warm`` installed
    it (verified by a ``check``, for this code)::

        import gatekeeper
        model = gatekeeper.load_aot("gatekeeper.toml", "mlp/b1/default+aot")
        out = model(x)

    ``target`` is an ``+aot`` target's id (or that id without ``+aot``); ``cache_dir``
    (default: the one inductor would use) is where ``warm`` installed it. Raises
    :class:`AotUnavailable` when no verified package is installed there (the service
    then compiles as before); the config (a path or a loaded Config) is read only
    then, to tell a target that does not exist (UsageError) from a missing package.
    Imports torch, not inductor."""
    from .kinds import get

    wanted = get("aot").target_id(target)
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
    if not (where / PACKAGE).is_file():
        raise AotUnavailable(f"{wanted}: {where / PACKAGE} is missing")
    _check_package(wanted, where, info)
    return load_package(where / PACKAGE, info)


def _check_package(wanted: str, where: Path, info: dict) -> None:
    """Loading a package runs its shared library: it must be the file ``warm`` verified.
    Its sha256 must be the one ``warm`` recorded; where this process has the signing
    key (or a signature is required), the bundle's signed manifest ``warm`` kept beside
    it must verify and record that same sha256, so an edited ``package.json`` is no way
    around it. Raises :class:`AotUnavailable` otherwise."""
    from . import bundle
    from .errors import BundleError, ConfigError
    from .hashing import sha256_file

    recorded = info.get("sha256")
    if not isinstance(recorded, str) or not re.fullmatch(r"[0-9a-f]{64}", recorded):
        raise AotUnavailable(f"{wanted}: {where / INFO} records no sha256 for its package")
    try:
        key = bundle.signing_key()
    except ConfigError as e:
        raise AotUnavailable(f"{wanted}: {e}") from None
    if key is not None:
        try:
            data = (where / MANIFEST).read_bytes()
            target = json.loads(data).get("target")
            manifest = bundle.verify_manifest(data, target=str(target), signing_key=key)
        except (OSError, ValueError, AttributeError, BundleError) as e:
            raise AotUnavailable(
                f"{wanted}: no signed manifest verifies the package in {where} ({e}); "
                "run gatekeeper warm again"
            ) from None
        entry = manifest.files.get(AOT_MEMBER)
        if entry is None or entry.sha256 != recorded or manifest.code_hash != info.get("code_hash"):
            raise AotUnavailable(f"{wanted}: {where / INFO} is not what its signed manifest says")
    actual = sha256_file(where / PACKAGE)
    if actual != recorded:
        raise AotUnavailable(
            f"{wanted}: {where / PACKAGE} is not the package warm verified (sha256 "
            f"{actual[:12]}, recorded {recorded[:12]}): not loaded"
        )


def _aot_target(config: Config | str | os.PathLike[str] | None, wanted: str) -> None:
    """A UsageError unless ``wanted`` is an aot target of the config."""
    from . import kinds
    from .config import Config, load_config
    from .errors import UsageError
    from .targets import expand

    cfg = config if isinstance(config, Config) else load_config(config)
    found = expand(cfg)
    if wanted in [t.id for t in found]:
        return
    aot = ", ".join(t.id for t in found if kinds.of(t) is kinds.get("aot"))
    hint = aot or 'none: add "aot" to a model\'s strategies'
    raise UsageError(
        f"{wanted}: not an aot target of {cfg.path or 'the config'} (aot targets: {hint})"
    )
