"""The Actions event: the pull request it is about, and fork detection for ``read-only: auto``.

Every event kind that carries a pull request is covered; whatever leaves the head repository
unknown (issue_comment, a PR event kind this module does not know, a deleted fork, an
unreadable event) must come out read-only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gatekeeper.github.client import GitHubError
from gatekeeper.github.event import PRContext, pr_context_from_env, read_only_from_env

REPO = "acme/models"
BASE_SHA = "b" * 40
HEAD_SHA = "a" * 40


def _pull_request(head_repo: str | None, labels: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "number": 42,
        "labels": [{"id": i, "name": name, "color": "ededed"} for i, name in enumerate(labels)],
        "base": {"ref": "main", "sha": BASE_SHA, "repo": {"full_name": REPO}},
        "head": {
            "ref": "feature",
            "sha": HEAD_SHA,
            "repo": None if head_repo is None else {"full_name": head_repo},
        },
    }


def _issue_comment(on_pr: bool = True) -> dict[str, Any]:
    issue: dict[str, Any] = {"number": 42, "labels": [{"name": "gatekeeper:accept"}]}
    if on_pr:
        issue["pull_request"] = {"url": f"https://api.github.com/repos/{REPO}/pulls/42"}
    return {
        "action": "created",
        "issue": issue,
        "comment": {"body": "/benchmark"},
        "repository": {"full_name": REPO},
    }


def _env(tmp_path: Path, name: str, event: Any) -> dict[str, str]:
    path = tmp_path / "event.json"
    path.write_text(event if isinstance(event, str) else json.dumps(event))
    return {"GITHUB_REPOSITORY": REPO, "GITHUB_EVENT_NAME": name, "GITHUB_EVENT_PATH": str(path)}


PR_KINDS = [
    "pull_request",
    "pull_request_target",
    "pull_request_review",
    "pull_request_review_comment",
]


@pytest.mark.parametrize("name", PR_KINDS)
def test_a_same_repo_pr_is_writable(tmp_path: Path, name: str) -> None:
    env = _env(tmp_path, name, {"pull_request": _pull_request(REPO, ("gatekeeper:accept", "perf"))})

    assert pr_context_from_env(env) == PRContext(
        repo=REPO,
        number=42,
        is_fork=False,
        base_ref="main",
        head_sha=HEAD_SHA,
        base_sha=BASE_SHA,
        labels=("gatekeeper:accept", "perf"),
    )
    assert read_only_from_env(env) is False


@pytest.mark.parametrize("name", PR_KINDS)
def test_a_fork_pr_is_read_only(tmp_path: Path, name: str) -> None:
    # pull_request_review and pull_request_review_comment were taken for "not a PR": writable
    env = _env(tmp_path, name, {"pull_request": _pull_request("mallory/models")})

    context = pr_context_from_env(env)
    assert context is not None and context.is_fork and context.number == 42
    assert read_only_from_env(env) is True


@pytest.mark.parametrize("name", PR_KINDS)
def test_a_deleted_fork_is_read_only(tmp_path: Path, name: str) -> None:
    env = _env(tmp_path, name, {"pull_request": _pull_request(None)})

    assert read_only_from_env(env) is True


def test_an_issue_comment_on_a_pr_is_read_only(tmp_path: Path) -> None:
    # the payload names no head repository: a fork cannot be ruled out
    env = _env(tmp_path, "issue_comment", _issue_comment())

    context = pr_context_from_env(env)
    assert context == PRContext(
        repo=REPO, number=42, is_fork=True, base_ref="", head_sha="", labels=("gatekeeper:accept",)
    )
    assert read_only_from_env(env) is True


def test_an_issue_comment_on_an_issue_is_no_pr(tmp_path: Path) -> None:
    env = _env(tmp_path, "issue_comment", _issue_comment(on_pr=False))

    assert pr_context_from_env(env) is None
    assert read_only_from_env(env) is False


@pytest.mark.parametrize("name", ["pull_request_review_thread", "some_future_event"])
def test_an_unknown_event_kind_with_a_pr_is_read_only(tmp_path: Path, name: str) -> None:
    env = _env(tmp_path, name, {"pull_request": _pull_request(REPO)})  # same repo, even

    context = pr_context_from_env(env)
    assert context is not None and context.is_fork
    assert read_only_from_env(env) is True


_UNREADABLE = ["{}", "not json", "[]", json.dumps({"pull_request": {"number": 1}})]


@pytest.mark.parametrize(
    ("name", "event"),
    [
        *(
            (name, event)
            for name in ("pull_request", "pull_request_review", "pull_request_something_new")
            for event in _UNREADABLE
        ),
        ("issue_comment", "not json"),
        ("issue_comment", json.dumps({"issue": {"pull_request": {}, "number": "x"}})),
    ],
)
def test_an_unreadable_pr_event_raises_and_is_read_only(
    tmp_path: Path, name: str, event: str
) -> None:
    env = _env(tmp_path, name, event)

    with pytest.raises(GitHubError, match="cannot read the") as excinfo:
        pr_context_from_env(env)
    assert "\n" not in str(excinfo.value)
    assert read_only_from_env(env) is True


def test_a_pr_event_without_its_file_is_read_only() -> None:
    env = {"GITHUB_REPOSITORY": REPO, "GITHUB_EVENT_NAME": "pull_request"}

    assert read_only_from_env(env) is True


@pytest.mark.parametrize("name", ["push", "schedule", "workflow_dispatch"])
def test_other_events_are_no_pr_and_writable(tmp_path: Path, name: str) -> None:
    env = _env(tmp_path, name, {"ref": "refs/heads/main", "after": HEAD_SHA})

    assert pr_context_from_env(env) is None
    assert read_only_from_env(env) is False
    assert read_only_from_env({**env, "GITHUB_EVENT_PATH": str(tmp_path / "missing.json")}) is False


def test_outside_actions_there_is_no_pr() -> None:
    assert pr_context_from_env({}) is None
    assert read_only_from_env({}) is False


def test_the_repository_comes_from_the_runner_first(tmp_path: Path) -> None:
    env = _env(tmp_path, "pull_request", {"pull_request": _pull_request(REPO)})

    context = pr_context_from_env({**env, "GITHUB_REPOSITORY": "acme/renamed"})
    assert context is not None and context.repo == "acme/renamed"


# -- event kinds without a pull_request payload (docs/hardening.md, finding 7) ------------

FORK = "mallory/models"


def _workflow_run(head_repo: str | None, event: str = "pull_request") -> dict[str, Any]:
    run: dict[str, Any] = {
        "id": 99,
        "event": event,
        "head_branch": "feature",
        "head_sha": HEAD_SHA,
        "repository": {"full_name": REPO},
        "head_repository": None if head_repo is None else {"full_name": head_repo},
        # GitHub lists no pull request for a fork's run
        "pull_requests": [] if head_repo != REPO else [_abridged_pr(1, 1)],
    }
    return {"action": "completed", "workflow_run": run, "repository": {"full_name": REPO}}


def _abridged_pr(head_id: int | None, base_id: int) -> dict[str, Any]:
    """A pull request as check_suite, check_run and workflow_run events abridge it."""
    return {
        "number": 42,
        "head": {"ref": "feature", "sha": HEAD_SHA, "repo": {"id": head_id, "name": "models"}},
        "base": {"ref": "main", "sha": BASE_SHA, "repo": {"id": base_id, "name": "models"}},
    }


def _check_suite(head_branch: str | None, prs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "head_branch": head_branch,
        "head_sha": HEAD_SHA,
        "pull_requests": prs,
        "app": {"slug": "github-actions"},
    }


def _check_event(name: str, head_branch: str | None, prs: list[dict[str, Any]]) -> dict[str, Any]:
    suite = _check_suite(head_branch, prs)
    repository = {"id": 1, "full_name": REPO}
    if name == "check_suite":
        return {"action": "rerequested", "check_suite": suite, "repository": repository}
    run = {"name": "gate", "head_sha": HEAD_SHA, "check_suite": suite, "pull_requests": prs}
    return {"action": "rerequested", "check_run": run, "repository": repository}


def test_a_workflow_run_of_a_fork_is_read_only(tmp_path: Path) -> None:
    # before: no pull_request in the payload, so "not a PR" and writable
    assert read_only_from_env(_env(tmp_path, "workflow_run", _workflow_run(FORK))) is True
    gone = _env(tmp_path, "workflow_run", _workflow_run(None))  # the fork was deleted
    assert read_only_from_env(gone) is True


def test_a_workflow_run_of_this_repository_is_writable(tmp_path: Path) -> None:
    for event in ("push", "pull_request"):
        env = _env(tmp_path, "workflow_run", _workflow_run(REPO, event))
        assert read_only_from_env(env) is False


@pytest.mark.parametrize("name", ["check_suite", "check_run"])
def test_a_check_event_of_a_fork_is_read_only(tmp_path: Path, name: str) -> None:
    # a fork's head branch: GitHub sends head_branch null and no pull requests
    assert read_only_from_env(_env(tmp_path, name, _check_event(name, None, []))) is True
    # a pull request whose head repository is another one than its base
    fork_pr = _check_event(name, "feature", [_abridged_pr(2, 1)])
    assert read_only_from_env(_env(tmp_path, name, fork_pr)) is True
    malformed = _check_event(name, "feature", [{"number": 42}])
    assert read_only_from_env(_env(tmp_path, name, malformed)) is True


@pytest.mark.parametrize("name", ["check_suite", "check_run"])
def test_a_check_event_of_this_repository_is_writable(tmp_path: Path, name: str) -> None:
    same = _check_event(name, "feature", [_abridged_pr(1, 1)])
    assert read_only_from_env(_env(tmp_path, name, same)) is False
    branch = _check_event(name, "main", [])  # a push's suite
    assert read_only_from_env(_env(tmp_path, name, branch)) is False


@pytest.mark.parametrize(
    ("name", "event"),
    [
        # a merge queue's commit holds queued pull requests the payload does not name
        ("merge_group", {"merge_group": {"head_sha": HEAD_SHA, "head_ref": "gh-readonly-queue"}}),
        ("discussion_comment", {"discussion": {"number": 3}}),
        ("some_future_event", {"whatever": True}),
        ("workflow_run", "not json"),
        ("check_suite", {"check_suite": "?"}),
    ],
)
def test_every_other_event_kind_is_read_only(tmp_path: Path, name: str, event: Any) -> None:
    assert read_only_from_env(_env(tmp_path, name, event)) is True
