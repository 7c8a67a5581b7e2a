"""A broken store, a full disk and a closed stdout, through the real CLI in new processes.

* A store that cannot be read is an error (exit 2, one line naming the store and the
  cause) wherever the answer depends on it: ``gate``, ``merge``, ``baseline``, ``run``.
  "no-baseline" only when the store answered that there is none.
* ``warm`` and ``gatekeeper.warm_start()`` stay best effort: any failure is a warning
  and a ``miss``, and nothing is left half-written.
* A disk that fills up while a baseline is published: one line naming the path, no
  temporary file left, nothing a reader can see; what the publish did store before it
  failed is an orphan that ``store verify`` reports and ``store prune`` removes.
* A reader that goes away (``| head``) changes nothing but the output.

S3 is moto's server on 127.0.0.1; results and baselines are built by hand (no compile),
except for the full cache disk, which packs a small bundle for this machine's key.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.factories import make_result
from support.helpers import write_project
from support.s3_server import ACCESS_KEY, REGION, SECRET_KEY, S3BucketURI, S3Server

from gatekeeper import bundle
from gatekeeper.gate.baseline import publish_result
from gatekeeper.key import target_key
from gatekeeper.project import expand, load_config
from gatekeeper.results import ReferenceOutputs, Results, TargetResult
from gatekeeper.store import BundleLocation, baselines, maintenance, open_store

TARGET = "tiny/b4/default"
MISSING = "s3://gk-no-such-bucket/gk"
GRACE = maintenance.ORPHAN_GRACE_S

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
    "GITHUB_OUTPUT",
    "GITHUB_STEP_SUMMARY",
    "GITHUB_ACTIONS",
)


def environ(endpoint_url: str, nowhere: Path, **changes: str | None) -> dict[str, str]:
    """A runner's environment against the S3 server; ``None`` in changes removes a var."""
    env = {k: v for k, v in os.environ.items() if k not in _AWS_VARS}
    env |= {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ENDPOINT_URL_S3": endpoint_url,
        "AWS_CONFIG_FILE": str(nowhere),
        "AWS_SHARED_CREDENTIALS_FILE": str(nowhere),
        "AWS_EC2_METADATA_DISABLED": "true",
        "OMP_NUM_THREADS": "1",
    }
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def gk(
    project: Path, *args: str, env: dict[str, str], timeout: float = 300, **popen: Any
) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "gatekeeper", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        **popen,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The whole of stderr (but for ``[i/n]`` progress lines): exactly one line, an
    error, never an internal one."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if not ln.startswith("[")]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("gatekeeper: error: "), lines[0]
    assert "internal error" not in lines[0]
    return lines[0]


def write_results(folder: Path, *targets: TargetResult) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    doc = Results(
        created_at="2025-01-01T00:10:00Z",
        gatekeeper_version="test",
        creator={"commit": "0123456789abcdef"},
        base_ref="main",
        targets=list(targets),
    )
    path = folder / "results.json"
    path.write_text(doc.dump())
    return path


@pytest.fixture
def nowhere(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("aws") / "absent"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = write_project(tmp_path / "project")
    write_results(root, make_result(TARGET))
    return root


# -- a store that cannot be read is an error -------------------------------------------

BROKEN = {  # how a store can be unreadable: (--store, env changes, what the line says)
    "missing-bucket": (MISSING, {}, ["gk-no-such-bucket", "does not exist"]),
    "no-credentials": (
        None,
        {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None},
        ["no usable AWS credentials"],
    ),
    "unknown-profile": (
        None,
        {"AWS_PROFILE": "gk-no-such-profile"},
        ["gk-no-such-profile", "could not be found"],
    ),
    "malformed-endpoint": (
        None,
        {"AWS_ENDPOINT_URL_S3": "http://no such host:x"},
        ["Invalid endpoint"],
    ),
    "uri-typo": ("s3:/{bucket}/gk", {}, ["s3:/", "neither s3://bucket/prefix nor"]),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_gate_on_an_unreadable_store_is_an_error(
    case: str, project: Path, s3_bucket_uri: S3BucketURI, nowhere: Path
):
    uri, changes, says = BROKEN[case]
    uri = (uri or s3_bucket_uri).format(bucket=s3_bucket_uri.bucket)
    proc = gk(
        project,
        "gate",
        "--store",
        uri,
        "--base-ref",
        "main",
        env=environ(s3_bucket_uri.endpoint_url, nowhere, **changes),
    )
    line = one_error_line(proc)
    assert all(s in line for s in says), line
    assert (MISSING.split("/")[2] if uri == MISSING else s3_bucket_uri.bucket) in line
    assert proc.stdout == ""  # no report of a gate that did not happen


def test_gate_on_a_store_without_baselines_says_no_baseline(
    project: Path, s3_bucket_uri: S3BucketURI, nowhere: Path
):
    """The control: an empty bucket answers "none", which is not an error."""
    proc = gk(
        project,
        "gate",
        "--store",
        s3_bucket_uri,
        "--base-ref",
        "main",
        "--json",
        env=environ(s3_bucket_uri.endpoint_url, nowhere),
    )
    assert proc.returncode == 0, proc.stderr
    assert [t["verdict"] for t in json.loads(proc.stdout)["targets"]] == ["no-baseline"]


def test_merge_and_baseline_on_a_missing_bucket_are_errors(
    project: Path, s3_env: S3Server, nowhere: Path
):
    env = environ(s3_env.endpoint_url, nowhere)
    merged = gk(
        project,
        "merge",
        "results.json",
        "--out",
        "merged",
        "--store",
        MISSING,
        "--base-ref",
        "main",
        env=env,
    )
    assert "does not exist" in one_error_line(merged)
    published = gk(project, "baseline", "--ref", "main", "--store", MISSING, env=env)
    assert "does not exist" in one_error_line(published)


@pytest.mark.parametrize("flags", [["--read-only"], []], ids=["read-only", "writable"])
def test_run_on_a_missing_bucket_stops_before_measuring(
    flags: list[str], project: Path, s3_env: S3Server, nowhere: Path
):
    out = project / "out"
    started = time.monotonic()
    proc = gk(
        project,
        "run",
        "--store",
        MISSING,
        "--out",
        str(out),
        "--base-ref",
        "main",
        *flags,
        env=environ(s3_env.endpoint_url, nowhere),
    )
    line = one_error_line(proc)
    assert "gk-no-such-bucket" in line and "does not exist" in line and TARGET in line
    assert not (out / "results.json").exists()  # no cold measurement was gated
    assert time.monotonic() - started < 120


# -- warm stays best effort --------------------------------------------------------------


@pytest.mark.parametrize("case", ["unknown-profile", "malformed-endpoint"])
def test_warm_on_an_unopenable_store_is_a_miss(
    case: str, project: Path, s3_bucket_uri: S3BucketURI, nowhere: Path, tmp_path: Path
):
    _, changes, says = BROKEN[case]
    proc = gk(
        project,
        "warm",
        "--store",
        s3_bucket_uri,
        "--cache-dir",
        str(tmp_path / "c"),
        "--json",
        env=environ(s3_bucket_uri.endpoint_url, nowhere, **changes),
    )
    assert proc.returncode == 0, proc.stderr
    (entry,) = json.loads(proc.stdout)["targets"]
    assert entry["status"] == "miss" and all(s in entry["reason"] for s in says)
    warnings = proc.stderr.splitlines()
    assert len(warnings) == 1 and "compile cold" in warnings[0], proc.stderr


@pytest.mark.parametrize("case", ["unknown-profile", "malformed-endpoint"])
def test_warm_start_never_raises(
    case: str,
    project: Path,
    s3_bucket_uri: S3BucketURI,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
):
    import gatekeeper

    _, changes, says = BROKEN[case]
    with monkeypatch.context() as env:  # undone before the bucket is cleaned up
        for name, value in changes.items():
            env.setenv(name, value)
        results = gatekeeper.warm_start(
            project / "gatekeeper.toml", store=str(s3_bucket_uri), cache_dir=tmp_path / "cache"
        )
    assert [(r.target, r.status) for r in results] == [(TARGET, "miss")]
    assert all(s in results[0].reason for s in says)


def _can_mount_tmpfs(where: Path) -> bool:
    if shutil.which("unshare") is None:
        return False
    where.mkdir(parents=True, exist_ok=True)
    probe = subprocess.run(
        ["unshare", "-Urm", "sh", "-c", 'mount -t tmpfs -o size=64k tmpfs "$0"', str(where)],
        capture_output=True,
        timeout=30,
    )
    return probe.returncode == 0


def test_warm_onto_a_full_cache_disk_is_a_miss_and_leaves_no_temporary_file(
    project: Path, tmp_path: Path
):
    """The cache dir is a 256 KiB tmpfs (in a private mount namespace, so no root is
    needed where user namespaces are allowed); the bundle holds 2 x 200 KB of kernels:
    the second one fills the disk (ENOSPC) while it is installed."""
    cache = tmp_path / "cache"
    if not _can_mount_tmpfs(cache):
        pytest.skip("cannot mount a tmpfs in a user namespace here")
    config = load_config(project / "gatekeeper.toml")
    (target,) = expand(config)
    key = target_key(target, config.base_dir).with_deps(
        {"modules": {}, "files": {}, "distributions": {}, "absent": []}
    )
    work = tmp_path / "pack"
    (work / "cache" / "kernels").mkdir(parents=True)
    for name in ("a.so", "b.so"):
        (work / "cache" / "kernels" / name).write_bytes(os.urandom(200_000))
    archive, manifest = bundle.pack(
        work / "cache",
        None,
        work,
        target=target.id,
        key=key.as_dict(),
        compile_info={"seconds": 1.0},
        creator={},
        version="test",
        signing_key=None,
    )
    store = open_store(str(tmp_path / "store"))
    loc = BundleLocation(target.id, key.env_key, key.code_hash)
    assert store.publish_bundle(loc, archive, archive.name, manifest.to_bytes()) == "published"

    out, leftovers = tmp_path / "warm.json", tmp_path / "leftovers.txt"
    script = (
        'mount -t tmpfs -o size=256k tmpfs "$CACHE" || exit 99; "$@" > "$OUT"; rc=$?; '
        'find "$CACHE" -name ".gk-*" > "$LEFT"; exit $rc'
    )
    env = {k: v for k, v in os.environ.items() if k not in _AWS_VARS}
    proc = subprocess.run(
        [
            "unshare",
            "-Urm",
            "sh",
            "-c",
            script,
            "sh",
            sys.executable,
            "-m",
            "gatekeeper",
            "warm",
            "--store",
            str(tmp_path / "store"),
            "--cache-dir",
            str(cache),
            "--json",
        ],
        cwd=project,
        env=env | {"CACHE": str(cache), "OUT": str(out), "LEFT": str(leftovers)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr
    (entry,) = json.loads(out.read_text())["targets"]
    assert entry["status"] == "miss" and "No space left on device" in entry["reason"]
    assert leftovers.read_text() == ""  # no half-installed file in the cache dir
    assert len(proc.stderr.splitlines()) == 1 and "compile cold" in proc.stderr


# -- a full disk while a baseline is published ---------------------------------------------


def _file_size_limit(limit: int):
    def apply() -> None:  # in the child: writes past ``limit`` bytes fail with EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


@pytest.mark.parametrize("too_big", ["outputs", "history"])
def test_disk_full_during_a_baseline_publish(too_big: str, project: Path, tmp_path: Path):
    """``RLIMIT_FSIZE`` makes the kernel refuse to grow any file past 128 KiB (EFBIG, as a
    full disk refuses with ENOSPC): portable, no root, no mount, and it fails exactly the
    one write that is too big. Either the reference outputs are too big (the first
    write), or the baseline document is (after the outputs went in)."""
    outputs = os.urandom(300_000 if too_big == "outputs" else 20_000)
    result = make_result(TARGET, n=6000 if too_big == "history" else 40)
    result.reference = ReferenceOutputs(
        file="references/tiny.pt", size=len(outputs), sha256=hashlib.sha256(outputs).hexdigest()
    )
    results = write_results(tmp_path / "results", result)
    (results.parent / "references").mkdir()
    (results.parent / "references" / "tiny.pt").write_bytes(outputs)
    root = tmp_path / "store"

    proc = gk(
        project,
        "baseline",
        "--results",
        str(results),
        "--ref",
        "main",
        "--store",
        str(root),
        env=dict(os.environ),
        preexec_fn=_file_size_limit(128 * 1024),
    )
    line = one_error_line(proc)
    assert f"cannot write {root}/baselines/{TARGET}/" in line and "File too large" in line
    assert ("/outputs/" if too_big == "outputs" else "/history/") in line

    leftovers = [p for p in root.rglob("*") if p.name.startswith(".tmp-")]
    assert leftovers == []  # the failed write removed its temporary file
    store = open_store(str(root))
    assert baselines.fetch(store, baselines.BaselineKey(TARGET, result.env_key, "main")) is None
    assert not [f for f in maintenance.verify(store, None) if not f.ok]
    # what went in before the failure (the outputs, named by no baseline) is an orphan:
    # reported by verify and removed by prune once past its grace
    later = time.time() + GRACE + 60
    orphans = [f.key for f in maintenance.verify(store, None, now=later) if not f.ok]
    assert len(orphans) == (1 if too_big == "history" else 0)
    assert maintenance.prune(store, keep=5, older_than_days=None, now=later) == orphans
    assert not [f for f in maintenance.verify(store, None, now=later) if not f.ok]


# -- a reader that goes away ------------------------------------------------------------------


def closed_stdout(project: Path, *args: str) -> subprocess.CompletedProcess:
    """Run the CLI with its stdout a pipe whose reader is gone before it writes a byte."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gatekeeper", *args],
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        env={k: v for k, v in os.environ.items() if k not in _AWS_VARS},
    )
    assert proc.stdout is not None
    proc.stdout.close()
    _, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "", err)


@pytest.mark.parametrize("verdict", ["pass", "regressed"])
def test_a_closed_stdout_keeps_the_verdict(verdict: str, project: Path, tmp_path: Path):
    store = open_store(str(tmp_path / "store"))
    base = make_result(TARGET, seed=1)
    assert publish_result(store, base, ref="main", commit="a" * 12) == "published"
    pr = make_result(TARGET, seed=2, compiled_s=1e-3 if verdict == "pass" else 4e-3)
    results = write_results(tmp_path / "pr", pr)
    args = (
        "gate",
        "--results",
        str(results),
        "--base-ref",
        "main",
        "--store",
        str(tmp_path / "store"),
    )
    expected = gk(project, *args, env=dict(os.environ)).returncode
    assert expected == (0 if verdict == "pass" else 1)

    (tmp_path / "pr" / "report.md").unlink()
    proc = closed_stdout(project, *args)
    assert proc.returncode == expected, proc.stderr
    assert "BrokenPipe" not in proc.stderr and "error" not in proc.stderr, proc.stderr
    assert (tmp_path / "pr" / "report.md").is_file()  # the command went on to the end
    ls = closed_stdout(project, "store", "ls", "--store", str(tmp_path / "store"))
    assert (ls.returncode, ls.stderr) == (0, "")
