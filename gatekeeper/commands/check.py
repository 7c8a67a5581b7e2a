"""``gatekeeper check``: measure every target and write results.json."""
from __future__ import annotations

from pathlib import Path

from ..check import check_all, write_results
from ..errors import EXIT_ERROR, EXIT_OK
from ..provenance import base_ref
from .common import Context

HELP = "measure parity, compile time, graph breaks, latency and memory per target"


def add_measure_flags(p) -> None:
    p.add_argument("--out", metavar="DIR", default=".",
                   help="where results.json (and reference outputs) go (default: .)")
    p.add_argument("--cold", action="store_true",
                   help="measure a cold compile: do not restore bundles first")
    p.add_argument("--paired", metavar="BASE_REF",
                   help="also build BASE_REF's model code from a git worktree and measure "
                        "base and head interleaved in the same process (paired A/B)")
    p.add_argument("--base-ref", metavar="REF",
                   help="branch whose baseline outputs to compare with (default: "
                        "$GITHUB_BASE_REF, else main)")


def register(sub, parents) -> None:
    p = sub.add_parser("check", help=HELP, description=HELP, parents=parents)
    add_measure_flags(p)


def measure(ctx: Context):
    out = Path(ctx.args.out)
    results = check_all(ctx.targets, ctx.config, ctx.store, out_dir=out,
                        base_ref=ctx.args.base_ref or base_ref(), cold=ctx.args.cold,
                        verbose=ctx.args.verbose, paired_ref=ctx.args.paired,
                        shard=ctx.args.shard)
    return results, write_results(results, out)


def run(ctx: Context) -> int:
    results, path = measure(ctx)
    rows = [{"target": r.target, "status": r.status,
             "p50_ms": r.latency.compiled.p50 * 1e3 if r.latency else None,
             "speedup": r.latency.speedup if r.latency else None,
             "compile_s": r.compile.seconds if r.compile else None,
             "cache": r.compile.cache if r.compile else None,
             "breaks": r.graphs.breaks if r.graphs else None,
             "parity": (r.parity.vs_eager.method if r.parity.vs_eager.passed else "FAILED")
             if r.parity else None,
             "error": r.error} for r in results.targets]
    ctx.emit({"command": "check", "results": str(path),
              "targets": [{"target": r.target, "status": r.status, "error": r.error}
                          for r in results.targets]},
             rows, {"target": "target", "status": "status", "p50_ms": "compiled p50 ms",
                    "speedup": "speedup", "compile_s": "compile s", "cache": "cache",
                    "breaks": "graph breaks", "parity": "parity", "error": "error"},
             footer=f"wrote {path}")
    return EXIT_ERROR if any(r.status == "error" for r in results.targets) else EXIT_OK
