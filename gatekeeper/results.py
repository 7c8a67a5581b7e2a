"""The documents measurement produces and the gate reads, as versioned pydantic schemas.

* ``results.json`` (:class:`Results`): what ``gatekeeper check`` measured, per target,
  with every timing sample kept.
* a baseline (:class:`Baseline`): one target's result published for a branch, plus the
  store key of its reference outputs.

No torch here: tensors never appear in these documents, only numbers and file hashes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from . import safefs
from .config import GateConfig
from .errors import GatekeeperError
from .generation import Generation

RESULTS_SCHEMA = "gatekeeper.results/1"
BASELINE_SCHEMA = "gatekeeper.baseline/1"
# the largest results.json read: a fleet's merged results hold every timing sample of
# every target (tens of KB each); anything larger is refused before it is read
MAX_RESULTS_BYTES = 256 << 20
# packages a target's document keeps as fields of their own, as it always did (every
# version reads them); any other is under ``packages`` (docs/strategies.md)
PACKAGE_FIELDS = ("precompile", "aot")


def reference_name(target_id: str) -> str:  # relative to its results.json
    return "references/" + target_id.replace("/", "__") + ".pt"


def trace_name(target_id: str, *, base: bool = False) -> str:
    """Where a target's gzipped Chrome trace goes, relative to its results.json (paired:
    ``.base.json.gz`` for the base commit's)."""
    return "traces/" + target_id.replace("/", "__") + (".base.json.gz" if base else ".json.gz")


# The gate's verdict on a target (and on a run: its worst target's), most severe first;
# gatekeeper.gate.verdicts orders them. "accepted": a regression the pull request accepts
# on purpose; "no-baseline": nothing to compare with, and nothing failed.
Verdict = Literal[
    "error",
    "parity-failed",
    "regressed",
    "inconclusive",
    "accepted",
    "improved",
    "pass",
    "no-baseline",
]
# a target's measurement: "not-exportable" is an +aot target whose model torch.export
# refuses (TargetResult.export says why); "unavailable" one whose AOTInductor package
# took its worker down inside torch (a signal while building, loading or calling it:
# TargetResult.error says which, with torch's version and the device)
Status = Literal["ok", "error", "not-exportable", "unavailable"]
# how the cache dir a compile ran against was found: the bundle of this code ("hit"), of
# other code of the same target ("partial"), none ("miss"), not looked up ("cold"), or a
# hit whose every FX graph missed ("stale")
CacheStatus = Literal["hit", "partial", "miss", "cold", "stale"]
# what inductor's counters say a compile was (CompileStats.state)
CompileState = Literal["warm", "cold", "mixed"]
TimingMode = Literal["paired", "stored"]  # what decided a target's timing


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LatencySummary(_Doc):
    n: int
    mean: float
    p50: float
    p95: float
    p99: float
    min: float
    max: float
    stdev: float


class Disturbance(_Doc):
    """How disturbed the machine was while this run was timed."""

    others_cores: float | None = None  # CPU other processes used, in cores (average)
    own_cores: float | None = None  # CPU this measurement used (its threads, children)
    cores: int = 1
    reference_noise: float | None = None  # within-run spread of the reference workload
    seconds: float | None = None  # how long the timed rounds took


class Latency(_Doc):
    """Seconds per call. Eager, compiled and a fixed reference workload ran interleaved
    (E C R E C R ...), so each index i of the three sample lists is one round."""

    eager: LatencySummary
    compiled: LatencySummary
    reference: LatencySummary | None = None
    speedup: float  # median eager / median compiled
    throughput: float  # compiled calls per second (1 / p50)
    inner_loops: int  # calls averaged into each sample
    samples: dict[str, list[float]]  # "eager", "compiled", "reference"
    runs: list[int] | None = None  # rounds per process when pooled from several; None: one
    disturbance: Disturbance | None = None  # the worst of the runs pooled here


class GraphBreak(_Doc):
    reason: str
    file: str | None = None
    line: int | None = None

    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.file else "?"


class ShapeSweep(_Doc):
    """Every shape set of the model run in one process after the first compile."""

    shape_sets: int
    recompiles: int  # compiles caused by a failed guard
    guards: list[str] = Field(default_factory=list)  # the failed guard of each, as torch says
    fxgraph_cache_hit: int = 0  # the recompiles' graphs found in the FX graph cache
    fxgraph_cache_miss: int = 0


class Graphs(_Doc):
    count: int
    breaks: int
    break_reasons: list[GraphBreak] = Field(default_factory=list)
    recompiles: int = 0  # while measuring, after the first compile
    recompile_guards: list[str] = Field(default_factory=list)
    sweep: ShapeSweep | None = None  # absent in documents from before the sweep


class CompileStats(_Doc):
    seconds: float  # first compiled call, wall time
    warm: bool  # the cache dir was restored from a bundle before compiling
    cache: CacheStatus
    fxgraph_cache_hit: int = 0
    fxgraph_cache_miss: int = 0
    autograd_cache_hit: int = 0
    autograd_cache_miss: int = 0
    cold_seconds: float | None = None  # the cold compile of the bundle restored, if any

    @property
    def state(self) -> CompileState:
        """What inductor's own counters say the compile was: every FX graph a hit
        (warm), every one a miss (cold), or some of each. The bundle lookup ("hit") is
        not enough: a bundle of other code restores a cache that misses every graph."""
        if self.fxgraph_cache_hit and not self.fxgraph_cache_miss:
            return "warm"
        if self.fxgraph_cache_miss and not self.fxgraph_cache_hit:
            return "cold"
        if not self.fxgraph_cache_hit and not self.fxgraph_cache_miss:
            return "warm" if self.warm else "cold"  # no counters (an old document)
        return "mixed"


class _Aliased(_Doc):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)  # written by alias


class Memory(_Aliased):
    # what measured the peaks, written "kind": "cuda": max_memory_allocated; "cpu": peak
    # live bytes of the profiler's memory events; "rss": resident-set growth (old: 0 on CPU)
    source: Literal["cuda", "cpu", "rss"] = Field(alias="kind")
    eager_peak_bytes: int | None = None
    compiled_peak_bytes: int | None = None
    # the model's parameters and buffers (each storage once), the worker's own peak (CUDA:
    # the allocator's; CPU: the resident set, torch included) and it over the weights
    weight_bytes: int | None = None
    process_peak_bytes: int | None = None
    peak_x_weights: float | None = None
    build_peak_bytes: int | None = None  # the same once the factory returned, pre-compile
    build_peak_x_weights: float | None = None


class Work(_Doc):
    """Deterministic work counters of one call: they do not drift between processes."""

    flops: int | None = None  # FlopCounterMode on the eager call
    bytes_accessed: int | None = None  # inductor's estimate for the compiled graphs
    kernels: int | None = None  # kernels inductor generated
    instructions: int | Literal["unavailable"] | None = None  # one compiled call


class ProfileOp(_Doc):
    name: str
    self_us: float  # self time per call, microseconds (device time on CUDA)
    count: float  # times it ran per call


class Profile(_Doc):
    """Where the compiled call spends its time: the top operators by self time."""

    calls: int
    device_time: bool = False
    ops: list[ProfileOp] = Field(default_factory=list)
    trace: str | None = None  # Chrome trace, relative to the results file


class ParityCheck(_Doc):
    passed: bool
    method: str  # allclose | fp64-rmse | cosine | nan-inf | structure | dtype | shape | failed
    max_abs_err: float | None = None
    rmse: float | None = None
    cosine: float | None = None
    detail: str | None = None


class OutputsSummary(_Aliased):
    """What the model returned, as parity walked it (gatekeeper.worker.outputs)."""

    # the top level's type, written "kind": "tensor", "CausalLMOutputWithPast{cache,logits}"
    structure: str = Field(alias="kind")
    leaves: int  # tensors and plain values compared
    tensors: int
    elements: int  # numbers in those tensors
    containers: dict[str, str] = {}  # path -> type of each cache, ModelOutput, object


class Parity(_Doc):
    vs_eager: ParityCheck
    vs_baseline: ParityCheck | None = None  # compiled outputs vs the baseline's stored ones
    outputs: OutputsSummary | None = None  # inference targets


class ReferenceOutputs(_Doc):  # outputs of the compiled model on the seeded inputs
    file: str  # path relative to the results file
    sha256: str
    size: int


class Quantization(_Doc):
    """A quantized target (docs/quantization.md): the torchao config it was quantized
    with (its arguments, the modules, torchao's version), the SQNR in dB of the quantized
    model's eager output against its own float model's (same seed, same inputs), and the
    weight bytes of both (the quantized ones counted from torchao's tensor subclasses'
    inner tensors)."""

    config: str
    options: dict[str, Any] = Field(default_factory=dict)
    modules: list[str] | None = None
    torchao: str | None = None
    sqnr_db: float | None = None  # None: no floating-point output to compare
    weight_bytes: int
    float_weight_bytes: int


class Paired(_Doc):
    """Paired mode: the base version measured in the same process, round by round."""

    base_ref: str
    base_commit: str
    code_hash: str  # the base version's
    compile_seconds: float
    graphs: Graphs
    samples: list[float]  # base compiled latency; index i pairs with latency.samples["compiled"][i]
    work: Work | None = None  # the base version's counters, measured in the same process
    profile: Profile | None = None  # the base version's, profiled in the same process
    # False: the base commit's config builds other inputs, so outputs were not compared
    same_inputs: bool = True
    quantization: Quantization | None = None  # a quantized target: the base version's
    generation: Generation | None = None  # a generate target: the base version's


class BaseTarget(_Doc):
    """Paired: this target as the base commit's own config defines it (gate.governing).
    ``defined`` false: the base has no such target (it is new in this change)."""

    defined: bool
    rules: GateConfig | None = None  # the base's gate rules for it
    definition: dict[str, Any] | None = None  # project.definition(target) in the base's config


class Export(_Doc):
    """An ``+aot`` target's ``torch.export``: exported, or torch's reason and the user's
    line (what torch.compile would call a graph break)."""

    exportable: bool
    reason: str | None = None
    file: str | None = None
    line: int | None = None
    strict: bool = False
    seconds: float | None = None  # how long torch.export took, where it ran here
    # paired: whether the base commit's model exported (None: not tried or not paired)
    base_exportable: bool | None = None

    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.file else "?"

    def says(self) -> str:
        """``not exportable: <torch's reason> at <file:line>``."""
        return f"not exportable: {self.reason or 'torch.export failed'} at {self.where()}"


class RankResult(_Doc):
    """One rank of a distributed target: what it compiled, hit and measured. A
    distributed step is as fast as its slowest rank: the target's latency is the
    per-round maximum over ranks; these are each rank's own medians (``cpu``: its
    process's CPU time per call, which names the rank that does more work when the
    others only wait for it in a collective)."""

    rank: int
    pid: int | None = None
    compile_seconds: float | None = None
    fxgraph_cache_hit: int = 0
    fxgraph_cache_miss: int = 0
    parity: bool | None = None  # every parity check of this rank passed
    latency_p50: float | None = None  # compiled, wall, seconds per call
    cpu_p50: float | None = None
    base_latency_p50: float | None = None  # paired: the base version's
    base_cpu_p50: float | None = None
    slowest_rounds: int | None = None  # rounds in which this rank was the slowest
    cache_used: list[str] | None = None  # compile: the cache files it read or wrote


class TargetResult(_Doc):
    target: str
    model: str
    env_key: str
    code_hash: str
    device: str
    status: Status
    error: str | None = None
    compile: CompileStats | None = None
    graphs: Graphs | None = None
    latency: Latency | None = None
    memory: Memory | None = None
    parity: Parity | None = None
    reference: ReferenceOutputs | None = None
    paired: Paired | None = None
    work: Work | None = None
    profile: Profile | None = None
    mode: TimingMode | None = None  # what decided this target's timing
    # each package the bundle carries, by its name: what the measurement loaded of it and
    # its verification (loaded in a fresh worker, outputs as eager's), or why not; "now":
    # verified by this check (else an earlier check's verdict)
    packages: dict[str, dict[str, Any]] = Field(default_factory=dict)
    export: Export | None = None  # +aot targets: torch.export's outcome
    measured_at: str | None = None
    # the rules and definition of the config this was measured with (a baseline's gate
    # a pull request: gate.governing); absent in documents from before they were kept
    rules: GateConfig | None = None
    definition: dict[str, Any] | None = None
    base_target: BaseTarget | None = None  # paired: the base commit's definition of it
    ranks: list[RankResult] | None = None  # a distributed target's ranks
    quantization: Quantization | None = None  # a quantized target's SQNR and weights
    generation: Generation | None = None  # a generate target's TTFT, TPOT, tokens/s

    @model_validator(mode="before")
    @classmethod
    def _fold_package_fields(cls, data: Any) -> Any:
        """:data:`PACKAGE_FIELDS` read into :attr:`packages`."""
        if not isinstance(data, dict) or not any(f in data for f in PACKAGE_FIELDS):
            return data
        own = {f: data[f] for f in PACKAGE_FIELDS if data.get(f) is not None}
        rest = {k: v for k, v in data.items() if k not in PACKAGE_FIELDS}
        return {**rest, "packages": {**own, **(data.get("packages") or {})}}

    @model_serializer(mode="wrap")
    def _package_fields(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """:data:`PACKAGE_FIELDS` written as fields, ``packages`` only for the others."""
        out = handler(self)
        found = out.pop("packages")
        out.update({f: found.get(f) for f in PACKAGE_FIELDS})
        if others := {k: v for k, v in found.items() if k not in PACKAGE_FIELDS}:
            out["packages"] = others
        return out


class Results(_Doc):
    schema_: str = Field(RESULTS_SCHEMA, alias="schema")
    created_at: str
    gatekeeper_version: str
    creator: dict
    base_ref: str
    shard: str | None = None  # "i/n" when this run measured one shard of the targets
    mode: TimingMode | None = None
    mode_reason: str | None = None  # why: "paired with main at 1a2b3c" / why not
    targets: list[TargetResult]
    removed: list[str] = Field(default_factory=list)  # paired: targets only the base defines
    # why the model code of this run ran without its whole box (the runner owner's
    # GATEKEEPER_UNCONFINED: gatekeeper.boundary.box); absent when every box held
    unconfined: list[str] | None = None

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def dump(self) -> str:
        unsaid = None if self.unconfined else {"unconfined"}  # a boxed run's, as it was
        return self.model_dump_json(indent=2, by_alias=True, exclude=unsaid)


class RunMedians(_Doc):
    """One published run (one process) of a target, by its medians."""

    measured_at: str
    code_hash: str
    latency: float  # median compiled latency per round / reference workload (or raw)
    vs_eager: float  # median of the per-round ratio compiled / eager
    normalised: bool = True  # ``latency`` was divided by the reference workload


class Noise(_Doc):
    """How noisy this target's latency is on the runner that measured it.

    ``within`` is relative (1.4826 * MAD / median) over the rounds of this run.
    ``between`` and ``vs_eager_between`` are the sd of log run medians between runs of
    the same code among ``runs`` (this run and up to nine before it), pooled per code
    hash with ``df`` degrees of freedom; None until df >= 2. The stored-baseline gate
    compares a PR's run medians with these runs' (stats.compare_runs)."""

    within: float
    between: float | None = None
    vs_eager_between: float | None = None
    df: int = 0
    runs: list[RunMedians] = Field(default_factory=list)  # oldest first, this run last
    detectable: float  # smallest slowdown one PR run can tell from this baseline

    @field_validator("runs", mode="before")
    @classmethod
    def _count_only(cls, v: object) -> object:
        # baselines published before run medians were stored had a count here: still
        # readable, gated as if they had no history
        return [] if isinstance(v, int) else v


class Baseline(_Doc):
    schema_: str = Field(BASELINE_SCHEMA, alias="schema")
    target: str
    env_key: str
    ref: str
    commit: str | None
    created_at: str  # when the result was measured: orders baselines (newest wins)
    published_at: str
    result: TargetResult
    reference_key: str | None = None  # store key of the reference outputs
    noise: Noise | None = None
    verdict: Verdict | None = None  # the gate's verdict on this run, when publishing knew it

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def dump(self) -> bytes:
        return self.model_dump_json(indent=2, by_alias=True).encode()


def load_results(path: str | Path) -> Results:
    path = Path(path)
    try:
        if path.is_dir():
            raise GatekeeperError(
                f"{path}: is a directory, not a results file (give the results.json in it)"
            )
        size = path.stat().st_size
        if size > MAX_RESULTS_BYTES:
            raise GatekeeperError(
                f"{path}: {size} bytes, more than the {MAX_RESULTS_BYTES} a results file "
                "may have: refused unread"
            )
        with open(path, "rb") as f:
            data = f.read(MAX_RESULTS_BYTES + 1)
        if len(data) > MAX_RESULTS_BYTES:
            raise GatekeeperError(f"{path}: grew past {MAX_RESULTS_BYTES} bytes while read")
        return Results.model_validate_json(data)
    except FileNotFoundError:
        raise GatekeeperError(
            f"{path}: results file not found (run 'gatekeeper check' first)"
        ) from None
    except OSError as e:
        raise GatekeeperError(f"{path}: cannot read: {e.strerror or e}") from None
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise GatekeeperError(
            f"{path}: not a gatekeeper results file: {where}: {err['msg']}"
        ) from None


def write_results(results: Results, out_dir: Path) -> Path:
    """``out_dir/results.json``: a new file renamed over it (a link, hard link or FIFO
    at the name is replaced, never written through: :func:`gatekeeper.safefs.write_new`)."""
    path = out_dir / "results.json"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        safefs.write_new(path, results.dump())
    except OSError as e:
        raise GatekeeperError(f"cannot write {path}: {e.strerror or e}") from None
    return path
