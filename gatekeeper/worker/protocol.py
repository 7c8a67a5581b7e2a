"""What the parent asks of a worker process and what it answers: typed, shared by both
sides, and free of torch (the parent never imports it).

The parent writes a :class:`Request` as JSON, runs ``python -m gatekeeper.worker REQ
RESP`` (:mod:`gatekeeper.worker.launch`), and reads back a :class:`Response`. What the
worker measures travels as the :mod:`gatekeeper.results` models it becomes, so pydantic
checks the worker's JSON once, on the way in, and the parent uses it as it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from ..config import Config, MeasureConfig, ModelConfig, ParityTolerance
from ..results import (
    Graphs,
    Latency,
    Memory,
    OutputsSummary,
    Parity,
    ParityCheck,
    Profile,
    Work,
)
from ..targets import Target

# the environment of a service that loads precompile packages (see gatekeeper.warm.service_env):
PRECOMPILE_ENV = "TORCH_CACHING_PRECOMPILE"  # torch loads packages inside torch.compile
# inductor trusts the CPU's flags for its vector ISA (the key pins them) instead of
# building and loading a probe library in a subprocess (about 0.5 s per process)
ISA_ENV = "TORCHINDUCTOR_VEC_ISA_OK"


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BaseSide(_Msg):
    """``measure``, paired: the target as the base commit's own config defines it (its
    model's factory, inputs, call, options, regions, export and train settings, and the
    checkout folder its factories are imported from), built and compiled beside the
    head's as a check of that commit would; ``aot_in``: its bundle's package."""

    model: ModelConfig
    base_dir: str
    shapes: dict[str, int]
    mode: str
    dynamic: bool
    aot_in: str | None = None

    @classmethod
    def of(cls, target: Target, base_dir: Path, aot_in: str | None = None) -> BaseSide:
        return cls(
            model=target.model,
            base_dir=str(base_dir),
            shapes=target.shape_set,
            mode=target.mode,
            dynamic=target.dynamic,
            aot_in=aot_in,
        )


class Request(_Msg):
    """One job for a worker.

    * ``compile``: build the model, compile it, call it until settled, and save the
      Mega-Cache blob to ``megacache_out`` (the cache dir itself is the parent's).
    * ``probe``: the same first compiled call against whatever cache dir the parent
      restored, saving nothing: does a warm start really start warm?
    * ``measure``: everything ``check`` reports for one target (see worker.measure).
    * ``deps``: only build the model and its inputs, and say what they were built from.
    * ``precompile``: load the precompile package the parent restored (Dynamo skipped),
      make the first call, and check its outputs against eager and the stored reference
      outputs: what ``check`` must see before a deploy may load the package.
    * ``aot``: the same for an ``+aot`` target's AOTInductor package (``aot_in``), loaded
      the way :func:`gatekeeper.load_aot` loads it.

    ``strategy`` says how the model is compiled: ``whole``, ``regional`` (its repeated
    blocks, the rest eager) or ``aot`` (torch.export, then an AOTInductor package: written
    to ``aot_out`` by ``compile``, loaded from ``aot_in`` by the others when given).

    Every action that builds the model answers with ``deps``, what it was built from
    (see :mod:`gatekeeper.worker.deps`); the parent computes the code hash from it.
    """

    action: Literal["compile", "probe", "measure", "deps", "precompile", "aot"]
    model: ModelConfig
    base_dir: str  # the config's folder: factories are imported from there
    device: str  # resolved: "cpu", "cuda", "cuda:1"
    shapes: dict[str, int]
    mode: str
    dynamic: bool
    task: Literal["infer", "train"] = "infer"
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    strategy: Literal["whole", "regional", "aot"] = "whole"
    aot_out: str | None = None  # compile, aot: write the AOTInductor package here
    aot_in: str | None = None  # aot: the package to load (else export and compile it)
    sweep: bool = True  # measure: run every shape set of the model and count recompiles
    megacache_out: str | None = None  # compile: write the Mega-Cache blob here
    megacache_in: str | None = None  # load this blob first (PyTorch's recipe, benchmarks)
    precompile_out: str | None = None  # compile: record the precompile package (a cache dir)
    precompile: bool = False  # probe, precompile: load precompile packages (skip Dynamo)
    eager: bool = False  # probe: time the first eager call instead (the floor; benchmarks)
    reference_in: str | None = None  # precompile: this check's reference outputs
    budget: MeasureConfig | None = None  # measure: warmup, min_time, max_samples
    parity: ParityTolerance | None = None  # measure: tolerances
    baseline_reference: str | None = None  # measure: the baseline's reference outputs
    reference_out: str | None = None  # measure: write this run's reference outputs here
    paired_base: BaseSide | None = None  # measure, paired: the base commit's target
    trace_out: str | None = None  # measure: Chrome trace of the compiled call (".base" too)

    @classmethod
    def for_target(
        cls, action: str, target: Target, config: Config, device: str, **extra: Any
    ) -> Request:
        return cls(
            action=action,
            model=target.model,
            base_dir=str(config.base_dir),
            device=device,
            shapes=target.shape_set,
            mode=target.mode,
            dynamic=target.dynamic,
            task=target.task,
            precision=target.precision,
            strategy=target.strategy,
            **extra,
        )

    @property
    def base_path(self) -> Path:
        return Path(self.base_dir)

    def for_base(self) -> Request:
        """Paired: the same request for the base commit's target (its task, precision
        and strategy are the head's: they are in the target's id)."""
        assert self.paired_base is not None
        return self.model_copy(update={**dict(self.paired_base), "paired_base": None})


def dynamo_skipped(counters: dict[str, int]) -> bool:
    """Whether the compiled calls behind ``counters`` (worker.compile.snapshot_counters)
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


class PackageParity(BaseModel):
    """A package's verification (precompile, aot): its first outputs against eager and
    against this check's own compiled outputs (``vs_reference``)."""

    model_config = ConfigDict(extra="forbid")

    vs_eager: ParityCheck
    vs_reference: ParityCheck | None = None


class Response(_Msg):
    """A worker's answer. ``ok`` false: ``kind`` is ``config`` (the user's factory or
    inputs are wrong), ``compile`` (torch failed), ``export`` (an ``+aot`` target's
    model does not export: ``export`` says torch's reason and the user's line) or
    ``unavailable`` (an ``+aot`` target whose package took its worker down inside
    torch's AOTInductor: :func:`gatekeeper.worker.launch.run_or_fail`), ``error`` one
    line. ``ok`` true: the fields of the action that ran; nested documents match
    :mod:`gatekeeper.results`."""

    ok: bool
    kind: Literal["config", "compile", "export", "unavailable"] | None = None
    error: str | None = None
    torch: str | None = None
    compile_seconds: float | None = None  # first compiled call, wall time
    # of which importing inductor (once per process, whatever the cache holds)
    import_seconds: float | None = None
    call_seconds: list[float] | None = None  # compile/probe: the first calls
    counters: dict[str, int] | None = None  # cache hits/misses, graphs, breaks, frames
    megacache: bool | None = None  # compile: a Mega-Cache blob was written
    megacache_load_seconds: float | None = None
    precompile: dict[str, Any] | None = None  # compile: recorded or why not; precompile: verdict
    # compile: the files of the cache dir it read, loaded or wrote (relative paths; None
    # when that could not be known)
    cache_used: list[str] | None = None
    graphs: Graphs | None = None  # measure
    parity: Parity | None = None  # measure: the checks (``outputs`` comes apart)
    package_parity: PackageParity | None = None  # precompile, aot: the package's checks
    outputs: OutputsSummary | None = None  # measure: what the model returned
    memory: Memory | None = None
    latency: Latency | None = None
    paired: BaseMeasured | None = None  # measure, paired: the base version's
    work: Work | None = None  # measure: deterministic work counters
    profile: Profile | None = None  # measure: top operators by self time
    deps: dict[str, Any] | None = None  # what the model and inputs were built from
    # aot: torch.export's outcome (exportable, or torch's reason and the user's file:line)
    export: dict[str, Any] | None = None
    # aot: the package's load and first call (probe, measure) or its verdict (aot)
    aot: dict[str, Any] | None = None
    pid: int | None = None

    @classmethod
    def failure(cls, kind: str, error: str) -> Response:
        return cls(ok=False, kind=kind, error=error)
