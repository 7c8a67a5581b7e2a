"""``gatekeeper merge``: one verdict and one report from the results of many shards."""

from __future__ import annotations

from pathlib import Path

from ..gate.judge import judge
from ..results import write_results
from ..shards import merge_results
from .common import (
    Context,
    accept_globs,
    add_gate_flags,
    default_base_ref,
    output_dir,
    output_file,
)

HELP = "merge shard results.json files, then gate and report them as one run"


def register(sub, parents) -> None:
    p = sub.add_parser("merge", help=HELP, description=HELP, parents=parents)
    p.add_argument(
        "results",
        nargs="+",
        metavar="RESULTS",
        help="results.json files (or folders holding one) of each shard",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        default=".",
        help="where the merged results.json and report go (default: .)",
    )
    p.add_argument("--base-ref", metavar="REF")
    add_gate_flags(p)


def run(ctx: Context) -> int:
    paths = [Path(p) / "results.json" if Path(p).is_dir() else Path(p) for p in ctx.args.results]
    out = output_dir(ctx.args.out, "--out")
    report_path = output_file(ctx.args.report or out / "report.md", "--report")
    merged = merge_results(paths, out)
    path = write_results(merged, out)
    report = judge(
        merged,
        ctx.config,
        ctx.store,
        base_ref=ctx.args.base_ref or merged.base_ref or default_base_ref(),
        require_baseline=ctx.args.require_baseline,
        accept=accept_globs(ctx.args),
    )
    return ctx.finish_gate(report, report_path, path)
