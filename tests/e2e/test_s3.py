"""The whole CLI against S3 (moto's server), with real compiles, as a fleet runs it.

One tiny model is compiled once per session into a bucket (and, at the same time, once
more by a runner whose store is read-only). Tests that change the store work on a
server-side copy of that bucket. Every command runs in a new process that finds S3
through ``AWS_ENDPOINT_URL_S3`` and fake credentials, as a runner would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.helpers import TINY_CONFIG, write_project
from support.s3_server import (
    ACCESS_KEY,
    REGION,
    SECRET_KEY,
    FaultProxy,
    S3Server,
    unreachable_endpoint,
)

TARGET = "tiny/b4/default"
PREFIX = "gk"
CONFIG = TINY_CONFIG + "\n[tool.gatekeeper.measure]\nwarmup = 2\nmin_time = 0.5\n"

# what could point boto3 at a real AWS account: never inherited by the subprocesses
_AWS_VARS = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_ENDPOINT_URL_S3",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "GATEKEEPER_SIGNING_KEY",
)


def s3_environ(endpoint_url: str, nowhere: Path) -> dict[str, str]:
    """A runner's environment: the S3 endpoint and fake credentials, no real AWS config."""
    env = {k: v for k, v in os.environ.items() if k not in _AWS_VARS}
    return env | {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ENDPOINT_URL_S3": endpoint_url,
        "AWS_CONFIG_FILE": str(nowhere),
        "AWS_SHARED_CREDENTIALS_FILE": str(nowhere),
        "AWS_EC2_METADATA_DISABLED": "true",
    }


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "gatekeeper", *args]


@dataclass
class Runner:
    """Runs the CLI in a new process in ``project``, against ``endpoint_url``."""

    project: Path
    endpoint_url: str
    nowhere: Path

    def env(self, endpoint_url: str | None = None) -> dict[str, str]:
        return s3_environ(endpoint_url or self.endpoint_url, self.nowhere)

    def run(
        self, *args: str, endpoint_url: str | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            command(*args),
            cwd=self.project,
            env=self.env(endpoint_url),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc

    def json(self, *args: str, expect: int = 0, **kw: Any) -> dict:
        proc = self.run(*args, "--json", **kw)
        assert proc.returncode == expect, proc.stdout + proc.stderr
        return json.loads(proc.stdout)


@dataclass
class Compiled:
    server: S3Server
    bucket: str  # holds the tiny target's bundle, published by `compile`
    project: Path
    runner: Runner
    compile_doc: dict
    read_only: subprocess.CompletedProcess  # `compile --read-only` into an empty bucket
    read_only_bucket: str

    def uri(self, bucket: str | None = None) -> str:
        return f"s3://{bucket or self.bucket}/{PREFIX}"


@pytest.fixture(scope="session")
def compiled(s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Compiled]:
    project = write_project(tmp_path_factory.mktemp("s3-project"), config=CONFIG)
    runner = Runner(project, s3_server.endpoint_url, tmp_path_factory.mktemp("aws") / "absent")
    bucket, ro_bucket = s3_server.create_bucket(), s3_server.create_bucket()
    # two runners compile at once: one may publish, the other's store is read-only
    procs = [
        subprocess.Popen(
            command("compile", "--store", f"s3://{b}/{PREFIX}", "--json", *extra),
            cwd=project,
            env=runner.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        for b, extra in ((bucket, ()), (ro_bucket, ("--read-only",)))
    ]
    (out, err), (ro_out, ro_err) = (p.communicate(timeout=600) for p in procs)
    assert procs[0].returncode == 0, out + err
    read_only = subprocess.CompletedProcess(procs[1].args, procs[1].returncode, ro_out, ro_err)
    try:
        yield Compiled(s3_server, bucket, project, runner, json.loads(out), read_only, ro_bucket)
    finally:
        for b in (bucket, ro_bucket):
            s3_server.delete_bucket(b)


def objects(server: S3Server, bucket: str) -> dict[str, bytes]:
    client = server.client()
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", ()):
            out[obj["Key"]] = client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
    return out


@pytest.fixture
def bucket(compiled: Compiled) -> Iterator[str]:
    """A private copy of the compiled bucket, for a test that changes it."""
    server = compiled.server
    name = server.create_bucket()
    client = server.client()
    for key in objects(server, compiled.bucket):
        client.copy_object(Bucket=name, Key=key, CopySource={"Bucket": compiled.bucket, "Key": key})
    yield name
    server.delete_bucket(name)


def warm(compiled: Compiled, cache: Path, uri: str, expect: int = 0, **kw: Any) -> dict:
    return compiled.runner.json(
        "warm", "--store", uri, "--cache-dir", str(cache), expect=expect, **kw
    )


# -- tests -----------------------------------------------------------------------------


def test_compile_publishes_to_s3(compiled: Compiled):
    (entry,) = compiled.compile_doc["targets"]
    assert entry["target"] == TARGET and entry["status"] == "published"
    assert compiled.compile_doc["store"] == compiled.uri()
    assert compiled.compile_doc["skipped_writes"] == 0
    keys = sorted(objects(compiled.server, compiled.bucket))
    prefix = f"{PREFIX}/bundles/{TARGET}/{entry['env_key']}/{entry['code_hash']}/"
    assert [k.removeprefix(prefix) for k in keys][1:] == ["manifest.json"]
    assert keys[0].startswith(prefix + "bundle-") and keys[0].endswith(".tar.zst")
    # a second runner finds it and publishes nothing
    again = compiled.runner.json("compile", "--store", compiled.uri())
    assert again["targets"][0]["status"] == "exists"


def test_read_only_compile_skips_and_counts_its_writes(compiled: Compiled):
    proc = compiled.read_only
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [t["status"] for t in doc["targets"]] == ["skipped"]
    assert doc["skipped_writes"] == 1
    assert len([ln for ln in proc.stderr.splitlines() if "read-only" in ln]) == 1
    assert objects(compiled.server, compiled.read_only_bucket) == {}


def test_compile_warm_check_baseline_gate(compiled: Compiled, bucket: str, tmp_path: Path):
    uri, run = compiled.uri(bucket), compiled.runner.json
    # a deploy in a new process with an empty cache dir starts warm
    (entry,) = warm(compiled, tmp_path / "cache", uri)["targets"]
    assert entry["status"] == "hit" and entry["files"] > 0
    assert any((tmp_path / "cache").rglob("*.so"))

    out = tmp_path / "out"
    doc = run("check", "--store", uri, "--out", str(out), "--base-ref", "main")
    assert [t["status"] for t in doc["targets"]] == ["ok"]
    results = json.loads((out / "results.json").read_text())
    assert results["targets"][0]["compile"]["cache"] == "hit"  # warmed from S3

    results_file = str(out / "results.json")
    doc = run("baseline", "--store", uri, "--results", results_file, "--ref", "main")
    assert [t["status"] for t in doc["targets"]] == ["published"]
    assert doc["skipped_writes"] == 0
    stored = objects(compiled.server, bucket)
    base = f"{PREFIX}/baselines/{TARGET}/{entry['env_key']}/main/"
    assert base + "latest.json" in stored
    assert any(k.startswith(base + "history/") for k in stored)
    assert any(k.startswith(base + "outputs/") for k in stored)

    doc = run("gate", "--store", uri, "--results", results_file, "--base-ref", "main")
    (target,) = doc["targets"]
    # the same results against themselves pass; on a busy runner (CI shares its cores)
    # a disturbed run vouches for nothing its interval cannot show, and says so, but an
    # undecided verdict still exits 0 by default (gate.inconclusive = "pass")
    expected = "inconclusive" if target["disturbed"] else "pass"
    assert target["verdict"] == expected and doc["verdict"] == expected, target
    assert doc["exit_code"] == 0

    doc = run("store", "verify", "--store", uri)
    assert doc["ok"] is True and all(o["ok"] for o in doc["objects"])
    doc = run("store", "ls", "--store", uri)
    assert [(b["target"], b["complete"]) for b in doc["bundles"]] == [(TARGET, True)]


def test_flipped_byte_in_s3_is_caught_by_warm_and_verify(
    compiled: Compiled, bucket: str, tmp_path: Path
):
    client = compiled.server.client()
    (key,) = [k for k in objects(compiled.server, bucket) if k.endswith(".tar.zst")]
    data = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    data[len(data) // 2] ^= 0x01
    client.put_object(Bucket=bucket, Key=key, Body=bytes(data))
    uri = compiled.uri(bucket)

    proc = compiled.runner.run("warm", "--store", uri, "--cache-dir", str(tmp_path / "c"), "--json")
    assert proc.returncode == 0, proc.stderr
    (entry,) = json.loads(proc.stdout)["targets"]
    assert entry["status"] == "miss"
    assert TARGET in entry["reason"] and "sha256" in entry["reason"]
    assert not any((tmp_path / "c").rglob("*.so"))  # nothing unverified was installed

    doc = compiled.runner.json("store", "verify", "--store", uri, expect=1)
    assert doc["ok"] is False
    (failed,) = [o for o in doc["objects"] if not o["ok"]]
    assert key.removeprefix(PREFIX + "/").startswith(failed["key"] + "/")
    assert "sha256" in failed["detail"]
    table = compiled.runner.run("store", "verify", "--store", uri)
    assert table.returncode == 1 and failed["key"] in table.stdout


@pytest.mark.parametrize("mode", ["503", "drop"])
def test_warm_retries_through_a_faulty_network(compiled: Compiled, tmp_path: Path, mode: str):
    with FaultProxy(compiled.server.endpoint_url, fail_first=3, mode=mode) as proxy:
        (entry,) = warm(
            compiled, tmp_path / "cache", compiled.uri(), endpoint_url=proxy.endpoint_url
        )["targets"]
        assert proxy.faults == 3
    assert entry["status"] == "hit" and entry["files"] > 0


def test_warm_with_the_store_unreachable_is_a_miss(compiled: Compiled, tmp_path: Path):
    start = time.monotonic()
    proc = compiled.runner.run(
        "warm",
        "--store",
        compiled.uri(),
        "--cache-dir",
        str(tmp_path / "c"),
        "--json",
        endpoint_url=unreachable_endpoint(),
        timeout=120,
    )
    took = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["targets"] and all(t["status"] == "miss" for t in doc["targets"])
    assert all("cannot reach" in t["reason"] for t in doc["targets"])
    warnings = [ln for ln in proc.stderr.splitlines() if "compile cold" in ln]
    assert len(warnings) == len(doc["targets"])
    # botocore's own backoff over the backend's 8 attempts: a few seconds, not minutes
    assert took < 60, f"warm took {took:.0f} s with the store unreachable"
    # --strict makes the same miss fail the step
    strict = compiled.runner.run(
        "warm",
        "--store",
        compiled.uri(),
        "--cache-dir",
        str(tmp_path / "c"),
        "--strict",
        endpoint_url=unreachable_endpoint(),
        timeout=120,
    )
    assert strict.returncode == 1
