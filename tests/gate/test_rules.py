"""The gate's rules on hand-built results: work counters, disturbed runs, inconclusive
slowdowns, accepted regressions and compile time compared like with like."""

from __future__ import annotations

from support.factories import RULES, base_side, make_baseline, make_result

from gatekeeper.config import GateConfig
from gatekeeper.gate import drift
from gatekeeper.gate import rules as gate
from gatekeeper.results import Work

TARGET = "m/b1/default"
WORK = Work(flops=1_000_000, bytes_accessed=200_000, kernels=3, instructions="unavailable")


def steady(result, runs=(1.0, 1.003, 0.997, 1.002, 0.998, 1.0, 1.001, 0.999, 1.0)):
    """``result`` as a baseline whose history agrees to 0.3% between runs."""
    history = []
    for i, f in enumerate(runs):
        r = make_result(
            TARGET,
            seed=100 + i,
            noise=0.005,
            n=200,
            compiled_s=1e-3 * f,
            eager_s=2e-3 * f,
            reference_s=2e-4,
            code_hash=result.code_hash,
        )
        r.measured_at = f"2024-12-{i + 1:02d}T00:00:00Z"
        history.append(r)
    base = make_baseline(result)
    base.noise = drift.measure_noise(result, history)
    return base


# -- work counters: deterministic, so one stored baseline run is enough ------------------


def test_ten_percent_more_flops_is_regressed_with_a_single_baseline_run():
    base = make_baseline(make_result(TARGET, seed=1, work=WORK))  # no history at all
    pr = make_result(TARGET, seed=2, work=WORK.model_copy(update={"flops": 1_100_000}))
    v = gate.gate_target(pr, base, RULES)
    assert v.verdict == "regressed"
    (reason,) = [r for r in v.reasons if "FLOPs" in r]
    assert "1 M -> 1.1 M" in reason and "+10.0%" in reason and "threshold 5%" in reason


def test_bytes_accessed_growth_is_regressed_and_named():
    base = make_baseline(make_result(TARGET, seed=1, work=WORK))
    pr = make_result(TARGET, seed=2, work=WORK.model_copy(update={"bytes_accessed": 260_000}))
    v = gate.gate_target(pr, base, RULES)
    assert v.verdict == "regressed" and any("bytes accessed" in r for r in v.reasons)


def test_identical_counters_are_never_flagged():
    base = make_baseline(make_result(TARGET, seed=1, work=WORK))
    for seed in range(20):
        v = gate.gate_target(make_result(TARGET, seed=seed, work=WORK), base, RULES)
        assert not any("FLOPs" in r or "bytes" in r for r in v.reasons)


def test_unknown_counters_gate_nothing():
    base = make_baseline(make_result(TARGET, seed=1, work=Work()))
    pr = make_result(TARGET, seed=2, work=WORK)
    assert not any("FLOPs" in r for r in gate.gate_target(pr, base, RULES).reasons)


def test_paired_work_is_compared_with_the_base_commit():
    pr = make_result(TARGET, seed=2, work=WORK.model_copy(update={"flops": 1_200_000}))
    pr.paired = base_side(pr, work=WORK)
    v = gate.gate_target(pr, None, RULES)
    assert v.verdict == "regressed" and any("vs the base commit" in r for r in v.reasons)


# -- disturbed runs: inconclusive or pass, never regressed or improved ------------------


def test_a_disturbed_run_is_never_regressed_nor_improved():
    base = steady(make_result(TARGET, seed=1, noise=0.005, n=200))
    slow = make_result(
        TARGET, seed=2, noise=0.005, n=200, compiled_s=1.5e-3, eager_s=3e-3, others_cores=1.8
    )
    v = gate.gate_target(slow, base, RULES)
    assert v.verdict == "inconclusive"
    assert "other processes used 1.8 of 2 cores" in v.disturbed
    assert any("disturbed" in r for r in v.reasons)
    fast = make_result(
        TARGET, seed=3, noise=0.005, n=200, compiled_s=0.6e-3, eager_s=1.2e-3, others_cores=1.8
    )
    assert gate.gate_target(fast, base, RULES).verdict not in ("improved", "regressed")
    # the same slowdown measured quietly is a regression
    quiet = make_result(TARGET, seed=2, noise=0.005, n=200, compiled_s=1.5e-3, eager_s=3e-3)
    assert gate.gate_target(quiet, base, RULES).verdict == "regressed"


def test_other_load_on_a_machine_with_cores_to_spare_is_no_disturbance():
    base = steady(make_result(TARGET, seed=1, noise=0.005, n=200))
    # a 16-core runner: another process on one core leaves our 1.2 cores alone
    roomy = make_result(
        TARGET,
        seed=2,
        noise=0.005,
        n=200,
        compiled_s=1.5e-3,
        eager_s=3e-3,
        others_cores=1.0,
        own_cores=1.2,
        cores=16,
    )
    v = gate.gate_target(roomy, base, RULES)
    assert v.disturbed is None and v.verdict == "regressed"


def test_a_reference_workload_that_moved_marks_the_run_disturbed():
    base = steady(make_result(TARGET, seed=1, noise=0.005, n=200))
    moved = make_result(
        TARGET, seed=2, noise=0.005, n=200, compiled_s=2e-3, eager_s=4e-3, reference_s=1e-3
    )  # 5x the baseline's reference
    v = gate.gate_target(moved, base, RULES)
    assert v.verdict == "inconclusive" and "reference workload ran 5x" in v.disturbed


def test_a_scattered_reference_disturbs_a_stored_run_but_not_a_paired_one():
    """Measured on the 2-core machine, torch using both cores and nothing else running:
    the reference scattered 16%. Paired, the base shares every round, so the ratio's own
    interval carries that noise: a clear slowdown is still regressed. Stored, the same
    spread says the run cannot vouch for its level."""
    base = steady(make_result(TARGET, seed=1, noise=0.005, n=200))
    slow = make_result(
        TARGET,
        seed=2,
        noise=0.005,
        n=200,
        compiled_s=1.5e-3,
        eager_s=3e-3,
        others_cores=0.01,
        own_cores=1.99,
    )
    slow.latency.disturbance.reference_noise = 0.16
    stored = gate.gate_target(slow, base, RULES)
    assert stored.verdict == "inconclusive" and "scattered 16%" in stored.disturbed
    slow.paired = base_side(slow, [x / 1.5 for x in slow.latency.samples["compiled"]])
    paired = gate.gate_target(slow, None, RULES)
    assert paired.disturbed is None and paired.verdict == "regressed", paired.reasons


def test_a_disturbed_unchanged_run_with_a_tight_interval_still_passes():
    base = steady(make_result(TARGET, seed=1, noise=0.005, n=200))
    same = make_result(TARGET, seed=1, noise=0.005, n=200, others_cores=0.6)
    # the interval is as wide as the runner's drift: within the threshold, nothing to say
    v = gate.gate_target(same, base, RULES)
    assert v.verdict in ("pass", "inconclusive")
    assert v.verdict != "regressed"


# -- inconclusive: past the threshold, not decided ---------------------------------------


def test_inconclusive_passes_by_default_and_fails_when_configured():
    lone = make_baseline(make_result(TARGET, seed=1, noise=0.005, n=200))  # assumed drift
    pr = make_result(TARGET, seed=2, noise=0.005, n=200, compiled_s=1.1e-3, eager_s=2.2e-3)
    rep = gate.build_report([pr], {TARGET: lone}, lambda t: RULES, base_ref="main")
    assert rep.verdict == "inconclusive" and rep.exit_code == 0
    strict = GateConfig(inconclusive="fail")
    rep = gate.build_report([pr], {TARGET: lone}, lambda t: strict, base_ref="main")
    assert rep.verdict == "inconclusive" and rep.exit_code == 1
    (reason,) = [r for r in rep.rows[0].verdict.reasons if "latency" in r]
    assert "past the 5% threshold" in reason and "smallest slowdown it can tell" in reason


# -- accepted: a regression the pull request makes on purpose -----------------------------


def test_an_accepted_regression_exits_0_but_parity_never_is_accepted():
    base = make_baseline(make_result(TARGET, seed=1, work=WORK))
    slower = make_result(TARGET, seed=2, work=WORK.model_copy(update={"flops": 2_000_000}))
    rep = gate.build_report(
        [slower], {TARGET: base}, lambda t: RULES, base_ref="main", accepted=lambda t: True
    )
    assert rep.verdict == "accepted" and rep.exit_code == 0
    assert rep.rows[0].verdict.reasons  # the reasons are still shown
    wrong = make_result(TARGET, seed=2, parity_ok=False)
    rep = gate.build_report(
        [wrong], {TARGET: base}, lambda t: RULES, base_ref="main", accepted=lambda t: True
    )
    assert rep.verdict == "parity-failed" and rep.exit_code == 1


# -- compile time: like with like --------------------------------------------------------


def test_a_cold_pr_compile_is_not_compared_with_a_warm_baseline():
    base = make_baseline(make_result(TARGET, seed=1, compile_s=1.3, warm=True, cache="hit"))
    pr = make_result(TARGET, seed=1, compile_s=2.6, warm=True, cache="partial")
    pr.compile.fxgraph_cache_hit, pr.compile.fxgraph_cache_miss = 0, 3  # every graph missed
    v = gate.gate_target(pr, base, RULES.model_copy(update={"compile_time_regression": 0.15}))
    assert v.verdict == "pass"
    assert any("compile time not compared" in n for n in v.notes)


def test_a_cold_pr_compile_is_compared_with_the_baselines_cold_figure():
    base = make_baseline(
        make_result(TARGET, seed=1, compile_s=1.3, warm=True, cache="hit", cold_s=10.0)
    )
    ok = make_result(TARGET, seed=1, compile_s=10.5, warm=False, cache="partial")
    assert gate.gate_target(ok, base, RULES).verdict == "pass"
    slow = make_result(TARGET, seed=1, compile_s=20.0, warm=False, cache="partial")
    v = gate.gate_target(slow, base, RULES)
    assert v.verdict == "regressed" and any("cold compile time 10.0 s" in r for r in v.reasons)


# -- recompiles in the shape sweep (issue 12) ------------------------------------------------
def with_sweep(result, recompiles, guards=()):
    from gatekeeper.results import ShapeSweep

    result.graphs.sweep = ShapeSweep(shape_sets=3, recompiles=recompiles, guards=list(guards))
    return result


GUARD = "0/0: 5 <= x.size()[0] # if x.shape[0] > 4: # model.py:11 in forward"


def test_more_recompiles_than_the_baseline_is_regressed_naming_the_guard():
    base = make_baseline(with_sweep(make_result(TARGET, seed=1), 0))
    pr = with_sweep(make_result(TARGET, seed=1), 1, [GUARD])
    v = gate.gate_target(pr, base, RULES)
    assert v.verdict == "regressed"
    (reason,) = [r for r in v.reasons if "recompiles" in r]
    assert "0 -> 1" in reason and "x.shape[0] > 4" in reason


def test_as_many_recompiles_passes_and_ignore_only_notes():
    base = make_baseline(with_sweep(make_result(TARGET, seed=1), 2, [GUARD]))
    assert (
        gate.gate_target(with_sweep(make_result(TARGET, seed=1), 2, [GUARD]), base, RULES).verdict
        == "pass"
    )
    more = with_sweep(make_result(TARGET, seed=1), 3, [GUARD])
    v = gate.gate_target(more, base, GateConfig(recompiles="ignore"))
    assert v.verdict == "pass" and any("recompiles" in n for n in v.notes)


def test_baseline_from_before_the_sweep_is_not_compared():
    base = make_baseline(make_result(TARGET, seed=1, recompiles=0))  # no sweep recorded
    pr = with_sweep(make_result(TARGET, seed=1), 4, [GUARD])
    assert gate.gate_target(pr, base, RULES).verdict == "pass"


# -- exportability (issue 23) ------------------------------------------------------------------
def aot_outcome(status: str, error: str, export=None, device: str = "cpu"):
    """An +aot target's result without measurements: not exportable, or unavailable."""
    from gatekeeper.results import TargetResult

    return TargetResult(
        target="m/b1/default+aot",
        model="m",
        env_key="env",
        code_hash="c0de",
        device=device,
        status=status,
        error=error,
        export=export,
    )


def not_exportable(base_exportable=None):
    from gatekeeper.results import Export

    export = Export(
        exportable=False,
        reason="Could not guard on data-dependent expression Eq(u0, 1)",
        file="models/net.py",
        line=12,
        base_exportable=base_exportable,
    )
    return aot_outcome("not-exportable", export.says(), export)


def test_a_pr_that_breaks_export_is_regressed_naming_torchs_reason_and_the_line():
    exported = make_baseline(make_result("m/b1/default+aot"))  # only exported ones publish
    v = gate.gate_target(not_exportable(), exported, RULES)
    assert v.verdict == "regressed", v
    (reason,) = v.reasons
    assert "data-dependent expression" in reason and "at models/net.py:12" in reason
    # paired: the base commit's model exported, whatever the store holds
    assert gate.gate_target(not_exportable(base_exportable=True), None, RULES).verdict == (
        "regressed"
    )
    # accepted on purpose, like any regression
    assert gate.gate_target(not_exportable(), exported, RULES, accept=True).verdict == "accepted"


def test_a_model_that_never_exported_is_not_a_regression():
    v = gate.gate_target(not_exportable(base_exportable=False), None, RULES)
    assert v.verdict == "pass" and "as on the base" in v.notes[0], v
    v = gate.gate_target(not_exportable(), None, RULES)
    assert v.verdict == "no-baseline" and "not exportable" in v.notes[0], v
    report = gate.build_report(
        [not_exportable(base_exportable=False)], {}, lambda t: RULES, base_ref="main"
    )
    assert report.exit_code == 0


def test_an_aot_package_unavailable_here_is_regressed_only_where_the_base_ran():
    said = (
        "unavailable: torch's AOTInductor killed the worker (SIGSEGV) in load package "
        "with torch 2.11.0+cu130 on cuda; the target's other strategies are unaffected"
    )
    crashed = aot_outcome("unavailable", said, device="cuda")
    ran = make_baseline(make_result("m/b1/default+aot"))  # its package loaded and ran
    v = gate.gate_target(crashed, ran, RULES)
    assert v.verdict == "regressed" and v.reasons == [f"{said} (the base's ran)"], v
    v = gate.gate_target(crashed, None, RULES)
    assert v.verdict == "no-baseline" and v.notes == [said], v
    report = gate.build_report([crashed], {}, lambda t: RULES, base_ref="main")
    assert report.exit_code == 0
