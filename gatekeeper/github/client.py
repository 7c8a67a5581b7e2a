"""GitHub's REST API through PyGithub: GITHUB_API_URL as the base, rate limits waited out.

PyGithub, not githubkit: ~5 MB on requests/urllib3 against githubkit's ~60 MB of schemas
(and githubkit 0.16.1 fails to import beside hishel 2.0); typed; ``base_url`` for GHES. Its
own retry (GithubRetry) repeats a POST after a 5xx and caps no total wait, so ours is here.
"""

import os
import time
from collections.abc import Callable
from typing import Any

from ..errors import GatekeeperError

DEFAULT_API_URL = "https://api.github.com"
MAX_WAIT_S = 300.0  # all the waiting one call may do, rate limits included; then GitHubError
RETRY_DELAYS_S: tuple[float, ...] = (0.5, 1.0, 2.0)  # after a 5xx or a network error


class GitHubError(GatekeeperError):
    """The GitHub API failed: bad credentials, unreachable, rate limited, or refused."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status GitHub refused with, when it answered


class Unsure(GitHubError):
    """A write failed after it was sent (5xx, timeout, dropped): it may have been applied."""


def connect(token: str, api_url: str | None = None) -> Any:
    """A lazy PyGithub ``Github`` (>= 2.9): it sends nothing until an attribute needs one."""
    if not token:
        raise GitHubError("no GitHub token: pass github-token (or set GITHUB_TOKEN)")
    from github import Auth, Github  # here, not at the top: only commenting needs it

    url = (api_url or os.environ.get("GITHUB_API_URL") or DEFAULT_API_URL).rstrip("/")
    return Github(
        auth=Auth.Token(token),
        base_url=url,
        user_agent="gatekeeper",
        timeout=30,
        per_page=100,
        lazy=True,
        retry=None,
        seconds_between_requests=None,
        seconds_between_writes=None,
    )


def call(
    fn: Callable[[], Any],
    what: str,
    *,
    idempotent: bool = True,
    answers: dict[int, Any] | None = None,
) -> Any:
    """``fn()`` (PyGithub calls), waiting as long as a rate limit says (Retry-After, else
    x-ratelimit-reset when none remain, else a minute) and, if ``idempotent``, retrying a
    5xx or a network error; at most MAX_WAIT_S of waiting, then GitHubError (or Unsure).
    ``answers`` maps a refusal's status to what to return instead of raising."""
    from github import GithubException

    waited, failures = 0.0, 0
    while True:  # ends: each wait is >= 1 s or a bounded retry, and all waits <= MAX_WAIT_S
        try:
            return fn()
        except GithubException as exc:
            data = exc.data if isinstance(exc.data, dict) else {}
            message = f"HTTP {exc.status}: {data.get('message') or exc.message or ''}".rstrip(": ")
            h, wait = {k.lower(): v for k, v in (exc.headers or {}).items()}, None
            if exc.status in (403, 429) and h.get("retry-after", "").isdigit():
                wait = max(float(h["retry-after"]), 1.0)
            elif exc.status in (403, 429) and h.get("x-ratelimit-remaining") == "0":
                wait = (
                    max(int(h.get("x-ratelimit-reset") or 0) - time.time(), 0.0) + 1.0
                )  # +1: skew
            elif exc.status == 429 or (exc.status == 403 and "rate limit" in message.lower()):
                wait = 60.0  # GitHub's advice for a secondary rate limit without Retry-After
            elif exc.status in (answers or {}):
                return (answers or {})[exc.status]
            elif exc.status < 500:
                why = "GitHub rejected the token" if exc.status == 401 else f"GitHub API {what}"
                raise GitHubError(f"{why}: {message}", exc.status) from None
        except OSError as exc:  # requests' connection errors and timeouts
            message, wait = f"{type(exc).__name__}: {exc}", None
        if wait is None and not idempotent:
            raise Unsure(f"GitHub API {what}: {message}") from None
        if wait is None:
            if failures == len(RETRY_DELAYS_S):
                raise GitHubError(
                    f"GitHub API {what} failed after {failures + 1} attempts: {message}"
                )
            wait, failures = RETRY_DELAYS_S[failures], failures + 1
        if waited + wait > MAX_WAIT_S:
            raise GitHubError(
                f"GitHub API {what}: {message}; asked to wait {wait:.0f} s, past the "
                f"{MAX_WAIT_S:g} s gatekeeper waits in all (try again later)"
            )
        time.sleep(wait)
        waited += wait
