"""The metric registry: one :class:`Metric` per figure the gate judges and the reports
show. The gate's rules (:mod:`gatekeeper.gate.rules`), the report's rows, headers and
details, the dashboard's series, bisect's ``--metric`` and the rules table of
docs/gate.md all read it; a new metric is one descriptor here plus its measurement in
the worker (CONTRIBUTING.md, "Add a metric").

A metric is read off a :class:`~gatekeeper.results.TargetResult` (this run's, or a
stored baseline's) and, paired, off its :class:`~gatekeeper.results.Paired` (the base
commit measured in the same process). A ``counted`` metric is judged by the gate's
generic rule: its change against the base beyond the ``threshold`` setting of
:class:`~gatekeeper.config.GateConfig` (a fraction, or an amount in its unit when not
``relative``) and by more than its ``floor``, in its worse direction; and, with a
``bound`` setting, its value on the wrong side of that setting. An ``own`` metric's
rule is a function of gate/rules.py (latency's statistics, compile time's cache
states ...) that reads its settings and floors from here.

Pure: no torch, no I/O.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from . import units

if TYPE_CHECKING:
    from .config import GateConfig
    from .results import Paired, TargetResult

Value = float | int | str | None  # a string: the worker could not measure it ("unavailable")


@dataclass(frozen=True)
class Chart:
    """A dashboard chart of the metric over a branch's published runs."""

    id: str
    title: str
    caption: str
    unit: str  # the axis's
    compact: bool = True


@dataclass(frozen=True)
class Metric:
    name: str  # the registry's key; bisect's --metric when ``bisect`` (a group bisects as its name)
    label: str  # in the gate's reasons and notes: "FLOPs per call"
    read: Callable[[TargetResult], Value]  # this run's figure, or a stored baseline's
    # paired: the base commit's figure, measured in the same process (None: the
    # baseline's stands for it)
    beside: Callable[[Paired], Value] | None = None
    fmt: Callable[[Any], str] = units.count
    unit: str = ""  # of its values, and of an absolute threshold or floor ("s", "B", "dB")
    better: Literal["lower", "higher"] | None = "lower"  # None: no direction (parity)
    rule: Literal["counted", "own"] = "counted"
    threshold: str | None = None  # the GateConfig setting a change must pass to count
    relative: bool = True  # the threshold is a fraction of the base's value, else an amount
    # a change no larger never counts, whatever the threshold; by source (memory's kind)
    floor: float | Mapping[str, float] = 0.0
    bound: str | None = None  # a GateConfig setting the value must not cross (sqnr_floor)
    policy: str | None = None  # a GateConfig setting that turns its rule on or off
    timing: bool = False  # timed round by round and judged by statistics (gate.stats)
    # a generate target's per-round samples it is compared on, paired (seconds: lower is
    # better; gate.generation): ``Generation.samples``' key
    samples: str | None = None
    sources: Mapping[str, str] = field(default_factory=dict)  # what each source measures
    source: Callable[[TargetResult], str | None] | None = None  # which one a result used
    group: str | None = None  # a details table and one bisect --metric for its members
    column: str | None = None  # its column in the markdown report's main table
    heading: str | None = None  # its column in its group's details table
    json: str | None = ""  # the JSON report's key of its two sides ("": its name; None: none)
    chart: Chart | None = None
    bisect: bool = False
    doc: str | None = None  # the row of docs/gate.md's rules table that states its rule

    @property
    def json_key(self) -> str | None:
        return self.name if self.json == "" else self.json

    @property
    def bisect_name(self) -> str:
        return self.group or self.name

    def value(self, r: TargetResult | None) -> float | None:
        """The figure as a number (None: not measured, or not measurable here)."""
        return number(self.read(r)) if r is not None else None

    def base_value(self, pair: Paired) -> float | None:
        return number(self.beside(pair)) if self.beside is not None else None

    def setting(self, rules: GateConfig) -> float | None:
        return None if self.threshold is None else float(getattr(rules, self.threshold))

    def floor_for(self, source: str | None = None) -> float:
        if isinstance(self.floor, Mapping):
            return float(self.floor.get(source or "", 0.0))
        return float(self.floor)

    def change(self, b: float, p: float) -> float | None:
        """From ``b`` to ``p``: relative (None from zero) or in the unit."""
        if not self.relative:
            return p - b
        return p / b - 1 if b else None

    def worse(self, change: float) -> float:
        """``change`` signed so that positive is worse."""
        return -change if self.better == "higher" else change

    def change_text(self, change: float) -> str:
        return units.change(change) if self.relative else f"{change:+.3g} {self.unit}".rstrip()

    def amount_text(self, amount: float) -> str:
        """A threshold: ``5%``, or ``1 dB``."""
        return f"{amount:.0%}" if self.relative else f"{amount:g} {self.unit}".rstrip()


def number(v: Value) -> float | None:
    """A figure as a float; None for none, or a string (not measurable here)."""
    return None if v is None or isinstance(v, (str, bool)) else float(v)


# --------------------------------------------------------------------------- readers


def _p50(r: TargetResult) -> Value:
    return r.latency.compiled.p50 if r.latency else None


def _base_p50(pair: Paired) -> Value:
    return statistics.median(pair.samples) if pair.samples else None


def _speedup(r: TargetResult) -> Value:
    return r.latency.speedup if r.latency else None


def _compile(r: TargetResult) -> Value:
    return r.compile.seconds if r.compile else None


def _breaks(r: TargetResult) -> Value:
    return r.graphs.breaks if r.graphs else None


def _base_breaks(pair: Paired) -> Value:
    return pair.graphs.breaks


def _recompiles(r: TargetResult) -> Value:
    """Recompiles after the first compile: while measuring, plus the shape sweep's."""
    g = r.graphs
    return None if g is None else g.recompiles + (g.sweep.recompiles if g.sweep else 0)


def _peak(r: TargetResult) -> Value:
    return r.memory.compiled_peak_bytes if r.memory else None


def _memory_source(r: TargetResult) -> str | None:
    return r.memory.source if r.memory else None


def _parity(r: TargetResult) -> Value:
    return r.parity.vs_eager.max_abs_err if r.parity else None


def _work(name: str) -> tuple[Callable[[TargetResult], Value], Callable[[Paired], Value]]:
    def read(r: TargetResult) -> Value:
        return getattr(getattr(r, "work", None), name, None)  # not in every schema version

    def beside(pair: Paired) -> Value:
        return getattr(pair.work, name, None)

    return read, beside


def _sqnr(r: TargetResult) -> Value:
    q = getattr(r, "quantization", None)  # not in every schema version
    return q.sqnr_db if q is not None else None


def _base_sqnr(pair: Paired) -> Value:
    q = getattr(pair, "quantization", None)
    return q.sqnr_db if q is not None else None


def _generated(field: str) -> tuple[Callable[[TargetResult], Value], Callable[[Paired], Value]]:
    """A generate target's figure (its compiled side's median), this run's and the base
    commit's measured beside it."""

    def of(doc: Any) -> Value:
        gen = getattr(doc, "generation", None)  # not in every schema version
        return getattr(gen.compiled, field) if gen is not None and gen.compiled else None

    return of, of


def _decode_recompiles(doc: Any) -> Value:
    gen = getattr(doc, "generation", None)
    return gen.decode_recompiles if gen is not None and gen.compiled else None


def counter(
    name: str, label: str, heading: str, chart: Chart, threshold: str | None = None
) -> Metric:
    """A work counter of :class:`gatekeeper.results.Work`: deterministic, both sides."""
    read, beside = _work(name)
    return Metric(
        name,
        label,
        read,
        beside,
        threshold=threshold,
        group="work",
        heading=heading,
        json=None,  # the report's "work" holds the counters
        chart=chart,
        bisect=True,
        doc="work" if threshold else None,
    )


# ------------------------------------------------------------------------- the registry

BUILTIN: tuple[Metric, ...] = (
    Metric(
        "latency",
        "latency",
        _p50,
        _base_p50,
        fmt=units.seconds,
        unit="s",
        rule="own",
        threshold="latency_regression",
        timing=True,
        column="p50 latency (Δ, trend)",
        json="p50_s",
        bisect=True,
        doc="latency",
    ),
    Metric(
        "speedup",
        "speedup vs eager",
        _speedup,
        fmt=units.speedup,
        unit="x",
        better="higher",
        rule="own",
        threshold="speedup_regression",
        timing=True,
        column="speedup vs eager",
        doc="speedup vs eager",
    ),
    Metric(
        "compile",
        "compile time",
        _compile,
        fmt=units.seconds,
        unit="s",
        rule="own",
        threshold="compile_time_regression",
        floor=1.0,
        column="compile",
        json="compile_s",
        bisect=True,
        doc="compile time",
    ),
    Metric(
        "graph-breaks",
        "graph breaks",
        _breaks,
        _base_breaks,
        rule="own",
        relative=False,
        policy="graph_breaks",
        column="graph breaks",
        json="graph_breaks",
        bisect=True,
        doc="graph breaks",
    ),
    Metric(
        "recompiles",
        "recompiles",
        _recompiles,
        rule="own",
        relative=False,
        policy="recompiles",
        column="recompiles",
        doc="recompiles",
    ),
    Metric(
        "memory",
        "peak memory",
        _peak,
        fmt=units.size,
        unit="B",
        rule="own",
        threshold="memory_regression",
        floor={"cuda": 1 << 20, "cpu": 256 << 10, "rss": 8 << 20},
        sources={
            "cuda": "CUDA max allocated",
            "cpu": "peak bytes allocated",
            "rss": "peak RSS growth",
        },
        source=_memory_source,
        column="peak mem compiled (MiB)",
        json=None,  # the report's "memory" holds both peaks and the source
        bisect=True,
        doc="peak memory",
    ),
    Metric(
        "parity",
        "parity",
        _parity,
        fmt=units.sci,
        better=None,
        rule="own",
        policy="parity",
        column="parity (max abs err)",
        json=None,  # the report's "parity" holds both checks
        bisect=True,
        doc="parity",
    ),
    # a quantized target's output vs its own float model's (gate.quantized: its rule, with
    # the per-config floor gate.sqnr_floor and the float twin's latency)
    Metric(
        "sqnr",
        "SQNR vs float",
        _sqnr,
        _base_sqnr,
        fmt=units.db,
        unit="dB",
        better="higher",
        rule="own",
        threshold="sqnr_regression",
        relative=False,
        column="SQNR vs float",
        json=None,  # the report's "quantization" holds it, the base's and the twin ratios
        doc="SQNR (quantized targets)",
    ),
    # generate targets (docs/generation.md; their rules: gate/generation.py)
    Metric(
        "ttft",
        "time to first token",
        *_generated("ttft_s"),
        fmt=units.seconds,
        unit="s",
        rule="own",
        threshold="ttft_regression",
        timing=True,
        samples="first_token",
        column="TTFT",
        json="ttft_s",
        chart=Chart("ttft", "Time to first token", "generate: prefill, compiled", "s"),
        bisect=True,
        doc="time to first token",
    ),
    Metric(
        "tpot",
        "decode",
        *_generated("tpot_s"),
        fmt=units.per_token,
        unit="s/token",
        rule="own",
        threshold="tpot_regression",
        timing=True,
        samples="per_token",
        column="decode",
        json="tpot_s",
        chart=Chart("tpot", "Time per output token", "generate: decode, compiled", "s/token"),
        bisect=True,
        doc="time per output token",
    ),
    Metric(
        "tokens-per-s",
        "decode tokens/s",
        *_generated("tokens_per_s"),
        fmt=units.rate,
        unit="tokens/s",
        better="higher",
        rule="own",
        threshold="tokens_per_s_regression",
        timing=True,
        samples="per_token",  # tokens/s is the batch over it
        column="tokens/s",
        json="tokens_per_s",
        chart=Chart("tokens-per-s", "Decode tokens/s", "generate: compiled", "tokens/s"),
        bisect=True,
        doc="decode tokens/s",
    ),
    Metric(
        "decode-recompiles",
        "recompiles during decode",
        _decode_recompiles,
        _decode_recompiles,
        rule="own",
        relative=False,
        policy="recompiles",
        json="decode_recompiles",
        chart=Chart(
            "decode-recompiles", "Recompiles during decode", "generate: steady decode", "compiles"
        ),
        bisect=True,
        doc="recompiles during decode",
    ),
    counter(
        "flops",
        "FLOPs per call",
        "FLOPs / call",
        Chart("work-flops", "FLOPs", "work counter: flops", "FLOPs"),
        "work_regression",
    ),
    counter(
        "bytes_accessed",
        "bytes accessed per call",
        "bytes accessed / call",
        Chart("work-bytes_accessed", "Bytes accessed", "work counter: bytes_accessed", "bytes"),
        "work_regression",
    ),
    counter(
        "kernels",
        "kernels generated",
        "kernels generated",
        Chart("work-kernels", "Kernels", "work counter: kernels", "kernels"),
    ),
    counter(
        "instructions",
        "instructions per call",
        "instructions / call",
        Chart("work-instructions", "Instructions", "work counter: instructions", "instructions"),
    ),
)
GROUPS = {"work": "Work per call (deterministic)"}  # a group's details table's title

_REGISTRY: dict[str, Metric] = {m.name: m for m in BUILTIN}


def register(metric: Metric) -> Metric:
    """Add a metric (a plugin's, or a test's); its name must be new."""
    if metric.name in _REGISTRY or metric.name in GROUPS:
        raise ValueError(f"metric {metric.name!r} is already registered")
    _REGISTRY[metric.name] = metric
    return metric


def unregister(name: str) -> None:
    if name in {m.name for m in BUILTIN}:
        raise ValueError(f"metric {name!r} is built in")
    _REGISTRY.pop(name, None)


def registry() -> list[Metric]:
    """Every metric, built-in first, in the report's order."""
    return list(_REGISTRY.values())


def get(name: str) -> Metric:
    return _REGISTRY[name]


def counted() -> list[Metric]:
    """The metrics the gate's generic rule judges."""
    return [m for m in _REGISTRY.values() if m.rule == "counted"]


def group(name: str) -> list[Metric]:
    return [m for m in _REGISTRY.values() if m.group == name]


def bisectable() -> tuple[str, ...]:
    """bisect's ``--metric`` choices: each bisected metric, a group once by its name."""
    return tuple(dict.fromkeys(m.bisect_name for m in _REGISTRY.values() if m.bisect))


def members(name: str) -> list[Metric]:
    """What bisect's ``--metric name`` judges: the metric, or its group's gated members."""
    if name in _REGISTRY and _REGISTRY[name].group is None:
        return [_REGISTRY[name]]
    return [m for m in group(name) if m.threshold is not None]
