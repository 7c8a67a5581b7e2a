"""The one sticky PR comment, found by a hidden marker AND its author, updated in place.

Never two: a POST that failed after it was sent (5xx, timeout, dropped connection) is only
repeated when listing the comments again shows it did not land. A token that may not write
(a fork PR's) skips; a rate limit is waited out by ``client.call``, never taken for that.
"""

import re
from dataclasses import dataclass
from typing import Any, Literal

from .client import GitHubError, Unsure, call, connect

DEFAULT_MARKER = "<!-- gatekeeper-report -->"
ACTIONS_BOT_LOGIN = "github-actions[bot]"  # the author of comments made with GITHUB_TOKEN
MAX_COMMENT_CHARS = 65536  # GitHub refuses longer comment bodies
TRUNCATION_NOTE = (
    "\n\n---\n*Report truncated: it exceeds GitHub's 65536-character comment limit. "
    "The job summary and the `report` output have it in full.*\n"
)
POST_ATTEMPTS = 3  # a POST is repeated only when listing again showed it did not land
_REPO_RE = re.compile(r"^[A-Za-z0-9-]+/(?!\.\.?$)[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class CommentResult:
    action: Literal["created", "updated", "skipped"]
    url: str | None = None  # the comment's html_url
    reason: str = ""  # one line, when skipped


def upsert_sticky_comment(
    *,
    repo: str,
    issue_number: int,
    body: str,
    token: str,
    marker: str = DEFAULT_MARKER,
    api_url: str | None = None,
    author: str | None = None,
) -> CommentResult:
    """Create or update the PR's one comment with ``marker`` by ``author`` (default: the
    token's login, or github-actions[bot] when /user is refused, as for GITHUB_TOKEN)."""
    if not _REPO_RE.match(repo):
        raise GitHubError(f"not an owner/name repository: {repo!r}")
    gh, path = connect(token, api_url), f"/repos/{repo}/issues/{issue_number}/comments"
    author = author or call(
        lambda: gh.get_user().login,
        "GET /user",  # 403: an Actions token
        answers={403: ACTIONS_BOT_LOGIN},
    )
    issue, text = gh.get_repo(repo).get_issue(issue_number), comment_body(body, marker)

    def find() -> Any:
        return call(
            lambda: next(
                (
                    c
                    for c in issue.get_comments()
                    if marker in (c.body or "") and c.user and c.user.login == author
                ),
                None,
            ),
            f"GET {path}",
        )

    existing = find()
    try:
        if existing is not None:
            call(lambda: existing.edit(text), f"PATCH {existing.url}")
            return CommentResult("updated", existing.html_url)
        for _ in range(POST_ATTEMPTS):
            try:
                created = call(lambda: issue.create_comment(text), f"POST {path}", idempotent=False)
            except Unsure as exc:  # sent, then failed: it landed if listing again finds it
                created, unsure = find(), exc
            if created is not None:
                return CommentResult("created", created.html_url)
        raise unsure
    except GitHubError as exc:
        if exc.status in (403, 404):
            return CommentResult(
                "skipped",
                None,
                f"the token cannot write PR comments ({exc}; a fork "
                "PR's token is read-only); the workflow_run job in "
                "workflows/fork-comment.yml will post it",
            )
        raise


def comment_body(body: str, marker: str = DEFAULT_MARKER) -> str:
    """``body`` led by the hidden marker, cut to GitHub's size limit with a note."""
    text = body if marker in body else f"{marker}\n{body}"
    cut = MAX_COMMENT_CHARS - len(TRUNCATION_NOTE)
    return text if len(text) <= MAX_COMMENT_CHARS else text[:cut] + TRUNCATION_NOTE
