"""The REST client: GITHUB_API_URL, rate limits waited out (and capped), retries, one-line errors.

Each test drives PyGithub through ``client.connect`` and ``client.call`` against the fake
GitHub API, which answers rate limits the way GitHub does (see github_server).
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from support.github_server import DROP, FakeGitHub

from gatekeeper.errors import GatekeeperError
from gatekeeper.github import client
from gatekeeper.github.client import GitHubError, Unsure
from gatekeeper.github.comment import upsert_sticky_comment

PAT = "ghp_pat_secret"


def login(api_url: str | None, token: str = PAT) -> str:
    gh = client.connect(token, api_url)
    return client.call(lambda: gh.get_user().login, "GET /user")


def test_sends_the_token_and_a_user_agent(api: FakeGitHub) -> None:
    assert login(api.url) == "octocat"

    [request] = api.requests
    headers = {k.lower(): v for k, v in request.headers.items()}
    assert headers["authorization"] in (f"token {PAT}", f"Bearer {PAT}")
    assert headers["user-agent"] == "gatekeeper"


def test_api_url_comes_from_the_environment(
    api: FakeGitHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GITHUB_API_URL", api.url + "/")  # GitHub Enterprise Server: its own base

    assert login(None) == "octocat"

    result = upsert_sticky_comment(repo="acme/models", issue_number=7, body="ghes", token=PAT)
    assert result.action == "created"


@pytest.mark.parametrize("status", [403, 429])
def test_primary_rate_limit_waits_until_the_reset(api: FakeGitHub, status: int) -> None:
    api.rate_limit(after=0, reset_in=1, status=status)

    assert login(api.url) == "octocat"
    assert [r.path for r in api.requests] == [
        "/user",
        "/user",
    ]  # one refusal, one retry after the reset


def test_primary_rate_limit_past_the_cap_raises_at_once(api: FakeGitHub) -> None:
    api.rate_limit(after=0, reset_in=3600)

    start = time.monotonic()
    with pytest.raises(
        GitHubError, match=r"HTTP 403: API rate limit exceeded.*past the 5 s"
    ) as excinfo:
        login(api.url)
    assert time.monotonic() - start < 2  # no point waiting part of an hour
    assert isinstance(excinfo.value, GatekeeperError) and "\n" not in str(excinfo.value)


@pytest.mark.parametrize("status", [403, 429])
def test_secondary_rate_limit_honours_retry_after(api: FakeGitHub, status: int) -> None:
    api.secondary_rate_limit(retry_after=1, status=status)

    start = time.monotonic()
    assert login(api.url) == "octocat"
    assert time.monotonic() - start >= 1
    assert len(api.requests) == 2


def test_secondary_rate_limit_without_retry_after_waits_a_minute(
    api: FakeGitHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    waits: list[float] = []
    monkeypatch.setattr(client.time, "sleep", waits.append)
    api.secondary_rate_limit(retry_after=None)

    with pytest.raises(GitHubError, match="secondary rate limit.*wait 60 s"):
        login(api.url)  # the cap (5 s) is less than GitHub's advice
    monkeypatch.setattr(client, "MAX_WAIT_S", 300.0)
    api.secondary_rate_limit(retry_after=None)
    assert login(api.url) == "octocat"
    assert waits == [60.0]


def test_total_waiting_is_capped(api: FakeGitHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client, "MAX_WAIT_S", 1.5)
    api.secondary_rate_limit(2, retry_after=1)  # one wait of 1 s fits in 1.5 s, a second does not

    start = time.monotonic()
    with pytest.raises(
        GitHubError, match="asked to wait 1 s, past the 1.5 s gatekeeper waits in all"
    ):
        login(api.url)
    assert 1 <= time.monotonic() - start < 1.5
    assert len(api.requests) == 2


def test_a_refusal_that_is_no_rate_limit_raises_with_its_status(api: FakeGitHub) -> None:
    api.add_actions_token("ghs_actions")

    with pytest.raises(
        GitHubError, match="GET /user: HTTP 403: Resource not accessible"
    ) as excinfo:
        login(api.url, "ghs_actions")
    assert excinfo.value.status == 403 and len(api.requests) == 1


def test_bad_credentials_raise_one_line(api: FakeGitHub) -> None:
    with pytest.raises(GitHubError) as excinfo:
        login(api.url, "ghp_wrong_secret")

    message = str(excinfo.value)
    assert "401" in message and "Bad credentials" in message and "rejected the token" in message
    assert "\n" not in message and "ghp_wrong_secret" not in message


def test_server_errors_are_retried(api: FakeGitHub) -> None:
    api.fail_next(2, status=502)

    assert login(api.url) == "octocat"


def test_persistent_server_errors_raise_one_line(api: FakeGitHub) -> None:
    api.fail_next(10, status=503)

    with pytest.raises(
        GitHubError, match=r"GET /user failed after 3 attempts: HTTP 503"
    ) as excinfo:
        login(api.url)
    assert "\n" not in str(excinfo.value)


def test_unreachable_api_raises_one_line(api: FakeGitHub) -> None:
    closed_port = api.url.rsplit(":", 1)[0] + ":1"

    with pytest.raises(GitHubError, match="failed after 3 attempts") as excinfo:
        login(closed_port)
    assert "\n" not in str(excinfo.value) and PAT not in str(excinfo.value)


@pytest.mark.parametrize("failure", [DROP, 502])
def test_a_write_that_failed_after_it_was_sent_is_unsure_not_retried(
    api: FakeGitHub, failure: int
) -> None:
    api.fail_after_apply("POST", status=failure)
    issue = client.connect(PAT, api.url).get_repo("acme/models").get_issue(7)

    with pytest.raises(Unsure):
        client.call(lambda: issue.create_comment("x"), "POST comment", idempotent=False)
    assert len(api.writes()) == 1 and len(api.comments_on("acme/models", 7)) == 1


def test_no_token_is_a_usage_error() -> None:
    with pytest.raises(GitHubError, match="no GitHub token"):
        client.connect("", "http://127.0.0.1:1")


def test_importing_gatekeeper_does_not_load_the_client_library() -> None:
    code = (
        "import sys, gatekeeper, gatekeeper.github.event, gatekeeper.github.comment, "
        "gatekeeper.commands.comment; print('github' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
