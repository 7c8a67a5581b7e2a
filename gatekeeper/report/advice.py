"""Which mode and strategy? When a model is compiled in several modes or strategies
(artifact kinds: ``whole``, ``regional``, ``aot``, ...), compare every (mode, strategy)
per shape set: cold compile time, the deploy's first call (after a warm start; for a
kind whose deploys load a package, loading it), p50, speedup vs eager, peak memory and
the break-even call count (compile time / time saved per call), and name one for
serving and one for short jobs, with the rule used. A kind whose deploys load a package
is recommended only where a check verified the package. Pure: no I/O, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .. import kinds
from ..results import TargetResult

SHORT_JOB_CALLS = 1000  # a short job: this many calls, starting from a cold compile
TIE = 0.03  # p50s within 3% are a tie for serving


@dataclass(frozen=True)
class ModeFigures:
    mode: str
    target: str
    cold_s: float | None  # first compiled call with an empty cache (aot: export + package)
    warm_s: float | None  # the deploy's first call: after a warm start (aot: package loaded)
    p50: float  # compiled, seconds per call
    eager_p50: float
    peak: int | None  # compiled peak memory, bytes
    ok: bool  # measured, and parity vs eager passed
    strategy: str = kinds.DEFAULT
    verified: bool | None = None  # a package a deploy loads (aot): verified by a check

    @property
    def kind(self) -> kinds.Kind:
        return kinds.get(self.strategy)

    @property
    def label(self) -> str:
        """``default``, ``default+regional``, ``max-autotune+aot``."""
        return kinds.label(self.kind, self.mode)

    @property
    def loads_package(self) -> bool:
        """Whether a deploy loads its kind's package instead of compiling."""
        return self.kind.package is not None and self.kind.package.standalone

    @property
    def eligible(self) -> bool:
        """Whether it may be recommended: parity passed, and a package a deploy loads
        verified."""
        return self.ok and (not self.loads_package or self.verified is True)

    @property
    def speedup(self) -> float:
        return self.eager_p50 / self.p50

    @property
    def saved(self) -> float:
        """Seconds saved per call by compiling."""
        return self.eager_p50 - self.p50

    def break_even(self, compile_s: float | None) -> float | None:
        """Calls after which the compile has paid for itself (inf: never)."""
        if compile_s is None:
            return None
        return compile_s / self.saved if self.saved > 0 else math.inf


@dataclass(frozen=True)
class Advice:
    model: str
    shapes: str
    modes: list[ModeFigures]
    serving: str | None  # a label (mode, or mode+strategy)
    serving_rule: str
    short_job: str | None  # a label, or "eager"
    short_job_rule: str
    # (mode+strategy, why) of the ones that have no figures: an aot target that did not
    # export, or one whose measurement failed
    unavailable: list[tuple[str, str]] = field(default_factory=list)

    @property
    def strategies(self) -> bool:
        """Whether more than the default strategy is compared."""
        return any(f.strategy != kinds.DEFAULT for f in self.modes) or any(
            "+" in label for label, _ in self.unavailable
        )


def split_variant(variant: str) -> tuple[str, str, str]:
    """``default+bf16+aot`` -> (``default``, ``aot``, ``bf16``): mode, strategy, the rest."""
    mode, *parts = variant.split("+")
    strategy = parts.pop() if parts and parts[-1] in kinds.names() else kinds.DEFAULT
    return mode, strategy, "+".join(parts)


def figures(r: TargetResult, mode: str, strategy: str = kinds.DEFAULT) -> ModeFigures | None:
    if r.status != "ok" or r.latency is None or r.compile is None:
        return None
    c = r.compile
    cold = c.seconds if c.state == "cold" else c.cold_seconds
    warm = c.seconds if c.state == "warm" else None
    verified = None
    own = kinds.get(strategy).package
    if own is not None and own.standalone:
        doc = r.packages.get(own.name) or {}
        verified = doc.get("verified")
        # the deploy's first call: the verified package, loaded in a fresh process
        first = doc.get("first_call_seconds")
        warm = first if isinstance(first, (int, float)) else warm
    ok = r.parity is None or r.parity.vs_eager.passed
    return ModeFigures(
        mode,
        r.target,
        cold,
        warm,
        r.latency.compiled.p50,
        r.latency.eager.p50,
        r.memory.compiled_peak_bytes if r.memory else None,
        ok,
        strategy,
        verified,
    )


def advise(results: list[TargetResult]) -> list[Advice]:
    """One Advice per (model, shape set, other variant parts) measured in several modes
    or strategies."""
    groups: dict[tuple[str, str, str], list[ModeFigures]] = {}
    missing: dict[tuple[str, str, str], list[tuple[str, str]]] = {}
    for r in results:
        model, shapes, variant = r.target.split("/")
        mode, strategy, rest = split_variant(variant)
        key = (model, shapes, rest)
        f = figures(r, mode, strategy)
        if f is not None:
            groups.setdefault(key, []).append(f)
        else:
            label = kinds.label(kinds.get(strategy), mode)
            why = r.export.says() if r.export is not None else (r.error or r.status)
            missing.setdefault(key, []).append((label, why))
    out = []
    for key, modes in groups.items():
        unavailable = missing.get(key, [])
        if len({f.label for f in modes}) + len(unavailable) < 2:
            continue
        model, shapes, rest = key
        out.append(_advice(model, shapes + (f"+{rest}" if rest else ""), modes, unavailable))
    return out


def _advice(
    model: str, shapes: str, modes: list[ModeFigures], unavailable: list[tuple[str, str]]
) -> Advice:
    good = [f for f in modes if f.eligible]
    serving, serving_rule = None, "nothing passed parity (an aot package must also verify)"
    if good:
        fastest = min(f.p50 for f in good)
        tied = [f for f in good if f.p50 <= fastest * (1 + TIE)]
        best = min(
            tied,
            key=lambda f: (
                f.warm_s if f.warm_s is not None else math.inf,
                f.peak if f.peak is not None else math.inf,
            ),
        )
        serving = best.label
        serving_rule = (
            f"lowest p50 (a deploy compiles once and warm-starts); within {TIE:.0%} of "
            "it, the smaller deploy first call wins, then the smaller peak memory"
        )
        if best.loads_package and (own := best.kind.package) is not None and own.serving:
            serving_rule += f"; {own.serving}"
    short, short_rule = None, "no cold compile time was measured"
    timed = [f for f in good if f.cold_s is not None]
    if timed:
        n = SHORT_JOB_CALLS
        totals = {f.label: f.cold_s + n * f.p50 for f in timed if f.cold_s is not None}
        eager = n * timed[0].eager_p50
        best_label = min(totals, key=totals.__getitem__)
        short = best_label if totals[best_label] < eager else "eager"
        short_rule = (
            f"smallest cold compile + {n:,} calls × p50, against {n:,} eager calls ({eager:.2f} s)"
        )
    return Advice(
        model,
        shapes,
        sorted(modes, key=lambda f: (f.mode, kinds.names().index(f.strategy))),
        serving,
        serving_rule,
        short,
        short_rule,
        unavailable,
    )
