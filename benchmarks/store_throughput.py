"""How fast does a bundle go up to and come down from S3 through gatekeeper's store?

A 64 MB bundle (a real ``bundle.pack`` archive of incompressible data) against a local S3
server (moto's, started here on 127.0.0.1 in its own process), compared with plain boto3
moving the same bytes:

    upload:   Store.publish_bundle (HEAD, multipart upload of the archive with
              If-None-Match on completion, then the manifest)
              vs boto3 ``upload_file`` (s3transfer's defaults)
    download: Store.download of the archive (one streamed GET)
              vs boto3 ``download_file`` (s3transfer's defaults: ranged parallel GETs)

Each operation runs --repeats times, the two sides interleaved (A B A B ...) so drift of a
shared machine cancels; the table gives the median MB/s (MB = 10^6 bytes) and the ratio
store / boto3. Nothing leaves 127.0.0.1 and no real credentials are used.

    python benchmarks/store_throughput.py [--size-mb 64] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

# a fake account on a local server: shut out any real AWS configuration first
for _name in (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
):
    os.environ.pop(_name, None)
os.environ.update(
    AWS_ACCESS_KEY_ID="bench",
    AWS_SECRET_ACCESS_KEY="bench",
    AWS_DEFAULT_REGION="us-east-1",
    AWS_EC2_METADATA_DISABLED="true",
    AWS_CONFIG_FILE=os.devnull,
    AWS_SHARED_CREDENTIALS_FILE=os.devnull,
)

import boto3  # noqa: E402
from tabulate import tabulate  # noqa: E402

from gatekeeper import bundle  # noqa: E402
from gatekeeper.store import BundleLocation, Store  # noqa: E402
from gatekeeper.store.s3 import S3Backend  # noqa: E402

MB = 1_000_000
TARGET = "bench/b1/default"
ENV_KEY = "bench-env-000000"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto() -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"moto server exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1).close()
            return proc, url
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("moto server did not start within 30 s")


def make_bundle(work: Path, size: int) -> tuple[Path, bytes]:
    """A real bundle whose archive is ``size`` bytes of incompressible cache data."""
    cache = work / "cache"
    cache.mkdir(parents=True)
    left, n = size, 0
    while left > 0:  # a few large "kernels", like a GPU cache dir
        chunk = min(left, 16 * 1024 * 1024)
        (cache / f"kernel{n}.so").write_bytes(os.urandom(chunk))
        left -= chunk
        n += 1
    archive, manifest = bundle.pack(
        cache,
        None,
        work,
        target=TARGET,
        key={"env_key": ENV_KEY, "code_hash": "0" * 16},
        compile_info={"seconds": 0.0},
        creator={},
        version="bench",
        signing_key=None,
    )
    shutil.rmtree(cache)
    return archive, manifest.to_bytes()


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=64, help="bundle size in MiB (default 64)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="gk-bench-s3-"))
    server, endpoint = start_moto()
    try:
        archive, manifest = make_bundle(work, args.size_mb * 1024 * 1024)
        size = archive.stat().st_size
        client = boto3.client("s3", endpoint_url=endpoint)
        bucket = "gk-bench"
        client.create_bucket(Bucket=bucket)
        backend = S3Backend(f"s3://{bucket}/gk", endpoint_url=endpoint)
        store = Store(backend)
        print(
            f"{args.size_mb} MiB bundle ({size / MB:.1f} MB), moto server at {endpoint}, "
            f"{args.repeats} repeats each",
            file=sys.stderr,
        )

        times: dict[str, list[float]] = {
            k: [] for k in ("store_up", "boto_up", "store_down", "boto_down")
        }
        for r in range(args.repeats):
            loc = BundleLocation(TARGET, ENV_KEY, f"{r:016x}")  # a new bundle each round
            plain_key = f"plain/{r}/{archive.name}"

            def store_up(loc: BundleLocation = loc) -> None:
                status = store.publish_bundle(loc, archive, archive.name, manifest)
                assert status == "published", status

            def boto_up(plain_key: str = plain_key) -> None:
                client.upload_file(str(archive), bucket, plain_key)

            def store_down(loc: BundleLocation = loc) -> None:
                store.download(loc.key(archive.name), work / "store.tar.zst")

            def boto_down(plain_key: str = plain_key) -> None:
                client.download_file(bucket, plain_key, str(work / "boto.tar.zst"))

            ups = [("store_up", store_up), ("boto_up", boto_up)]
            downs = [("store_down", store_down), ("boto_down", boto_down)]
            if r % 2:  # alternate who goes first
                ups.reverse()
                downs.reverse()
            for name, fn in ups + downs:
                times[name].append(timed(fn))
            for name in ("store.tar.zst", "boto.tar.zst"):
                assert (work / name).stat().st_size == size
            print(
                f"round {r + 1}: "
                + "  ".join(f"{k}={size / MB / v[-1]:.0f} MB/s" for k, v in times.items()),
                file=sys.stderr,
            )
            for key in [loc.key(archive.name), loc.key("manifest.json")]:
                backend.delete(key)
            client.delete_object(Bucket=bucket, Key=plain_key)

        def rate(name: str) -> float:
            return size / MB / statistics.median(times[name])

        rows = []
        for op, ours, theirs, how in (
            ("upload", "store_up", "boto_up", "publish_bundle vs upload_file"),
            ("download", "store_down", "boto_down", "Store.download vs download_file"),
        ):
            rows.append(
                [
                    op,
                    f"{rate(ours):.0f}",
                    f"{rate(theirs):.0f}",
                    f"{rate(ours) / rate(theirs):.2f}",
                    how,
                ]
            )
        print(
            tabulate(
                rows,
                headers=["", "store MB/s", "boto3 MB/s", "ratio", "compared"],
                disable_numparse=True,
            )
        )
        print(
            f"\n{args.size_mb} MiB ({size / MB:.1f} MB) object, median of {args.repeats}; "
            f"moto server on 127.0.0.1; {platform.python_implementation()} "
            f"{platform.python_version()}, boto3 {boto3.__version__}, {os.cpu_count()} CPUs"
        )
        backend.close()
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
