"""``gatekeeper store ls``: what the store holds."""
from __future__ import annotations

import datetime as dt

from ..errors import EXIT_OK
from .common import Context, human_bytes

HELP = "inspect the store"


def register(sub, parents) -> None:
    p = sub.add_parser("store", help=HELP, description=HELP)
    verbs = p.add_subparsers(dest="store_verb", metavar="{ls}", required=True)
    verbs.add_parser("ls", help="list bundles", parents=parents)


def run(ctx: Context) -> int:
    bundles = list(ctx.store.bundles())
    rows = [{"target": b.location.target_id, "env_key": b.location.env_key,
             "code_hash": b.location.code_hash, "size": human_bytes(b.size),
             "bytes": b.size, "complete": b.complete,
             "modified": dt.datetime.fromtimestamp(b.modified, dt.timezone.utc)
             .isoformat(timespec="seconds")} for b in bundles]
    ctx.emit({"command": "store ls", "store": ctx.store.uri, "bundles": rows}, rows,
             {"target": "target", "env_key": "env key", "code_hash": "code hash",
              "size": "size", "modified": "modified", "complete": "complete"},
             footer=f"{len(rows)} bundle(s) in {ctx.store.uri}")
    return EXIT_OK
