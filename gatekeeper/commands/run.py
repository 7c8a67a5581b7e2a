"""``gatekeeper run``: compile, check, gate and report in one command."""

from __future__ import annotations

from .. import pipeline
from ..provenance import current_ref
from .common import (
    Context,
    accept_globs,
    add_gate_flags,
    add_measure_flags,
    output_dir,
    output_file,
)

HELP = "compile + check + gate + report; re-measures borderline timings before failing"


def register(sub, parents) -> None:
    p = sub.add_parser("run", help=HELP, description=HELP, parents=parents)
    add_measure_flags(p)
    add_gate_flags(p)
    p.add_argument(
        "--publish",
        action="store_true",
        help="then publish the results as the baseline of the current branch "
        "(for pushes to the base branch)",
    )


def run(ctx: Context) -> int:
    ctx.signing_key()  # a signature required without a key: exit 2 before any work
    args = ctx.args
    out_dir = output_dir(args.out, "--out")
    report_path = output_file(args.report or out_dir / "report.md", "--report")
    out = pipeline.run(
        ctx.targets,
        ctx.config,
        ctx.store,
        out_dir=out_dir,
        base_ref=ctx.base_ref,
        mode=ctx.mode(),
        cold=args.cold,
        verbose=args.verbose,
        shard=args.shard,
        require_baseline=args.require_baseline,
        accept=accept_globs(args),
    )
    code = ctx.finish_gate(out.report, report_path, out.results_path)
    if args.publish:
        pipeline.publish(out, ctx.store, current_ref())
    return code
