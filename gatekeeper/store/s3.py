"""The S3 backend: a bucket and prefix on AWS S3 or any S3-compatible server, via boto3.

Conditional writes map onto S3's own: ``if_none_match`` is ``If-None-Match: *`` (on
PutObject, or on CompleteMultipartUpload for a multipart upload) and ``if_match`` is
``If-Match: <etag>``. A 412 ``PreconditionFailed`` or a 409 ``ConditionalRequestConflict``
(two conditional writes racing) both raise :class:`~gatekeeper.errors.PreconditionFailed`.
ETags are returned exactly as the server gives them (with their quotes).

botocore's "standard" retry mode retries throttling, 5xx, timeouts and dropped
connections with exponential backoff and full jitter; this module adds a retry of a body
that breaks off mid-download, and resolves the one ambiguity retries create for
conditional writes (see :meth:`S3Backend.put`). Content is verified a layer above
(sha256). botocore's automatic checksums are off (S3-compatible servers often reject its
CRC trailers); the one checksum sent is each multipart part's CRC32, as a header, with a
fallback for servers that refuse it (see :meth:`S3Backend.upload`).

Every botocore failure becomes a one-line :class:`~gatekeeper.errors.StoreError`.
"""

from __future__ import annotations

import base64
import logging
import os
import random
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    CredentialRetrievalError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)

from ..errors import AccessDenied, PreconditionFailed, StoreError, StoreUnavailable
from ..secrecy import aws_credentials
from .base import Backend, ObjectInfo, too_large

log = logging.getLogger(__name__)

MIN_PART_SIZE = 5 * 1024 * 1024  # S3's smallest part (all but the last)
MAX_PARTS = 10_000  # S3's most parts in one upload
DEFAULT_REGION = "us-east-1"

_ABSENT = {"NoSuchKey", "NotFound", "404"}
_CONFLICT = {"PreconditionFailed", "ConditionalRequestConflict"}
_DENIED = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AllAccessDisabled",
    "AccountProblem",
    "InvalidToken",
    "ExpiredToken",
}
_THROTTLED = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "ServiceUnavailable",
    "InternalError",
    "RequestTimeout",
}
# what a server that does not take checksums answers CreateMultipartUpload's algorithm with
_NO_CHECKSUMS = {"InvalidArgument", "InvalidRequest", "NotImplemented", "InvalidChecksum"}
_Parts = list[dict[str, Any]]  # CompleteMultipartUpload's Parts (``list`` is shadowed below)


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> ``("bucket", "some/prefix")``; the prefix may be empty."""
    if not uri.startswith("s3://"):
        raise StoreError(f"not an S3 store URI: {uri!r} (expected s3://bucket/prefix)")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    if not bucket:
        raise StoreError(f"S3 store URI {uri!r} names no bucket (expected s3://bucket/prefix)")
    return bucket, prefix.strip("/")


def _code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def _status(e: ClientError) -> int | None:
    return e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")


def _attempts(e: ClientError) -> int:
    return 1 + int(e.response.get("ResponseMetadata", {}).get("RetryAttempts", 0))


def _is_conflict(e: ClientError) -> bool:
    return _code(e) in _CONFLICT or _status(e) == 412


class S3Backend(Backend):
    """Objects under ``s3://bucket/prefix`` (keys are joined under the prefix).

    ``endpoint_url`` defaults to ``AWS_ENDPOINT_URL_S3``, then ``AWS_ENDPOINT_URL``, then
    AWS itself; with an endpoint set, requests use path-style addressing. Credentials and
    region come from the standard chain (region ``us-east-1`` if none is configured).
    ``max_attempts`` counts every attempt of a request, the first included. Files above
    ``multipart_threshold`` bytes go up in parts of at least ``multipart_chunksize``
    (raised to S3's 5 MiB minimum), the remainder spread over them and at most 10,000,
    ``max_concurrency`` at a time.
    ``list_page_size`` is the number of keys per ListObjectsV2 page. ``part_checksums``
    sends each multipart part with its CRC32 (see :meth:`upload`).
    """

    def __init__(
        self,
        uri: str,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        max_attempts: int = 8,
        connect_timeout: float = 5,
        read_timeout: float = 60,
        multipart_threshold: int = 16 * 1024 * 1024,
        multipart_chunksize: int = 8 * 1024 * 1024,
        max_concurrency: int = 8,
        list_page_size: int = 1000,
        part_checksums: bool = True,
    ) -> None:
        self.bucket, self.prefix = parse_s3_uri(uri)
        self.uri = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        self._max_attempts = max(1, max_attempts)
        self._threshold = multipart_threshold
        self._chunksize = max(multipart_chunksize, MIN_PART_SIZE)
        self._concurrency = max(1, max_concurrency)
        self._page_size = list_page_size
        self._bucket_seen = False  # set once the bucket is known to exist (see head)

        self._part_checksums = part_checksums
        endpoint_url = (
            endpoint_url
            or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL")
            or None
        )
        try:
            # the keys the gatekeeper program took out of its environment (secrecy.seal)
            session = boto3.session.Session(**aws_credentials())
            config = Config(
                region_name=region or session.region_name or DEFAULT_REGION,
                retries={"mode": "standard", "total_max_attempts": self._max_attempts},
                connect_timeout=connect_timeout,
                read_timeout=read_timeout,
                max_pool_connections=max(10, self._concurrency),
                # S3-compatible servers often reject the CRC trailers newer botocore adds
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
                s3={"addressing_style": "path"} if endpoint_url else None,
            )
            self._client: Any = session.client("s3", endpoint_url=endpoint_url, config=config)
        except (BotoCoreError, ValueError) as e:
            # an unknown AWS_PROFILE (ProfileNotFound), a malformed endpoint URL (ValueError)
            raise StoreError(f"cannot open S3 store {self.uri}: {e}") from e
        self.endpoint_url: str = self._client.meta.endpoint_url

    # -- keys and errors ---------------------------------------------------------------
    def _key(self, key: str) -> str:
        if not key or any(p in ("", ".", "..") for p in key.split("/")):
            raise StoreError(f"invalid store key {key!r}")
        return f"{self.prefix}/{key}" if self.prefix else key

    def _where(self, key: str | None) -> str:
        return f"{self.uri}/{key}" if key else self.uri

    def _error(self, e: Exception, op: str, key: str | None) -> StoreError:
        """The one-line gatekeeper error for a botocore failure of ``op`` on ``key``."""
        where = self._where(key)
        if isinstance(e, ClientError):
            code, status = _code(e), _status(e)
            message = e.response.get("Error", {}).get("Message") or ""
            if code == "NoSuchBucket":
                return self._no_bucket()
            if _is_conflict(e):
                return PreconditionFailed(f"{where} exists or changed ({code or status})")
            if status == 403 or code in _DENIED:
                return AccessDenied(f"S3 denied {op} of {where}: {code or status} {message}")
            if (status or 0) >= 500 or code in _THROTTLED:
                return StoreUnavailable(
                    f"S3 endpoint {self.endpoint_url} failed {op} of {where} "
                    f"after {_attempts(e)} attempts: {status} {code}"
                )
            return StoreError(f"S3 {op} of {where} failed: {code or status} {message}")
        if isinstance(e, (NoCredentialsError, PartialCredentialsError, CredentialRetrievalError)):
            return StoreUnavailable(
                f"no usable AWS credentials for {self.uri} ({e}): set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or run with an IAM role"
            )
        if isinstance(e, (BotoConnectionError, HTTPClientError, IncompleteReadError)):
            return StoreUnavailable(
                f"cannot reach S3 endpoint {self.endpoint_url} ({op} of "
                f"{where}, {self._max_attempts} attempts): {e}"
            )
        return StoreError(f"S3 {op} of {where} failed: {e}")

    def _no_bucket(self) -> StoreUnavailable:
        return StoreUnavailable(f"S3 bucket '{self.bucket}' does not exist ({self.uri})")

    @contextmanager
    def _translated(self, op: str, key: str | None = None) -> Iterator[None]:
        try:
            yield
        except (ClientError, BotoCoreError) as e:
            raise self._error(e, op, key) from e

    def _backoff(self, attempt: int) -> None:
        """Sleep like botocore's standard mode: full jitter, doubling, at most 20 s."""
        time.sleep(random.random() * min(20.0, 2.0 ** (attempt - 1)))

    # -- reads -------------------------------------------------------------------------
    def _read_into(
        self,
        key: str,
        write: Callable[[bytes], object],
        restart: Callable[[], object],
        max_bytes: int | None = None,
    ) -> str | None:
        """Stream the object into ``write``; its ETag, or None when absent.

        botocore retries the request itself; a body that breaks off mid-stream is fetched
        again from the start (after ``restart``), so the bytes and the ETag always belong
        to one version of the object even if it is replaced meanwhile. An object over
        ``max_bytes`` (by its Content-Length, or by what arrives) raises ObjectTooLarge.
        """
        attempt = 0
        while True:
            attempt += 1
            try:
                resp = self._client.get_object(Bucket=self.bucket, Key=self._key(key))
            except ClientError as e:
                if _code(e) in _ABSENT:
                    return None
                raise
            body = resp["Body"]
            try:
                size = resp.get("ContentLength")
                if max_bytes is not None and size is not None and int(size) > max_bytes:
                    raise too_large(self._where(key), max_bytes, int(size))
                got = 0
                for chunk in body.iter_chunks(1 << 20):
                    got += len(chunk)
                    if max_bytes is not None and got > max_bytes:
                        raise too_large(self._where(key), max_bytes)
                    write(chunk)
                return str(resp["ETag"])
            except (HTTPClientError, IncompleteReadError):
                if attempt >= self._max_attempts:
                    raise
            finally:
                body.close()
            restart()
            self._backoff(attempt)

    def get(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, str] | None:
        buf = bytearray()
        with self._translated("get", key):
            etag = self._read_into(key, buf.extend, buf.clear, max_bytes)
        return None if etag is None else (bytes(buf), etag)

    def download(self, key: str, dest: Path, *, max_bytes: int | None = None) -> bool:
        dest = Path(dest)
        part = dest.with_name(dest.name + ".part")
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            part.unlink(missing_ok=True)  # a new file: never through what is at its name
            with open(part, "xb") as f, self._translated("download", key):

                def restart() -> None:
                    f.seek(0)
                    f.truncate()

                etag = self._read_into(key, f.write, restart, max_bytes)
            if etag is None:
                return False
            os.replace(part, dest)
            return True
        except OSError as e:
            raise StoreError(f"cannot write {dest}: {e.strerror or e}") from e
        finally:
            part.unlink(missing_ok=True)

    def head(self, key: str) -> ObjectInfo | None:
        with self._translated("head", key):
            try:
                resp = self._client.head_object(Bucket=self.bucket, Key=self._key(key))
            except ClientError as e:
                if _code(e) not in _ABSENT:
                    raise
                # HEAD errors have no body: a missing bucket looks like a missing key
                self._check_bucket()
                return None
        self._bucket_seen = True
        return ObjectInfo(
            key, int(resp["ContentLength"]), resp["LastModified"].timestamp(), str(resp["ETag"])
        )

    def _check_bucket(self) -> None:
        if not self._bucket_seen:
            try:
                self._client.head_bucket(Bucket=self.bucket)
            except ClientError as e:
                if _code(e) in ("404", "NoSuchBucket", "NotFound"):
                    raise self._no_bucket() from e
                raise
            self._bucket_seen = True

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        base = f"{self.prefix}/" if self.prefix else ""
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=base + prefix, PaginationConfig={"PageSize": self._page_size}
        )
        with self._translated("list", prefix or None):
            for page in pages:
                for obj in page.get("Contents", ()):
                    yield ObjectInfo(
                        obj["Key"][len(base) :],
                        int(obj["Size"]),
                        obj["LastModified"].timestamp(),
                        obj.get("ETag"),
                    )

    # -- writes ------------------------------------------------------------------------
    def put(
        self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        """Store ``data``; conditional on absence or on the current ETag if asked.

        A retried conditional write is ambiguous: when an earlier attempt landed but its
        reply was lost, the retry fails its own condition. So when a condition fails after
        retries and the object now holds exactly ``data``, the write is taken as done.
        """
        conditions: dict[str, str] = {}
        if if_none_match:
            conditions["IfNoneMatch"] = "*"
        if if_match is not None:
            conditions["IfMatch"] = if_match
        with self._translated("put", key):
            try:
                resp = self._client.put_object(
                    Bucket=self.bucket, Key=self._key(key), Body=data, **conditions
                )
            except ClientError as e:
                # If-Match on an absent key is a 404 NoSuchKey: the object moved too
                if not conditions or not (_is_conflict(e) or _code(e) in _ABSENT):
                    raise
                if _attempts(e) > 1:
                    current = self.get(key)
                    if current is not None and current[0] == data:
                        return current[1]
                raise PreconditionFailed(
                    f"{self._where(key)} "
                    + ("exists" if if_none_match else f"changed (ETag is no longer {if_match})")
                ) from e
        return str(resp["ETag"])

    def upload(self, key: str, src: Path, *, if_none_match: bool = False) -> str:
        """Store the file ``src``: one PutObject up to the threshold, else a multipart upload.

        A multipart upload sends its parts in parallel and carries the condition on
        CompleteMultipartUpload, the moment the object appears; on any failure it is
        aborted so no parts linger. Each part goes with its CRC32 (``ChecksumCRC32``, a
        header, never a trailer): the server checks each part as it arrives, and at
        completion combines the parts' CRC32s instead of reading the whole object again
        for a full-object checksum of its own (what S3, and moto, do for an upload that
        declared none: a fifth of a 64 MiB upload's time on moto). A server that rejects
        checksums gets the upload without them (once; it is remembered).
        """
        src = Path(src)
        try:
            size = src.stat().st_size
            small = src.read_bytes() if size <= self._threshold else None
        except OSError as e:
            raise StoreError(f"cannot read {src}: {e.strerror or e}") from e
        if small is not None:
            return self.put(key, small, if_none_match=if_none_match)

        k = self._key(key)
        # a cheap early exit; the condition on completion is what makes it safe
        if if_none_match and self.head(key) is not None:
            raise PreconditionFailed(f"{self._where(key)} exists")
        with self._translated("upload", key):
            upload_id, checksums = self._create_multipart_upload(k)
            try:
                parts = self._upload_parts(k, upload_id, src, size, checksums)
                resp = self._client.complete_multipart_upload(
                    Bucket=self.bucket,
                    Key=k,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                    **({"IfNoneMatch": "*"} if if_none_match else {}),
                )
            except BaseException:
                self._abort(k, upload_id)
                raise
        return str(resp["ETag"])

    def _create_multipart_upload(self, k: str) -> tuple[str, bool]:
        """A new multipart upload: its id, and whether its parts carry CRC32s."""
        if self._part_checksums:
            try:
                resp = self._client.create_multipart_upload(
                    Bucket=self.bucket, Key=k, ChecksumAlgorithm="CRC32"
                )
                return str(resp["UploadId"]), True
            except ClientError as e:
                if _code(e) not in _NO_CHECKSUMS and _status(e) != 501:
                    raise
                log.info(
                    "%s does not take checksums (%s): uploading without them",
                    self.endpoint_url,
                    _code(e) or _status(e),
                )
                self._part_checksums = False
        resp = self._client.create_multipart_upload(Bucket=self.bucket, Key=k)
        return str(resp["UploadId"]), False

    def _upload_parts(
        self, k: str, upload_id: str, src: Path, size: int, checksums: bool
    ) -> _Parts:
        # parts of about the chunk size, the remainder spread over them: no small last
        # part that would wait for a second round of the thread pool on its own
        count = min(max(1, size // self._chunksize), MAX_PARTS)
        part_size = -(-size // count)
        count = -(-size // part_size)
        try:
            fd = os.open(src, os.O_RDONLY)
        except OSError as e:
            raise StoreError(f"cannot read {src}: {e.strerror or e}") from e

        def send(number: int) -> dict[str, Any]:
            body = os.pread(fd, part_size, (number - 1) * part_size)
            part: dict[str, Any] = {"PartNumber": number}
            if checksums:
                crc = base64.b64encode(zlib.crc32(body).to_bytes(4, "big")).decode()
                part["ChecksumCRC32"] = crc  # CompleteMultipartUpload must repeat it
            resp = self._client.upload_part(
                Bucket=self.bucket, Key=k, UploadId=upload_id, Body=body, **part
            )
            return part | {"ETag": resp["ETag"]}

        try:
            with ThreadPoolExecutor(
                max_workers=min(self._concurrency, count), thread_name_prefix="gk-s3-part"
            ) as pool:
                futures = [pool.submit(send, n) for n in range(1, count + 1)]
                try:
                    return [f.result() for f in futures]
                except BaseException:
                    for f in futures:
                        f.cancel()
                    raise
        finally:
            os.close(fd)

    def _abort(self, k: str, upload_id: str) -> None:
        try:
            self._client.abort_multipart_upload(Bucket=self.bucket, Key=k, UploadId=upload_id)
        except (ClientError, BotoCoreError) as e:  # best effort: a lifecycle rule sweeps the rest
            log.warning("could not abort multipart upload of s3://%s/%s: %s", self.bucket, k, e)

    def delete(self, key: str) -> None:
        with self._translated("delete", key):
            self._client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def close(self) -> None:
        self._client.close()
