"""A local S3 for tests, as a pytest plugin: moto's server, buckets, and a faulty network.

Fixtures:

* ``s3_server`` (session): moto's ``ThreadedMotoServer`` on 127.0.0.1, on a free port; an
  :class:`S3Server` with ``endpoint_url`` and helpers to make a client or a bucket. It does
  not touch the environment.
* ``s3_env`` (function): fake credentials (``testing``), region ``us-east-1`` and
  ``AWS_ENDPOINT_URL_S3`` pointing at the server, with the real AWS config, profile and
  instance metadata shut out; all restored after the test.
* ``s3_bucket_uri`` (function, uses ``s3_env``): a fresh bucket, as an :class:`S3BucketURI`:
  the string ``s3://<bucket>/gk`` with ``.bucket`` and ``.endpoint_url``; emptied and deleted
  afterwards.

Helpers: :class:`FaultProxy` spoils the first N connections to an endpoint (503, dropped
connection, lost reply, truncated reply) and :func:`unreachable_endpoint` gives the URL of a
port nobody listens on.

moto checks ``If-None-Match``/``If-Match`` before it writes, in the request's own thread, so
two racing conditional writes could both pass. Real S3 decides them atomically; to test the
client against those semantics, the server handles one request at a time (see
:class:`_OneAtATime`).
"""

from __future__ import annotations

import io
import socket
import struct
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import boto3
import pytest
from moto.server import ThreadedMotoServer

ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"


class _OneAtATime:
    """A WSGI wrapper that lets one request at a time into the app.

    The request body is read before the lock is taken, so a slow or stalled client
    cannot hold up the others.
    """

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self._app = app
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        stream = environ["wsgi.input"]
        if environ.get("wsgi.input_terminated"):
            body = stream.read()
        else:
            body = stream.read(int(environ.get("CONTENT_LENGTH") or 0))
        environ["wsgi.input"] = io.BytesIO(body)
        with self._lock:
            result = self._app(environ, start_response)
            try:
                return list(result)
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()


@dataclass(frozen=True)
class S3Server:
    endpoint_url: str

    def client(self) -> Any:
        """A boto3 S3 client with the fake credentials, independent of the environment."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        )

    def create_bucket(self) -> str:
        name = f"gk-test-{uuid.uuid4().hex[:16]}"
        self.client().create_bucket(Bucket=name)
        return name

    def delete_bucket(self, name: str) -> None:
        client = self.client()
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
            for obj in page.get("Contents", ()):
                client.delete_object(Bucket=name, Key=obj["Key"])
        for upload in client.list_multipart_uploads(Bucket=name).get("Uploads", ()):
            client.abort_multipart_upload(
                Bucket=name, Key=upload["Key"], UploadId=upload["UploadId"]
            )
        client.delete_bucket(Bucket=name)


class S3BucketURI(str):
    """``s3://<bucket>/gk``, knowing its bucket and the server's endpoint."""

    bucket: str
    endpoint_url: str

    def __new__(cls, bucket: str, endpoint_url: str) -> S3BucketURI:
        uri = super().__new__(cls, f"s3://{bucket}/gk")
        uri.bucket = bucket
        uri.endpoint_url = endpoint_url
        return uri


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    # the server is listening but has served nothing yet: safe to wrap its app
    wsgi = server._server  # moto exposes no hook for this
    assert wsgi is not None
    wsgi.app = _OneAtATime(wsgi.app)
    host, port = server.get_host_and_port()
    try:
        yield S3Server(f"http://{host}:{port}")
    finally:
        server.stop()


@pytest.fixture
def s3_env(
    s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> S3Server:
    nowhere = tmp_path_factory.mktemp("aws") / "absent"
    for name in (
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_ENDPOINT_URL",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ROLE_ARN",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server.endpoint_url)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(nowhere))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(nowhere))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return s3_server


@pytest.fixture
def s3_bucket_uri(s3_env: S3Server) -> Iterator[S3BucketURI]:
    bucket = s3_env.create_bucket()
    yield S3BucketURI(bucket, s3_env.endpoint_url)
    s3_env.delete_bucket(bucket)


def unreachable_endpoint() -> str:
    """The URL of a local port nobody listens on: connections are refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# -- a faulty network ------------------------------------------------------------------

_SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


def _close(sock: socket.socket, reset: bool = False) -> None:
    """Close ``sock``, waking any thread blocked on it; ``reset`` sends a TCP RST."""
    try:
        if reset:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        # a thread blocked in recv() keeps the socket open past close(): wake it first;
        # SHUT_RD sends nothing, so with SO_LINGER 0 the close() below sends the RST
        sock.shutdown(socket.SHUT_RD if reset else socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def _read_head(sock: socket.socket, buf: bytes = b"") -> tuple[bytes, bytes]:
    """Read up to the end of an HTTP head: (head, what came after it)."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before the end of the HTTP head")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    return head + b"\r\n\r\n", rest


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until ``src`` ends, then end ``dst``'s sending side."""
    try:
        while chunk := src.recv(65536):
            dst.sendall(chunk)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


class FaultProxy:
    """A TCP proxy in front of an HTTP server that spoils its first ``fail_first`` connections.

    Each spoiled connection carries one request and then ends, so with a fresh client
    "the first N connections" are "the first N requests". Modes:

    * ``"503"``: answer ``503 SlowDown`` without forwarding the request;
    * ``"drop"``: reset the connection once the request's head arrives, forwarding nothing;
    * ``"drop-reply"``: forward the request, wait for the server's reply, then reset the
      connection instead of relaying it (the request took effect; the client never hears);
    * ``"truncate"``: forward the request, relay the reply's head and half its body, reset.

    Later connections pass through untouched. It listens on 127.0.0.1 (a free port); its
    sockets time out after ``idle_timeout`` s and it stops itself after ``lifetime`` s.
    Use it as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    MODES = ("503", "drop", "drop-reply", "truncate")

    def __init__(
        self,
        upstream_url: str,
        *,
        fail_first: int = 0,
        mode: str = "503",
        idle_timeout: float = 10.0,
        lifetime: float = 120.0,
    ) -> None:
        if mode not in self.MODES:
            raise ValueError(f"mode must be one of {self.MODES}, not {mode!r}")
        up = urlsplit(upstream_url)
        self._upstream = (up.hostname or "127.0.0.1", up.port or 80)
        self.mode = mode
        self.faults_left = fail_first
        self.faults = 0  # connections spoiled so far
        self.connections = 0  # connections accepted so far
        self._idle_timeout = idle_timeout
        self._lifetime = lifetime
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self._stopped = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.endpoint_url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._thread = threading.Thread(target=self._accept, name="fault-proxy", daemon=True)
        self._timer = threading.Timer(lifetime, self.stop)
        self._timer.daemon = True

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> FaultProxy:
        self._thread.start()
        self._timer.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._timer.cancel()
        with self._lock:
            socks, self._socks = list(self._socks), set()
        for sock in socks:
            _close(sock)
        if self._thread.is_alive():
            self._thread.join()
        self._listener.close()

    # -- internals ---------------------------------------------------------------------
    def _track(self, sock: socket.socket) -> socket.socket:
        sock.settimeout(self._idle_timeout)
        with self._lock:
            self._socks.add(sock)
        return sock

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.connections += 1
                spoil = self.faults_left > 0
                if spoil:
                    self.faults_left -= 1
                    self.faults += 1
            threading.Thread(
                target=self._serve, args=(self._track(client), spoil), daemon=True
            ).start()

    def _connect_upstream(self) -> socket.socket:
        return self._track(socket.create_connection(self._upstream, timeout=self._idle_timeout))

    def _serve(self, client: socket.socket, spoil: bool) -> None:
        upstream: socket.socket | None = None
        try:
            if not spoil:
                upstream = self._connect_upstream()
                threading.Thread(target=_pump, args=(client, upstream), daemon=True).start()
                _pump(upstream, client)
            elif self.mode == "503":
                head, _ = _read_head(client)
                body = b"" if head.startswith(b"HEAD ") else _SLOW_DOWN
                client.sendall(
                    b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                    b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body
                )
                client.shutdown(socket.SHUT_WR)
                while client.recv(65536):  # let the client finish sending, so no RST
                    pass
            elif self.mode == "drop":
                _read_head(client)
                _close(client, reset=True)
            else:
                upstream = self._connect_upstream()
                threading.Thread(target=_pump, args=(client, upstream), daemon=True).start()
                head, rest = _read_head(upstream)
                while head.split(b" ", 2)[1:2] == [b"100"]:  # pass "100 Continue" through
                    client.sendall(head)
                    head, rest = _read_head(upstream, rest)
                if self.mode == "truncate":
                    keep = _content_length(head) // 2
                    while len(rest) < keep and (chunk := upstream.recv(65536)):
                        rest += chunk
                    client.sendall(head + rest[:keep])
                _close(client, reset=True)
        except OSError:
            pass  # the client or the server went away: nothing left to do
        finally:
            for sock in (client, upstream):
                if sock is not None:
                    with self._lock:
                        self._socks.discard(sock)
                    _close(sock)
