"""``gatekeeper baseline``: publish results as the baseline of a branch."""
from __future__ import annotations

from pathlib import Path

from .. import baseline as baselines
from ..errors import EXIT_OK
from ..provenance import current_ref
from ..results import Results, load_results
from ..store import Store
from .common import Context

HELP = "publish results.json as the baseline of a branch (default: the current one)"


def register(sub, parents) -> None:
    p = sub.add_parser("baseline", help=HELP, description=HELP, parents=parents)
    p.add_argument("--results", metavar="PATH", default="results.json")
    p.add_argument("--ref", metavar="REF",
                   help="branch to publish for (default: $GITHUB_REF_NAME, else git's)")


def publish_all(results: Results, results_dir: Path, store: Store, ref: str) -> list[dict]:
    rows = []
    commit = results.creator.get("commit")
    for r in results.targets:
        if r.status != "ok":
            rows.append({"target": r.target, "status": "error", "error": r.error})
            continue
        ref_file = results_dir / r.reference.file if r.reference else None
        status = baselines.publish(store, r, ref=ref, commit=commit,
                                   reference_file=ref_file if ref_file and ref_file.is_file()
                                   else None)
        rows.append({"target": r.target, "status": status, "env_key": r.env_key})
    return rows


def run(ctx: Context) -> int:
    path = Path(ctx.args.results)
    results = load_results(path)
    ref = ctx.args.ref or current_ref()
    rows = publish_all(results, path.parent, ctx.store, ref)
    ctx.emit({"command": "baseline", "ref": ref, "store": ctx.store.uri,
              "skipped_writes": len(ctx.store.skipped_writes), "targets": rows},
             rows, {"target": "target", "status": "status", "error": "error"},
             footer=f"baseline of {ref} in {ctx.store.uri}")
    return EXIT_OK
