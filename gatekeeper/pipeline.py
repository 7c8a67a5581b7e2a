"""``run``: the whole job of a pull request (or of a push to the base branch) in one call:
compile, check, gate, re-measure what was borderline, and publish when asked."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from .check.paired import Mode, choose_mode
from .check.run import Plan, check_all
from .compile import compile_all
from .config import Config
from .errors import StoreError
from .gate import GateReport, GateRow
from .gate.baseline import publish_results
from .gate.drift import merge_latency
from .gate.judge import judge
from .generation import merged
from .inside import contained
from .results import Results, TargetResult, write_results
from .scratch import scratch_dir
from .store import Store
from .store.base import store_error
from .targets import Target


@dataclass
class RunOutcome:
    results: Results
    results_path: Path
    report: GateReport


def run(
    targets: list[Target],
    config: Config,
    store: Store,
    *,
    out_dir: Path,
    base_ref: str,
    mode: Mode,
    cold: bool = False,
    verbose: bool = False,
    shard: str | None = None,
    require_baseline: bool = False,
    accept: list[str] | None = None,
) -> RunOutcome:
    """Compile every target (publishing bundles the store lacks), measure, gate. A target
    whose timing is borderline is measured once more in a new process and gated again on
    both runs; a stored-mode one is re-measured paired when the base commit is there.

    A store that fails during compile ends the run (StoreError, exit 2) before anything
    is measured: a cold measurement gated without baselines would pass. A re-measure
    keeps the first run's reference outputs, so the results' sha256 still names the
    file in ``out_dir`` (which ``run --publish`` stores as the baseline's).
    """
    for compiled in compile_all(targets, config, store, verbose=verbose):
        if compiled.error_kind == "store":
            raise store_error(
                store.uri, StoreError(compiled.error or "failed"), f"{compiled.target}: compile"
            )
    plan = Plan(out_dir, base_ref, mode, cold, verbose, shard)
    results = check_all(targets, config, store, plan)
    path = write_results(results, out_dir)
    report = judge(
        results, config, store, base_ref=base_ref, require_baseline=require_baseline, accept=accept
    )
    borderline = [row for row in report.rows if row.verdict.borderline]
    if borderline:
        if mode.name == "stored":  # measured again paired, where it can be
            pairable = choose_mode("auto", base_ref, config.base_dir)
            mode = pairable if pairable.name == "paired" else mode
        again = partial(check_all, config=config, store=store)
        by_id = {t.id: t for t in targets}
        for row in borderline:
            _remeasure(row, by_id[row.result.target], results, replace(plan, mode=mode), again)
        write_results(results, out_dir)
        report = judge(
            results,
            config,
            store,
            base_ref=base_ref,
            require_baseline=require_baseline,
            accept=accept,
        )
        report.remeasured = [row.result.target for row in borderline]
    return RunOutcome(results, path, report)


def _remeasure(
    row: GateRow, target: Target, results: Results, plan: Plan, check: Callable[..., Results]
) -> None:
    """Measure a borderline target once more, in a new process: its timings join the
    first run's, unless it was paired where the first was not (pairing decides from
    then on). The second run's outputs go to a scratch folder."""
    out_dir = plan.out_dir
    with scratch_dir("gk-remeasure-") as scratch:
        again_plan = replace(plan, out_dir=Path(scratch), shard=None)
        (again,) = check([target], plan=again_plan).targets
        first = row.result.latency
        if again.status != "ok" or first is None or again.latency is None:
            return
        if again.paired and not row.result.paired:
            _keep_files(again, Path(scratch), out_dir)
            results.targets[results.targets.index(row.result)] = row.result = again
            return
    row.result.latency = merge_latency(first, again.latency)
    if row.result.generation and again.generation:  # a generate target's TTFT and TPOT
        row.result.generation = merged(row.result.generation, again.generation)
    if row.result.paired and again.paired:
        row.result.paired.samples += again.paired.samples
        pair, more = row.result.paired.generation, again.paired.generation
        if pair is not None and more is not None:
            row.result.paired.generation = merged(pair, more)


def _keep_files(result: TargetResult, scratch: Path, out_dir: Path) -> None:
    """Move a result's reference outputs and traces from ``scratch`` into ``out_dir``
    (the same relative paths, so its sha256 and trace names stay right)."""
    names = [result.reference.file] if result.reference else []
    for profile in (result.profile, result.paired.profile if result.paired else None):
        if profile is not None and profile.trace:
            names.append(profile.trace)
    for name in names:
        src = contained(scratch, name, f"{result.target}: a file of its results")
        dest = contained(out_dir, name, f"{result.target}: a file of its results")
        if src.is_file():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(src, dest)


def publish(outcome: RunOutcome, store: Store, ref: str) -> list[dict]:
    """``run --publish``: the results become ``ref``'s baseline."""
    return publish_results(
        outcome.results,
        outcome.results_path.parent,
        store,
        ref,
        {row.result.target: row.verdict.verdict for row in outcome.report.rows},
    )
