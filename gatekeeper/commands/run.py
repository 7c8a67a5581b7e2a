"""``gatekeeper run``: compile, check, gate and report in one command."""
from __future__ import annotations

from pathlib import Path

from ..check import check_all, write_results
from ..compile import compile_all
from ..provenance import base_ref, current_ref
from ..results import merge_latency
from ..verdict import judge
from .baseline import publish_all
from .check import add_measure_flags, measure
from .common import Context
from .gate import add_gate_flags, write_report

HELP = "compile + check + gate + report; re-measures borderline timings before failing"


def register(sub, parents) -> None:
    p = sub.add_parser("run", help=HELP, description=HELP, parents=parents)
    add_measure_flags(p)
    add_gate_flags(p)
    p.add_argument("--publish", action="store_true",
                   help="then publish the results as the baseline of the current branch "
                        "(for pushes to the base branch)")


def run(ctx: Context) -> int:
    args = ctx.args
    ref = args.base_ref or base_ref()
    compile_all(ctx.targets, ctx.config, ctx.store, verbose=args.verbose)
    results, path = measure(ctx)
    report = judge(results, ctx.config, ctx.store, base_ref=ref,
                   require_baseline=args.require_baseline)
    borderline = [row for row in report.rows if row.verdict.borderline]
    if borderline:
        by_id = {t.id: t for t in ctx.targets}
        for row in borderline:
            (again,) = check_all([by_id[row.result.target]], ctx.config, ctx.store,
                                 out_dir=path.parent, base_ref=ref, cold=args.cold,
                                 verbose=args.verbose, paired_ref=args.paired).targets
            if again.status == "ok" and row.result.latency and again.latency:
                row.result.latency = merge_latency(row.result.latency, again.latency)
                if row.result.paired and again.paired:
                    row.result.paired.samples += again.paired.samples
        write_results(results, path.parent)
        report = judge(results, ctx.config, ctx.store, base_ref=ref,
                       require_baseline=args.require_baseline)
        report.remeasured = [row.result.target for row in borderline]
    code = write_report(ctx, report, Path(args.report or path.parent / "report.md"), path)
    if args.publish:
        publish_all(results, path.parent, ctx.store, current_ref())
    return code
