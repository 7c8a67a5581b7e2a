"""``gatekeeper baseline``: publish results as the baseline of a branch."""

from __future__ import annotations

from pathlib import Path

from ..errors import EXIT_OK
from ..gate.baseline import publish_results
from ..provenance import current_ref
from ..results import load_results
from .common import Context

HELP = "publish results.json as the baseline of a branch (default: the current one)"


def register(sub, parents) -> None:
    p = sub.add_parser("baseline", help=HELP, description=HELP, parents=parents)
    p.add_argument("--results", metavar="PATH", default="results.json")
    p.add_argument(
        "--ref", metavar="REF", help="branch to publish for (default: $GITHUB_REF_NAME, else git's)"
    )


def run(ctx: Context) -> int:
    path = Path(ctx.args.results)
    results = load_results(path)
    ref = ctx.args.ref or current_ref()
    rows = publish_results(results, path.parent, ctx.store, ref)
    ctx.emit(
        {
            "command": "baseline",
            "ref": ref,
            "store": ctx.store.uri,
            "skipped_writes": len(ctx.store.skipped_writes),
            "targets": rows,
        },
        rows,
        {"target": "target", "status": "status", "error": "error"},
        footer=f"baseline of {ref} in {ctx.store.uri}",
    )
    return EXIT_OK
