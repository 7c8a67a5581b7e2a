"""``gatekeeper check``: measure every target and write results.json."""

from __future__ import annotations

from ..check.run import Plan, check_all
from ..errors import EXIT_ERROR, EXIT_OK
from ..results import write_results
from .common import Context, add_measure_flags, output_dir

HELP = "measure parity, compile time, graph breaks, latency and memory per target"


def register(sub, parents) -> None:
    p = sub.add_parser("check", help=HELP, description=HELP, parents=parents)
    add_measure_flags(p)


def run(ctx: Context) -> int:
    ctx.signing_key()  # a signature required without a key: exit 2 before any work
    out = output_dir(ctx.args.out, "--out")
    args = ctx.args
    plan = Plan(out, ctx.base_ref, ctx.mode(), args.cold, args.verbose, args.shard)
    results = check_all(ctx.targets, ctx.config, ctx.store, plan)
    path = write_results(results, out)
    rows = [
        {
            "target": r.target,
            "status": r.status,
            "p50_ms": r.latency.compiled.p50 * 1e3 if r.latency else None,
            "speedup": r.latency.speedup if r.latency else None,
            "compile_s": r.compile.seconds if r.compile else None,
            "cache": r.compile.cache if r.compile else None,
            "breaks": r.graphs.breaks if r.graphs else None,
            "parity": (r.parity.vs_eager.method if r.parity.vs_eager.passed else "FAILED")
            if r.parity
            else None,
            "error": r.error,
        }
        for r in results.targets
    ]
    ctx.emit(
        {
            "command": "check",
            "results": str(path),
            "mode": results.mode,
            "mode_reason": results.mode_reason,
            "targets": [
                {"target": r.target, "status": r.status, "mode": r.mode, "error": r.error}
                for r in results.targets
            ],
        },
        rows,
        {
            "target": "target",
            "status": "status",
            "p50_ms": "compiled p50 ms",
            "speedup": "speedup",
            "compile_s": "compile s",
            "cache": "cache",
            "breaks": "graph breaks",
            "parity": "parity",
            "error": "error",
        },
        footer=f"wrote {path}",
    )
    return EXIT_ERROR if any(r.status == "error" for r in results.targets) else EXIT_OK
