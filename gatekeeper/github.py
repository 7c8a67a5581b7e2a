"""A small GitHub REST client (standard library only) for gatekeeper's sticky PR comment.

The API base comes from ``GITHUB_API_URL`` (default ``https://api.github.com``), so GitHub
Enterprise Server works too. The one comment gatekeeper owns on a PR is found by a hidden
marker *and* its author, and updated in place. A token that cannot write comments (a fork
PR's read-only ``GITHUB_TOKEN``) is not an error: the comment is skipped, and the
``workflow_run`` pattern in ``workflows/fork-comment.yml`` posts it instead.
"""
from __future__ import annotations

import http.client
import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from email.message import Message
from typing import Any, Iterator, Literal, Mapping

from gatekeeper.errors import GatekeeperError

DEFAULT_API_URL = "https://api.github.com"
DEFAULT_MARKER = "<!-- gatekeeper-report -->"
ACTIONS_BOT_LOGIN = "github-actions[bot]"  # the author of comments made with GITHUB_TOKEN
MAX_COMMENT_CHARS = 65536  # GitHub refuses longer comment bodies
TRUNCATION_NOTE = (
    "\n\n---\n*Report truncated: it exceeds GitHub's 65536-character comment limit. "
    "The job summary and the `report` output have it in full.*\n"
)
USER_AGENT = "gatekeeper"
TIMEOUT_S = 30.0
RETRY_DELAYS_S: tuple[float, ...] = (0.5, 1.0, 2.0)  # sleeps between attempts
PER_PAGE = 100

_REPO_RE = re.compile(r"^[A-Za-z0-9-]+/(?!\.\.?$)[A-Za-z0-9_.-]+$")
_LINK_RE = re.compile(r'<([^>]+)>\s*;\s*rel="([^"]+)"')
_PR_EVENTS = frozenset({"pull_request", "pull_request_target"})


class GitHubError(GatekeeperError):
    """The GitHub API failed: bad credentials, unreachable, or an unexpected answer."""


@dataclass(frozen=True)
class CommentResult:
    """What :func:`upsert_sticky_comment` did."""

    action: Literal["created", "updated", "skipped"]
    url: str | None = None  # the comment's html_url
    reason: str = ""  # one line, when skipped


@dataclass(frozen=True)
class PRContext:
    """The pull request a workflow run is about, read from the Actions event."""

    repo: str  # "owner/name" of the base repository
    number: int
    is_fork: bool  # the head branch lives in another repository
    base_ref: str
    head_sha: str


@dataclass(frozen=True)
class Response:
    status: int
    data: Any  # the decoded JSON body, or None
    headers: Message

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def message(self) -> str:
        """GitHub's error message, or the bare status."""
        if isinstance(self.data, dict) and self.data.get("message"):
            return f"HTTP {self.status}: {self.data['message']}"
        return f"HTTP {self.status}"


class _AuthSafeRedirect(urllib.request.HTTPRedirectHandler):
    """Follow redirects, but never send the token to another host."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str,
                         headers: Message, newurl: str) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and new.host != req.host:
            new.remove_header("Authorization")
        return new


class GitHubClient:
    """Authenticated JSON requests to one GitHub REST API, with bounded retries."""

    def __init__(self, token: str, api_url: str | None = None) -> None:
        if not token:
            raise GitHubError("no GitHub token: pass github-token (or set GITHUB_TOKEN)")
        self.api_url = (api_url or os.environ.get("GITHUB_API_URL") or DEFAULT_API_URL).rstrip("/")
        self._token = token
        self._opener = urllib.request.build_opener(_AuthSafeRedirect())

    def request(self, method: str, path_or_url: str, payload: Any = None) -> Response:
        """Send one request; retry network errors and 5xx, raise on 401."""
        url = self._url(path_or_url)
        failure = ""
        for delay in (0.0, *RETRY_DELAYS_S):
            time.sleep(delay)
            try:
                response = self._send(method, url, payload)
            except (OSError, http.client.HTTPException) as exc:
                failure = _describe_network_error(exc)
                continue
            if response.status < 500:
                if response.status == 401:
                    raise GitHubError(f"GitHub rejected the token ({response.message}) at {self.api_url}")
                return response
            failure = response.message
        attempts = len(RETRY_DELAYS_S) + 1
        raise GitHubError(f"GitHub API {method} {_path(url)} failed after {attempts} attempts: {failure}")

    def paginate(self, path: str) -> Iterator[Any]:
        """Every item of a list endpoint, page by page, following Link rel="next"."""
        url: str | None = self._url(path)
        while url is not None:
            response = _expect_ok(self.request("GET", url), "GET", url, list)
            yield from response.data
            url = _next_link(response.headers.get("Link"))
            if url is not None and not self._same_origin(url):
                raise GitHubError(f"GitHub API pagination left {self.api_url}: {url}")

    def authenticated_login(self) -> str | None:
        """The token's user login, or None when /user is refused (an app or Actions token)."""
        response = self.request("GET", "/user")
        if response.status == 403:
            return None
        login = _expect_ok(response, "GET", "/user", dict).data.get("login")
        return str(login) if login else None

    def _send(self, method: str, url: str, payload: Any) -> Response:
        data = None if payload is None else json.dumps(payload).encode("utf-8")
        request = urllib.request.Request(url, data=data, method=method, headers=self._headers(data is not None))
        try:
            with self._opener.open(request, timeout=TIMEOUT_S) as reply:
                return Response(reply.status, _decode(reply.read()), reply.headers)
        except urllib.error.HTTPError as exc:
            with exc:
                return Response(exc.code, _decode(exc.read()), exc.headers)

    def _headers(self, has_body: bool) -> dict[str, str]:
        headers = {
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": "2022-11-28",
            "Authorization": f"Bearer {self._token}",
            "User-Agent": USER_AGENT,
        }
        if has_body:
            headers["Content-Type"] = "application/json"
        return headers

    def _url(self, path_or_url: str) -> str:
        return path_or_url if "://" in path_or_url else f"{self.api_url}{path_or_url}"

    def _same_origin(self, url: str) -> bool:
        ours, theirs = urllib.parse.urlsplit(self.api_url), urllib.parse.urlsplit(url)
        return (ours.scheme, ours.netloc) == (theirs.scheme, theirs.netloc)


def upsert_sticky_comment(*, repo: str, issue_number: int, body: str, token: str,
                          marker: str = DEFAULT_MARKER, api_url: str | None = None,
                          author: str | None = None) -> CommentResult:
    """Create or update in place the one PR comment carrying ``marker`` by ``author``.

    ``author`` defaults to the token's login, or ``github-actions[bot]`` when the token
    cannot read /user (the Actions GITHUB_TOKEN). A marker comment by anyone else is left
    alone. A token that may not write comments gives ``action="skipped"``, not an error.
    """
    if not _REPO_RE.match(repo):
        raise GitHubError(f"not an owner/name repository: {repo!r}")
    client = GitHubClient(token, api_url)
    author = author or client.authenticated_login() or ACTIONS_BOT_LOGIN
    text = comment_body(body, marker)
    existing = find_sticky_comment(client, repo, issue_number, marker, author)
    if existing is None:
        method, path, action = "POST", f"/repos/{repo}/issues/{issue_number}/comments", "created"
    else:
        method, path, action = "PATCH", f"/repos/{repo}/issues/comments/{existing['id']}", "updated"
    response = client.request(method, path, {"body": text})
    if response.status in (403, 404):
        return CommentResult("skipped", None, _cannot_write_reason(response))
    return CommentResult(action, _expect_ok(response, method, path, dict).data.get("html_url"))


def find_sticky_comment(client: GitHubClient, repo: str, issue_number: int,
                        marker: str, author: str) -> dict[str, Any] | None:
    """The oldest comment on the issue that carries ``marker`` and was written by ``author``."""
    path = f"/repos/{repo}/issues/{issue_number}/comments?per_page={PER_PAGE}"
    for comment in client.paginate(path):
        if marker in (comment.get("body") or "") and (comment.get("user") or {}).get("login") == author:
            return comment
    return None


def comment_body(body: str, marker: str = DEFAULT_MARKER) -> str:
    """``body`` led by the hidden marker, cut to GitHub's size limit with a note."""
    text = body if marker in body else f"{marker}\n{body}"
    if len(text) <= MAX_COMMENT_CHARS:
        return text
    return text[: MAX_COMMENT_CHARS - len(TRUNCATION_NOTE)] + TRUNCATION_NOTE


def pr_context_from_env(environ: Mapping[str, str] = os.environ) -> PRContext | None:
    """The pull request this Actions run is about, or None when the event is not a PR."""
    if environ.get("GITHUB_EVENT_NAME") not in _PR_EVENTS or not environ.get("GITHUB_EVENT_PATH"):
        return None
    event_path = environ["GITHUB_EVENT_PATH"]
    try:
        with open(event_path, encoding="utf-8") as f:
            pr = json.load(f)["pull_request"]
        base_repo = pr["base"]["repo"]["full_name"]
        head_repo = (pr["head"].get("repo") or {}).get("full_name")  # None: the fork was deleted
        return PRContext(
            repo=environ.get("GITHUB_REPOSITORY") or base_repo,
            number=int(pr["number"]),
            is_fork=head_repo != base_repo,
            base_ref=pr["base"]["ref"],
            head_sha=pr["head"]["sha"],
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise GitHubError(f"cannot read the pull_request event at {event_path}: {exc!r}") from exc


def _expect_ok(response: Response, method: str, path_or_url: str, kind: type) -> Response:
    """``response`` if it succeeded with a JSON ``kind`` (dict or list), else GitHubError."""
    if not response.ok:
        raise GitHubError(f"GitHub API {method} {_path(path_or_url)}: {response.message}")
    if not isinstance(response.data, kind):
        raise GitHubError(f"GitHub API {method} {_path(path_or_url)}: unexpected answer (not a JSON {kind.__name__})")
    return response


def _cannot_write_reason(response: Response) -> str:
    return (f"the token cannot write PR comments ({response.message}; a fork PR's token is read-only); "
            "the workflow_run job in workflows/fork-comment.yml will post it")


def _next_link(link_header: str | None) -> str | None:
    for url, rel in _LINK_RE.findall(link_header or ""):
        if rel == "next":
            return str(url)
    return None


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


def _path(path_or_url: str) -> str:
    """The path of a URL (no host, no query), for messages."""
    return urllib.parse.urlsplit(path_or_url).path


def _describe_network_error(exc: BaseException) -> str:
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    return f"{type(reason).__name__}: {reason}" if str(reason) else type(reason).__name__
