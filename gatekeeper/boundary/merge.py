"""A distributed target's answers, one per rank, made into the one answer the parent's
commands read (no torch here).

* **Latency**: a distributed step is as fast as its slowest rank, so each timed round's
  sample is the maximum over ranks (the ranks agreed on the rounds and started each
  together, :mod:`gatekeeper.worker.team`); each rank's own medians, wall and CPU, go
  into :attr:`Response.ranks` (the spread, and which rank does the work).
* **Compile**: the slowest rank's first call; FX and AOTAutograd counters summed; the
  cache files every rank used, shared where all used one, per rank where not.
* **Parity**: the worst rank's check, named in its detail.
"""

from __future__ import annotations

from statistics import median
from typing import Any

from ..gate import stats
from ..results import Latency, Parity, ParityCheck, RankResult
from .protocol import BaseMeasured, Response

_COUNTED = ("fxgraph_cache_hit", "fxgraph_cache_miss", "autograd_cache_hit", "autograd_cache_miss")


def merge(answers: list[Response]) -> Response:
    """One answer from every rank's (in rank order, all ``ok``)."""
    first = answers[0]
    used = [a.cache_used for a in answers]
    update: dict[str, Any] = {
        "rank": None,
        "cpu_samples": None,
        "compile_seconds": _most(a.compile_seconds for a in answers),
        "import_seconds": _most(a.import_seconds for a in answers),
        "call_seconds": _per_index_max([a.call_seconds for a in answers]),
        "counters": _counters([a.counters for a in answers]),
        "cache_used": sorted({f for u in used for f in u or ()})
        if all(u is not None for u in used)
        else None,
        "parity": _parity([a.parity for a in answers]),
        "memory": _memory(answers),
        "ranks": [_rank(n, a) for n, a in enumerate(answers)],
    }
    if first.latency is not None and all(a.latency for a in answers):
        update["latency"] = _latency([a.latency for a in answers if a.latency is not None])
        slowest = _slowest([a.latency.samples["compiled"] for a in answers if a.latency])
        for rank, count in zip(update["ranks"], slowest, strict=True):
            rank.slowest_rounds = count
    if first.paired is not None and all(a.paired for a in answers):
        update["paired"] = _paired([a.paired for a in answers if a.paired is not None])
    return first.model_copy(update=update)


def _most(values: Any) -> float | None:
    found = [v for v in values if v is not None]
    return max(found) if found else None


def _per_index_max(series: list[list[float] | None]) -> list[float] | None:
    if any(s is None for s in series):
        return None
    return [max(xs) for xs in zip(*series, strict=False)]


def _counters(each: list[dict[str, int] | None]) -> dict[str, int] | None:
    if any(c is None for c in each):
        return None
    found = [c for c in each if c is not None]
    out = dict(found[0])
    for name in _COUNTED:
        out[name] = sum(c.get(name, 0) for c in found)
    return out


def _memory(answers: list[Response]) -> Any:
    """The rank with the highest compiled peak (each rank holds its own share)."""
    found = [a.memory for a in answers if a.memory is not None]
    if not found:
        return None
    return max(found, key=lambda m: m.compiled_peak_bytes or 0)


def _worst(checks: list[tuple[int, ParityCheck]]) -> ParityCheck:
    failed = [(r, c) for r, c in checks if not c.passed]
    rank, check = failed[0] if failed else max(checks, key=lambda rc: rc[1].max_abs_err or 0.0)
    said = (
        f"rank {rank} of {len(checks)}" if failed else f"worst of {len(checks)} ranks: rank {rank}"
    )
    detail = f"{said}: {check.detail}" if check.detail else said
    return check.model_copy(update={"detail": detail})


def _parity(each: list[Parity | None]) -> Parity | None:
    if any(p is None for p in each):
        return None
    found = [p for p in each if p is not None]
    vs_eager = _worst(list(enumerate(p.vs_eager for p in found)))
    base = [(r, p.vs_baseline) for r, p in enumerate(found) if p.vs_baseline is not None]
    return found[0].model_copy(
        update={"vs_eager": vs_eager, "vs_baseline": _worst(base) if base else None}
    )


def round_max(series: list[list[float]]) -> list[float]:
    """Each round's slowest rank."""
    return [max(xs) for xs in zip(*series, strict=True)]


def _latency(each: list[Latency]) -> Latency:
    samples = {name: round_max([lat.samples[name] for lat in each]) for name in each[0].samples}
    eager, compiled = stats.summary_doc(samples["eager"]), stats.summary_doc(samples["compiled"])
    disturbed = [lat.disturbance for lat in each if lat.disturbance is not None]
    worst = max(disturbed, key=lambda d: d.others_cores or 0.0) if disturbed else None
    return Latency.model_validate(
        {
            **each[0].model_dump(),
            "samples": samples,
            "eager": eager,
            "compiled": compiled,
            "reference": stats.summary_doc(samples["reference"])
            if samples.get("reference")
            else None,
            "speedup": eager["p50"] / compiled["p50"],
            "throughput": 1.0 / compiled["p50"],
            "disturbance": worst.model_dump() if worst else None,
        }
    )


def _slowest(series: list[list[float]]) -> list[int]:
    """How many rounds each rank was the slowest in."""
    counts = [0] * len(series)
    for xs in zip(*series, strict=True):
        counts[xs.index(max(xs))] += 1
    return counts


def _paired(each: list[BaseMeasured]) -> BaseMeasured:
    return each[0].model_copy(
        update={
            "compile_seconds": max(p.compile_seconds for p in each),
            "samples": round_max([p.samples for p in each]),
            "same_inputs": all(p.same_inputs for p in each),
        }
    )


def _p50(xs: list[float] | None) -> float | None:
    return median(xs) if xs else None


def _rank(n: int, a: Response) -> RankResult:
    counters = a.counters or {}
    checks = [a.parity.vs_eager, a.parity.vs_baseline] if a.parity else []
    cpu = a.cpu_samples or {}
    return RankResult(
        rank=a.rank if a.rank is not None else n,
        pid=a.pid,
        compile_seconds=a.compile_seconds,
        fxgraph_cache_hit=counters.get("fxgraph_cache_hit", 0),
        fxgraph_cache_miss=counters.get("fxgraph_cache_miss", 0),
        parity=all(c.passed for c in checks if c is not None) if a.parity else None,
        latency_p50=_p50(a.latency.samples.get("compiled")) if a.latency else None,
        cpu_p50=_p50(cpu.get("compiled")),
        base_latency_p50=_p50(a.paired.samples) if a.paired else None,
        base_cpu_p50=_p50(cpu.get("base")),
        cache_used=a.cache_used,
    )
