"""What the parent asks of a worker process and what it answers: typed, shared by both
sides, and free of torch (the parent never imports it).

The parent writes a :data:`Request` as JSON (one model per action: ``compile``,
``probe``, ``measure``, ``deps``, ``verify``, told apart by ``action``), runs ``python
-m gatekeeper.worker REQ RESP`` (:mod:`gatekeeper.boundary.client`), and reads back a
:class:`Response`. Config sections travel as their models (``budget`` is a
``MeasureConfig``, ``parity`` a ``ParityTolerance``), and what the worker measures as
the :mod:`gatekeeper.results` models it becomes, so pydantic checks each side's JSON
once, on the way in, and each side uses it as it is.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol, Self

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from .. import units
from ..config import Config, MeasureConfig, ModelConfig, ParityTolerance, Precision, Task
from ..errors import ConfigError
from ..generation import Generation
from ..quantize import Quantize
from ..results import (
    Graphs,
    Latency,
    Memory,
    OutputsSummary,
    Parity,
    ParityCheck,
    Profile,
    Quantization,
    RankResult,
    Work,
)
from ..targets import Target


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Half(Protocol):
    """A kind or a package as a request names it (:class:`gatekeeper.kinds.Kind`,
    :class:`gatekeeper.kinds.Package`): the caller, above the kinds, passes it in."""

    @property
    def name(self) -> str: ...

    @property
    def worker(self) -> str: ...


class KindRef(_Msg):
    """A target's artifact kind as the worker meets it: its name, and its worker half
    (``"module:attribute"``, :class:`gatekeeper.worker.kinds.Builder`)."""

    name: str
    worker: str

    @classmethod
    def of(cls, kind: Half) -> KindRef:
        return cls(name=kind.name, worker=kind.worker)


class PackageRef(_Msg):
    """A package and a path: where a compile writes it, or what a worker loads."""

    name: str
    worker: str  # its worker half (gatekeeper.worker.kinds.base.PackageHalf)
    path: str

    @classmethod
    def of(cls, package: Half, path: Path | str) -> PackageRef:
        return cls(name=package.name, worker=package.worker, path=str(path))


def memory_limit() -> int | None:
    """``GATEKEEPER_MEMORY_LIMIT`` in bytes (``12GiB``, ``500MiB``...), or None unset."""
    text = os.environ.get("GATEKEEPER_MEMORY_LIMIT", "").strip()
    if not text:
        return None
    try:
        return units.parse_size(text)
    except ValueError as e:
        raise ConfigError(f"GATEKEEPER_MEMORY_LIMIT: {e}") from None


class Build(_Msg):
    """The target a worker builds: the model as the config defines it, its shape set,
    mode, task, precision and kind, on a resolved device."""

    model: ModelConfig
    base_dir: str  # the config's folder: factories are imported from there
    device: str  # resolved: "cpu", "cuda", "cuda:1"
    shapes: dict[str, int]
    mode: str
    dynamic: bool
    task: Task = "infer"
    precision: Precision = "fp32"
    quantize: Quantize = "none"  # the torchao config applied to the float model
    kind: KindRef
    # what the worker's environment takes from the parent's besides the allow-list
    pass_env: list[str] = Field(default_factory=list)
    # bytes the target's model may take (GATEKEEPER_MEMORY_LIMIT): more is refused
    # before any compile (gatekeeper.worker.plan); None: the device's free memory
    memory_limit: int | None = None

    @classmethod
    def of(cls, target: Target, config: Config, device: str, *, kind: Half, **extra: Any) -> Self:
        """This request for ``target``, of ``kind`` (``gatekeeper.kinds.of(target)``;
        ``extra``: the action's own fields)."""
        return cls(
            memory_limit=memory_limit(),
            model=target.model,
            base_dir=str(config.base_dir),
            device=device,
            shapes=target.shape_set,
            mode=target.mode,
            dynamic=target.dynamic,
            task=target.task,
            precision=target.precision,
            quantize=target.quantize,
            kind=KindRef.of(kind),
            pass_env=[*config.pass_env, *target.model.pass_env],
            **extra,
        )

    @property
    def base_path(self) -> Path:
        return Path(self.base_dir)


class BaseSide(_Msg):
    """``measure``, paired: the target as the base commit's own config defines it (its
    model's factory, inputs, call, options, regions, export and train settings, and the
    checkout folder its factories are imported from), built and compiled beside the
    head's as a check of that commit would; ``load``: its bundle's package."""

    model: ModelConfig
    base_dir: str
    shapes: dict[str, int]
    mode: str
    dynamic: bool
    load: PackageRef | None = None

    @classmethod
    def of(cls, target: Target, base_dir: Path, load: PackageRef | None = None) -> BaseSide:
        return cls(
            model=target.model,
            base_dir=str(base_dir),
            shapes=target.shape_set,
            mode=target.mode,
            dynamic=target.dynamic,
            load=load,
        )


class CompileRequest(Build):
    """Build the model, compile it, call it until settled, and save the Mega-Cache blob
    to ``megacache_out`` (the cache dir itself is the parent's). ``packages``: where
    each package goes, the kind's own (its build writes it) and the add-ons (recorded
    after the compile, :mod:`gatekeeper.worker.kinds`)."""

    action: Literal["compile"] = "compile"
    megacache_out: str | None = None
    packages: list[PackageRef] = Field(default_factory=list)


class ProbeRequest(Build):
    """The first compiled call against whatever cache dir the parent restored, saving
    nothing: does a warm start really start warm? ``load``: the package warm served,
    loaded as a deploy loads it; ``eager``: time the first eager call instead (the
    floor; benchmarks); ``megacache_in``: load this blob first (PyTorch's recipe)."""

    action: Literal["probe"] = "probe"
    load: PackageRef | None = None
    eager: bool = False
    megacache_in: str | None = None


class MeasureRequest(Build):
    """Everything ``check`` reports for one target (:mod:`gatekeeper.worker.measure`);
    ``load``: the kind's package from the bundle (else it is built anew)."""

    action: Literal["measure"] = "measure"
    budget: MeasureConfig  # warmup, min_time, max_samples
    parity: ParityTolerance
    reference_out: str  # write this run's reference outputs here
    baseline_reference: str | None = None  # the baseline's reference outputs
    trace_out: str | None = None  # Chrome trace of the compiled call (".base" beside it)
    sweep: bool = True  # run every shape set of the model and count recompiles
    load: PackageRef | None = None
    paired_base: BaseSide | None = None  # paired: the base commit's target
    # paired: the latency threshold that judges it (the base's rules); the timed rounds
    # go on past min_time while their interval straddles it (MeasureConfig.max_time)
    decide_at: float | None = None

    def for_base(self) -> MeasureRequest:
        """Paired: the same request for the base commit's target (its task, precision
        and kind are the head's: they are in the target's id)."""
        assert self.paired_base is not None
        return self.model_copy(update={**dict(self.paired_base), "paired_base": None})


class DepsRequest(Build):
    """Only build the model and its inputs, and say what they were built from."""

    action: Literal["deps"] = "deps"


class VerifyRequest(Build):
    """Load the ``package`` the parent restored, as a deploy would, make the first call,
    and check its outputs against eager and against this check's own
    (``reference_in``): what a deploy may load only once it passed."""

    action: Literal["verify"] = "verify"
    package: PackageRef
    parity: ParityTolerance
    reference_in: str | None = None


# One job for a worker, by its action. Every action that builds the model answers with
# ``deps``, what it was built from (see gatekeeper.worker.deps); the parent computes the
# code hash from it.
Request = Annotated[
    CompileRequest | ProbeRequest | MeasureRequest | DepsRequest | VerifyRequest,
    Field(discriminator="action"),
]
REQUEST: TypeAdapter[Request] = TypeAdapter(Request)


def dynamo_skipped(counters: dict[str, int]) -> bool:
    """Whether the compiled calls behind ``counters`` (worker.compiler.snapshot_counters)
    came from a loaded precompile package: a package was read (``dynamo_cache_hit``,
    which alone only says the file was read) and Dynamo built no graph. Not "no frame":
    the worker's audit hook runs while a package loads, and Dynamo counts it as a frame
    with no graph."""
    return counters.get("dynamo_cache_hit", 0) > 0 and counters.get("graphs", 0) == 0


class BaseMeasured(_Msg):
    """``measure``, paired: the base version, measured in the same process (the
    :class:`gatekeeper.results.Paired` the parent makes of it adds what only the parent
    knows: the base's ref, commit and code hash, computed from ``deps``)."""

    compile_seconds: float
    graphs: Graphs
    samples: list[float]  # base compiled latency, round by round with the head's
    deps: dict[str, Any] | None = None  # what the base model was built from
    work: Work | None = None
    profile: Profile | None = None
    same_inputs: bool = True  # false: its inputs differ, outputs were not compared
    quantization: Quantization | None = None
    generation: Generation | None = None


class PackageParity(_Msg):
    """A package's verification: its first outputs against eager and against this
    check's own compiled outputs (``vs_reference``)."""

    vs_eager: ParityCheck
    vs_reference: ParityCheck | None = None


class Response(_Msg):
    """A worker's answer. ``ok`` false: ``fault`` is ``config`` (the user's factory or
    inputs are wrong), ``compile`` (torch failed), ``export`` (an ``+aot`` target's
    model does not export: ``export`` says torch's reason and the user's line) or
    ``unavailable`` (an ``+aot`` target whose package took its worker down inside
    torch's AOTInductor: :func:`gatekeeper.boundary.client.run_or_fail`) or ``memory``
    (the target will not fit in the memory given: refused before any compile,
    :mod:`gatekeeper.worker.plan`), ``error`` one line. ``ok`` true: the fields of the
    action that ran; nested documents match :mod:`gatekeeper.results`."""

    ok: bool
    fault: Literal["config", "compile", "export", "unavailable", "memory"] | None = None
    error: str | None = None
    torch: str | None = None
    compile_seconds: float | None = None  # first compiled call, wall time
    # of which importing inductor (once per process, whatever the cache holds)
    import_seconds: float | None = None
    call_seconds: list[float] | None = None  # compile/probe: the first calls
    counters: dict[str, int] | None = None  # cache hits/misses, graphs, breaks, frames
    megacache: bool | None = None  # compile: a Mega-Cache blob was written
    megacache_load_seconds: float | None = None
    # compile: the files of the cache dir it read, loaded or wrote (relative paths; None
    # when that could not be known)
    cache_used: list[str] | None = None
    graphs: Graphs | None = None  # measure
    parity: Parity | None = None  # measure: the checks (``outputs`` comes apart)
    package_parity: PackageParity | None = None  # verify: the package's checks
    outputs: OutputsSummary | None = None  # measure: what the model returned
    memory: Memory | None = None
    latency: Latency | None = None
    paired: BaseMeasured | None = None  # measure, paired: the base version's
    work: Work | None = None  # measure: deterministic work counters
    profile: Profile | None = None  # measure: top operators by self time
    deps: dict[str, Any] | None = None  # what the model and inputs were built from
    # a kind that exports: torch.export's outcome (exportable, or torch's reason and the
    # user's file:line)
    export: dict[str, Any] | None = None
    # by package name: what the compile recorded or built, a package's load and first
    # call (probe, measure), or its verdict (verify)
    packages: dict[str, dict[str, Any]] = Field(default_factory=dict)
    pid: int | None = None
    # the worker's torch's CPU facts, as torch said them before any model code ran: a
    # fact the parent remembered that they contradict is replaced (gatekeeper.runtime)
    facts: dict[str, Any] | None = None
    # a rank of a distributed target: its rank, and its CPU seconds per call of each
    # timed function, sample by sample (gatekeeper.worker.timing)
    rank: int | None = None
    cpu_samples: dict[str, list[float]] | None = None
    ranks: list[RankResult] | None = None  # the merged answer of a distributed target
    quantization: Quantization | None = None  # measure: a quantized target's SQNR, weights
    # measure: a generate target's figures; compile and probe: its first generation's
    generation: Generation | None = None

    @classmethod
    def failure(cls, fault: str, error: str) -> Response:
        return cls(ok=False, fault=fault, error=error)
