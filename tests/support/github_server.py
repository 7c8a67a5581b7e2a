"""A fake GitHub REST API, as a pytest plugin: the ``github_api`` fixture.

It serves, on 127.0.0.1, the endpoints gatekeeper's sticky comment uses, and answers the
way GitHub does:

* ``GET /user``: the token's login, or 403 "Resource not accessible by integration" for an
  installation token (the Actions ``GITHUB_TOKEN``);
* ``GET /repos/{o}/{r}/issues/{n}/comments``: oldest first, ``per_page`` (default 30, max
  100) and ``page``, with a ``Link`` header (rel="next", "last", "first", "prev");
* ``POST /repos/{o}/{r}/issues/{n}/comments`` and ``PATCH /repos/{o}/{r}/issues/comments/{id}``:
  403 "Resource not accessible by integration" for a read-only token.

``Authorization: Bearer X`` or ``token X``; an unknown token gets 401 "Bad credentials".

On demand, per test, it also answers the way GitHub limits and fails:

* :meth:`FakeGitHub.rate_limit`: the primary rate limit. Once the budget is spent, every
  request gets 403 (or 429) "API rate limit exceeded" with ``x-ratelimit-remaining: 0``
  and ``x-ratelimit-reset`` (epoch seconds) until that time has really passed;
* :meth:`FakeGitHub.secondary_rate_limit`: 403 (or 429) "You have exceeded a secondary
  rate limit", with a ``Retry-After`` header unless told otherwise;
* :meth:`FakeGitHub.fail_next`: 5xx for the next requests;
* :meth:`FakeGitHub.fail_after_apply`: the request takes effect (a POST creates its
  comment), then the connection is dropped (or a 5xx sent): the ambiguous failure.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

ACTIONS_BOT_LOGIN = "github-actions[bot]"
NOT_ACCESSIBLE = "Resource not accessible by integration"
PRIMARY_LIMITED = "API rate limit exceeded for installation ID 4242."
SECONDARY_LIMITED = (
    "You have exceeded a secondary rate limit. Please wait a few minutes before you "
    "try again. If you reach out to GitHub Support for help, please include the "
    "request ID 0000:1111:2222."
)
RATE_LIMIT_DOCS = "https://docs.github.com/rest/using-the-rest-api/rate-limits-for-the-rest-api"
DROP = -1  # a scripted "status": close the connection without an answer

_COMMENTS_RE = re.compile(r"^/repos/([^/]+/[^/]+)/issues/(\d+)/comments$")
_COMMENT_RE = re.compile(r"^/repos/([^/]+/[^/]+)/issues/comments/(\d+)$")


@dataclass(frozen=True)
class Token:
    login: str
    write: bool = True  # False: a fork PR's read-only token
    can_read_user: bool = True  # False: an installation token, /user is 403


@dataclass(frozen=True)
class LoggedRequest:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any  # decoded JSON, or None


@dataclass(frozen=True)
class Scripted:
    """A canned answer for the next request (of ``method``, when given)."""

    status: int  # or DROP
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    method: str | None = None
    after_apply: bool = False  # the request takes effect first, then this is the answer


@dataclass
class FakeGitHub:
    """The fake API's state; tests arrange and inspect it directly."""

    url: str = ""
    tokens: dict[str, Token] = field(default_factory=dict)
    comments: dict[tuple[str, int], list[dict[str, Any]]] = field(default_factory=dict)
    requests: list[LoggedRequest] = field(default_factory=list)
    script: list[Scripted] = field(default_factory=list)  # answers for the next requests
    lock: threading.Lock = field(default_factory=threading.Lock)
    budget: int | None = None  # primary rate limit: requests left in this window (None: unlimited)
    reset_at: int = 0  # epoch seconds when the window resets
    limited_status: int = 403
    _next_id: int = 1000

    def add_token(
        self, token: str, login: str, write: bool = True, can_read_user: bool = True
    ) -> None:
        self.tokens[token] = Token(login, write, can_read_user)

    def add_actions_token(self, token: str, write: bool = True) -> None:
        """An Actions ``GITHUB_TOKEN``: comments as github-actions[bot], /user refused."""
        self.add_token(token, ACTIONS_BOT_LOGIN, write=write, can_read_user=False)

    def add_comment(self, repo: str, issue: int, body: str, login: str) -> dict[str, Any]:
        with self.lock:
            return self._create(repo, issue, body, login)

    def seed_comments(self, repo: str, issue: int, count: int, login: str = "someone") -> None:
        """``count`` ordinary comments, so that pagination matters."""
        for i in range(count):
            self.add_comment(repo, issue, f"comment {i}", login)

    def comments_on(self, repo: str, issue: int) -> list[dict[str, Any]]:
        return list(self.comments.get((repo, issue), []))

    def fail_next(self, count: int, status: int = 502) -> None:
        """Answer the next ``count`` requests with ``status``."""
        self.script.extend([Scripted(status, {"message": "Server Error"})] * count)

    def rate_limit(self, *, after: int = 0, reset_in: float = 1.0, status: int = 403) -> None:
        """The primary rate limit: ``after`` more requests pass, then ``status`` (403 or 429)
        with ``x-ratelimit-remaining: 0`` until ``reset_in`` seconds from now have passed."""
        self.budget, self.limited_status = after, status
        self.reset_at = math.ceil(time.time() + reset_in)

    def secondary_rate_limit(
        self,
        count: int = 1,
        *,
        retry_after: int | None = 1,
        status: int = 403,
        method: str | None = None,
    ) -> None:
        """The next ``count`` requests (of ``method``) hit a secondary rate limit."""
        headers = {} if retry_after is None else {"Retry-After": str(retry_after)}
        body = {"message": SECONDARY_LIMITED, "documentation_url": RATE_LIMIT_DOCS}
        self.script.extend([Scripted(status, body, headers, method)] * count)

    def fail_after_apply(self, method: str = "POST", status: int = DROP) -> None:
        """The next ``method`` request takes effect, then the connection drops (or ``status``)."""
        self.script.append(
            Scripted(status, {"message": "Server Error"}, {}, method, after_apply=True)
        )

    def writes(self) -> list[LoggedRequest]:
        return [r for r in self.requests if r.method in ("POST", "PATCH")]

    def _create(self, repo: str, issue: int, body: str, login: str) -> dict[str, Any]:
        self._next_id += 1
        now = _timestamp()
        comment = {
            "id": self._next_id,
            "url": f"{self.url}/repos/{repo}/issues/comments/{self._next_id}",
            "body": body,
            "user": {"login": login, "type": "Bot" if login.endswith("[bot]") else "User"},
            "html_url": f"https://github.example/{repo}/pull/{issue}#issuecomment-{self._next_id}",
            "created_at": now,
            "updated_at": now,
        }
        self.comments.setdefault((repo, issue), []).append(comment)
        return comment

    def _find(self, repo: str, comment_id: int) -> dict[str, Any] | None:
        for (comment_repo, _), comments in self.comments.items():
            for comment in comments:
                if comment_repo == repo and comment["id"] == comment_id:
                    return comment
        return None


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_PATCH(self) -> None:
        self._handle()

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass

    def _handle(self) -> None:
        state = self.server.state
        split = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(split.query))
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        with state.lock:
            state.requests.append(
                LoggedRequest(self.command, split.path, query, dict(self.headers), body)
            )
            scripted = self._scripted(state)
            if scripted is not None and not scripted.after_apply:
                status, data, headers = scripted.status, scripted.body, scripted.headers
            else:
                status, data, headers = self._limited(state, split.path, query, body)
                if scripted is not None:
                    status, data, headers = scripted.status, scripted.body, scripted.headers
        if status == DROP:
            self.close_connection = True  # the request was read (and maybe applied): no answer
            return
        self._reply(status, data, headers)

    def _scripted(self, state: FakeGitHub) -> Scripted | None:
        for i, scripted in enumerate(state.script):
            if scripted.method in (None, self.command):
                return state.script.pop(i)
        return None

    def _limited(
        self, state: FakeGitHub, path: str, query: dict[str, str], body: Any
    ) -> tuple[int, Any, dict[str, str]]:
        """The primary rate limit around :meth:`_route`, with GitHub's x-ratelimit headers."""
        if state.budget is not None and time.time() >= state.reset_at:
            state.budget = None  # a new window
        if state.budget is None or self._token(state) is None:
            return self._route(state, path, query, body)
        limited = state.budget == 0
        state.budget = max(state.budget - 1, 0)
        headers = {
            "x-ratelimit-limit": "5000",
            "x-ratelimit-remaining": str(state.budget),
            "x-ratelimit-used": str(5000 - state.budget),
            "x-ratelimit-resource": "core",
            "x-ratelimit-reset": str(state.reset_at),
        }
        if limited:
            return (
                state.limited_status,
                {"message": PRIMARY_LIMITED, "documentation_url": RATE_LIMIT_DOCS},
                headers,
            )
        status, data, extra = self._route(state, path, query, body)
        return status, data, {**extra, **headers}

    def _route(
        self, state: FakeGitHub, path: str, query: dict[str, str], body: Any
    ) -> tuple[int, Any, dict[str, str]]:
        token = self._token(state)
        if token is None:
            return 401, {"message": "Bad credentials"}, {}
        if self.command == "GET" and path == "/user":
            if not token.can_read_user:
                return 403, {"message": NOT_ACCESSIBLE}, {}
            return 200, {"login": token.login, "type": "User"}, {}
        if match := _COMMENTS_RE.match(path):
            repo, issue = match[1], int(match[2])
            if self.command == "GET":
                return self._list(state, repo, issue, query)
            if self.command == "POST":
                if not token.write:
                    return 403, {"message": NOT_ACCESSIBLE}, {}
                return 201, state._create(repo, issue, body["body"], token.login), {}
        if (match := _COMMENT_RE.match(path)) and self.command == "PATCH":
            if not token.write:
                return 403, {"message": NOT_ACCESSIBLE}, {}
            comment = state._find(match[1], int(match[2]))
            if comment is None:
                return 404, {"message": "Not Found"}, {}
            comment.update(body=body["body"], updated_at=_timestamp())
            return 200, comment, {}
        return 404, {"message": "Not Found"}, {}

    def _token(self, state: FakeGitHub) -> Token | None:
        scheme, _, value = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() not in ("bearer", "token"):
            return None
        return state.tokens.get(value.strip())

    def _list(
        self, state: FakeGitHub, repo: str, issue: int, query: dict[str, str]
    ) -> tuple[int, Any, dict[str, str]]:
        per_page = min(int(query.get("per_page", 30)), 100)
        page = max(int(query.get("page", 1)), 1)
        comments = state.comments.get((repo, issue), [])
        last = max((len(comments) + per_page - 1) // per_page, 1)
        items = comments[(page - 1) * per_page : page * per_page]
        base = f"{state.url}/repos/{repo}/issues/{issue}/comments?per_page={per_page}&page="
        rels: dict[str, int] = {}
        if page < last:
            rels.update(next=page + 1, last=last)
        if page > 1:
            rels.update(prev=page - 1, first=1)
        links = [f'<{base}{n}>; rel="{rel}"' for rel, n in rels.items()]
        return 200, items, {"Link": ", ".join(links)} if links else {}

    def _reply(self, status: int, data: Any, headers: dict[str, str]) -> None:
        payload = json.dumps(data).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(payload)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: FakeGitHub

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


def _timestamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@pytest.fixture(scope="session")
def _github_server() -> Iterator[_Server]:
    server = _Server()
    thread = threading.Thread(target=server.serve_forever, name="fake-github", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def github_api(_github_server: _Server) -> FakeGitHub:
    """A fake GitHub API with fresh state; point ``api_url`` (or GITHUB_API_URL) at ``.url``."""
    _github_server.state = FakeGitHub(url=_github_server.url)
    return _github_server.state
