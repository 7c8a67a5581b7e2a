"""One contract for every store backend: the local directory and S3 (moto's server), and
bisect's scratch store over a store (empty here: tests/store/test_overlay.py fills it).

The shared tests run against both; the S3-only ones at the end cover what only a network
store has: multipart uploads, retries through a faulty network, and its failure messages.
"""

from __future__ import annotations

import base64
import json
import os
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import EndpointConnectionError
from botocore.stub import Stubber
from support.helpers import run_threads
from support.s3_server import FaultProxy, S3BucketURI, S3Server, unreachable_endpoint

from gatekeeper.errors import (
    AccessDenied,
    GatekeeperError,
    PreconditionFailed,
    StoreError,
    StoreUnavailable,
)
from gatekeeper.store.base import Backend
from gatekeeper.store.local import LocalBackend
from gatekeeper.store.overlay import OverlayBackend
from gatekeeper.store.s3 import S3Backend

MiB = 1024 * 1024
PART = 5 * MiB  # S3's smallest part: the threshold and part size used here


def make_s3(uri: str, **kwargs: Any) -> S3Backend:
    options: dict[str, Any] = dict(
        multipart_threshold=PART, multipart_chunksize=PART, list_page_size=2
    )
    return S3Backend(uri, **(options | kwargs))


@pytest.fixture(params=["local", "s3", "overlay"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "local":
        yield LocalBackend(tmp_path / "store")
        return
    if request.param == "overlay":
        yield OverlayBackend(LocalBackend(tmp_path / "scratch"), LocalBackend(tmp_path / "store"))
        return
    store = make_s3(request.getfixturevalue("s3_bucket_uri"))
    yield store
    store.close()


def write_file(path: Path, size: int, fill: int | None = None) -> Path:
    """``size`` random bytes, or ``size`` times the byte ``fill``."""
    path.write_bytes(os.urandom(size) if fill is None else bytes([fill]) * size)
    return path


def one_line(e: pytest.ExceptionInfo[GatekeeperError]) -> str:
    text = str(e.value)
    assert "\n" not in text and "Traceback" not in text
    return text


# -- the contract ----------------------------------------------------------------------


def test_roundtrip(backend: Backend, tmp_path: Path) -> None:
    dest = tmp_path / "out" / "obj.bin"
    assert backend.get("a/b.json") is None
    assert backend.head("a/b.json") is None
    assert backend.download("a/b.json", dest) is False
    assert not dest.exists() and not dest.with_name("obj.bin.part").exists()

    etag = backend.put("a/b.json", b'{"v": 1}')
    assert backend.get("a/b.json") == (b'{"v": 1}', etag)
    info = backend.head("a/b.json")
    assert info is not None
    assert (info.key, info.size, info.etag) == ("a/b.json", 8, etag)
    assert abs(info.modified - time.time()) < 120

    etag2 = backend.put("a/b.json", b'{"v": 2}')  # unconditional overwrite
    assert etag2 != etag
    assert backend.download("a/b.json", dest) is True
    assert dest.read_bytes() == b'{"v": 2}'
    assert os.listdir(dest.parent) == ["obj.bin"]  # no .part left behind

    backend.delete("a/b.json")
    backend.delete("a/b.json")  # absent is fine
    assert backend.get("a/b.json") is None
    assert list(backend.list()) == []


def test_list_prefix_and_pages(backend: Backend) -> None:
    assert list(backend.list()) == []
    keys = ["a/1", "a/2", "a/b/3", "ab/4", "b/5", "b/6", "c"]  # 4 pages of 2 on S3
    for i, key in enumerate(keys):
        backend.put(key, b"x" * i)
    listed = {o.key: o.size for o in backend.list()}
    assert listed == {key: i for i, key in enumerate(keys)}
    assert sorted(o.key for o in backend.list("a/")) == ["a/1", "a/2", "a/b/3"]
    assert sorted(o.key for o in backend.list("a")) == ["a/1", "a/2", "a/b/3", "ab/4"]
    assert list(backend.list("zzz")) == []


@pytest.mark.parametrize("key", ["", "/a", "a//b", "a/../b", "./a", "a/"])
def test_invalid_keys(backend: Backend, key: str) -> None:
    with pytest.raises(StoreError, match="invalid store key"):
        backend.put(key, b"x")
    with pytest.raises(StoreError, match="invalid store key"):
        backend.get(key)


def test_create_only(backend: Backend, tmp_path: Path) -> None:
    etag = backend.put("m.json", b"first", if_none_match=True)
    with pytest.raises(PreconditionFailed):
        backend.put("m.json", b"second", if_none_match=True)
    with pytest.raises(PreconditionFailed):
        backend.upload("m.json", write_file(tmp_path / "small", 100), if_none_match=True)
    assert backend.get("m.json") == (b"first", etag)


def test_compare_and_swap(backend: Backend) -> None:
    with pytest.raises(PreconditionFailed):  # nothing to match yet
        backend.put("latest.json", b"0", if_match='"d41d8cd98f00b204e9800998ecf8427e"')
    e1 = backend.put("latest.json", b"1")
    e2 = backend.put("latest.json", b"2", if_match=e1)
    with pytest.raises(PreconditionFailed):
        backend.put("latest.json", b"3", if_match=e1)  # stale
    assert backend.get("latest.json") == (b"2", e2)
    e4 = backend.put("latest.json", b"4", if_match=e2)
    assert backend.get("latest.json") == (b"4", e4)


def test_large_upload_download(backend: Backend, tmp_path: Path) -> None:
    src = write_file(tmp_path / "big", 16 * MiB)  # on S3: 3 parts of 5 MiB and a third
    etag = backend.upload("bundles/t/big.tar.zst", src, if_none_match=True)
    info = backend.head("bundles/t/big.tar.zst")
    assert info is not None and (info.size, info.etag) == (16 * MiB, etag)
    if isinstance(backend, S3Backend):
        assert etag.strip('"').endswith("-3")  # really a multipart upload

    dest = tmp_path / "restored"
    assert backend.download("bundles/t/big.tar.zst", dest)
    assert dest.read_bytes() == src.read_bytes()

    other = write_file(tmp_path / "other", 6 * MiB)
    with pytest.raises(PreconditionFailed):
        backend.upload("bundles/t/big.tar.zst", other, if_none_match=True)
    assert backend.head("bundles/t/big.tar.zst") == info
    backend.upload("bundles/t/big.tar.zst", other)  # unconditional replace
    assert backend.download("bundles/t/big.tar.zst", dest)
    assert dest.read_bytes() == other.read_bytes()


@pytest.mark.parametrize("size", [64 * 1024, 6 * MiB], ids=["small", "large"])
def test_create_only_race(backend: Backend, tmp_path: Path, size: int) -> None:
    files = [write_file(tmp_path / f"f{i}", size, fill=65 + i) for i in range(16)]
    winners: list[int] = []
    losers: list[int] = []

    def publish(i: int) -> None:
        try:
            backend.upload("blob", files[i], if_none_match=True)
            winners.append(i)
        except PreconditionFailed:
            losers.append(i)

    run_threads(16, publish)
    assert len(winners) == 1 and len(losers) == 15
    got = backend.get("blob")
    assert got is not None and got[0] == files[winners[0]].read_bytes()


def test_compare_and_swap_loses_no_update(backend: Backend) -> None:
    backend.put("log.json", b"[]", if_none_match=True)

    def append(i: int) -> None:
        for j in range(4):
            while True:
                got = backend.get("log.json")
                assert got is not None
                entries = json.loads(got[0]) + [f"{i}.{j}"]
                try:
                    backend.put("log.json", json.dumps(entries).encode(), if_match=got[1])
                    break
                except PreconditionFailed:
                    continue

    run_threads(8, append)
    got = backend.get("log.json")
    assert got is not None
    assert sorted(json.loads(got[0])) == sorted(f"{i}.{j}" for i in range(8) for j in range(4))


# -- S3 only ---------------------------------------------------------------------------


def pending_uploads(server: S3Server, uri: S3BucketURI) -> list[Any]:
    return server.client().list_multipart_uploads(Bucket=uri.bucket).get("Uploads", [])


def test_s3_multipart_condition_is_checked_on_completion(
    s3_bucket_uri: S3BucketURI, s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_s3(s3_bucket_uri)
    rival = make_s3(s3_bucket_uri)
    send_part = store._client.upload_part

    rival_etag: list[str] = []

    def rival_publishes_first(**kwargs: Any) -> Any:
        if kwargs["PartNumber"] == 1:  # after the early existence check, before completion
            rival_etag.append(rival.put("blob", b"rival", if_none_match=True))
        return send_part(**kwargs)

    monkeypatch.setattr(store._client, "upload_part", rival_publishes_first)
    with pytest.raises(PreconditionFailed):
        store.upload("blob", write_file(tmp_path / "big", 11 * MiB), if_none_match=True)
    assert store.get("blob") == (b"rival", rival_etag[0])
    assert pending_uploads(s3_server, s3_bucket_uri) == []  # aborted


def test_s3_failed_multipart_upload_is_aborted(
    s3_bucket_uri: S3BucketURI, s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_s3(s3_bucket_uri)
    send_part = store._client.upload_part

    def third_part_fails(**kwargs: Any) -> Any:
        if kwargs["PartNumber"] == 3:
            raise EndpointConnectionError(endpoint_url=s3_bucket_uri.endpoint_url)
        return send_part(**kwargs)

    monkeypatch.setattr(store._client, "upload_part", third_part_fails)
    with pytest.raises(StoreUnavailable):
        store.upload("blob", write_file(tmp_path / "big", 16 * MiB))  # 3 parts
    assert store.head("blob") is None
    assert pending_uploads(s3_server, s3_bucket_uri) == []


def test_s3_multipart_parts_carry_their_crc32(
    s3_bucket_uri: S3BucketURI, s3_server: S3Server, tmp_path: Path
) -> None:
    """Each part goes up with its CRC32 and completion repeats them, so S3 keeps the
    composite CRC32 of the parts' CRC32s (and need not compute a full-object CRC64)."""
    store = make_s3(s3_bucket_uri)
    data = write_file(tmp_path / "big", 16 * MiB).read_bytes()
    store.upload("blob", tmp_path / "big", if_none_match=True)
    head = s3_server.client().head_object(
        Bucket=s3_bucket_uri.bucket, Key="gk/blob", ChecksumMode="ENABLED"
    )
    part = -(-len(data) // 3)  # 3 parts: 5 MiB each and the remainder spread over them
    crcs = b"".join(
        zlib.crc32(data[i : i + part]).to_bytes(4, "big") for i in range(0, len(data), part)
    )
    assert (
        head.get("ChecksumCRC32") == base64.b64encode(zlib.crc32(crcs).to_bytes(4, "big")).decode()
    )


@pytest.mark.parametrize(
    ("size", "parts"), [(16 * MiB, 3), (15 * MiB + 1, 3), (15 * MiB - 1, 2), (5 * MiB + 7, 1)]
)
def test_s3_parts_spread_the_remainder(
    s3_bucket_uri: S3BucketURI, tmp_path: Path, size: int, parts: int
) -> None:
    """Parts of about the chunk size (never below it), the remainder spread over them:
    no small last part waiting on its own for a free thread."""
    store = make_s3(s3_bucket_uri, multipart_threshold=1)
    etag = store.upload("blob", write_file(tmp_path / "f", size))
    assert etag.strip('"').endswith(f"-{parts}")
    assert store.get("blob")[0] == (tmp_path / "f").read_bytes()  # type: ignore[index]


def test_s3_server_that_refuses_checksums(
    s3_bucket_uri: S3BucketURI, s3_server: S3Server, tmp_path: Path
) -> None:
    """An S3-compatible server that answers a checksum algorithm with 400 InvalidArgument
    gets the upload without checksums, and is not asked again."""
    store = make_s3(s3_bucket_uri)
    refused: list[str] = []

    def no_checksums(model: Any, params: dict, **kwargs: Any) -> Any:
        if "x-amz-checksum-algorithm" not in {h.lower() for h in params["headers"]}:
            return None  # on to the server
        refused.append(params["url_path"])
        body = {
            "Error": {"Code": "InvalidArgument", "Message": "x-amz-checksum-algorithm"},
            "ResponseMetadata": {"HTTPStatusCode": 400, "RetryAttempts": 0},
        }
        return AWSResponse("https://s3.invalid", 400, {}, None), body

    store._client.meta.events.register("before-call.s3.CreateMultipartUpload", no_checksums)
    for name in ("a", "b"):
        src = write_file(tmp_path / name, 6 * MiB)
        store.upload(name, src, if_none_match=True)
        assert store.get(name) == (src.read_bytes(), store.head(name).etag)  # type: ignore
    assert len(refused) == 1
    assert pending_uploads(s3_server, s3_bucket_uri) == []


@pytest.mark.parametrize("mode", ["503", "drop"])
def test_s3_retries_transient_failures(
    s3_bucket_uri: S3BucketURI, tmp_path: Path, mode: str
) -> None:
    with FaultProxy(s3_bucket_uri.endpoint_url, fail_first=3, mode=mode) as proxy:
        store = make_s3(s3_bucket_uri, endpoint_url=proxy.endpoint_url, max_attempts=5)
        etag = store.put("k", b"data", if_none_match=True)  # the first 3 attempts fail
        assert proxy.faults == 3
        assert store.get("k") == (b"data", etag)
        assert [o.key for o in store.list()] == ["k"]


def test_s3_gives_up_after_max_attempts(s3_bucket_uri: S3BucketURI) -> None:
    with FaultProxy(s3_bucket_uri.endpoint_url, fail_first=2, mode="503") as proxy:
        store = make_s3(s3_bucket_uri, endpoint_url=proxy.endpoint_url, max_attempts=2)
        with pytest.raises(StoreUnavailable) as e:
            store.get("k")
    assert one_line(e) == (
        f"S3 endpoint {proxy.endpoint_url} failed get of {s3_bucket_uri}/k "
        "after 2 attempts: 503 SlowDown"
    )


def test_s3_lost_reply_to_a_conditional_write(s3_bucket_uri: S3BucketURI) -> None:
    direct = make_s3(s3_bucket_uri)
    e1 = direct.put("latest.json", b"1")
    cases: list[tuple[str, bytes, dict[str, Any]]] = [
        ("new.json", b"n", {"if_none_match": True}),
        ("latest.json", b"2", {"if_match": e1}),
    ]
    for key, data, condition in cases:
        # the write lands but its reply is lost: the retry then fails its own condition
        with FaultProxy(s3_bucket_uri.endpoint_url, fail_first=1, mode="drop-reply") as proxy:
            store = make_s3(s3_bucket_uri, endpoint_url=proxy.endpoint_url, max_attempts=3)
            etag = store.put(key, data, **condition)
            assert proxy.faults == 1
        assert direct.get(key) == (data, etag)


def test_s3_truncated_download_is_fetched_again(s3_bucket_uri: S3BucketURI, tmp_path: Path) -> None:
    data = os.urandom(3 * MiB)
    etag = make_s3(s3_bucket_uri).put("blob", data)
    with FaultProxy(s3_bucket_uri.endpoint_url, fail_first=2, mode="truncate") as proxy:
        store = make_s3(s3_bucket_uri, endpoint_url=proxy.endpoint_url, max_attempts=3)
        assert store.download("blob", tmp_path / "blob")
        assert store.get("blob") == (data, etag)
        assert proxy.faults == 2
    assert (tmp_path / "blob").read_bytes() == data


def test_s3_unreachable_endpoint(s3_env: S3Server, tmp_path: Path) -> None:
    url = unreachable_endpoint()
    store = make_s3("s3://bucket/gk", endpoint_url=url, max_attempts=2, connect_timeout=1)
    started = time.monotonic()
    for op in (
        lambda: store.get("k"),
        lambda: store.head("k"),
        lambda: store.put("k", b"x"),
        lambda: list(store.list()),
        lambda: store.download("k", tmp_path / "k"),
    ):
        with pytest.raises(StoreUnavailable) as e:
            op()
        assert url in one_line(e)
    assert time.monotonic() - started < 15


def test_s3_missing_bucket(s3_env: S3Server, tmp_path: Path) -> None:
    store = make_s3("s3://gk-no-such-bucket/pre")
    ops: list[Callable[[], object]] = [
        lambda: store.get("k"),
        lambda: store.head("k"),
        lambda: store.put("k", b"x"),
        lambda: list(store.list()),
        lambda: store.delete("k"),
        lambda: store.upload("k", write_file(tmp_path / "big", 6 * MiB)),
    ]
    for op in ops:
        with pytest.raises(StoreUnavailable) as e:
            op()
        assert one_line(e) == (
            "S3 bucket 'gk-no-such-bucket' does not exist (s3://gk-no-such-bucket/pre)"
        )


def test_s3_no_credentials(s3_bucket_uri: S3BucketURI, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    store = make_s3(s3_bucket_uri)
    with pytest.raises(StoreUnavailable) as e:
        store.get("k")
    assert "AWS_ACCESS_KEY_ID" in one_line(e)


def test_s3_access_denied(s3_bucket_uri: S3BucketURI) -> None:
    store = make_s3(s3_bucket_uri)
    with Stubber(store._client) as stub:
        stub.add_client_error(
            "put_object",
            service_error_code="AccessDenied",
            service_message="Access Denied",
            http_status_code=403,
        )
        with pytest.raises(AccessDenied) as e:
            store.put("baselines/x.json", b"{}")
    assert one_line(e).startswith(f"S3 denied put of {s3_bucket_uri}/baselines/x.json")


def test_s3_uri_and_endpoint(s3_env: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    assert S3Backend("s3://b").uri == "s3://b"
    store = S3Backend("s3://b/p/q/")
    assert (store.bucket, store.prefix, store.uri) == ("b", "p/q", "s3://b/p/q")
    assert store.endpoint_url == s3_env.endpoint_url  # from AWS_ENDPOINT_URL_S3
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    assert S3Backend("s3://b").endpoint_url == "http://127.0.0.1:9"
    assert (
        S3Backend("s3://b", endpoint_url="http://localhost:1").endpoint_url == "http://localhost:1"
    )
    for bad in ("b/p", "s3://", "s3:///p"):
        with pytest.raises(StoreError):
            S3Backend(bad)
