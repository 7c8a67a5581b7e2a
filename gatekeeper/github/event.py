"""The GitHub Actions event this run is about: its pull request, and whether it came from a fork.

Fork detection decides whether the store may be written (``read-only: auto``), so whatever
is unsure counts as a fork: a PR event kind this module does not know, an ``issue_comment``
on a pull request (its payload names no head repository), a head repository that is gone,
a ``workflow_run`` or ``check_suite``/``check_run`` of a fork's head, a ``merge_group``,
an event kind that is not known to carry no outside code.
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


# events that carry no pull request and run no outside code: a run of one may write
# (issue_comment: one on a plain issue; on a pull request it is read-only, above)
TRUSTED_EVENTS = frozenset(
    {
        "push",
        "schedule",
        "workflow_dispatch",
        "repository_dispatch",
        "release",
        "create",
        "delete",
        "deployment",
        "deployment_status",
        "registry_package",
        "page_build",
        "issue_comment",
        "issues",
    }
)


def read_only_from_env(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this run must not write the store: a fork's PR, or not sure that it is not one.

    Every event kind is decided: a pull request's events by its head repository;
    ``workflow_run`` by the head repository of the run that triggered it;
    ``check_suite`` and ``check_run`` by their head branch (GitHub leaves it null for a
    fork's) and their pull requests' head and base repositories; the events of
    :data:`TRUSTED_EVENTS` are writable; anything else (``merge_group``, whose queued
    pull requests the payload does not name, and every kind this module does not know)
    is read-only. Outside Actions (no ``GITHUB_EVENT_NAME``) nothing is a fork."""
    name = environ.get("GITHUB_EVENT_NAME", "")
    try:
        context = pr_context_from_env(environ)
    except GitHubError:
        return True
    if context is not None:
        return context.is_fork
    if not name or name in TRUSTED_EVENTS:
        return False
    if name not in ("workflow_run", "check_suite", "check_run"):
        return True  # merge_group, and whatever this module does not know
    try:
        with open(environ.get("GITHUB_EVENT_PATH", ""), encoding="utf-8") as f:
            event = json.load(f)
        return _untrusted_run(name, event, environ.get("GITHUB_REPOSITORY", ""))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return True  # unreadable: unsure


def _untrusted_run(name: str, event: dict[str, Any], repository: str) -> bool:
    """Whether a workflow_run / check_suite / check_run event may be about a fork."""
    base = event["repository"]
    if name == "workflow_run":
        run = event["workflow_run"]
        head = run.get("head_repository")
        if not isinstance(head, dict) or not head.get("full_name"):
            return True  # the head repository is gone or not said: unsure
        base_name = repository or base["full_name"]
        return bool(head["full_name"] != base_name or _fork_prs(run.get("pull_requests")))
    suite = event["check_suite"] if name == "check_suite" else event["check_run"]["check_suite"]
    if suite.get("head_branch") is None:
        return True  # GitHub leaves it null when the head branch is in a fork
    prs = list(suite.get("pull_requests") or [])
    if name == "check_run":
        prs += event["check_run"].get("pull_requests") or []
    return _fork_prs(prs, base.get("id"))


def _fork_prs(prs: object, base_id: object = None) -> bool:
    """Whether any of these (abridged) pull requests comes from another repository
    than its base; a malformed entry counts as one."""
    if prs is None:
        return False
    if not isinstance(prs, list):
        return True
    for pr in prs:
        try:
            head, into = pr["head"]["repo"], pr["base"]["repo"]
            if head is None or head.get("id") is None or head.get("id") != into.get("id"):
                return True
            if base_id is not None and into.get("id") != base_id:
                return True
        except (KeyError, TypeError, AttributeError):
            return True
    return False


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
