"""A store shared by a fleet: races, read-only runners, corruption and housekeeping.

Every test runs on both backends (a local directory and S3 on moto's server), through
the layers a fleet uses: :class:`~gatekeeper.store.Store`, :mod:`gatekeeper.baseline`
and :mod:`gatekeeper.housekeeping` (the backend contract itself is in
``test_backend_contract.py``). Bundles are real ``bundle.pack`` archives of small
synthetic cache dirs; results are hand-built :class:`~gatekeeper.results.TargetResult`
documents.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse
from support.helpers import run_threads
from support.stores import (
    ENV,
    TARGET,
    StoreFactory,
    flip_byte,
    keys,
    make_bundle,
    overwrite,
    publish,
)

from gatekeeper import cli
from gatekeeper.errors import AccessDenied, StoreError
from gatekeeper.gate.baseline import publish_result
from gatekeeper.results import (
    CompileStats,
    Graphs,
    Latency,
    LatencySummary,
    Memory,
    Parity,
    ParityCheck,
    ReferenceOutputs,
    TargetResult,
)
from gatekeeper.store import BundleLocation, Store, baselines
from gatekeeper.store import maintenance as housekeeping
from gatekeeper.store.base import Backend
from gatekeeper.store.local import LocalBackend
from gatekeeper.store.s3 import S3Backend

OTHER_ENV = "torch2.13.0+cpu-py3.11-cpu-x86_64-avx2-t2-77e0c2"
DAY = 86400.0
GRACE = housekeeping.ORPHAN_GRACE_S


# -- stores ----------------------------------------------------------------------------


class DenyWrites:
    """Make a backend refuse every write with AccessDenied, as a read-only IAM role does.

    Local: a subclass of the backend whose writes raise. S3: a botocore ``before-call``
    hook answers PutObject, CreateMultipartUpload and DeleteObject with a 403
    ``AccessDenied`` (the reply S3 gives), while reads still reach the server.
    """

    S3_WRITES = ("PutObject", "CreateMultipartUpload", "DeleteObject")

    def __init__(self) -> None:
        self.refused = 0

    def local(self, root: Path) -> Backend:
        deny = self

        class ReadOnlyDir(LocalBackend):
            def put(self, key: str, data: bytes, **kw: Any) -> str:
                deny.refused += 1
                raise AccessDenied(f"denied put of {key}")

            def upload(self, key: str, src: Path, **kw: Any) -> str:
                deny.refused += 1
                raise AccessDenied(f"denied upload of {key}")

            def delete(self, key: str) -> None:
                deny.refused += 1
                raise AccessDenied(f"denied delete of {key}")

        return ReadOnlyDir(root)

    def s3(self, backend: S3Backend) -> S3Backend:
        def refuse(model: Any, **kwargs: Any) -> tuple[AWSResponse, dict]:
            self.refused += 1
            body = {
                "Error": {"Code": "AccessDenied", "Message": "Access Denied"},
                "ResponseMetadata": {"HTTPStatusCode": 403, "RetryAttempts": 0},
            }
            return AWSResponse("https://s3.invalid", 403, {}, None), body

        for op in self.S3_WRITES:
            backend._client.meta.events.register(f"before-call.s3.{op}", refuse)
        return backend


def _summary(xs: list[float]) -> LatencySummary:
    s = sorted(xs)
    mean = sum(s) / len(s)
    return LatencySummary(
        n=len(s),
        mean=mean,
        p50=s[len(s) // 2],
        p95=s[-2],
        p99=s[-1],
        min=s[0],
        max=s[-1],
        stdev=(sum((x - mean) ** 2 for x in s) / len(s)) ** 0.5,
    )


def make_result(
    measured_at: str,
    *,
    code_hash: str = "c0de0000c0de0000",
    env_key: str = ENV,
    target: str = TARGET,
    reference: bytes | None = None,
) -> TargetResult:
    """A realistic, minimal result of ``gatekeeper check`` for the tiny model on CPU."""
    eager = [7.1e-5, 7.3e-5, 6.9e-5, 7.0e-5, 7.4e-5, 7.2e-5]
    compiled = [2.2e-5, 2.3e-5, 2.1e-5, 2.2e-5, 2.4e-5, 2.2e-5]
    ref = [1.36e-2, 1.37e-2, 1.35e-2, 1.36e-2, 1.38e-2, 1.36e-2]
    latency = Latency(
        eager=_summary(eager),
        compiled=_summary(compiled),
        reference=_summary(ref),
        speedup=7.2e-5 / 2.2e-5,
        throughput=1 / 2.2e-5,
        inner_loops=8,
        samples={"eager": eager, "compiled": compiled, "reference": ref},
    )
    return TargetResult(
        target=target,
        model=target.split("/")[0],
        env_key=env_key,
        code_hash=code_hash,
        device="cpu",
        status="ok",
        compile=CompileStats(
            seconds=3.6, warm=True, cache="hit", fxgraph_cache_hit=1, autograd_cache_hit=1
        ),
        graphs=Graphs(count=1, breaks=0),
        latency=latency,
        memory=Memory(source="rss", eager_peak_bytes=0, compiled_peak_bytes=0),
        parity=Parity(
            vs_eager=ParityCheck(
                passed=True, method="allclose", max_abs_err=0.0, rmse=0.0, cosine=1.0
            )
        ),
        reference=None
        if reference is None
        else ReferenceOutputs(
            file="references/tiny__b4__default.pt",
            sha256=hashlib.sha256(reference).hexdigest(),
            size=len(reference),
        ),
        measured_at=measured_at,
    )


def at(second: int) -> str:
    """An ISO timestamp like the one ``check`` writes, ``second`` s after a fixed start."""
    return f"2026-11-22T00:{second // 60:02d}:{second % 60:02d}.{second % 1000:03d}+00:00"


def publish_baseline(
    store: Store,
    tmp: Path,
    second: int,
    *,
    ref: str = "main",
    outputs: bytes | None = None,
    **kw: Any,
) -> str:
    result = make_result(at(second), reference=outputs, **kw)
    ref_file = None
    if outputs is not None:
        ref_file = tmp / f"outputs-{second}.pt"
        ref_file.write_bytes(outputs)
    return publish_result(store, result, ref=ref, commit=f"c{second:011d}", reference_file=ref_file)


def bad(findings: list[housekeeping.Finding]) -> list[housekeeping.Finding]:
    return [f for f in findings if not f.ok]


# -- races -----------------------------------------------------------------------------


def test_sixteen_runners_publish_one_bundle(stores: StoreFactory, tmp_path: Path):
    """Each runner compiled the same target (different bytes); exactly one bundle wins."""
    candidates = [make_bundle(tmp_path, i) for i in range(16)]
    assert len({archive.name for _, archive, _ in candidates}) == 16
    runners = [stores() for _ in range(16)]  # one client per runner

    def publish_one(i: int) -> str:
        loc, archive, manifest = candidates[i]
        return runners[i].publish_bundle(loc, archive, archive.name, manifest)

    statuses = run_threads(16, publish_one)
    assert sorted(statuses) == ["exists"] * 15 + ["published"]
    winner = statuses.index("published")

    store = stores()
    loc = candidates[0][0]
    stored = keys(store, "bundles/")
    archives = sorted(k for k in stored if k.endswith(".tar.zst"))
    assert archives == [loc.key(candidates[winner][1].name)]  # the losers cleaned up
    assert stored == {archives[0], loc.key("manifest.json")}
    assert store.read(loc.key("manifest.json"))[0] == candidates[winner][2]
    findings = housekeeping.verify(store, None)
    assert [(f.key, f.ok) for f in findings] == [(loc.prefix, True)]
    assert not any(r.skipped_writes for r in runners)


def test_eight_concurrent_baseline_updates_lose_nothing(stores: StoreFactory, tmp_path: Path):
    """Eight runners publish main's baseline at once; measured in a shuffled order."""
    seconds = [40, 3, 71, 15, 99, 58, 27, 86]
    runners = [stores() for _ in range(8)]
    results = [make_result(at(s), code_hash=f"{s:016x}") for s in seconds]

    statuses = run_threads(
        8,
        lambda i: publish_result(
            runners[i], results[i], ref="main", commit=f"commit{seconds[i]:02d}"
        ),
    )
    assert set(statuses) <= {"published", "older"} and "published" in statuses
    # the newest measurement always ends up published (never "older")
    assert statuses[seconds.index(max(seconds))] == "published"

    store = stores()
    base = baselines.BaselineKey(TARGET, ENV, "main").prefix
    history = sorted(k for k in keys(store, base + "/") if "/history/" in k)
    assert len(history) == 8
    assert sorted(json.loads(store.read(k)[0])["created_at"] for k in history) == sorted(
        at(s) for s in seconds
    )
    latest = baselines.fetch(store, baselines.BaselineKey(TARGET, ENV, "main"))
    assert latest is not None
    assert latest.created_at == at(max(seconds))
    assert latest.result.code_hash == f"{max(seconds):016x}"
    assert latest.commit == f"commit{max(seconds):02d}"
    assert not bad(housekeeping.verify(store, None))


def test_late_older_baseline_goes_to_history_only(store: Store, tmp_path: Path):
    assert publish_baseline(store, tmp_path, 50) == "published"
    assert publish_baseline(store, tmp_path, 10) == "older"
    assert baselines.fetch(store, baselines.BaselineKey(TARGET, ENV, "main")).created_at == at(50)
    base = baselines.BaselineKey(TARGET, ENV, "main").prefix
    assert len([k for k in keys(store, base) if "/history/" in k]) == 2


# -- read-only -------------------------------------------------------------------------


@pytest.fixture
def store_logs(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> pytest.LogCaptureFixture:
    # cli.main (run in-process by other tests) stops "gatekeeper" from propagating
    monkeypatch.setattr(logging.getLogger("gatekeeper"), "propagate", True)
    caplog.set_level(logging.WARNING, logger="gatekeeper")
    return caplog


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("gatekeeper") and r.levelno >= logging.WARNING
    ]


def test_read_only_store_skips_every_write_and_says_so_once(
    stores: StoreFactory, tmp_path: Path, store_logs: pytest.LogCaptureFixture
):
    writer = stores()
    existing = publish(writer, tmp_path, "existing", code_hash="e" * 16)
    before = keys(writer)

    ro = stores(read_only=True)
    loc, archive, manifest = make_bundle(tmp_path, "new")
    assert ro.publish_bundle(loc, archive, archive.name, manifest) == "skipped"
    assert ro.publish_bundle(loc, archive, archive.name, manifest) == "skipped"
    assert publish_baseline(ro, tmp_path, 5, outputs=b"outputs") == "skipped"
    assert ro.delete(existing.key("manifest.json")) is False
    assert housekeeping.prune(ro, keep=None, older_than_days=0, now=time.time() + DAY) == []

    # every skipped write is counted: 2 bundles, 1 baseline, 1 delete, 2 prune deletes
    assert len(ro.skipped_writes) == 6
    said = [m for m in warnings_of(store_logs) if "read-only" in m]
    assert len(said) == 1 and ro.uri in said[0]
    assert keys(writer) == before  # nothing was written or deleted
    # reads still work
    assert ro.read_manifest(BundleLocation(TARGET, ENV, "e" * 16)) is not None


def test_denied_write_turns_store_read_only(
    stores: StoreFactory, tmp_path: Path, store_logs: pytest.LogCaptureFixture
):
    """An untrusted runner whose credentials may read but not write."""
    writer = stores()
    publish(writer, tmp_path, "existing", code_hash="e" * 16)
    publish_baseline(writer, tmp_path, 1)
    before = keys(writer)

    deny = DenyWrites()
    store = stores.denying(deny)
    loc, archive, manifest = make_bundle(tmp_path, "new")
    assert store.publish_bundle(loc, archive, archive.name, manifest) == "skipped"
    assert store.read_only
    assert deny.refused == 1  # the first refusal flips the store; no write is tried again
    assert publish_baseline(store, tmp_path, 9, outputs=b"outputs") == "skipped"
    assert store.publish_bundle(loc, archive, archive.name, manifest) == "skipped"
    # the bundle "existing" is old and no baseline names it: its two deletes are skipped
    assert housekeeping.prune(store, keep=None, older_than_days=1, now=time.time() + 2 * DAY) == []
    assert deny.refused == 1
    assert len(store.skipped_writes) == 5
    said = warnings_of(store_logs)
    assert len(said) == 1, said
    assert "read-only" in said[0] and "denied" in said[0].lower()
    assert keys(writer) == before
    # reads still work on the denied store
    assert store.read_manifest(BundleLocation(TARGET, ENV, "e" * 16)) is not None
    assert baselines.fetch(store, baselines.BaselineKey(TARGET, ENV, "main")).created_at == at(1)


# -- verify ----------------------------------------------------------------------------


def test_verify_passes_a_healthy_store(store: Store, tmp_path: Path):
    loc = publish(store, tmp_path, 1)
    publish_baseline(store, tmp_path, 1, outputs=b"reference outputs" * 100)
    findings = housekeeping.verify(store, None)
    assert not bad(findings)
    assert loc.prefix in {f.key for f in findings}
    assert any(f.detail == "reference outputs" for f in findings)


def test_verify_catches_a_flipped_byte_in_an_archive(store: Store, tmp_path: Path):
    loc, archive, manifest = make_bundle(tmp_path, 1)
    store.publish_bundle(loc, archive, archive.name, manifest)
    other = publish(store, tmp_path, 2, code_hash="f" * 16)
    overwrite(store, loc.key(archive.name), flip_byte)

    findings = housekeeping.verify(store, None)
    (failed,) = bad(findings)
    assert failed.key == loc.prefix
    assert "sha256" in failed.detail and TARGET in failed.detail
    assert (other.prefix, True) in [(f.key, f.ok) for f in findings]


def test_verify_catches_a_tampered_manifest(store: Store, tmp_path: Path):
    loc = publish(store, tmp_path, 1)
    overwrite(
        store,
        loc.key("manifest.json"),
        lambda b: b.replace(b'"cache/kernel.cpp"', b'"cache/evil.cpp"'),
    )
    (failed,) = bad(housekeeping.verify(store, None))
    assert failed.key == loc.prefix and "manifest" in failed.detail


def test_verify_catches_a_flipped_byte_in_reference_outputs(store: Store, tmp_path: Path):
    outputs = os.urandom(2048)
    publish_baseline(store, tmp_path, 1, outputs=outputs)
    (ref_key,) = [k for k in keys(store, "baselines/") if "/outputs/" in k]
    overwrite(store, ref_key, flip_byte)

    failed = bad(housekeeping.verify(store, None))
    assert failed and {f.key for f in failed} == {ref_key}
    assert all("sha256" in f.detail for f in failed)
    # gate's own fetch refuses it too
    doc = baselines.fetch(store, baselines.BaselineKey(TARGET, ENV, "main"))
    with pytest.raises(StoreError, match="sha256"):
        baselines.fetch_reference(store, doc, tmp_path / "ref.pt")


def test_verify_reports_leftovers_and_broken_baselines(store: Store, tmp_path: Path):
    loc, archive, _ = make_bundle(tmp_path, 1)
    store.write(loc.key(archive.name), archive)  # the archive of a publish that died
    bad_key = baselines.BaselineKey(TARGET, ENV, "main").prefix + "/latest.json"
    store.write(bad_key, b"{not json")
    failed = {f.key: f.detail for f in bad(housekeeping.verify(store, None))}
    assert "leftover" in failed[loc.prefix]
    assert "not a valid baseline" in failed[bad_key]


# -- prune -----------------------------------------------------------------------------


class Fleet:
    """A store as a fleet leaves it, for prune.

    ``tiny`` in ENV: h0, h1, h2 (older, in that order or tied) and h3 (newest, a second
    later). The baseline of main was measured on h1, then on h2: history names both,
    latest names h2. ``tiny`` in OTHER_ENV: g0; target ``wide``: w0 (each alone in its
    group). A leftover archive without a manifest; reference outputs named by the
    baselines; one outputs object that no baseline names.
    """

    def __init__(self, store: Store, tmp: Path, kind: str) -> None:
        self.store = store
        self.h = [publish(store, tmp, f"h{i}", code_hash=f"{i:016x}") for i in range(3)]
        self.g0 = publish(store, tmp, "g0", env_key=OTHER_ENV)
        self.w0 = publish(store, tmp, "w0", target="wide/b1/default")
        self.leftover, archive, _ = make_bundle(tmp, "left", code_hash="1eff0000" * 2)
        store.write(self.leftover.key(archive.name), archive)
        self.leftover_keys = {self.leftover.key(archive.name)}
        publish_baseline(store, tmp, 10, outputs=b"outputs of h1", code_hash=self.h[1].code_hash)
        publish_baseline(store, tmp, 20, outputs=b"outputs of h2", code_hash=self.h[2].code_hash)
        self.unreferenced = (
            baselines.BaselineKey(TARGET, ENV, "main").prefix + "/outputs/00000000deadbeef.pt"
        )
        store.write(self.unreferenced, b"outputs of a publish that died")
        self.referenced = {k for k in keys(store, "baselines/") if "/outputs/" in k} - {
            self.unreferenced
        }
        assert len(self.referenced) == 2
        if kind == "s3":
            time.sleep(1.1)  # S3's LastModified has one-second resolution
        self.h.append(publish(store, tmp, "h3", code_hash=f"{3:016x}"))
        self.all = keys(store)

    def bundle_keys(self, *locs: BundleLocation) -> set[str]:
        return {k for k in self.all if any(k.startswith(loc.prefix + "/") for loc in locs)}


@pytest.fixture
def fleet(stores: StoreFactory, tmp_path: Path) -> Fleet:
    return Fleet(stores(), tmp_path, stores.kind)


def test_prune_keeps_newest_n_per_target_and_env(fleet: Fleet):
    h0, h1, h2, h3 = fleet.h
    gone = housekeeping.prune(fleet.store, keep=1, older_than_days=None)
    # h1 and h2 are beyond the newest 1, but a baseline (history, latest) names them;
    # g0 and w0 are the newest of their own groups; the leftover is within its grace
    assert set(gone) == fleet.bundle_keys(h0)
    assert gone[0].endswith("/manifest.json")  # a reader never finds data-less manifests
    assert keys(fleet.store) == fleet.all - set(gone)
    assert not [
        f for f in bad(housekeeping.verify(fleet.store, None)) if f.key != fleet.leftover.prefix
    ]
    # idempotent
    assert housekeeping.prune(fleet.store, keep=1, older_than_days=None) == []


def test_prune_older_than_never_touches_what_a_baseline_names(fleet: Fleet):
    h0, h1, h2, h3 = fleet.h
    # nothing is 2 days old yet
    assert housekeeping.prune(fleet.store, keep=None, older_than_days=2) == []
    later = time.time() + 3 * DAY
    gone = set(housekeeping.prune(fleet.store, keep=None, older_than_days=2, now=later))
    assert gone == fleet.bundle_keys(h0, h3, fleet.g0, fleet.w0) | fleet.leftover_keys | {
        fleet.unreferenced
    }
    left = keys(fleet.store)
    assert fleet.bundle_keys(h1, h2) <= left and fleet.referenced <= left
    # every baseline document stays, and everything it names still verifies
    assert {k for k in fleet.all if k.startswith("baselines/") and "/outputs/" not in k} <= left
    assert not bad(housekeeping.verify(fleet.store, None))
    # even far in the future, what a baseline names survives
    assert (
        housekeeping.prune(fleet.store, keep=1, older_than_days=0, now=time.time() + 1000 * DAY)
        == []
    )


def test_prune_deletes_leftovers_only_after_the_grace_period(fleet: Fleet):
    """Orphans (an archive without a manifest, outputs no baseline names) go with any
    prune once past the grace, whatever --keep and --older-than say."""
    assert (
        housekeeping.prune(
            fleet.store, keep=10, older_than_days=None, now=time.time() + GRACE - 3600
        )
        == []
    )
    later = time.time() + GRACE + 3600
    orphans = {f.key for f in bad(housekeeping.verify(fleet.store, None, now=later))}
    assert orphans == {fleet.leftover.prefix, fleet.unreferenced}
    gone = housekeeping.prune(fleet.store, keep=10, older_than_days=None, now=later)
    assert set(gone) == fleet.leftover_keys | {fleet.unreferenced}
    assert not bad(housekeeping.verify(fleet.store, None, now=later))


def test_prune_never_deletes_unreferenced_outputs_within_grace(fleet: Fleet):
    """Reference outputs are written before the baseline that names them: a prune in
    between must not take them, even with --older-than 0."""
    gone = housekeeping.prune(fleet.store, keep=None, older_than_days=0)
    assert fleet.unreferenced not in gone
    assert not (set(gone) & fleet.referenced)
    gone = housekeeping.prune(
        fleet.store, keep=None, older_than_days=0, now=time.time() + GRACE + 3600
    )
    assert fleet.unreferenced in gone


def test_prune_racing_a_baseline_publish_keeps_its_outputs(stores: StoreFactory, tmp_path: Path):
    """A cron job prunes (--older-than 0) just as a runner publishes a baseline."""
    store = stores()
    pruned: list[str] = []
    write = store.write

    def write_then_prune(key: str, data: Any, **kw: Any) -> Any:
        etag = write(key, data, **kw)
        if "/outputs/" in key:  # the outputs are up; history and latest not yet
            pruned.extend(housekeeping.prune(stores(), keep=None, older_than_days=0))
        return etag

    store.write = write_then_prune  # type: ignore[method-assign]
    assert publish_baseline(store, tmp_path, 1, outputs=b"outputs") == "published"
    assert pruned == []
    assert not bad(housekeeping.verify(store, None))


def test_prune_dry_run_deletes_nothing(fleet: Fleet):
    later = time.time() + 3 * DAY
    would = housekeeping.prune(fleet.store, keep=1, older_than_days=2, now=later, dry_run=True)
    assert would and keys(fleet.store) == fleet.all
    gone = housekeeping.prune(fleet.store, keep=1, older_than_days=2, now=later)
    assert sorted(gone) == sorted(would)
    assert keys(fleet.store) == fleet.all - set(would)


# -- the CLI over both backends ----------------------------------------------------------


def gk_cli(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, dict]:
    code = cli.main([*args, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_store_commands(
    fleet: Fleet,
    stores: StoreFactory,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
):
    monkeypatch.chdir(tmp_path)  # no config file here: --store alone is enough
    logger = logging.getLogger("gatekeeper")  # cli.main sets up logging: undo it afterwards
    for name in ("handlers", "propagate", "level"):
        value = getattr(logger, name)
        monkeypatch.setattr(logger, name, list(value) if name == "handlers" else value)
    uri = str(stores.root)
    code, doc = gk_cli(capsys, "store", "ls", "--store", uri)
    assert code == 0
    rows = {(r["target"], r["env_key"], r["code_hash"]): r for r in doc["bundles"]}
    assert len(rows) == 7
    assert rows[(TARGET, ENV, fleet.leftover.code_hash)]["complete"] is False
    assert all(r["bytes"] > 0 for r in rows.values())

    code, doc = gk_cli(capsys, "store", "verify", "--store", uri)
    assert code == 1 and doc["ok"] is False
    assert [o["key"] for o in doc["objects"] if not o["ok"]] == [fleet.leftover.prefix]

    code, doc = gk_cli(capsys, "store", "prune", "--keep", "1", "--dry-run", "--store", uri)
    assert code == 0 and doc["dry_run"] is True
    assert set(doc["deleted"]) == fleet.bundle_keys(fleet.h[0])
    assert keys(fleet.store) == fleet.all

    code, doc = gk_cli(capsys, "store", "prune", "--keep", "1", "--read-only", "--store", uri)
    assert code == 0 and doc["deleted"] == [] and doc["skipped_writes"] == 2
    assert keys(fleet.store) == fleet.all

    code, doc = gk_cli(capsys, "store", "prune", "--keep", "1", "--store", uri)
    assert code == 0 and set(doc["deleted"]) == fleet.bundle_keys(fleet.h[0])
    assert doc["skipped_writes"] == 0
    code, doc = gk_cli(capsys, "store", "ls", "--store", uri)
    assert len(doc["bundles"]) == 6

    assert cli.main(["store", "prune", "--store", uri]) == 2  # neither --keep nor --older-than
