"""``gatekeeper comment``: post or update the sticky PR comment with the report."""

from __future__ import annotations

import re

from ..errors import EXIT_OK, UsageError
from ..github.comment import upsert_sticky_comment
from ..github.event import pr_context_from_env
from ..secrecy import secret
from .common import Context, input_file

HELP = "post the report as one sticky pull-request comment (updated in place)"


def register(sub, parents) -> None:
    p = sub.add_parser("comment", help=HELP, description=HELP, parents=parents)
    p.add_argument("--report", metavar="PATH", default="report.md")
    p.add_argument(
        "--repo", metavar="OWNER/NAME", help="default: the pull request of $GITHUB_EVENT_PATH"
    )
    p.add_argument("--pr", type=int, metavar="N", help="pull request number (with --repo)")
    p.add_argument(
        "--author",
        metavar="LOGIN",
        help="login the comment is posted as (default: the token's user, else github-actions[bot])",
    )


# a repository as GitHub names one: OWNER/NAME, never a path of more segments
REPO_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/(?!\.\.?$)[A-Za-z0-9._-]{1,100}")


def run(ctx: Context) -> int:
    args = ctx.args
    if args.pr is not None or args.repo:  # the flags are checked before anything is sent
        if args.pr is None or not args.repo:
            raise UsageError("--repo and --pr go together")
        if args.pr < 1:
            raise UsageError(f"--pr must be a pull request number (1 or more), not {args.pr}")
        if not REPO_NAME.fullmatch(args.repo):
            raise UsageError(f"--repo must be OWNER/NAME, not {args.repo!r}")
    token = secret("GITHUB_TOKEN") or secret("GH_TOKEN")
    if not token:
        raise UsageError("no GitHub token: set GITHUB_TOKEN (the action passes `github-token`)")
    if args.pr is not None:
        repo, number = args.repo, args.pr
    else:
        pr = pr_context_from_env()
        if pr is None:
            ctx.emit(
                {"command": "comment", "action": "skipped", "reason": "not a pull request event"},
                footer="not a pull request event: no comment posted",
            )
            return EXIT_OK
        repo, number = pr.repo, pr.number
    path = input_file(args.report, "--report", "report")
    try:
        body = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise UsageError(f"--report {path}: cannot read: {e.strerror or e}") from None
    result = upsert_sticky_comment(
        repo=repo, issue_number=number, body=body, token=token, author=args.author
    )
    ctx.emit(
        {
            "command": "comment",
            "action": result.action,
            "url": result.url,
            "reason": result.reason or None,
        },
        footer=f"comment {result.action}: {result.url or result.reason}",
    )
    return EXIT_OK
