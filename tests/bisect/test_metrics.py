"""What one measurement says of each metric (no compile): results built by the test
factories, paired with a base commit as check's paired mode fills them in."""

from __future__ import annotations

import numpy as np
import pytest
from support.factories import make_result

from gatekeeper.bisect.metrics import classify, default_threshold, position
from gatekeeper.config import GateConfig
from gatekeeper.results import GraphBreak, Paired, ParityCheck, Work

TARGET = "net/b64/default"
RULES = GateConfig()


def paired(
    result,
    *,
    base_scale: float = 1.0,
    jitter: float = 0.0,
    work: Work | None = None,
    breaks: int = 0,
):
    """``result`` as paired mode measures it: the base's rounds beside its own, the
    head ``base_scale`` times the base's latency, each pair ``jitter`` apart (log-normal)."""
    graphs = result.graphs.model_copy(update={"breaks": breaks, "break_reasons": []})
    compiled = result.latency.samples["compiled"]
    noise = np.random.default_rng(7).lognormal(0.0, jitter, len(compiled))
    noise /= np.exp(np.log(noise).mean())  # the pairs' ratio is base_scale exactly
    result.paired = Paired(
        base_ref="good",
        base_commit="a" * 40,
        code_hash="b0",
        compile_seconds=3.0,
        graphs=graphs,
        samples=[float(x / base_scale * e) for x, e in zip(compiled, noise, strict=True)],
        work=work,
    )
    return result


def latency(scale: float, *, others: float = 0.0, jitter: float = 0.005):
    r = make_result(TARGET, seed=1, noise=0.005, n=200, others_cores=others)
    return paired(r, base_scale=scale, jitter=jitter)


def test_latency_bad_sets_the_direction_and_later_commits_follow_it():
    slow = classify("latency", latency(1.3), None, RULES, 0.1, None)
    assert slow.outcome == "bad" and slow.direction == 1
    assert slow.delta == pytest.approx(0.3, abs=0.02) and slow.ci_lo > 0.1 and slow.p_value < 0.05
    assert "latency +3" in slow.text and "CI" in slow.text
    # bisecting a slowdown, a faster commit is like good, an unchanged one too
    assert classify("latency", latency(0.7), None, RULES, 0.1, 1).outcome == "good"
    assert classify("latency", latency(1.0), None, RULES, 0.1, 1).outcome == "good"
    fast = classify("latency", latency(0.7), None, RULES, 0.1, None)
    assert fast.outcome == "bad" and fast.direction == -1


def test_a_disturbed_or_borderline_latency_is_undecided_and_measured_again():
    disturbed = classify("latency", latency(1.3, others=1.8), None, RULES, 0.1, 1)
    assert disturbed.outcome == "undecided" and disturbed.again and "disturbed" in disturbed.text
    noisy = classify("latency", latency(1.105, jitter=0.08), None, RULES, 0.1, 1)
    assert noisy.outcome == "undecided" and noisy.again
    # a disturbed run still vouches for no change when its whole interval is inside
    same = classify("latency", latency(1.0, others=0.6), None, RULES, 0.1, 1)
    assert same.outcome == "good"


def test_parity_is_the_compiled_outputs_against_the_base_commits():
    r = paired(make_result(TARGET))
    assert classify("parity", r, None, RULES, None, None).outcome == "good"
    r.parity.vs_baseline = ParityCheck(passed=False, method="allclose", detail="max diff 0.5")
    said = classify("parity", r, None, RULES, None, None)
    assert said.outcome == "bad" and said.text == "parity: max diff 0.5"


def test_work_and_graph_breaks_against_the_base_measured_beside():
    base = Work(flops=1_000_000, bytes_accessed=2_000_000)
    more = make_result(TARGET, work=Work(flops=1_000_000, bytes_accessed=2_600_000))
    said = classify("work", paired(more, work=base), None, RULES, 0.1, None)
    assert said.outcome == "bad" and said.delta == pytest.approx(0.3)
    assert "bytes accessed" in said.text and "+30.0%" in said.text
    little = make_result(TARGET, work=Work(flops=1_000_000, bytes_accessed=2_100_000))
    assert classify("work", paired(little, work=base), None, RULES, 0.1, 1).outcome == "good"
    broken = make_result(TARGET, breaks=[GraphBreak(reason="print", file="m.py", line=3)])
    said = classify("graph-breaks", paired(broken), None, RULES, None, None)
    assert said.outcome == "bad" and said.text == "graph breaks 0 -> 1: print at m.py:3"
    assert classify("graph-breaks", paired(make_result(TARGET)), None, RULES, None, 1).outcome == (
        "good"
    )


def test_memory_and_compile_are_compared_with_the_base_measured_alone():
    base = make_result(TARGET, peak=40 << 20, compile_s=6.0)
    bigger = paired(make_result(TARGET, peak=60 << 20, compile_s=6.5))
    said = classify("memory", bigger, base, RULES, 0.05, None)
    assert said.outcome == "bad" and said.direction == 1 and "40.0 MiB -> 60.0 MiB" in said.text
    # 0.5 s more compile is under the gate's floor of a second, whatever the ratio
    assert classify("compile", bigger, base, RULES, 0.05, None).outcome == "good"
    slower = paired(make_result(TARGET, compile_s=9.0))
    assert classify("compile", slower, base, RULES, 0.15, None).outcome == "bad"
    assert classify("memory", bigger, None, RULES, 0.05, None) == (
        "no measurement of the base commit to compare with"
    )


def test_a_result_without_its_base_cannot_say():
    alone = make_result(TARGET)
    for metric in ("latency", "parity", "work", "graph-breaks"):
        assert isinstance(classify(metric, alone, None, RULES, 0.1, None), str)


def test_default_thresholds_are_the_gates():
    assert default_threshold("latency", RULES) == RULES.latency_regression
    assert default_threshold("memory", RULES) == RULES.memory_regression
    assert default_threshold("parity", RULES) is None


def test_position_from_good_to_bad():
    assert position("latency", 1.0, 2.0, 2.0) == pytest.approx(1.0)
    assert position("latency", 1.0, 2.0, 2**0.5) == pytest.approx(0.5)
    assert position("graph-breaks", 0, 2, 1) == 0.5
    assert position("memory", 1.0, 1.0, 3.0) is None
