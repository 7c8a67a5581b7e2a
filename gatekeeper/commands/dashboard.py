"""``gatekeeper dashboard``: a static site of a branch's baseline history, with charts."""

from __future__ import annotations

import sys

from ..errors import EXIT_OK
from .common import Context, output_dir

HELP = "build a static site with charts of a branch's baselines over commits"


def register(sub, parents) -> None:
    p = sub.add_parser("dashboard", help=HELP, description=HELP, parents=parents)
    p.add_argument(
        "--out",
        metavar="DIR",
        required=True,
        help="folder to write the site into (index.html, targets/, assets/)",
    )
    p.add_argument(
        "--ref",
        metavar="REF",
        default="main",
        help="branch whose baselines to chart (default: main)",
    )
    p.add_argument(
        "--repository",
        metavar="OWNER/NAME",
        help="link commits to this GitHub repository (default: "
        "$GITHUB_REPOSITORY; on $GITHUB_SERVER_URL)",
    )


def run(ctx: Context) -> int:
    from ..dashboard import build

    a = ctx.args
    out = output_dir(a.out, "--out", create=False)  # made once there is a site to write
    built = build(
        ctx.store, out, ref=a.ref, globs=a.target, repository=a.repository, stream=sys.stderr
    )
    doc = {"command": "dashboard", **built.as_dict()}
    rows = [
        {
            "target": t["target"],
            "env_key": t["env_key"],
            "points": t["points"],
            "verdict": t["verdict"],
            "page": t["page"],
        }
        for t in doc["targets"]
    ]
    skipped = f"; {len(built.skipped)} unreadable document(s) skipped" if built.skipped else ""
    ctx.emit(
        doc,
        rows,
        {
            "target": "target",
            "env_key": "env key",
            "points": "points",
            "verdict": "verdict",
            "page": "page",
        },
        footer=f"dashboard of {a.ref}: {len(built.pages)} page(s), {built.points} "
        f"point(s){skipped}; open {out / 'index.html'}",
    )
    return EXIT_OK
