"""The cache key: target id, env key and code hash, and the facts each is made of.

* **env key**: where a bundle may be used (torch, Triton and Python versions; the
  GPU, or the CPU's capability, architecture, threads and instruction-set flags; the
  compile-configuring environment variables, only when one is set). A readable prefix
  plus a short hash of every fact: ``torch2.13.0+cpu-py3.11-cpu-avx512-t2-3f9c1a``.
* **code hash**: which code was compiled: the factory references, the compile spec and
  the dependencies the worker recorded while building the model and its inputs
  (:mod:`gatekeeper.worker.deps`). The parent re-checks a manifest's recorded
  dependencies here, without importing them, to call a bundle a ``hit``.

What each fact guards against and why the code hash is found this way: docs/caching.md.
torch is imported here only to read versions and the device, never to compile.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import logging
import os
import platform
import re
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from . import bundle, kinds, quantize
from .config import ModelConfig
from .errors import AccessDenied, BundleError, ConfigError, GatekeeperError, StoreUnavailable
from .hashing import locate, search_path, sha256_bytes, sha256_file
from .inputs import InputSpec
from .store.layout import BundleLocation, Store
from .targets import Target

log = logging.getLogger("gatekeeper.key")

# instruction-set extensions in /proc/cpuinfo "flags" that change what -march=native emits
_ISA_FLAG = re.compile(
    r"^(sse\w*|ssse3|avx\w*|amx\w*|fma\w*|f16c|bmi\w*|adx|aes|vaes|"
    r"vpclmulqdq|gfni|sha_ni|movbe|popcnt|lzcnt|abm|xsave\w*|"
    r"fp\w*|asimd\w*|sve\w*|sme\w*|i8mm|bf16|dotprod)$"
)


# environment variables torch reads to configure compilation; cache locations and
# switches, logging and tracing, and the compile worker pool change no compiled code
_COMPILE_ENV = re.compile(
    r"^(TORCHINDUCTOR_|TORCHDYNAMO_|TORCH_COMPILE_|TORCH_INDUCTOR_|TRITON_|"
    r"CUTEDSL_|INDUCTOR_)|^(CXX|CC|CFLAGS|CXXFLAGS|LDFLAGS|"
    r"TORCH_CUDA_ARCH_LIST|TORCH_BLAS_PREFER_HIPBLASLT)$"
)
_NOT_COMPILE_ENV = re.compile(
    r"CACHE_DIR$|_HOME$|_DUMP_DIR$|LOG|TRACE|VERBOSE|DEBUG_DIR|"
    r"^TORCHINDUCTOR_(FX_GRAPH|AUTOGRAD|BUNDLED_AUTOTUNE)_CACHE$|"
    r"REMOTE_CACHE|^TORCHINDUCTOR_FORCE_DISABLE_CACHES$|"
    r"^TORCH_COMPILE_DEBUG$|^TORCHINDUCTOR_COMPILE_THREADS$|"
    r"^TORCHINDUCTOR_WORKER_START$|^TRITON_PRINT_AUTOTUNING$"
)


def compile_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The set environment variables that change what torch.compile produces."""
    env = os.environ if environ is None else environ
    return {
        k: v
        for k, v in sorted(env.items())
        if _COMPILE_ENV.search(k) and not _NOT_COMPILE_ENV.search(k)
    }


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
    """``auto`` → cuda where a CUDA device is available, else cpu (asks torch, through
    :mod:`gatekeeper.runtime`)."""
    from .runtime import resolve_device as resolve

    return resolve(device)


def env_facts(device: str, torch_facts: dict | None = None) -> dict:
    """Every fact that decides whether compiled artifacts can be reused here.
    ``torch_facts``: what :func:`gatekeeper.runtime.torch_facts` says of ``device``
    (asked of torch when not given; recorded ones stand in for a GPU this machine lacks)."""
    if torch_facts is None:
        from .runtime import torch_facts as ask

        torch_facts = ask(device)
    facts: dict = {
        **torch_facts,
        "triton": _dist_version("triton", "pytorch-triton", "pytorch-triton-rocm"),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "arch": platform.machine(),
    }
    if facts["device"] == "cpu":
        facts["isa_flags"] = _cpu_isa_flags()
    if env := compile_env():  # only when set: unset, the env key is what it always was
        facts["compile_env"] = env
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
    return (
        f"torch{facts['torch']}-py{facts['python']}-{where}-{sha256_bytes(_canonical(facts))[:6]}"
    )


def compile_spec(target: Target) -> dict:
    """Everything about how a target is compiled, besides the code and the environment."""
    m: ModelConfig = target.model
    # a dynamic model's bundle serves every shape set: its key names the dimensions
    # (and every shape set), never one set's sizes
    shape_set = {} if target.dynamic else target.shape_set

    def one(spec: InputSpec | bool | int | float | str) -> dict[str, Any]:
        if not isinstance(spec, InputSpec):  # a plain value, passed as it is
            return {"value": spec}
        if target.dynamic:
            return {
                "shape": list(spec.shape),
                "dtype": spec.dtype,
                "low": spec.low,
                "high": spec.high,
            }
        shape = [shape_set[d] if isinstance(d, str) else d for d in spec.shape]
        strides: list[int] = []
        acc = 1
        for d in reversed(shape):
            strides.insert(0, acc)
            acc *= max(d, 1)
        return {
            "shape": shape,
            "stride": strides,
            "dtype": spec.dtype,
            "low": spec.low,
            "high": spec.high,
        }

    # positional inputs are a list (as they always were); keyword inputs a table
    inputs: list[dict[str, Any]] | dict[str, dict[str, Any]] | None = None
    if isinstance(m.inputs, dict):
        inputs = {name: one(spec) for name, spec in m.inputs.items()}
    elif m.inputs is not None:
        inputs = [one(spec) for spec in m.inputs]
    spec_doc = {
        "backend": m.backend,
        "mode": target.mode,
        "dynamic": target.dynamic,
        "fullgraph": m.fullgraph,
        "options": m.options,
        "inputs": inputs,
        "inputs_factory": m.inputs_factory,
        "shapes": shape_set,
        "seed": m.seed,
    }
    if target.dynamic:
        spec_doc["shape_sets"] = m.shapes
    # what is compiled, only when not a module's forward (so those keys stay as they were)
    if m.call not in (None, "forward"):
        spec_doc["call"] = m.call
    if m.function is not None:
        spec_doc["function"] = m.function
    # only when not the default: the keys of inference float32 targets stay what they were
    if target.task != "infer":
        spec_doc["task"] = target.task
    if target.task == "train":
        spec_doc["train"] = m.training.spec()
    if target.task == "generate":  # new tokens and the cache shape what is compiled
        spec_doc["generate"] = m.generation.spec()
    if target.precision != "fp32":
        spec_doc["precision"] = target.precision
    if target.quantized:  # the config, its arguments, the modules and torchao's version
        spec_doc["quantize"] = target.quantization()
    if m.distributed is not None:
        spec_doc["distributed"] = m.distributed.spec()
    # what the artifact kind adds (the default kind nothing: those keys stay as they were)
    spec_doc.update(kinds.of(target).spec(m))
    return spec_doc


def refs_of(model: ModelConfig) -> list[str]:
    return [model.builder] + ([model.inputs_factory] if model.inputs_factory else [])


def code_hash(refs: list[str], spec: dict, deps: dict) -> str:
    """The code hash: the factories, the compile spec and the recorded dependencies."""
    body = {
        "refs": refs,
        "spec": spec,
        "deps": {k: deps.get(k) for k in ("modules", "files", "distributions", "absent")},
    }
    return sha256_bytes(_canonical(body))[:16]


@dataclass(frozen=True)
class CacheKey:
    """A target's key. ``code_hash`` is None until dependencies are known: recorded by a
    worker (:meth:`with_deps`) or matched in a stored manifest."""

    target_id: str
    env_key: str
    device: str
    env: dict
    spec: dict
    refs: list[str]
    base_dir: Path  # the config's folder the user's modules and data are resolved from
    code_hash: str | None = None
    deps: dict | None = None

    def with_deps(self, deps: dict) -> CacheKey:
        return replace(self, deps=deps, code_hash=code_hash(self.refs, self.spec, deps))

    def location(self) -> BundleLocation:
        """Where this key's bundle lives (the code hash must be known)."""
        if self.code_hash is None:
            raise ValueError(f"{self.target_id}: no code hash yet (dependencies unknown)")
        return BundleLocation(self.target_id, self.env_key, self.code_hash)

    def as_dict(self) -> dict:
        return {
            "target": self.target_id,
            "env_key": self.env_key,
            "code_hash": self.code_hash,
            "device": self.device,
            "env": self.env,
            "spec": self.spec,
            "refs": self.refs,
            "deps": self.deps,
        }


def refuse_unrunnable(targets: list[Target]) -> None:
    """A config error, before any work, for the first quantized target that cannot run
    here (torchao missing or too old, a device without the config's kernels)."""
    facts: dict[str, dict] = {}
    for t in targets:
        if t.quantized:
            device = resolve_device(t.model.device)
            if device not in facts:
                facts[device] = env_facts(device)
            if why := quantize.refusal(t.quantize, facts[device]):
                raise ConfigError(f"models.{t.model.name}.quantize: {why}")


def target_key(target: Target, base_dir: Path) -> CacheKey:
    """The env part of ``target``'s key and its compile spec; no code hash yet."""
    device = resolve_device(target.model.device)
    facts = env_facts(device)
    if target.quantized and (why := quantize.refusal(target.quantize, facts)):
        raise ConfigError(f"models.{target.model.name}.quantize: {why}")
    return CacheKey(
        target.bundle_id,
        env_key(facts),
        device,
        facts,
        compile_spec(target),
        refs_of(target.model),
        Path(base_dir),
    )


# -- re-checking recorded dependencies here (no import) ------------------------------------
def _current_sha(path: str | None, memo: dict[str, str | None]) -> str | None:
    """A file's sha256 now (None when it is gone). ``memo`` spans one lookup only: a
    file rewritten within the file system's timestamp granularity keeps its mtime."""
    if not path:
        return None
    if path not in memo:
        try:  # regular files only: a manifest naming /dev/zero must not hang a deploy
            memo[path] = sha256_file(Path(path)) if stat.S_ISREG(os.stat(path).st_mode) else None
        except OSError:
            memo[path] = None
    return memo[path]


def _installed_version(name: str, search: list[str]) -> str | None:
    for dist in importlib.metadata.distributions(name=name, path=search):
        return dist.version
    return None


def resolve_deps(recorded: dict, base_dir: Path, memo: dict | None = None) -> dict:
    """The recorded dependencies as they are here and now: each module located (never
    imported) from ``base_dir`` first, each file re-hashed, each distribution's installed
    version, the absent imports still absent. None where something is gone."""
    memo = {} if memo is None else memo
    importlib.invalidate_caches()
    search = search_path(base_dir)
    modules = {
        name: _current_sha(locate(name, search)[1], memo) for name in recorded.get("modules", {})
    }
    files = {}
    for name in recorded.get("files", {}):
        path = Path(name) if Path(name).is_absolute() else base_dir / name
        files[name] = _current_sha(str(path), memo)
    dists = {name: _installed_version(name, search) for name in recorded.get("distributions", {})}
    absent = [n for n in recorded.get("absent", []) if not locate(n, search)[0]]
    return {
        "format": recorded.get("format"),
        "modules": modules,
        "files": files,
        "distributions": dists,
        "absent": absent,
    }


def valid_deps(deps: object) -> bool:
    """Whether ``deps`` has the shape a worker records (a manifest is data, not trusted
    to be well formed just because it parsed)."""
    if not isinstance(deps, dict):
        return False
    maps = [deps.get(k, {}) for k in ("modules", "files", "distributions")]
    absent = deps.get("absent", [])
    return (
        all(
            isinstance(m, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in m.items())
            for m in maps
        )
        and isinstance(absent, list)
        and all(isinstance(n, str) for n in absent)
    )


def first_difference(recorded: dict, current: dict) -> str | None:
    """What no longer matches, in words (None when everything does)."""
    for kind, what in (("modules", "module"), ("files", "file"), ("distributions", "distribution")):
        for name, value in recorded.get(kind, {}).items():
            now = current.get(kind, {}).get(name)
            if now != value:
                return f"{what} {name} " + ("is gone" if now is None else "changed")
    for name in recorded.get("absent", []):
        if name not in current.get("absent", []):
            return f"module {name} is importable now"
    return None


# -- finding this checkout's bundle ----------------------------------------------------------
@dataclass(frozen=True)
class Match:
    status: Literal["hit", "partial"]
    location: BundleLocation
    manifest: bundle.Manifest  # verified, and found under the key it names
    key: CacheKey  # with the code hash when a hit
    why: str | None = None  # partial: what differs from this bundle's dependencies


def check_location(manifest: bundle.Manifest, loc: BundleLocation) -> None:
    """A manifest is only valid under the key it names (a copied one is refused)."""
    named = (manifest.target, manifest.env_key, manifest.code_hash)
    if named != (loc.target_id, loc.env_key, loc.code_hash):
        raise BundleError(
            f"{loc.target_id}: bundle refused: its manifest names "
            f"{manifest.target}/{manifest.env_key}/{manifest.code_hash} but was "
            f"found under {loc.target_id}/{loc.env_key}/{loc.code_hash}"
        )


def find_bundle(
    store: Store, key: CacheKey, *, signing_key: bytes | None
) -> tuple[Match | None, str | None]:
    """This checkout's bundle (``hit``: every recorded dependency still matches), else the
    newest valid one of the target and env (``partial``), else None and why.

    Manifests that do not verify or were found under another key than they name are
    skipped with one warning each. Raises StoreError when the store cannot be read.
    """
    partial: Match | None = None
    reason: str | None = None
    memo: dict[str, str | None] = {}  # candidates share most files: hash each once
    for loc in store.manifests(key.target_id, key.env_key):
        try:
            match = _examine(store, loc, key, signing_key=signing_key, memo=memo)
        except (StoreUnavailable, AccessDenied):
            raise  # the store, not this manifest: the lookup cannot go on
        except Exception as e:  # one bad manifest refuses itself only
            text = str(e) if isinstance(e, GatekeeperError) else f"{type(e).__name__}: {e}"
            if not text.startswith(key.target_id):
                text = f"{key.target_id}: bundle {loc.code_hash} refused: {text}"
            log.warning("%s", " ".join(text.split())[:400])
            reason = reason or text
            continue
        if match is None:  # pruned in between
            continue
        if match.status == "hit":
            return match, None
        partial = partial or match
    if partial is not None:
        return partial, None
    return None, reason or "no bundle for this target and environment"


def _examine(
    store: Store,
    loc: BundleLocation,
    key: CacheKey,
    *,
    signing_key: bytes | None,
    memo: dict[str, str | None],
) -> Match | None:
    """The manifest at ``loc`` as a hit or a partial match for ``key`` (None: gone).
    Raises whatever refuses it: :func:`find_bundle` skips that manifest only."""
    data = store.read_manifest(loc)
    if data is None:
        return None
    manifest = bundle.verify_manifest(data, target=key.target_id, signing_key=signing_key)
    check_location(manifest, loc)
    recorded = manifest.key.get("deps")
    why = "its manifest recorded no dependencies (an older gatekeeper wrote it)"
    if recorded is not None and not valid_deps(recorded):
        why, recorded = "its recorded dependencies are malformed", None
    if recorded is not None:
        current = resolve_deps(recorded, key.base_dir, memo)
        found = key.with_deps(current)
        if found.code_hash == manifest.code_hash:
            return Match("hit", loc, manifest, found)
        why = first_difference(recorded, current) or (
            "the factory or the compile spec changed"
            if manifest.key.get("refs") != key.refs or manifest.key.get("spec") != key.spec
            else "the code hash differs"
        )
    return Match("partial", loc, manifest, key, f"code changed since bundle {loc.code_hash}: {why}")
