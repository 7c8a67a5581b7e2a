"""Noise and drift, in one place: how much a target's latency moves within one run and
between runs (processes) on the runner that measures it.

Within one process interleaved rounds scatter little; between processes the whole
level moves (frequency, memory layout, the neighbours of a shared runner). A stored
baseline was measured in another process, so the gate needs the drift *between* runs,
estimated here from the baseline's recent history, and assumed (``DEFAULT_DRIFT``) until
that history is long enough. No torch, no store.
"""

from __future__ import annotations

import statistics

from ..results import Latency, LatencySummary, Noise, RunMedians, TargetResult
from . import stats

# assumed drift between processes (sd of log run medians) while a baseline's history
# cannot estimate it yet: measured 5.8% (latency / reference) and 1.6% (compiled/eager)
# over 58 quiet processes on a 2-core runner (docs/statistics.md, "Where the noise
# is"); these priors are wider
DEFAULT_DRIFT = 0.10
DEFAULT_VS_EAGER_DRIFT = 0.03
HISTORY_FOR_NOISE = 10  # runs (processes) behind a baseline's noise figures

# A run is disturbed when, while it was timed, other processes used this much CPU (in
# cores, on average) on a machine left without a free core, or the reference workload
# scattered this much within the run, or (stored mode) ran this many times slower or
# faster than in the baseline's run. A disturbed run cannot decide a timing regression
# either way (gate.rules).
DISTURBED_OTHERS_CORES = 0.25
CONTENDED = 0.9  # ... and, with the run's own, they used more than this share of the cores
DISTURBED_REFERENCE_NOISE = 0.10
DISTURBED_REFERENCE_SHIFT = 1.5


def normalised_latency(r: TargetResult, use_reference: bool = True) -> list[float]:
    """Compiled latency per round, divided by that round's reference workload when both
    were measured: the figure the gate compares across processes."""
    s = r.latency.samples if r.latency else {}
    if use_reference and s.get("reference"):
        return [c / ref for c, ref in zip(s["compiled"], s["reference"], strict=False)]
    return list(s.get("compiled", []))


def is_normalised(r: TargetResult) -> bool:
    return bool(r.latency and r.latency.samples.get("reference"))


def run_medians(r: TargetResult, use_reference: bool = True) -> list[tuple[float, float]]:
    """Per process behind ``r`` (several once re-measured): the median normalised
    latency and the median compiled/eager round ratio."""
    s = r.latency.samples if r.latency else {}
    lat, comp, eager = (
        normalised_latency(r, use_reference),
        s.get("compiled", []),
        s.get("eager", []),
    )
    out, start = [], 0
    for count in r.latency.runs if r.latency and r.latency.runs else [len(lat)]:
        stop = start + count
        if stop > start:
            out.append(
                (
                    statistics.median(lat[start:stop]),
                    statistics.median(
                        [c / e for c, e in zip(comp[start:stop], eager[start:stop], strict=False)]
                    ),
                )
            )
        start = stop
    return out


def disturbance(result: TargetResult, base: TargetResult | None = None) -> str | None:
    """How disturbed ``result``'s timing was, in words, or None when it was quiet."""
    lat = result.latency
    if lat is None:
        return None
    found = []
    d = lat.disturbance
    if (
        d is not None
        and d.others_cores is not None
        and d.others_cores >= DISTURBED_OTHERS_CORES
        and d.others_cores + (d.own_cores or 0.0) > CONTENDED * d.cores
    ):
        found.append(
            f"other processes used {d.others_cores:.1f} of {d.cores} cores while "
            f"it was timed (it used {d.own_cores or 0:.1f})"
        )
    # on a GPU the reference (small matmuls) is launch-bound and jittery by itself (5-18%
    # within a run on an idle H100): only a CPU run reads contention from its spread.
    # Paired, base and head share every round, so jitter lands on both and widens the
    # interval of their ratio, which then says inconclusive by itself; a 2-core runner
    # using both cores scatters the reference 15% with nothing else running, which must
    # not veto a paired verdict (other processes' CPU still does)
    if (
        d is not None
        and d.reference_noise is not None
        and result.device == "cpu"
        and result.paired is None
        and d.reference_noise > DISTURBED_REFERENCE_NOISE
    ):
        found.append(f"the reference workload scattered {d.reference_noise:.0%} within the run")
    if (
        result.paired is None
        and base is not None
        and base.latency
        and lat.reference
        and base.latency.reference
    ):
        shift = lat.reference.p50 / base.latency.reference.p50
        if not 1 / DISTURBED_REFERENCE_SHIFT <= shift <= DISTURBED_REFERENCE_SHIFT:
            found.append(
                f"the reference workload ran {shift:.2g}x as long as in the baseline's run"
            )
    return "; ".join(found) or None


def measure_noise(result: TargetResult, history: list[TargetResult]) -> Noise | None:
    """Within-process noise of this run, and the drift between runs of the same code
    over the recent history: the second is what one run's samples cannot show, and what
    the stored-baseline gate pays for (see gatekeeper.gate.rules)."""
    samples = normalised_latency(result)
    if len(samples) < 5:
        return None
    within = stats.noise(samples)
    runs = [
        RunMedians(
            measured_at=r.measured_at or "",
            code_hash=r.code_hash,
            latency=lat,
            vs_eager=ratio,
            normalised=is_normalised(r),
        )
        for r in [*(h for h in history if h.measured_at != result.measured_at), result]
        for lat, ratio in run_medians(r)
    ][-HISTORY_FOR_NOISE:]
    mine = [m for m in runs if m.normalised == runs[-1].normalised]
    between, df = stats.pooled_sd(_by_code(mine, "latency"))
    vs_eager_between, _ = stats.pooled_sd(_by_code(mine, "vs_eager"))
    same = sum(m.code_hash == result.code_hash for m in mine)
    detectable = stats.runs_detectable_change(
        between or DEFAULT_DRIFT, df if between else None, same
    )
    return Noise(
        within=within,
        between=between,
        vs_eager_between=vs_eager_between,
        df=df,
        runs=runs,
        detectable=detectable,
    )


def _by_code(runs: list[RunMedians], field: str) -> list[list[float]]:
    groups: dict[str, list[float]] = {}
    for m in runs:
        groups.setdefault(m.code_hash, []).append(getattr(m, field))
    return list(groups.values())


def merge_latency(a: Latency, b: Latency) -> Latency:
    """Two measurements of one target pooled into one (a re-measured borderline result)."""
    samples = {k: a.samples.get(k, []) + b.samples.get(k, []) for k in a.samples}

    def summary(xs: list[float]) -> LatencySummary:
        s = stats.summarize(xs)
        return LatencySummary(
            n=s.n,
            mean=s.mean,
            p50=s.median,
            p95=s.p95,
            p99=s.p99,
            min=s.min,
            max=s.max,
            stdev=s.stdev,
        )

    eager, compiled = summary(samples["eager"]), summary(samples["compiled"])
    runs = [*(a.runs or [len(a.samples["compiled"])]), *(b.runs or [len(b.samples["compiled"])])]
    worst = max(
        (d for d in (a.disturbance, b.disturbance) if d is not None),
        key=lambda d: (d.others_cores or 0.0, d.reference_noise or 0.0),
        default=None,
    )
    return Latency(
        eager=eager,
        compiled=compiled,
        reference=summary(samples["reference"]) if samples.get("reference") else None,
        speedup=eager.p50 / compiled.p50,
        throughput=1.0 / compiled.p50,
        inner_loops=a.inner_loops,
        samples=samples,
        runs=runs,
        disturbance=worst,
    )
