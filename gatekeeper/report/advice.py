"""Which compile mode? When a model lists several modes, compare them per shape set: cold
and warm compile time, p50, speedup vs eager, peak memory and the break-even call count
(compile time / time saved per call), and name a mode for serving and one for short jobs,
with the rule used. Pure: no I/O, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..results import TargetResult

SHORT_JOB_CALLS = 1000  # a short job: this many calls, starting from a cold compile
TIE = 0.03  # p50s within 3% are a tie for serving


@dataclass(frozen=True)
class ModeFigures:
    mode: str
    target: str
    cold_s: float | None  # first compiled call with an empty cache
    warm_s: float | None  # first compiled call after a warm start (bundle restored)
    p50: float  # compiled, seconds per call
    eager_p50: float
    peak: int | None  # compiled peak memory, bytes
    ok: bool  # measured, and parity vs eager passed

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
    serving: str | None
    serving_rule: str
    short_job: str | None  # a mode, or "eager"
    short_job_rule: str


def figures(r: TargetResult, mode: str) -> ModeFigures | None:
    if r.status != "ok" or r.latency is None or r.compile is None:
        return None
    c = r.compile
    cold = c.seconds if c.state == "cold" else c.cold_seconds
    warm = c.seconds if c.state == "warm" else None
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
    )


def advise(results: list[TargetResult]) -> list[Advice]:
    """One Advice per (model, shape set, other variant parts) measured in several modes."""
    groups: dict[tuple[str, str, str], list[ModeFigures]] = {}
    for r in results:
        model, shapes, variant = r.target.split("/")
        mode, _, rest = variant.partition("+")
        f = figures(r, mode)
        if f is not None:
            groups.setdefault((model, shapes, rest), []).append(f)
    out = []
    for (model, shapes, rest), modes in groups.items():
        if len({f.mode for f in modes}) < 2:
            continue
        out.append(_advice(model, shapes + (f"+{rest}" if rest else ""), modes))
    return out


def _advice(model: str, shapes: str, modes: list[ModeFigures]) -> Advice:
    good = [f for f in modes if f.ok]
    serving, serving_rule = None, "no mode passed parity"
    if good:
        fastest = min(f.p50 for f in good)
        tied = [f for f in good if f.p50 <= fastest * (1 + TIE)]
        best = min(
            tied,
            key=lambda f: (
                f.peak if f.peak is not None else math.inf,
                f.warm_s if f.warm_s is not None else math.inf,
            ),
        )
        serving = best.mode
        serving_rule = (
            f"lowest p50 (a deploy compiles once and warm-starts); modes within "
            f"{TIE:.0%} of it tie, then the smaller peak memory wins"
        )
    short, short_rule = None, "no cold compile time was measured"
    timed = [f for f in good if f.cold_s is not None]
    if timed:
        n = SHORT_JOB_CALLS
        totals = {f.mode: f.cold_s + n * f.p50 for f in timed}  # type: ignore[operator]
        eager = n * timed[0].eager_p50
        best_mode = min(totals, key=totals.__getitem__)
        short = best_mode if totals[best_mode] < eager else "eager"
        short_rule = (
            f"smallest cold compile + {n:,} calls × p50, against {n:,} eager calls ({eager:.2f} s)"
        )
    return Advice(
        model, shapes, sorted(modes, key=lambda f: f.mode), serving, serving_rule, short, short_rule
    )
