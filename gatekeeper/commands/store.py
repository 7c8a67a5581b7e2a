"""``gatekeeper store ls | verify | prune``: look after what the store holds."""

from __future__ import annotations

import datetime as dt
import math

from ..errors import EXIT_FAILED, EXIT_OK, UsageError
from ..store import maintenance
from .common import Context, human_bytes

HELP = "inspect, verify or prune the store"


def register(sub, parents) -> None:
    p = sub.add_parser("store", help=HELP, description=HELP)
    verbs = p.add_subparsers(dest="store_verb", metavar="{ls,verify,prune}", required=True)
    verbs.add_parser("ls", help="list bundles", parents=parents)
    verbs.add_parser(
        "verify",
        parents=parents,
        help="download and re-hash every bundle and baseline; exit 1 if any does not verify",
    )
    pr = verbs.add_parser(
        "prune", parents=parents, help="delete old bundles (never one a baseline points to)"
    )
    pr.add_argument(
        "--keep", type=int, metavar="N", help="keep the newest N bundles per target and env"
    )
    pr.add_argument(
        "--older-than", type=float, metavar="DAYS", help="delete bundles older than DAYS days"
    )
    pr.add_argument("--dry-run", action="store_true", help="only list what would go")


def ls(ctx: Context) -> int:
    bundles = list(ctx.store.bundles())
    rows = [
        {
            "target": b.location.target_id,
            "env_key": b.location.env_key,
            "code_hash": b.location.code_hash,
            "size": human_bytes(b.size),
            "bytes": b.size,
            "complete": b.complete,
            "modified": dt.datetime.fromtimestamp(b.modified, dt.UTC).isoformat(timespec="seconds"),
        }
        for b in bundles
    ]
    ctx.emit(
        {"command": "store ls", "store": ctx.store.uri, "bundles": rows},
        rows,
        {
            "target": "target",
            "env_key": "env key",
            "code_hash": "code hash",
            "size": "size",
            "modified": "modified",
            "complete": "complete",
        },
        footer=f"{len(rows)} bundle(s) in {ctx.store.uri}",
    )
    return EXIT_OK


def verify(ctx: Context) -> int:
    findings = maintenance.verify(ctx.store, ctx.signing_key())
    bad = [f for f in findings if not f.ok]
    ctx.emit(
        {
            "command": "store verify",
            "store": ctx.store.uri,
            "ok": not bad,
            "objects": [f.as_dict() for f in findings],
        },
        [f.as_dict() | {"ok": "ok" if f.ok else "FAILED"} for f in findings],
        {"key": "object", "ok": "status", "detail": "detail"},
        footer=f"{len(findings) - len(bad)} ok, {len(bad)} failed in {ctx.store.uri}",
    )
    return EXIT_FAILED if bad else EXIT_OK


def prune(ctx: Context) -> int:
    a = ctx.args
    if a.keep is None and a.older_than is None:
        raise UsageError("store prune needs --keep N and/or --older-than DAYS")
    if (a.keep is not None and a.keep < 1) or (a.older_than is not None and a.older_than < 0):
        raise UsageError("--keep must be at least 1 and --older-than not negative")
    if a.older_than is not None and not math.isfinite(a.older_than):
        raise UsageError(f"--older-than must be a number of days, not {a.older_than}")
    deleted = maintenance.prune(
        ctx.store, keep=a.keep, older_than_days=a.older_than, dry_run=a.dry_run
    )
    ctx.emit(
        {
            "command": "store prune",
            "store": ctx.store.uri,
            "dry_run": a.dry_run,
            "deleted": deleted,
            "skipped_writes": len(ctx.store.skipped_writes),
        },
        [{"key": k} for k in deleted],
        {"key": "would delete" if a.dry_run else "deleted"},
        footer=f"{len(deleted)} object(s) {'to delete' if a.dry_run else 'deleted'}",
    )
    return EXIT_OK


def run(ctx: Context) -> int:
    return {"ls": ls, "verify": verify, "prune": prune}[ctx.args.store_verb](ctx)
