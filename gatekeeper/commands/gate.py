"""``gatekeeper gate``: compare results.json with the baseline; write the report."""

from __future__ import annotations

from pathlib import Path

from ..gate.judge import judge
from ..results import load_results
from .common import Context, accept_globs, add_gate_flags, default_base_ref, output_file

HELP = "compare results with the base branch's baseline; exit 1 on a regression"


def register(sub, parents) -> None:
    p = sub.add_parser("gate", help=HELP, description=HELP, parents=parents)
    p.add_argument("--results", metavar="PATH", default="results.json")
    p.add_argument(
        "--base-ref",
        metavar="REF",
        help="branch to gate against (default: $GITHUB_BASE_REF, else main)",
    )
    add_gate_flags(p)


def run(ctx: Context) -> int:
    path = Path(ctx.args.results)
    results = load_results(path)
    report_path = output_file(ctx.args.report or path.parent / "report.md", "--report")
    report = judge(
        results,
        ctx.config,
        ctx.store,
        base_ref=ctx.args.base_ref or results.base_ref or default_base_ref(),
        require_baseline=ctx.args.require_baseline,
        accept=accept_globs(ctx.args),
    )
    return ctx.finish_gate(report, report_path, path)
