"""``run``: the whole job of a pull request (or of a push to the base branch) in one call:
compile, check, gate, re-measure what was borderline, and publish when asked."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .check import check_all
from .compile import compile_all
from .config import Config
from .gate import GateReport
from .gate.baseline import publish_results
from .gate.judge import judge
from .paired import Mode, choose_mode
from .gate.drift import merge_latency
from .results import Results, write_results
from .store import Store
from .targets import Target


@dataclass
class RunOutcome:
    results: Results
    results_path: Path
    report: GateReport


def run(targets: list[Target], config: Config, store: Store, *, out_dir: Path,
        base_ref: str, mode: Mode, cold: bool = False, verbose: bool = False,
        shard: str | None = None, require_baseline: bool = False,
        accept: list[str] | None = None) -> RunOutcome:
    """Compile every target (publishing bundles the store lacks), measure, gate. A target
    whose timing is borderline is measured once more in a new process and gated again on
    both runs; a stored-mode one is re-measured paired when the base commit is there."""
    compile_all(targets, config, store, verbose=verbose)
    results = check_all(targets, config, store, out_dir=out_dir, base_ref=base_ref,
                        mode=mode, cold=cold, verbose=verbose, shard=shard)
    path = write_results(results, out_dir)
    report = judge(results, config, store, base_ref=base_ref,
                   require_baseline=require_baseline, accept=accept)
    borderline = [row for row in report.rows if row.verdict.borderline]
    if borderline:
        by_id = {t.id: t for t in targets}
        again_mode = mode
        if mode.name == "stored":
            pairable = choose_mode("auto", base_ref, config.base_dir)
            again_mode = pairable if pairable.name == "paired" else mode
        for row in borderline:
            (again,) = check_all([by_id[row.result.target]], config, store, out_dir=out_dir,
                                 base_ref=base_ref, mode=again_mode, cold=cold,
                                 verbose=verbose).targets
            if again.status != "ok" or not row.result.latency or not again.latency:
                continue
            if again.paired and not row.result.paired:  # paired decides from now on
                index = results.targets.index(row.result)
                results.targets[index] = row.result = again
            else:
                row.result.latency = merge_latency(row.result.latency, again.latency)
                if row.result.paired and again.paired:
                    row.result.paired.samples += again.paired.samples
        write_results(results, out_dir)
        report = judge(results, config, store, base_ref=base_ref,
                       require_baseline=require_baseline, accept=accept)
        report.remeasured = [row.result.target for row in borderline]
    return RunOutcome(results, path, report)


def publish(outcome: RunOutcome, store: Store, ref: str) -> list[dict]:
    """``run --publish``: the results become ``ref``'s baseline."""
    return publish_results(outcome.results, outcome.results_path.parent, store, ref,
                           {row.result.target: row.verdict.verdict
                            for row in outcome.report.rows})
