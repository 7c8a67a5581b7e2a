"""The config schema (``gatekeeper.toml`` or ``[tool.gatekeeper]`` in ``pyproject.toml``).

Validated with pydantic; every error names the file, the field and what was expected,
on one line. The schema imports no kind: whoever reads a config (:func:`read_config`,
called by :func:`gatekeeper.project.load_config`) passes the kinds' checks in (the
validation's context, :class:`KindChecks`), so a model's ``strategies`` are checked
against the kinds there are inside the same validation. Expansion into targets lives in
:mod:`gatekeeper.project`.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from . import generation, quantize
from .errors import ConfigError
from .generation import GenerateConfig
from .inputs import INPUT_TAGS, Inputs, InputSpec, Strict
from .quantize import SQNR_FLOOR, Quantize, Quantized
from .secrecy import passable

DEFAULT_STORE = ".gatekeeper/store"
# the kind of a model that names no strategies (gatekeeper.kinds.DEFAULT); ids and keys
# leave it implicit
DEFAULT_STRATEGY = "whole"
Mode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
Task = Literal["infer", "train", "generate"]  # generate: docs/generation.md
# record torch's caching-precompile package with each bundle
Precompile = Literal["auto", "off"]
Precision = Literal["fp32", "bf16", "fp16"]  # fp32: no autocast; bf16/fp16: torch.autocast
MODES: tuple[Mode, ...] = get_args(Mode)
TASKS: tuple[Task, ...] = get_args(Task)
PRECOMPILE: tuple[Precompile, ...] = get_args(Precompile)
PRECISIONS: tuple[Precision, ...] = get_args(Precision)
_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
_CALLABLE = r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$"
# torch.optim classes by name (LBFGS needs a closure, SparseAdam sparse gradients)
OPTIMIZERS = tuple(
    "Adafactor Adadelta Adagrad Adam Adamax AdamW ASGD Muon NAdam RAdam RMSprop Rprop SGD".split()
)


class KindChecks(Protocol):
    """What validating a model's ``strategies`` asks of the artifact kinds
    (:mod:`gatekeeper.kinds` is one): the names there are, and why a model cannot be
    compiled the ways it names (None: it can). Passed as the validation's context,
    ``model_validate(data, context={"kinds": kinds})``."""

    def names(self) -> list[str]: ...

    def check(self, model: ModelConfig) -> str | None: ...


def _kinds(info: ValidationInfo) -> KindChecks | None:
    """The kinds' checks the reader passed (None: the schema alone, as for a model built
    in code or one a worker reads back from its request)."""
    return (info.context or {}).get("kinds")


def _kind(name: str, info: ValidationInfo) -> str:
    if (checks := _kinds(info)) is None:
        return name
    known = checks.names()
    if name not in known:
        quoted = [repr(k) for k in known]
        listed = ", ".join(quoted[:-1]) + f" or {quoted[-1]}" if len(quoted) > 1 else quoted[0]
        raise ValueError(f"expected {listed}")
    return name


# how a model is compiled: an artifact kind's name (gatekeeper.kinds): whole, regional
# (each repeated block compiled), aot (torch.export + AOTInductor) or an installed kind's
Strategy = Annotated[str, AfterValidator(_kind)]


class ParityTolerance(Strict):
    atol: float = Field(1e-4, ge=0)
    rtol: float = Field(1e-4, ge=0)
    cosine: float = Field(0.99, ge=-1, le=1)


class GateConfig(Strict):
    """Regression thresholds, as fractions (0.05 = 5% worse), and the rules' choices."""

    latency_regression: float = Field(0.05, ge=0, lt=1)
    speedup_regression: float = Field(0.05, ge=0, lt=1)
    # generate targets (docs/generation.md): paired like latency, the same default
    ttft_regression: float = Field(0.05, ge=0, lt=1)
    tpot_regression: float = Field(0.05, ge=0, lt=1)
    tokens_per_s_regression: float = Field(0.05, ge=0, lt=0.5)  # a drop: 1 / (1 - t) x TPOT
    compile_time_regression: float = Field(0.15, ge=0)
    memory_regression: float = Field(0.05, ge=0)
    work_regression: float = Field(0.05, ge=0)  # FLOPs or bytes accessed per call
    graph_breaks: Literal["no-increase", "ignore"] = "no-increase"
    # recompiles in the shape sweep (every shape set run after the first compile)
    recompiles: Literal["no-increase", "ignore"] = "no-increase"
    inconclusive: Literal["pass", "fail"] = "pass"  # exit code of an undecided slowdown
    parity: ParityTolerance = ParityTolerance()
    # quantized targets (docs/quantization.md): SQNR vs the float model (dB) below a floor
    # or fallen by more than sqnr_regression dB: regressed; slower than the float twin
    sqnr_floor: dict[Quantized, float] = Field(default_factory=lambda: dict(SQNR_FLOOR))
    sqnr_regression: float = Field(3.0, ge=0)
    quantized_slower: Literal["advise", "fail"] = "advise"


class DistributedConfig(Strict):
    """A model run as ``world_size`` ranks (docs/distributed.md): each rank calls the
    factory after joining the process group, and the factory parallelizes the model.
    ``backend`` ``auto``: ``nccl`` on CUDA, ``gloo`` on CPU. ``mesh``: the dimensions
    :func:`gatekeeper.device_mesh` builds (``{dp = 1, tp = 2}``). ``timeout``: the
    process group's, in seconds."""

    world_size: int = Field(ge=1, le=1024)
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    mesh: dict[str, int] | None = None
    timeout: float = Field(600.0, gt=0)

    @model_validator(mode="after")
    def _mesh(self) -> DistributedConfig:
        sizes = list((self.mesh or {"ranks": self.world_size}).values())
        if any(not re.fullmatch(r"[A-Za-z_]\w*", k) for k in self.mesh or {}) or min(sizes) < 1:
            raise ValueError("distributed.mesh: name each dimension and size it, {dp = 1, tp = 2}")
        if math.prod(sizes) != self.world_size:
            raise ValueError(
                f"distributed.mesh: {sizes} make {math.prod(sizes)} ranks, not {self.world_size}"
            )
        return self

    def spec(self) -> dict[str, Any]:
        """What the key records (the rank, address and port never are)."""
        return {"world_size": self.world_size, "backend": self.backend, "mesh": self.mesh}


class TrainConfig(BaseModel):
    """A training target's step: ``optimizer`` is a torch.optim class by name; every
    other key of the table (``weight_decay``, ``betas`` ...) is passed to it as a keyword
    argument. ``loss`` is ``module:function`` taking ``(outputs, inputs)`` and returning a
    scalar (default: the mean of squares of the first floating-point output). ``steps``
    is how many steps parity compares."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True)

    optimizer: str = "AdamW"
    lr: float = Field(1e-3, gt=0)
    steps: int = Field(3, ge=1, le=100)
    loss: str | None = Field(None, pattern=_CALLABLE)

    @field_validator("optimizer")
    @classmethod
    def _known(cls, name: str) -> str:
        if name not in OPTIMIZERS:
            raise ValueError(
                f"unknown optimizer {name!r} (expected one of {', '.join(OPTIMIZERS)})"
            )
        return name

    @property
    def kwargs(self) -> dict[str, Any]:
        """The optimizer's keyword arguments besides ``lr``."""
        return dict(self.model_extra or {})

    def spec(self) -> dict[str, Any]:
        """What the key records (everything that changes the compiled step)."""
        return {
            "optimizer": self.optimizer,
            "lr": self.lr,
            "loss": self.loss,
            "kwargs": self.kwargs,
        }


class ExportConfig(Strict):
    """How the ``aot`` strategy exports the model: ``torch.export.export(strict=...)``
    (non-strict by default: the model's Python runs as Python, only torch calls are
    traced); ``weights``: in the package (``bundled``), or left out and bound at load to
    the deploy's own (``bound``: ``load_aot(..., model=...)``); ``auto``: bound from
    256 MiB of weights."""

    strict: bool = False
    weights: Literal["auto", "bundled", "bound"] = "auto"


PassEnv = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*\*?$"), AfterValidator(passable)]


class ModelConfig(Strict):
    name: str = Field(pattern=_NAME)
    # what is compiled: the module ``factory`` returns (its ``forward``, or its method
    # ``call``), or the plain function ``function`` names
    factory: str | None = Field(None, pattern=_CALLABLE)
    function: str | None = Field(None, pattern=_CALLABLE)
    call: str | None = Field(None, pattern=r"^[A-Za-z_]\w*$")
    # positional inputs (a list) or keyword inputs (a table of named inputs)
    inputs: Inputs | None = None
    inputs_factory: str | None = Field(None, pattern=_CALLABLE)
    shapes: list[dict[str, int]] = Field(default_factory=lambda: [dict[str, int]()])
    modes: list[Mode] = Field(default_factory=lambda: list[Mode](["default"]))
    tasks: list[Task] = Field(default_factory=lambda: list[Task](["infer"]))
    precisions: list[Precision] = Field(default_factory=lambda: list[Precision](["fp32"]))
    # inference targets only: a training step is always compiled whole
    strategies: list[Strategy] = Field(default_factory=lambda: [DEFAULT_STRATEGY])
    # torchao variants of the infer fp32 targets (docs/quantization.md), each config's
    # keyword arguments, the modules quantized (submodule name globs; default: nn.Linear)
    quantize: list[Quantize] = Field(default_factory=lambda: list[Quantize](["none"]))
    quantize_options: dict[Quantized, dict[str, Any]] = Field(default_factory=dict)
    quantize_modules: list[str] | None = None
    # regional: the blocks to compile, as globs over submodule names ("layers.*");
    # default: the children of each nn.ModuleList that share a class
    regions: list[str] | None = None
    export: ExportConfig | None = None  # aot: how torch.export runs (export_settings)
    train: TrainConfig | None = None
    generate: GenerateConfig | None = None  # tasks "generate": how it generates
    dynamic: bool = False
    fullgraph: bool = False
    backend: str = "inductor"
    options: dict[str, Any] = Field(default_factory=dict)
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    seed: int = 0
    # several processes (ranks) through torch.distributed; None: one process
    distributed: DistributedConfig | None = None
    precompile: Precompile | None = None  # default: the config's
    gate: dict[str, Any] = Field(default_factory=dict)  # per-model overrides of [gate]
    pass_env: list[PassEnv] = Field(default_factory=list)

    @property
    def training(self) -> TrainConfig:
        """The training step's settings (the defaults when ``train`` is not given)."""
        return self.train or TrainConfig()

    @property
    def generation(self) -> GenerateConfig:
        """The generation's settings (the defaults when ``generate`` is not given)."""
        return self.generate or GenerateConfig()

    @property
    def export_settings(self) -> ExportConfig:
        """How torch.export runs (the defaults when ``export`` is not given)."""
        return self.export or ExportConfig()

    @property
    def builder(self) -> str:
        """The reference that builds what is compiled (``factory`` or ``function``)."""
        ref = self.factory or self.function
        assert ref is not None  # the validator requires one
        return ref

    def input_specs(self) -> list[InputSpec]:
        """The tensor inputs of ``inputs`` (positional or keyword)."""
        items = self.inputs.values() if isinstance(self.inputs, dict) else self.inputs or []
        return [i for i in items if isinstance(i, InputSpec)]

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> ModelConfig:
        self._check_callable()
        self._check_axes()
        if (checks := _kinds(info)) is not None and (why := checks.check(self)):
            raise ValueError(why)  # each kind's own fields and what it asks of the model
        self._check_shapes()
        return self

    def _check_callable(self) -> None:
        """What is compiled, and the inputs it is called with."""
        if (self.factory is None) == (self.function is None):
            raise ValueError("give exactly one of 'factory' (a module) or 'function'")
        if self.function is not None:
            if self.call is not None:
                raise ValueError(
                    "'call' names a method of the module 'factory' returns; a "
                    "'function' model has none"
                )
            if "train" in self.tasks:
                raise ValueError(
                    "tasks: \"train\" needs a module's parameters; a 'function' model "
                    "has none (use a factory)"
                )
        if isinstance(self.inputs, dict):
            for k in self.inputs:
                if not re.fullmatch(r"[A-Za-z_]\w*", k):
                    raise ValueError(f"inputs: keyword {k!r} is not an identifier")
        if (self.inputs is None) == (self.inputs_factory is None):
            raise ValueError("give exactly one of 'inputs' or 'inputs_factory'")

    def _check_axes(self) -> None:
        """The lists that make targets: distinct values, at least one each."""
        if not self.shapes:
            raise ValueError("'shapes' needs at least one shape set (use [{}] for none)")
        if len(set(self.modes)) != len(self.modes) or not self.modes:
            raise ValueError("'modes' must list distinct modes, at least one")
        for name in ("tasks", "precisions", "strategies", "quantize"):
            values = getattr(self, name)
            if not values or len(set(values)) != len(values):
                raise ValueError(f"'{name}' must list distinct values, at least one")
        if self.train is not None and "train" not in self.tasks:
            raise ValueError(
                '\'train\' is set but \'tasks\' has no "train" (add it: tasks = ["infer", "train"])'
            )
        if why := quantize.check_model(self):
            raise ValueError(why)
        if why := generation.refusal(self):
            raise ValueError(why)
        if self.options and self.modes != ["default"]:
            raise ValueError(
                "'options' cannot be combined with modes other than 'default' "
                "(torch.compile takes either mode or options)"
            )

    def _check_shapes(self) -> None:
        """Every shape set binds exactly the dimensions the inputs name."""
        used = set().union(*(i.names() for i in self.input_specs()))
        for n, shape_set in enumerate(self.shapes):
            for k, v in shape_set.items():
                if not re.fullmatch(r"[A-Za-z_]\w*", k):
                    raise ValueError(f"shapes[{n}]: name {k!r} is not an identifier")
                if v < 1:
                    raise ValueError(f"shapes[{n}].{k} must be a positive integer")
            if self.inputs is not None:
                if missing := used - shape_set.keys():
                    raise ValueError(f"shapes[{n}] does not bind {', '.join(sorted(missing))}")
                if unused := shape_set.keys() - used:
                    raise ValueError(
                        f"shapes[{n}] binds {', '.join(sorted(unused))}, which no input uses"
                    )


class MeasureConfig(Strict):
    """How long and how often to measure each target."""

    warmup: int = Field(5, ge=0)
    # seconds of timed rounds per target: 10 s gave the paired gate 60/60 at 10% and 0/60 at
    # 0% on a shared 2-core runner (docs/statistics.md); `run` doubles it when borderline
    min_time: float = Field(10.0, gt=0)
    # paired: rounds go on past min_time while they cannot decide, up to this (None:
    # 3 x min_time; gatekeeper.worker.timing.time_limit)
    max_time: float | None = Field(None, gt=0)
    max_samples: int = Field(400, ge=5)
    timeout: float = Field(1800, gt=0)  # per target subprocess, seconds
    # run every shape set after the first compile, counting recompiles (gate.recompiles)
    shape_sweep: bool = True


class Config(Strict):
    store: str = DEFAULT_STORE
    endpoint_url: str | None = None
    read_only: bool = False
    models: list[ModelConfig] = Field(min_length=1)
    gate: GateConfig = GateConfig()
    measure: MeasureConfig = MeasureConfig()
    # record torch's caching-precompile package in each inference bundle, so that a
    # deploy can skip Dynamo once `check` verified it (a model's own setting wins)
    precompile: Precompile = "auto"
    # load only bundles whose signature verifies: a missing or empty GATEKEEPER_SIGNING_KEY
    # is then an error, never an unchecked load (docs/hardening.md)
    require_signature: bool = False
    # variables (names, PREFIX* globs) workers get besides the allow-list (hardening.md)
    pass_env: list[PassEnv] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> Config:
        names = [m.name for m in self.models]
        if dupes := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"model names must be unique: {', '.join(dupes)} repeats")
        return self

    # where the config was read from: relative paths and factories resolve against it
    path: Path | None = Field(None, exclude=True)

    @property
    def base_dir(self) -> Path:
        return self.path.parent if self.path else Path.cwd()

    def precompile_for(self, model: ModelConfig) -> bool:
        """Whether ``model``'s inference bundles carry a precompile package."""
        return (model.precompile or self.precompile) == "auto"

    def gate_for(self, model: ModelConfig) -> GateConfig:
        """The gate rules for one model: [gate] with the model's overrides on top."""
        if not model.gate:
            return self.gate
        merged = self.gate.model_dump()
        for k, v in model.gate.items():
            merged[k] = {**merged[k], **v} if isinstance(v, dict) and k in merged else v
        return _validate(GateConfig, merged, self.path, f"models.{model.name}.gate")


def _where(loc: tuple) -> str:
    out = ""
    for part in loc:
        if part in INPUT_TAGS:  # an input's kind, not a field the user wrote
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _validate(
    cls: type[BaseModel],
    data: Any,
    path: Path | None,
    prefix: str = "",
    kinds: KindChecks | None = None,
) -> Any:
    try:
        return cls.model_validate(data, context={"kinds": kinds})
    except ValidationError as e:
        errs = e.errors()
        msgs = []
        for err in errs[:3]:
            loc = _where(tuple(p for p in err["loc"] if not str(p).startswith("function-")))
            field = ".".join(x for x in (prefix, loc) if x) or "(top level)"
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown field"
            elif err["type"] == "literal_error":
                msg = msg.replace("Input should be", "expected")
            elif err.get("input") is not None and err["type"] not in ("value_error", "missing"):
                msg = f"{msg}, got {err['input']!r}"
            msgs.append(f"{field}: {msg}")
        more = f" (and {len(errs) - 3} more)" if len(errs) > 3 else ""
        raise ConfigError(f"{path or 'config'}: " + "; ".join(msgs) + more) from None


def find_config(explicit: str | os.PathLike[str] | None, cwd: Path | None = None) -> Path:
    cwd = cwd or Path.cwd()
    if explicit is not None:
        path = Path(explicit)
        if not path.is_file():
            raise ConfigError(f"{path}: config file not found")
        return path
    for name in ("gatekeeper.toml", "pyproject.toml"):
        path = cwd / name
        if path.is_file() and (name != "pyproject.toml" or _has_section(path)):
            return path
    raise ConfigError(
        "no config: create gatekeeper.toml or add [tool.gatekeeper] to "
        "pyproject.toml, or pass --config PATH"
    )


def _has_section(path: Path) -> bool:
    try:
        tool = tomllib.loads(path.read_text()).get("tool")
        return isinstance(tool, dict) and "gatekeeper" in tool
    except OSError:
        return False
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: cannot read: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None


def read_config(
    explicit: str | os.PathLike[str] | None, cwd: Path | None, *, kinds: KindChecks
) -> Config:
    """The config ``explicit`` names, else the one found from ``cwd`` (:func:`find_config`),
    validated against the schema and ``kinds``' checks (every error: one line, naming the
    file and the field)."""
    path = find_config(explicit, cwd)
    try:
        doc = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {e}") from None
    tool = doc.get("tool")
    section = tool.get("gatekeeper") if isinstance(tool, dict) else None
    if section is None:
        if path.name == "pyproject.toml":
            raise ConfigError(f"{path}: no [tool.gatekeeper] section")
        section = doc
    elif not isinstance(section, dict):
        raise ConfigError(
            f"{path}: tool.gatekeeper: expected a table ([tool.gatekeeper]), "
            f"got {type(section).__name__}"
        )
    config = _validate(Config, section, path, kinds=kinds)
    config = config.model_copy(update={"path": path.absolute()})
    for model in config.models:
        config.gate_for(model)  # a bad per-model override fails now, not after measuring
    return config
