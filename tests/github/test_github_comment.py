"""The sticky PR comment against the fake GitHub API: found by marker and author, updated in
place, never duplicated, skipped (not failed) for a read-only token, never for a rate limit."""

from __future__ import annotations

import time
from typing import Any

import pytest
from support.github_server import DROP, FakeGitHub, Scripted

from gatekeeper.github import comment
from gatekeeper.github.client import GitHubError
from gatekeeper.github.comment import CommentResult, upsert_sticky_comment

REPO = "acme/models"
PR = 7
MARKER = comment.DEFAULT_MARKER
PAT = "ghp_pat_secret"
ACTIONS = "ghs_actions_secret"


def upsert(api: FakeGitHub, body: str, token: str = PAT, **kwargs: Any) -> CommentResult:
    return upsert_sticky_comment(
        repo=REPO, issue_number=PR, body=body, token=token, api_url=api.url, **kwargs
    )


def test_second_upsert_updates_the_comment_in_place(api: FakeGitHub) -> None:
    first = upsert(api, "verdict: pass")
    second = upsert(api, "verdict: fail")

    [comment] = api.comments_on(REPO, PR)
    assert (first.action, second.action) == ("created", "updated")
    assert first.url == second.url == comment["html_url"]
    assert comment["body"] == f"{MARKER}\nverdict: fail"
    assert comment["user"]["login"] == "octocat"
    assert [(r.method, r.path) for r in api.writes()] == [
        ("POST", f"/repos/{REPO}/issues/{PR}/comments"),
        ("PATCH", f"/repos/{REPO}/issues/comments/{comment['id']}"),
    ]


def test_marker_comment_by_another_author_is_left_alone(api: FakeGitHub) -> None:
    quoted = api.add_comment(REPO, PR, f"quoting the bot: {MARKER} old report", login="mallory")

    result = upsert(api, "report")

    assert result.action == "created"
    others, ours = api.comments_on(REPO, PR)
    assert others == quoted and others["body"] == f"quoting the bot: {MARKER} old report"
    assert ours["user"]["login"] == "octocat"


def test_finds_the_marker_comment_past_the_first_page(api: FakeGitHub) -> None:
    api.seed_comments(REPO, PR, 120)
    sticky = api.add_comment(REPO, PR, f"{MARKER}\nold report", login="octocat")
    api.seed_comments(REPO, PR, 30)

    result = upsert(api, "new report")

    assert result.action == "updated"
    assert len(api.comments_on(REPO, PR)) == 151
    assert sticky["body"] == f"{MARKER}\nnew report"
    pages = [
        r.query.get("page", "1") for r in api.requests if r.path.endswith(f"/issues/{PR}/comments")
    ]
    assert pages == ["1", "2"]
    assert all(r.query["per_page"] == "100" for r in api.requests if r.path.endswith("/comments"))


def test_walks_every_page_before_creating(api: FakeGitHub) -> None:
    api.seed_comments(REPO, PR, 250)

    assert upsert(api, "report").action == "created"
    pages = [
        r.query.get("page", "1") for r in api.requests if r.method == "GET" and "/issues/" in r.path
    ]
    assert pages == ["1", "2", "3"]


def test_read_only_token_skips_without_raising(api: FakeGitHub) -> None:
    api.add_actions_token("ghs_fork_readonly", write=False)

    result = upsert(api, "report", token="ghs_fork_readonly")

    assert result.action == "skipped" and result.url is None
    assert "cannot write" in result.reason and "workflow_run" in result.reason
    assert "fork-comment.yml" in result.reason and "\n" not in result.reason
    assert api.comments_on(REPO, PR) == []


def test_read_only_token_skips_the_update_too(api: FakeGitHub) -> None:
    api.add_comment(REPO, PR, f"{MARKER}\nold", login="github-actions[bot]")
    api.add_actions_token("ghs_fork_readonly", write=False)

    assert upsert(api, "new", token="ghs_fork_readonly").action == "skipped"
    assert api.comments_on(REPO, PR)[0]["body"] == f"{MARKER}\nold"


def test_actions_token_comments_as_github_actions_bot(api: FakeGitHub) -> None:
    api.add_comment(REPO, PR, f"{MARKER}\nby a person", login="octocat")
    ours = api.add_comment(REPO, PR, f"{MARKER}\nby the bot", login="github-actions[bot]")

    result = upsert(api, "fresh", token=ACTIONS)

    assert result.action == "updated" and result.url == ours["html_url"]
    assert ours["body"] == f"{MARKER}\nfresh"
    assert api.comments_on(REPO, PR)[0]["body"] == f"{MARKER}\nby a person"
    assert [r.path for r in api.requests][0] == "/user"


def test_explicit_author_skips_the_user_lookup(api: FakeGitHub) -> None:
    upsert(api, "report", author="octocat")

    assert "/user" not in [r.path for r in api.requests]


def test_long_bodies_are_truncated_with_a_note(api: FakeGitHub) -> None:
    upsert(api, "x" * 100_000)

    [posted] = api.comments_on(REPO, PR)
    assert len(posted["body"]) == comment.MAX_COMMENT_CHARS
    assert posted["body"].startswith(MARKER) and posted["body"].endswith(comment.TRUNCATION_NOTE)


def test_rejects_a_malformed_repo(api: FakeGitHub) -> None:
    with pytest.raises(GitHubError, match="owner/name"):
        upsert_sticky_comment(repo="../etc", issue_number=PR, body="x", token=PAT, api_url=api.url)


# --- rate limits are waited out, never taken for a read-only token -------------------


def test_primary_rate_limit_on_the_post_waits_for_the_reset(api: FakeGitHub) -> None:
    api.rate_limit(after=2, reset_in=1)  # /user and the list pass, the POST gets 403

    result = upsert(api, "report")

    assert result.action == "created"
    assert len(api.comments_on(REPO, PR)) == 1
    assert [r.method for r in api.writes()] == ["POST", "POST"]  # refused, then after the reset


def test_rate_limited_write_past_the_cap_is_an_error_not_read_only(api: FakeGitHub) -> None:
    api.rate_limit(after=2, reset_in=3600)

    with pytest.raises(GitHubError, match="rate limit exceeded.*past the 5 s") as excinfo:
        upsert(api, "report")
    assert "\n" not in str(excinfo.value) and "cannot write" not in str(excinfo.value)
    assert api.comments_on(REPO, PR) == []


def test_secondary_rate_limit_on_the_post_honours_retry_after(api: FakeGitHub) -> None:
    api.secondary_rate_limit(retry_after=1, method="POST")  # 403, like GitHub

    start = time.monotonic()
    result = upsert(api, "report")

    assert result.action == "created" and len(api.comments_on(REPO, PR)) == 1
    assert time.monotonic() - start >= 1  # 5xx retries do not sleep in these tests: Retry-After did


def test_secondary_rate_limit_on_the_update_is_not_read_only(api: FakeGitHub) -> None:
    ours = api.add_comment(REPO, PR, f"{MARKER}\nold", login="octocat")
    api.secondary_rate_limit(retry_after=1, method="PATCH")

    assert upsert(api, "new").action == "updated"
    assert ours["body"] == f"{MARKER}\nnew"


# --- a POST is never repeated blindly ----------------------------------------------------


@pytest.mark.parametrize("failure", [DROP, 502, 504], ids=["dropped", "502", "504"])
def test_post_that_failed_after_it_was_applied_is_not_repeated(
    api: FakeGitHub, failure: int
) -> None:
    api.fail_after_apply("POST", status=failure)

    result = upsert(api, "report")

    [created] = api.comments_on(REPO, PR)
    assert result.action == "created" and result.url == created["html_url"]
    assert [r.method for r in api.writes()] == ["POST"]


def test_post_that_failed_before_it_was_applied_is_sent_again(api: FakeGitHub) -> None:
    api.script.append(Scripted(502, {"message": "Server Error"}, method="POST"))  # not applied

    result = upsert(api, "report")

    assert result.action == "created" and len(api.comments_on(REPO, PR)) == 1
    assert [r.method for r in api.writes()] == ["POST", "POST"]  # listed again in between
    assert [r.method for r in api.requests].count("GET") == 3  # /user, the list, the list again


def test_post_that_keeps_failing_raises_one_line(api: FakeGitHub) -> None:
    api.script.extend(
        [Scripted(503, {"message": "Server Error"}, method="POST")] * comment.POST_ATTEMPTS
    )

    with pytest.raises(GitHubError, match="POST .*HTTP 503") as excinfo:
        upsert(api, "report")
    assert "\n" not in str(excinfo.value) and api.comments_on(REPO, PR) == []
    assert len(api.writes()) == comment.POST_ATTEMPTS  # each after a list that did not show it
