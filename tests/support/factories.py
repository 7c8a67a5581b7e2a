"""Realistic documents for tests of the gate and the report: measured targets with
log-normal timing noise, and baselines with a history of runs."""

from __future__ import annotations

import numpy as np

from gatekeeper.config import GateConfig
from gatekeeper.gate import drift
from gatekeeper.gate.stats import summarize
from gatekeeper.generation import Generation, Side
from gatekeeper.results import (
    Baseline,
    CompileStats,
    Disturbance,
    GraphBreak,
    Graphs,
    Latency,
    LatencySummary,
    Memory,
    Paired,
    Parity,
    ParityCheck,
    Results,
    TargetResult,
    Work,
)

ENV = "torch2.6.0+cpu-py3.11-cpu-avx512-t2-3f9c1a"
RULES = GateConfig()


def _summary(x: np.ndarray) -> LatencySummary:
    s = summarize(x)
    return LatencySummary(
        n=s.n, mean=s.mean, p50=s.median, p95=s.p95, p99=s.p99, min=s.min, max=s.max, stdev=s.stdev
    )


def make_result(
    target: str,
    *,
    seed: int = 0,
    compiled_s: float = 1e-3,
    eager_s: float = 2e-3,
    reference_s: float = 2e-4,
    noise: float = 0.02,
    n: int = 40,
    breaks: list[GraphBreak] | None = None,
    recompiles: int = 0,
    compile_s: float = 6.0,
    warm: bool = False,
    cache: str = "miss",
    peak: int = 40 << 20,
    parity_ok: bool = True,
    baseline_parity: bool = True,
    code_hash: str = "c0de1234",
    error: str | None = None,
    work: Work | None = None,
    others_cores: float | None = 0.0,
    own_cores: float = 1.0,
    cores: int = 2,
    cold_s: float | None = None,
    mode: str | None = None,
) -> TargetResult:
    """A realistic measured target: interleaved eager/compiled/reference samples with
    log-normal noise, summaries computed from them, counters, memory and parity."""
    model = target.split("/")[0]
    if error is not None:
        return TargetResult(
            target=target,
            model=model,
            env_key=ENV,
            code_hash=code_hash,
            device="cpu",
            status="error",
            error=error,
        )
    rng = np.random.default_rng(seed)
    drift = rng.lognormal(0.0, noise, n)  # shared by the three of one round
    eager = eager_s * drift * rng.lognormal(0.0, noise / 2, n)
    compiled = compiled_s * drift * rng.lognormal(0.0, noise / 2, n)
    ref = reference_s * drift * rng.lognormal(0.0, noise / 2, n)
    breaks = breaks or []
    return TargetResult(
        target=target,
        model=model,
        env_key=ENV,
        code_hash=code_hash,
        device="cpu",
        status="ok",
        compile=CompileStats(
            seconds=compile_s,
            warm=warm,
            cache=cache,
            fxgraph_cache_hit=3 if warm else 0,
            fxgraph_cache_miss=0 if warm else 3,
            autograd_cache_hit=0,
            autograd_cache_miss=0,
            cold_seconds=cold_s,
        ),
        graphs=Graphs(
            count=len(breaks) + 1, breaks=len(breaks), break_reasons=breaks, recompiles=recompiles
        ),
        latency=Latency(
            eager=_summary(eager),
            compiled=_summary(compiled),
            reference=_summary(ref),
            speedup=float(np.median(eager) / np.median(compiled)),
            throughput=float(1 / np.median(compiled)),
            inner_loops=4,
            samples={
                "eager": eager.tolist(),
                "compiled": compiled.tolist(),
                "reference": ref.tolist(),
            },
            disturbance=Disturbance(
                others_cores=others_cores,
                own_cores=own_cores,
                cores=cores,
                reference_noise=summarize(ref).noise,
            ),
        ),
        work=work,
        mode=mode,
        memory=Memory(source="rss", eager_peak_bytes=30 << 20, compiled_peak_bytes=peak),
        parity=Parity(
            vs_eager=ParityCheck(
                passed=parity_ok,
                method="allclose" if parity_ok else "failed",
                max_abs_err=2.4e-7 if parity_ok else 0.31,
                detail=None if parity_ok else "max abs err 0.31 > atol 1e-4",
            ),
            vs_baseline=ParityCheck(passed=True, method="allclose", max_abs_err=1.2e-7)
            if baseline_parity
            else None,
        ),
        measured_at="2025-01-01T00:00:00Z",
    )


def make_baseline(result: TargetResult, ref: str = "main", history: int = 0) -> Baseline:
    """``result`` as the baseline of ``ref``; with ``history``, after that many earlier
    runs of the same code (so the gate knows the runner's drift between runs)."""
    runs = []
    for i in range(history):
        r = make_result(result.target, seed=1000 + i, code_hash=result.code_hash)
        r.measured_at = f"2024-12-{i + 1:02d}T00:00:00Z"
        runs.append(r)
    return Baseline(
        target=result.target,
        env_key=result.env_key,
        ref=ref,
        commit="a1b2c3d4e5f6a7b8",
        created_at="2025-01-01T00:00:00Z",
        published_at="2025-01-01T00:05:00Z",
        result=result,
        noise=drift.measure_noise(result, runs) if history else None,
    )


def make_generation(
    *,
    seed: int = 0,
    ttft_s: float = 4e-3,
    tpot_s: float = 1.2e-2,
    noise: float = 0.02,
    n: int = 40,
    batch: int = 1,
    decode_recompiles: int = 0,
    guards: list[str] | None = None,
) -> Generation:
    """A generate target's figures (gatekeeper.generation.Generation): per-round time to
    first token and time per output token with log-normal noise, a shared drift per
    round (as :func:`make_result`'s samples have)."""
    rng = np.random.default_rng(seed)
    shared = rng.lognormal(0.0, noise, n)
    ttft = ttft_s * shared * rng.lognormal(0.0, noise / 2, n)
    tpot = tpot_s * shared * rng.lognormal(0.0, noise / 2, n)
    tp = float(np.median(tpot))
    side = Side(
        ttft_s=float(np.median(ttft)),
        tpot_s=tp,
        tpot_p95_s=float(np.percentile(tpot, 95)),
        tokens_per_s=batch / tp,
        e2e_s=float(np.median(ttft) + 15 * tp),
    )
    return Generation(
        batch=batch,
        prompt=32,
        new_tokens=16,
        cache="static",
        compiled=side,
        samples={"first_token": ttft.tolist(), "per_token": tpot.tolist()},
        decode_recompiles=decode_recompiles,
        decode_recompile_guards=guards or [],
    )


def base_side(result: TargetResult, samples: list[float] | None = None, **fields) -> Paired:
    """``result``'s paired base (main at ``a...a``, compiled in 3 s, ``result``'s graphs
    unless ``fields`` say otherwise): its rounds ``samples`` (the head's own when None)."""
    assert result.latency is not None
    doc: dict = {"base_ref": "main", "base_commit": "a" * 40, "code_hash": "b0"}
    doc |= {"compile_seconds": 3.0, "graphs": result.graphs}
    doc["samples"] = result.latency.samples["compiled"] if samples is None else samples
    return Paired(**(doc | fields))


def make_results(targets: list[TargetResult], **fields) -> Results:
    """A results document of ``targets`` (a run on ``main``)."""
    doc = dict(
        created_at="2025-01-09T00:00:00Z",
        gatekeeper_version="0",
        creator={},
        base_ref="main",
        targets=targets,
    )
    return Results(**(doc | fields))
