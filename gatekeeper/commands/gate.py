"""``gatekeeper gate``: compare results.json with the baseline; write the report."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..gate import GateReport
from ..github.announce import announce
from ..provenance import base_ref
from ..report import render_markdown, report_json, summary_line
from ..results import load_results
from ..verdict import judge
from .common import Context

HELP = "compare results with the base branch's baseline; exit 1 on a regression"


def add_gate_flags(p) -> None:
    p.add_argument("--report", metavar="PATH",
                   help="where the markdown report goes (default: report.md beside the "
                        "results)")
    p.add_argument("--require-baseline", action="store_true",
                   help="a target without a baseline fails (exit 1)")


def register(sub, parents) -> None:
    p = sub.add_parser("gate", help=HELP, description=HELP, parents=parents)
    p.add_argument("--results", metavar="PATH", default="results.json")
    p.add_argument("--base-ref", metavar="REF",
                   help="branch to gate against (default: $GITHUB_BASE_REF, else main)")
    add_gate_flags(p)


def write_report(ctx: Context, report: GateReport, report_path: Path,
                 results_path: Path) -> int:
    """Write report.md (and report.json beside it), print it, tell GitHub, return the
    exit code."""
    markdown = render_markdown(report)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(markdown)
    doc = report_json(report)
    report_path.with_suffix(".json").write_text(json.dumps(doc, indent=2))
    if ctx.args.json:
        ctx.emit(doc | {"report": str(report_path)})
    else:
        print(markdown)
    sys.stderr.write(summary_line(report) + "\n")
    announce(report, markdown=markdown, report_path=report_path, results_path=results_path,
             base_dir=ctx.config.base_dir)
    return report.exit_code


def run(ctx: Context) -> int:
    path = Path(ctx.args.results)
    results = load_results(path)
    report = judge(results, ctx.config, ctx.store,
                   base_ref=ctx.args.base_ref or results.base_ref or base_ref(),
                   require_baseline=ctx.args.require_baseline)
    return write_report(ctx, report, Path(ctx.args.report or path.parent / "report.md"), path)
