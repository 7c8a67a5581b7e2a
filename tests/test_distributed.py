"""Distributed targets without running ranks: the config, ids and keys, how the ranks'
answers merge (the slowest rank per round, the worst rank's parity), the warm rule, which
rank a slowdown is on, and which rank a failure is blamed on. The ranks themselves run
in tests/e2e/test_distributed.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from gatekeeper import distributed, kinds
from gatekeeper.boundary import ranks
from gatekeeper.boundary.merge import merge
from gatekeeper.boundary.protocol import BaseMeasured, Graphs, Response
from gatekeeper.config import Config
from gatekeeper.errors import ConfigError, WorkerError
from gatekeeper.key import compile_spec
from gatekeeper.project import expand
from gatekeeper.results import Latency, Parity, ParityCheck, RankResult, TargetResult


def config(**extra) -> Config:
    model = {"name": "mlp", "factory": "m:make", "inputs": [{"shape": [8, 4]}], **extra}
    try:
        return Config.model_validate({"models": [model]}, context={"kinds": kinds})
    except Exception as e:  # pydantic's error, as load_config would turn it
        raise ConfigError(str(e)) from None


def test_world_size_and_mesh_make_the_id_and_the_key_and_only_when_set() -> None:
    plain = expand(config())[0]
    ranked = expand(config(distributed={"world_size": 2, "mesh": {"dp": 1, "tp": 2}}))[0]
    assert plain.id == "mlp/fixed/default" and ranked.id == "mlp/fixed/default+ws2"
    assert "distributed" not in compile_spec(plain)  # existing keys do not move
    assert compile_spec(ranked)["distributed"] == {
        "world_size": 2,
        "backend": "auto",
        "mesh": {"dp": 1, "tp": 2},
    }
    train = expand(config(tasks=["train"], distributed={"world_size": 4}))[0]
    assert train.id == "mlp/fixed/default+train+ws4"


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"distributed": {"world_size": 2, "mesh": {"dp": 2, "tp": 2}}}, "make 4 ranks, not 2"),
        ({"distributed": {"world_size": 0}}, "world_size"),
        ({"distributed": {"world_size": 2, "backend": "mpi"}}, "backend"),
        (
            {"distributed": {"world_size": 2}, "strategies": ["whole", "regional"]},
            '"regional" does not run as ranks',
        ),
    ],
    ids=["mesh-product", "zero-ranks", "unknown-backend", "regional"],
)
def test_a_distributed_config_that_cannot_be_is_a_config_error(extra: dict, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        config(**extra)


def test_a_distributed_target_carries_no_precompile_package() -> None:
    target = expand(config(distributed={"world_size": 2}))[0]
    why = kinds.package("precompile").refusal(target)
    assert why is not None and "distributed" in why
    assert kinds.of(target).launch(target.model).ranks == 2
    assert kinds.of(expand(config())[0]).launch(target.model).launcher is not None
    assert kinds.of(target).launch(expand(config())[0].model).launcher is None


def _lat(compiled: list[float], eager: list[float]) -> Latency:
    def summary(xs: list[float]) -> dict:
        return {
            "n": len(xs),
            "mean": 1,
            "p50": 1,
            "p95": 1,
            "p99": 1,
            "min": 1,
            "max": 1,
            "stdev": 0,
        }

    return Latency.model_validate(
        {
            "eager": summary(eager),
            "compiled": summary(compiled),
            "speedup": 1.0,
            "throughput": 1.0,
            "inner_loops": 1,
            "samples": {"eager": eager, "compiled": compiled, "reference": [1.0] * len(eager)},
        }
    )


def _answer(rank: int, compiled: list[float], cpu: list[float], err: float, passed=True):
    return Response(
        ok=True,
        rank=rank,
        compile_seconds=10.0 + rank,
        counters={"fxgraph_cache_hit": 1, "fxgraph_cache_miss": 0, "graphs": 1},
        latency=_lat(compiled, [5.0] * len(compiled)),
        cpu_samples={"compiled": cpu, "base": [1.0] * len(cpu)},
        parity=Parity(vs_eager=ParityCheck(passed=passed, method="allclose", max_abs_err=err)),
        paired=BaseMeasured(
            compile_seconds=9.0, graphs=Graphs(count=1, breaks=0), samples=[1.0, 1.0, 1.0]
        ),
    )


def test_each_round_is_its_slowest_rank_and_each_rank_keeps_its_own_medians() -> None:
    r0 = _answer(0, [1.0, 3.0, 1.0], [0.5, 0.5, 0.5], 1e-7)
    r1 = _answer(1, [2.0, 2.0, 2.0], [1.8, 1.9, 2.0], 3e-7)
    merged = merge([r0, r1])
    assert merged.latency is not None
    assert merged.latency.samples["compiled"] == [2.0, 3.0, 2.0]
    assert merged.latency.compiled.p50 == 2.0
    assert merged.compile_seconds == 11.0
    assert merged.counters is not None and merged.counters["fxgraph_cache_hit"] == 2
    assert merged.ranks is not None
    assert [(r.rank, r.slowest_rounds, r.cpu_p50) for r in merged.ranks] == [
        (0, 1, 0.5),
        (1, 2, 1.9),
    ]
    assert merged.parity is not None
    assert merged.parity.vs_eager.max_abs_err == 3e-7
    assert merged.parity.vs_eager.detail == "worst of 2 ranks: rank 1"


def test_one_rank_failing_parity_fails_the_target_naming_it() -> None:
    r0 = _answer(0, [1.0], [1.0], 1e-7)
    r1 = _answer(1, [1.0], [1.0], 0.5, passed=False)
    merged = merge([r0, r1])
    assert merged.parity is not None and not merged.parity.vs_eager.passed
    assert merged.parity.vs_eager.detail == "rank 1 of 2"


def _manifest(info: dict | None) -> SimpleNamespace:
    return SimpleNamespace(compile={"distributed": info} if info is not None else {})


def test_a_bundle_that_could_warm_one_rank_and_not_another_is_not_restored() -> None:
    target = expand(config(distributed={"world_size": 2}))[0]
    full = {"shared": ["fxgraph/a"], "ranks": {"0": [], "1": []}}
    assert distributed.would_split(_manifest(full), target) is None
    own = {"shared": [], "ranks": {"0": ["fxgraph/a0"], "1": ["fxgraph/a1"]}}
    assert distributed.would_split(_manifest(own), target) is None
    one = {"shared": [], "ranks": {"0": ["fxgraph/a0"], "1": []}}
    assert "rank 1 used no file" in (distributed.would_split(_manifest(one), target) or "")
    gone = {"shared": ["fxgraph/a"], "ranks": {"0": []}}
    assert "no record of rank 1" in (distributed.would_split(_manifest(gone), target) or "")
    assert "records no ranks" in (distributed.would_split(_manifest(None), target) or "")
    assert distributed.would_split(_manifest(None), expand(config())[0]) is None


def _result(ranks: list[RankResult]) -> TargetResult:
    return TargetResult(
        target="t", model="m", env_key="e", code_hash="c", device="cpu", status="ok", ranks=ranks
    )


def test_the_slow_rank_is_the_one_whose_cpu_time_rose_most() -> None:
    paired = _result(
        [
            RankResult(rank=0, cpu_p50=1.1, base_cpu_p50=1.0, latency_p50=3.0),
            RankResult(rank=1, cpu_p50=3.0, base_cpu_p50=1.0, latency_p50=3.0),
        ]
    )
    assert distributed.slow_rank(paired) == "rank 1: CPU per call +200% (rank 0 +10%)"
    stored = _result([RankResult(rank=0, cpu_p50=2.0), RankResult(rank=1, cpu_p50=1.0)])
    base = _result([RankResult(rank=0, cpu_p50=1.0), RankResult(rank=1, cpu_p50=1.0)])
    assert distributed.slow_rank(stored, base) == "rank 0: CPU per call +100% (rank 1 +0%)"
    assert distributed.slow_rank(stored) is None  # nothing to compare with


def _fail(tmp: Path, launched: dict, answers: list[Response | None]) -> Response:
    return ranks._failed("t", launched, answers, tmp, 1, tmp)


def test_the_rank_blamed_is_the_one_that_failed_not_its_peer(tmp_path: Path) -> None:
    peer = Response.failure("compile", "RuntimeError: Connection closed by peer [127.0.0.1]")
    own = Response.failure("compile", "ValueError: factory exploded (at m.py:3)")
    assert (
        _fail(tmp_path, {}, [peer, own]).error == "rank 1: ValueError: factory exploded (at m.py:3)"
    )
    # a rank killed by a signal wrote no answer: its death is the error, named
    died = {"failures": {"0": "exited with code 1", "1": "killed by SIGSEGV"}}
    with pytest.raises(WorkerError, match="t: rank 1: killed by SIGSEGV"):
        _fail(tmp_path, died, [peer, None])
    # the ranks the agent stopped are not the cause
    stopped = {"failures": {"0": "killed by SIGTERM", "1": "exited with code 3"}}
    with pytest.raises(WorkerError, match="rank 1: exited with code 3"):
        _fail(tmp_path, stopped, [None, None])


def test_every_rank_failing_alike_is_said_once(tmp_path: Path) -> None:
    same = Response.failure("config", "model 'm' is distributed, but its 2 ranks never called")
    out = _fail(tmp_path, {}, [same, same])
    assert out.fault == "config" and out.error == same.error
