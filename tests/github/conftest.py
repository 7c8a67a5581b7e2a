"""Fixtures of the GitHub tests: outside Actions, a fake API with two tokens, short waits."""

from __future__ import annotations

import pytest
from support.github_server import FakeGitHub

from gatekeeper.github import client

PAT = "ghp_pat_secret"  # octocat's personal access token
ACTIONS = "ghs_actions_secret"  # an Actions GITHUB_TOKEN: github-actions[bot], /user refused

_GITHUB_ENV = (
    "GITHUB_ACTIONS",
    "GITHUB_API_URL",
    "GITHUB_OUTPUT",
    "GITHUB_STEP_SUMMARY",
    "GITHUB_REPOSITORY",
    "GITHUB_EVENT_NAME",
    "GITHUB_EVENT_PATH",
)


@pytest.fixture(autouse=True)
def _outside_actions(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests start outside Actions, even when the suite itself runs in a workflow; retries
    of 5xx and network errors do not sleep, and no call waits more than 5 s in all."""
    for name in _GITHUB_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(client, "RETRY_DELAYS_S", (0.0, 0.0))
    monkeypatch.setattr(client, "MAX_WAIT_S", 5.0)


@pytest.fixture
def api(github_api: FakeGitHub) -> FakeGitHub:
    github_api.add_token(PAT, "octocat")
    github_api.add_actions_token(ACTIONS)
    return github_api
