"""``run``: the whole job of a pull request (or of a push to the base branch) in one call:
compile, check, gate, re-measure what was borderline, and publish when asked."""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from .check import check_all
from .compile import compile_all
from .config import Config
from .errors import StoreError
from .gate import GateReport
from .gate.baseline import publish_results
from .gate.judge import judge
from .gate.drift import merge_latency
from .results import Results, write_results
from .store import Store
from .store.base import store_error
from .targets import Target


@dataclass
class RunOutcome:
    results: Results
    results_path: Path
    report: GateReport


def run(targets: list[Target], config: Config, store: Store, *, out_dir: Path,
        base_ref: str, cold: bool = False, verbose: bool = False,
        paired_ref: str | None = None, shard: str | None = None,
        require_baseline: bool = False) -> RunOutcome:
    """Compile every target (publishing bundles the store lacks), measure, gate; a target
    whose timing is borderline is measured once more in a new process (a second run) and
    gated again on both runs.

    A store that fails during compile ends the run (StoreError, exit 2) before anything
    is measured: a cold measurement gated without baselines would pass. A re-measure
    keeps the first run's reference outputs, so the results' sha256 still names the
    file in ``out_dir`` (which ``run --publish`` stores as the baseline's).
    """
    for compiled in compile_all(targets, config, store, verbose=verbose):
        if compiled.error_kind == "store":
            raise store_error(store.uri, StoreError(compiled.error or "failed"),
                              f"{compiled.target}: compile")
    results = check_all(targets, config, store, out_dir=out_dir, base_ref=base_ref,
                        cold=cold, verbose=verbose, paired_ref=paired_ref, shard=shard)
    path = write_results(results, out_dir)
    report = judge(results, config, store, base_ref=base_ref,
                   require_baseline=require_baseline)
    borderline = [row for row in report.rows if row.verdict.borderline]
    if borderline:
        by_id = {t.id: t for t in targets}
        for row in borderline:
            # the second run's outputs go to a scratch folder: only its timings are kept
            with tempfile.TemporaryDirectory(prefix="gk-remeasure-") as scratch:
                (again,) = check_all([by_id[row.result.target]], config, store,
                                     out_dir=Path(scratch), base_ref=base_ref, cold=cold,
                                     verbose=verbose, paired_ref=paired_ref).targets
            if again.status == "ok" and row.result.latency and again.latency:
                row.result.latency = merge_latency(row.result.latency, again.latency)
                if row.result.paired and again.paired:
                    row.result.paired.samples += again.paired.samples
        write_results(results, out_dir)
        report = judge(results, config, store, base_ref=base_ref,
                       require_baseline=require_baseline)
        report.remeasured = [row.result.target for row in borderline]
    return RunOutcome(results, path, report)


def publish(outcome: RunOutcome, store: Store, ref: str) -> list[dict]:
    """``run --publish``: the results become ``ref``'s baseline."""
    return publish_results(outcome.results, outcome.results_path.parent, store, ref)
