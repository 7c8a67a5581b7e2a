"""``gatekeeper compile``: precompile every target and publish its bundle."""

from __future__ import annotations

from ..compile import compile_all
from ..errors import EXIT_ERROR, EXIT_OK
from .common import Context, human_bytes

HELP = "compile each target in a fresh process and publish its bundle to the store"


def register(sub, parents) -> None:
    p = sub.add_parser("compile", help=HELP, description=HELP, parents=parents)
    p.add_argument(
        "--force",
        action="store_true",
        help="compile and publish even when the store has the bundle",
    )


def run(ctx: Context) -> int:
    ctx.signing_key()  # a signature required without a key: exit 2 before any work
    results = compile_all(
        ctx.targets, ctx.config, ctx.store, force=ctx.args.force, verbose=ctx.args.verbose
    )
    rows = [{**r.as_dict(), "size": human_bytes(r.bundle_bytes)} for r in results]
    ctx.emit(
        {
            "command": "compile",
            "store": ctx.store.uri,
            "skipped_writes": len(ctx.store.skipped_writes),
            "targets": [r.as_dict() for r in results],
        },
        rows,
        {
            "target": "target",
            "status": "status",
            "compile_seconds": "cold compile s",
            "size": "bundle",
            "error": "error",
        },
    )
    return EXIT_ERROR if any(r.status == "error" for r in results) else EXIT_OK
