"""The sticky PR comment against a fake GitHub API, the PR context, and the Actions layer."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from gatekeeper import ghactions, github
from gatekeeper.errors import GatekeeperError
from gatekeeper.github import CommentResult, GitHubError, pr_context_from_env, upsert_sticky_comment
from github_server import FakeGitHub

REPO = "acme/models"
PR = 7
MARKER = github.DEFAULT_MARKER
PAT = "ghp_pat_secret"
ACTIONS = "ghs_actions_secret"

_GITHUB_ENV = ("GITHUB_ACTIONS", "GITHUB_API_URL", "GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY",
               "GITHUB_REPOSITORY", "GITHUB_EVENT_NAME", "GITHUB_EVENT_PATH")


@pytest.fixture(autouse=True)
def _outside_actions(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests start outside Actions, even when the suite itself runs in a workflow."""
    for name in _GITHUB_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(github, "RETRY_DELAYS_S", (0.0, 0.0))


@pytest.fixture
def api(github_api: FakeGitHub) -> FakeGitHub:
    github_api.add_token(PAT, "octocat")
    github_api.add_actions_token(ACTIONS)
    return github_api


def upsert(api: FakeGitHub, body: str, token: str = PAT, **kwargs: Any) -> CommentResult:
    return upsert_sticky_comment(repo=REPO, issue_number=PR, body=body, token=token, api_url=api.url, **kwargs)


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
    pages = [r.query.get("page", "1") for r in api.requests if r.path.endswith(f"/issues/{PR}/comments")]
    assert pages == ["1", "2"]
    assert all(r.query["per_page"] == "100" for r in api.requests if r.path.endswith("/comments"))


def test_walks_every_page_before_creating(api: FakeGitHub) -> None:
    api.seed_comments(REPO, PR, 250)

    assert upsert(api, "report").action == "created"
    pages = [r.query.get("page", "1") for r in api.requests if r.method == "GET" and "/issues/" in r.path]
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


def test_bad_credentials_raise_one_line(api: FakeGitHub) -> None:
    with pytest.raises(GitHubError) as excinfo:
        upsert(api, "report", token="ghp_wrong_secret")

    message = str(excinfo.value)
    assert isinstance(excinfo.value, GatekeeperError)
    assert "401" in message and "Bad credentials" in message
    assert "\n" not in message and "ghp_wrong_secret" not in message


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


def test_sends_github_headers(api: FakeGitHub) -> None:
    upsert(api, "report")

    for request in api.requests:
        headers = {k.lower(): v for k, v in request.headers.items()}
        assert headers["accept"] == "application/vnd.github+json"
        assert headers["x-github-api-version"] == "2022-11-28"
        assert headers["authorization"] == f"Bearer {PAT}"
        assert headers["user-agent"].startswith("gatekeeper")


def test_api_url_comes_from_the_environment(api: FakeGitHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GITHUB_API_URL", api.url + "/")

    result = upsert_sticky_comment(repo=REPO, issue_number=PR, body="ghes", token=PAT)

    assert result.action == "created"


def test_long_bodies_are_truncated_with_a_note(api: FakeGitHub) -> None:
    upsert(api, "x" * 100_000)

    [comment] = api.comments_on(REPO, PR)
    assert len(comment["body"]) == github.MAX_COMMENT_CHARS
    assert comment["body"].startswith(MARKER) and comment["body"].endswith(github.TRUNCATION_NOTE)


def test_server_errors_are_retried(api: FakeGitHub) -> None:
    api.fail_next(2, status=502)

    assert upsert(api, "report").action == "created"


def test_persistent_server_errors_raise_one_line(api: FakeGitHub) -> None:
    api.fail_next(10, status=503)

    with pytest.raises(GitHubError, match=r"failed after 3 attempts: HTTP 503") as excinfo:
        upsert(api, "report")
    assert "\n" not in str(excinfo.value)


def test_unreachable_api_raises_one_line(api: FakeGitHub) -> None:
    url = api.url
    api_port_closed = url.rsplit(":", 1)[0] + ":1"

    with pytest.raises(GitHubError, match="failed after 3 attempts") as excinfo:
        upsert_sticky_comment(repo=REPO, issue_number=PR, body="x", token=PAT, api_url=api_port_closed)
    assert "\n" not in str(excinfo.value) and PAT not in str(excinfo.value)


def test_rejects_a_malformed_repo(api: FakeGitHub) -> None:
    with pytest.raises(GitHubError, match="owner/name"):
        upsert_sticky_comment(repo="../etc", issue_number=PR, body="x", token=PAT, api_url=api.url)


# --- the pull request context -------------------------------------------------------


def _event(tmp_path: Path, head_repo: dict[str, Any] | None) -> str:
    event = {"pull_request": {
        "number": 42,
        "base": {"ref": "main", "repo": {"full_name": REPO}},
        "head": {"ref": "feature", "sha": "abc123", "repo": head_repo},
    }}
    path = tmp_path / "event.json"
    path.write_text(json.dumps(event))
    return str(path)


def _env(event_path: str, event_name: str = "pull_request") -> dict[str, str]:
    return {"GITHUB_REPOSITORY": REPO, "GITHUB_EVENT_NAME": event_name, "GITHUB_EVENT_PATH": event_path}


def test_pr_context_of_a_same_repo_pr(tmp_path: Path) -> None:
    context = pr_context_from_env(_env(_event(tmp_path, {"full_name": REPO})))

    assert context == github.PRContext(repo=REPO, number=42, is_fork=False, base_ref="main", head_sha="abc123")


def test_pr_context_of_a_fork_pr(tmp_path: Path) -> None:
    context = pr_context_from_env(_env(_event(tmp_path, {"full_name": "someone/models"})))

    assert context is not None and context.is_fork and context.number == 42


def test_pr_context_of_a_deleted_fork(tmp_path: Path) -> None:
    context = pr_context_from_env(_env(_event(tmp_path, None), "pull_request_target"))

    assert context is not None and context.is_fork


def test_no_pr_context_outside_a_pr(tmp_path: Path) -> None:
    assert pr_context_from_env(_env(_event(tmp_path, {"full_name": REPO}), "push")) is None
    assert pr_context_from_env({}) is None


def test_unreadable_event_raises_one_line(tmp_path: Path) -> None:
    (tmp_path / "event.json").write_text("{}")

    with pytest.raises(GitHubError, match="cannot read the pull_request event"):
        pr_context_from_env(_env(str(tmp_path / "event.json")))


# --- the GitHub Actions layer -----------------------------------------------------------


def _read_file_commands(path: Path) -> dict[str, str]:
    """Parse ``name<<DELIM`` heredoc records the way the runner does."""
    lines = path.read_text(encoding="utf-8").split(os.linesep)
    values: dict[str, str] = {}
    while lines and lines[0]:
        name, delimiter = lines.pop(0).split("<<", 1)
        end = lines.index(delimiter)
        values[name] = "\n".join(lines[:end])
        lines = lines[end + 1:]
    return values


@pytest.fixture
def actions_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_OUTPUT", str(tmp_path / "output"))
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "summary.md"))
    return tmp_path


def test_set_output_writes_multiline_records(actions_env: Path) -> None:
    report = "## Report\n\n| a | b |\n|---|---|\nEOF\n"

    assert ghactions.in_actions()
    assert ghactions.set_output("verdict", "pass")
    assert ghactions.set_output("report", report)
    assert ghactions.set_output("cache-hit", True)

    assert _read_file_commands(actions_env / "output") == {"verdict": "pass", "report": report, "cache-hit": "true"}


def test_append_summary_appends_markdown(actions_env: Path) -> None:
    assert ghactions.append_summary("# one")
    assert ghactions.append_summary("two")

    assert (actions_env / "summary.md").read_text(encoding="utf-8") == "# one\ntwo\n"


def test_workflow_commands_in_actions(actions_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ghactions.error_annotation("3 regressions,\nsee summary", file="gate.toml", line=3, title="gate")
    assert ghactions.warning_annotation("cache miss")
    with ghactions.group("compile"):
        print("inside")
    assert ghactions.mask("s3cr3t\nline2")

    assert capsys.readouterr().out.splitlines() == [
        "::error title=gate,file=gate.toml,line=3::3 regressions,%0Asee summary",
        "::warning ::cache miss",
        "::group ::compile",
        "inside",
        "::endgroup::",
        "::add-mask ::s3cr3t",
        "::add-mask ::line2",
    ]


def test_outside_actions_everything_is_a_no_op(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert not ghactions.in_actions()
    assert not ghactions.set_output("verdict", "pass")
    assert not ghactions.append_summary("# report")
    assert not ghactions.error_annotation("boom")
    assert not ghactions.warning_annotation("hmm")
    assert not ghactions.mask("secret")
    with ghactions.group("compile"):
        pass

    assert capsys.readouterr().out == ""
    assert list(tmp_path.iterdir()) == []
