"""The GitHub Actions event this run is about: its pull request, and whether it came from a fork.

Fork detection decides whether the store may be written (``read-only: auto``), so whatever
is unsure counts as a fork: a PR event kind this module does not know, an ``issue_comment``
on a pull request (its payload names no head repository), a head repository that is gone.
An event that cannot be read raises GitHubError, which :func:`read_only_from_env` also
takes as read-only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .client import GitHubError

# the events whose payload has ``pull_request`` with its head and base
PR_EVENTS = frozenset(
    {"pull_request", "pull_request_target", "pull_request_review", "pull_request_review_comment"}
)


@dataclass(frozen=True)
class PRContext:
    """The pull request a workflow run is about, read from the Actions event."""

    repo: str  # "owner/name" of the base repository
    number: int
    is_fork: bool  # the head lives in another repository, or that is not known for sure
    base_ref: str  # "" when the event does not say (issue_comment)
    head_sha: str
    base_sha: str = ""  # pull_request.base.sha: the base branch commit this event compares with
    labels: tuple[str, ...] = ()  # the PR's label names (e.g. gatekeeper:accept)


def pr_context_from_env(environ: Mapping[str, str] = os.environ) -> PRContext | None:
    """The pull request this Actions run is about, or None when the event is not about one."""
    name, path = environ.get("GITHUB_EVENT_NAME", ""), environ.get("GITHUB_EVENT_PATH", "")
    maybe_pr = name.startswith("pull_request") or name == "issue_comment"
    if not name or not path:
        if maybe_pr:
            raise GitHubError(
                f"a {name} event without GITHUB_EVENT_PATH: cannot tell its pull request"
            )
        return None
    try:
        with open(path, encoding="utf-8") as f:
            event = json.load(f)
    except (OSError, ValueError) as exc:
        if not maybe_pr:
            return None  # a push or a schedule: nothing to learn from it
        raise GitHubError(f"cannot read the {name} event at {path}: {exc!r}") from exc
    try:
        return _context(
            name, event if isinstance(event, dict) else {}, environ.get("GITHUB_REPOSITORY", "")
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise GitHubError(
            f"cannot read the pull request of the {name} event at {path}: {exc!r}"
        ) from exc


def read_only_from_env(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this run must not write the store: a fork's PR, or not sure that it is not one."""
    try:
        context = pr_context_from_env(environ)
    except GitHubError:
        return True
    return context is not None and context.is_fork


def _context(name: str, event: dict[str, Any], repository: str) -> PRContext | None:
    pr, issue = event.get("pull_request"), event.get("issue")
    if isinstance(pr, dict):  # pull_request*, and any event kind yet unknown that carries one
        base_repo = pr["base"]["repo"]["full_name"]
        head_repo = (pr["head"].get("repo") or {}).get("full_name")  # None: the fork was deleted
        return PRContext(
            repo=repository or base_repo,
            number=int(pr["number"]),
            is_fork=name not in PR_EVENTS or head_repo != base_repo,
            base_ref=pr["base"]["ref"],
            head_sha=pr["head"]["sha"],
            base_sha=pr["base"].get("sha") or "",
            labels=_labels(pr),
        )
    if isinstance(issue, dict) and "pull_request" in issue:  # issue_comment on a PR: no head repo
        repo = repository or event["repository"]["full_name"]
        return PRContext(
            repo=repo,
            number=int(issue["number"]),
            is_fork=True,
            base_ref="",
            head_sha="",
            labels=_labels(issue),
        )
    if name.startswith("pull_request"):
        raise KeyError("pull_request")
    return None


def _labels(item: dict[str, Any]) -> tuple[str, ...]:
    return tuple(
        str(label["name"]) for label in item.get("labels") or [] if isinstance(label, dict)
    )
