"""``gatekeeper compile``: precompile every target and publish its bundle."""

from __future__ import annotations

from ..compile import compile_all, reuse_note
from ..errors import EXIT_ERROR, EXIT_OK
from .common import Context, human_bytes

HELP = "compile each target in a fresh process and publish its bundle to the store"


def register(sub, parents) -> None:
    p = sub.add_parser("compile", help=HELP, description=HELP, parents=parents)
    p.add_argument(
        "--force",
        action="store_true",
        help="compile and publish even when the store has the bundle (from an empty cache)",
    )
    p.add_argument(
        "--cold",
        action="store_true",
        help="compile from an empty cache dir, not seeded with the newest bundle of the "
        "target's earlier code",
    )


def run(ctx: Context) -> int:
    ctx.signing_key()  # a signature required without a key: exit 2 before any work
    results = compile_all(
        ctx.targets,
        ctx.config,
        ctx.store,
        force=ctx.args.force,
        verbose=ctx.args.verbose,
        cold=ctx.args.cold,
    )
    rows = [
        {
            **r.as_dict(),
            "size": human_bytes(r.bundle_bytes),
            "reused": reuse_note(r.seed).removeprefix(", ").replace(" FX graphs reused", ""),
        }
        for r in results
    ]
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
            "compile_seconds": "compile s",
            "reused": "FX graphs reused",
            "size": "bundle",
            "error": "error",
        },
    )
    return EXIT_ERROR if any(r.status == "error" for r in results) else EXIT_OK
