"""The cache key: target id, env key and code hash, and the facts each is made of.

* **env key** — where a bundle may be used: torch, Triton and Python versions and the
  device. On CPU that is the ATen CPU capability (``ATEN_CPU_CAPABILITY`` changes it),
  the architecture, the thread count and the CPU's instruction-set flags: inductor
  builds its C++ kernels with ``-march=native``, so a ``.so`` from an AVX-512 runner
  must never reach an AVX2 machine, and its own cache key does not tell them apart.
  Readable prefix plus a short hash of every fact: ``torch2.13.0+cpu-py3.11-cpu-avx512-t2-3f9c1a``.
* **code hash** — which code was compiled: the sha256 of the model's source files (the
  factory's whole top-level package, or its single module) and of the compile spec
  (backend, mode, dynamic, fullgraph, options, input shapes, dtypes, strides, bounds, seed).

torch is imported here only to read versions and the device, never to compile.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from .hashing import sha256_bytes
from .config import ModelConfig
from .errors import ConfigError
from .targets import Target

# instruction-set extensions in /proc/cpuinfo "flags" that change what -march=native emits
_ISA_FLAG = re.compile(r"^(sse\w*|ssse3|avx\w*|amx\w*|fma\w*|f16c|bmi\w*|adx|aes|vaes|"
                       r"vpclmulqdq|gfni|sha_ni|movbe|popcnt|lzcnt|abm|xsave\w*|"
                       r"fp\w*|asimd\w*|sve\w*|sme\w*|i8mm|bf16|dotprod)$")


def _canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()


def _dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


@lru_cache(maxsize=1)
def _cpu_isa_flags() -> str:
    """A short hash of the CPU's instruction-set flags ('' where /proc/cpuinfo is absent)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        if line.split(":")[0].strip() in ("flags", "Features"):
            flags = sorted(f for f in line.split(":", 1)[1].split() if _ISA_FLAG.match(f))
            return sha256_bytes(" ".join(flags).encode())[:12]
    return ""


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} is configured but no CUDA device is available")
    return device


def env_facts(device: str) -> dict:
    """Every fact that decides whether compiled artifacts can be reused here."""
    import torch

    facts: dict = {
        "torch": torch.__version__,
        "torch_git": torch.version.git_version,
        "triton": _dist_version("triton", "pytorch-triton", "pytorch-triton-rocm"),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "arch": platform.machine(),
    }
    if device.startswith("cuda"):
        index = torch.device(device).index or 0
        props = torch.cuda.get_device_properties(index)
        facts.update({
            "device": "cuda",
            "gpu": props.name,
            "capability": f"{props.major}.{props.minor}",
            "cuda": torch.version.cuda,
            "hip": torch.version.hip,
        })
    else:
        facts.update({
            "device": "cpu",
            "cpu_capability": torch.backends.cpu.get_cpu_capability().lower(),
            "threads": torch.get_num_threads(),
            "isa_flags": _cpu_isa_flags(),
        })
    return facts


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-")


def env_key(facts: dict) -> str:
    if facts["device"] == "cuda":
        runtime = f"hip{facts['hip']}" if facts.get("hip") else f"cuda{facts['cuda']}"
        gpu = _slug(facts["gpu"].replace("NVIDIA", ""))[:24].strip("-")
        where = f"{runtime}-sm{facts['capability'].replace('.', '')}-{gpu}"
    else:
        where = f"cpu-{facts['arch']}-{facts['cpu_capability']}-t{facts['threads']}"
    return f"torch{facts['torch']}-py{facts['python']}-{where}-{sha256_bytes(_canonical(facts))[:6]}"


def module_of(ref: str) -> str:
    return ref.split(":", 1)[0]


def code_files(ref: str, base_dir: Path) -> list[Path]:
    """The source files a ``module:attr`` reference lives in, found without running it.

    A module inside a package counts its whole top-level package; a lone module, itself.
    """
    mod = module_of(ref)
    with search_path(base_dir):
        try:
            spec = importlib.util.find_spec(mod.split(".")[0])
            leaf = importlib.util.find_spec(mod) if spec else None
        except (ImportError, ValueError) as e:
            raise ConfigError(f"factory {ref!r}: cannot import module {mod!r}: {e}") from None
    if spec is None or leaf is None:
        raise ConfigError(f"factory {ref!r}: module {mod!r} not found "
                          f"(searched {base_dir} and the Python path)")
    if spec.submodule_search_locations:
        files: list[Path] = []
        for loc in spec.submodule_search_locations:
            files += Path(loc).rglob("*.py")
        return sorted(set(files))
    if spec.origin and os.path.isfile(spec.origin):
        return [Path(spec.origin)]
    return []  # a built-in or frozen module: nothing of the user's to hash


class search_path:
    """While user modules are located: the config's folder first on ``sys.path`` and the
    current directory last, as the worker has them."""

    def __init__(self, base_dir: Path) -> None:
        self.front = str(base_dir) if str(base_dir) not in sys.path else None
        cwd = os.getcwd()
        self.back = cwd if cwd not in sys.path and cwd != str(base_dir) else None

    def __enter__(self) -> None:
        if self.front:
            sys.path.insert(0, self.front)
        if self.back:
            sys.path.append(self.back)

    def __exit__(self, *exc: object) -> None:
        for entry in (self.front, self.back):
            if entry and entry in sys.path:
                sys.path.remove(entry)


def compile_spec(target: Target) -> dict:
    """Everything about how a target is compiled, besides the code and the environment."""
    m: ModelConfig = target.model
    shape_set = target.shape_set
    inputs = None
    if m.inputs is not None:
        inputs = []
        for spec in m.inputs:
            shape = [shape_set[d] if isinstance(d, str) else d for d in spec.shape]
            strides, acc = [], 1
            for d in reversed(shape):
                strides.insert(0, acc)
                acc *= max(d, 1)
            inputs.append({"shape": shape, "stride": strides, "dtype": spec.dtype,
                           "low": spec.low, "high": spec.high})
    return {
        "backend": m.backend, "mode": target.mode, "dynamic": target.dynamic,
        "fullgraph": m.fullgraph, "options": m.options, "inputs": inputs,
        "inputs_factory": m.inputs_factory, "shapes": shape_set, "seed": m.seed,
    }


@dataclass(frozen=True)
class CacheKey:
    target_id: str
    env_key: str
    code_hash: str
    device: str
    env: dict
    spec: dict
    files: dict[str, str] = field(default_factory=dict)  # path -> sha256

    def as_dict(self) -> dict:
        return {"target": self.target_id, "env_key": self.env_key, "code_hash": self.code_hash,
                "device": self.device, "env": self.env, "spec": self.spec, "files": self.files}


def compute_key(target: Target, base_dir: Path) -> CacheKey:
    device = resolve_device(target.model.device)
    facts = env_facts(device)
    refs = [target.model.factory] + ([target.model.inputs_factory]
                                     if target.model.inputs_factory else [])
    files: dict[str, str] = {}
    for ref in refs:
        for path in code_files(ref, base_dir):
            try:
                name = path.relative_to(base_dir).as_posix()
            except ValueError:
                name = path.as_posix()
            files[name] = sha256_bytes(path.read_bytes())
    spec = compile_spec(target)
    code_hash = sha256_bytes(_canonical({"files": files, "spec": spec}))[:16]
    return CacheKey(target.id, env_key(facts), code_hash, device, facts, spec, files)
