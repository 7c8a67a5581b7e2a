"""Untrusted and bad input, through the real CLI on real files (see docs/hardening.md):

* shard results come from pull requests' jobs: a path they name never reaches a file
  outside their folder, and merged copies are named from the target id and checked
  against their sha256;
* every bad input is one line naming the file or flag, exit 2, never "internal error";
* ``require_signature``: a missing or empty signing key is an error, not an unchecked
  load; signed bundles read without a key are said.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
from support.factories import make_result
from support.github_server import FakeGitHub
from support.helpers import TINY_CONFIG, gk, write_project
from support.stores import make_bundle

from gatekeeper import bundle
from gatekeeper.results import ReferenceOutputs, Results, write_results
from gatekeeper.store import Store
from gatekeeper.store.local import LocalBackend

TARGETS = ["tiny/b4/default", "tiny/b8/default"]
NO_KEY = {"GATEKEEPER_SIGNING_KEY": "", "GATEKEEPER_REQUIRE_SIGNATURE": ""}


def _one_line_error(proc, *needles: str) -> str:
    """Exit 2, one line on stderr naming every needle, never an internal error."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("gatekeeper: error:")]
    assert len(lines) == 1, proc.stderr
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def _shard(folder: Path, index: int, target: str, *, ref_file: str, data: bytes) -> Path:
    """A shard's results folder: results.json naming its reference outputs ``ref_file``."""
    from gatekeeper.hashing import sha256_bytes

    result = make_result(target, mode="stored")
    result.reference = ReferenceOutputs(file=ref_file, sha256=sha256_bytes(data), size=len(data))
    doc = Results(
        created_at="2025-01-01T00:00:00Z",
        gatekeeper_version="test",
        creator={},
        base_ref="main",
        shard=f"{index}/2",
        targets=[result],
    )
    write_results(doc, folder)
    return folder / "results.json"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return write_project(tmp_path / "project")


# -- finding 1: paths from results ----------------------------------------------------


@pytest.mark.parametrize("name", ["../../secret.pt", "/tmp/secret.pt", "refs/../../secret.pt"])
def test_merge_never_follows_a_path_out_of_the_shard(
    project: Path, tmp_path: Path, name: str
) -> None:
    secret = tmp_path / "secret.pt"
    secret.write_bytes(b"the runner's secret")
    first = _shard(tmp_path / "shards" / "a", 1, TARGETS[0], ref_file=name, data=b"x")
    Path(first.parent, "references").mkdir()
    second = _shard(tmp_path / "shards" / "b", 2, TARGETS[1], ref_file="r.pt", data=b"y")
    (second.parent / "r.pt").write_bytes(b"y")
    out = tmp_path / "out"

    proc = gk("merge", str(first), str(second), "--out", str(out), cwd=project)
    _one_line_error(proc, str(first), "targets[0].reference.file", repr(name))
    # nothing read from outside the shard, nothing written outside --out
    assert not (out / "results.json").exists()
    assert not [p for p in tmp_path.rglob("secret.pt") if p != secret]


def test_merge_names_copies_by_target_and_checks_their_sha256(
    project: Path, tmp_path: Path
) -> None:
    first = _shard(tmp_path / "a", 1, TARGETS[0], ref_file="odd/place.pt", data=b"outputs a")
    (first.parent / "odd").mkdir()
    (first.parent / "odd" / "place.pt").write_bytes(b"outputs a")
    second = _shard(tmp_path / "b", 2, TARGETS[1], ref_file="r.pt", data=b"outputs b")
    (second.parent / "r.pt").write_bytes(b"tampered!")
    out = tmp_path / "out"

    proc = gk("merge", str(first), str(second), "--out", str(out), cwd=project)
    _one_line_error(proc, str(second), "targets[0].reference.file", "sha256")

    (second.parent / "r.pt").write_bytes(b"outputs b")
    proc = gk("merge", str(first), str(second), "--out", str(out), "--json", cwd=project)
    assert proc.returncode == 0, proc.stderr
    merged = json.loads((out / "results.json").read_text())
    files = {t["target"]: t["reference"]["file"] for t in merged["targets"]}
    assert files == {t: f"references/{t.replace('/', '__')}.pt" for t in TARGETS}
    assert (out / files[TARGETS[0]]).read_bytes() == b"outputs a"


def test_merge_refuses_a_trace_path_out_of_the_shard(project: Path, tmp_path: Path) -> None:
    first = _shard(tmp_path / "a", 1, TARGETS[0], ref_file="r.pt", data=b"a")
    (first.parent / "r.pt").write_bytes(b"a")
    doc = json.loads(first.read_text())
    doc["targets"][0]["profile"] = {"calls": 1, "ops": [], "trace": "../../../etc/hostname"}
    first.write_text(json.dumps(doc))
    second = _shard(tmp_path / "b", 2, TARGETS[1], ref_file="r.pt", data=b"b")
    (second.parent / "r.pt").write_bytes(b"b")

    proc = gk("merge", str(first), str(second), "--out", str(tmp_path / "out"), cwd=project)
    _one_line_error(proc, "targets[0].profile.trace", "etc/hostname")


def test_baseline_never_publishes_a_file_from_outside_the_results_folder(
    project: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.pt"
    secret.write_bytes(b"the runner's secret")
    results = _shard(
        tmp_path / "pr", 1, TARGETS[0], ref_file="../secret.pt", data=secret.read_bytes()
    )
    doc = json.loads(results.read_text())
    doc["shard"] = None
    results.write_text(json.dumps(doc))

    proc = gk("baseline", "--results", str(results), "--ref", "main", cwd=project)
    _one_line_error(proc, "reference.file", "../secret.pt")
    store = project / "store"
    assert not store.exists() or not [p for p in store.rglob("*.pt")]


# -- finding 12: bad input is one line naming the file or flag, exit 2 ------------------


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("gatekeeper.toml", 'tool = "x"\n'),
        ("pyproject.toml", 'tool = "x"\n'),
        ("pyproject.toml", '[tool]\ngatekeeper = "x"\n'),
        ("pyproject.toml", "tool = 3\n[project]\nname = 'p'\n"),
    ],
)
def test_a_tool_key_that_is_not_a_table(tmp_path: Path, name: str, text: str) -> None:
    (tmp_path / name).write_text(text)
    proc = gk("compile", "--config", name, cwd=tmp_path)
    _one_line_error(proc, name)
    proc = gk("compile", cwd=tmp_path)  # found, not named
    assert proc.returncode == 2 and "internal error" not in proc.stderr, proc.stderr


def test_flags_given_a_folder_or_an_unwritable_path(project: Path, tmp_path: Path) -> None:
    results = _shard(tmp_path / "r", 1, TARGETS[0], ref_file="r.pt", data=b"a")
    folder = results.parent
    a_file = tmp_path / "plain-file"
    a_file.write_text("not a folder")
    under_a_file = a_file / "report.md"

    def error(*args: str, needles: tuple[str, ...]) -> None:
        _one_line_error(gk(*args, cwd=project, env=NO_KEY), *needles)

    error("gate", "--results", str(folder), needles=(str(folder), "directory"))
    error("baseline", "--results", str(folder), needles=(str(folder), "directory"))
    error("gate", "--results", str(results), "--report", str(under_a_file), needles=("--report",))
    error("gate", "--results", str(results), "--report", str(folder), needles=("--report",))
    error("merge", str(results), "--out", str(a_file), needles=("--out", str(a_file)))
    error("merge", str(results), "--report", str(under_a_file), needles=("--report",))
    error("check", "--out", str(a_file), needles=("--out",))
    error("run", "--out", str(under_a_file), needles=("--out",))
    error("run", "--report", str(folder), needles=("--report",))
    error("dashboard", "--out", str(a_file), needles=("--out",))
    error("warm", "--cache-dir", str(a_file), needles=("--cache-dir",))
    token = {"GITHUB_TOKEN": "t"}
    proc = gk(
        "comment", "--repo", "o/n", "--pr", "1", "--report", str(folder), cwd=project, env=token
    )
    _one_line_error(proc, "--report", str(folder))


def test_an_oversized_results_file_is_refused_unread(project: Path, tmp_path: Path) -> None:
    big = tmp_path / "results.json"
    with open(big, "wb") as f:  # sparse: no disk, no time
        f.truncate((256 << 20) + 1)
    proc = gk("gate", "--results", str(big), cwd=project)
    _one_line_error(proc, str(big), "refused unread")


# -- finding 8: require_signature --------------------------------------------------------


def test_a_required_signature_without_a_key_is_an_error(project: Path) -> None:
    config = project / "gatekeeper.toml"
    required = TINY_CONFIG.replace(
        'precompile = "off"', 'precompile = "off"\nrequire_signature = true'
    )
    config.write_text(textwrap.dedent(required))
    for verb in (["warm"], ["compile"], ["check"], ["run"], ["store", "verify"]):
        for env in (NO_KEY, {**NO_KEY, "GATEKEEPER_SIGNING_KEY": "  "}):
            proc = gk(*verb, cwd=project, env=env)
            _one_line_error(proc, "GATEKEEPER_SIGNING_KEY")


def test_the_require_signature_variable_is_the_same_switch(project: Path) -> None:
    env = {**NO_KEY, "GATEKEEPER_REQUIRE_SIGNATURE": "true"}
    proc = gk("warm", "--cache-dir", "cache", cwd=project, env=env)
    _one_line_error(proc, "GATEKEEPER_SIGNING_KEY")
    assert not [p for p in (project / "cache").rglob("*") if p.is_file()]


def test_warm_start_with_a_required_signature_and_no_key_loads_nothing(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gatekeeper

    monkeypatch.setenv("GATEKEEPER_SIGNING_KEY", "")
    monkeypatch.setenv("GATEKEEPER_REQUIRE_SIGNATURE", "1")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "ignored"))
    results = gatekeeper.warm_start(project / "gatekeeper.toml", cache_dir=tmp_path / "cache")
    assert [r.status for r in results] == ["miss"]
    assert "GATEKEEPER_SIGNING_KEY" in (results[0].reason or "")


def test_signed_bundles_read_without_a_key_are_said(tmp_path: Path) -> None:
    store = Store(LocalBackend(tmp_path / "store"))
    loc, archive, manifest = make_bundle(tmp_path, "signed")
    signed = bundle.sign(
        bundle.verify_manifest(manifest, target=loc.target_id, signing_key=None), b"k"
    )
    store.publish_bundle(loc, archive, archive.name, signed.to_bytes())
    env = {**os.environ, **NO_KEY}
    proc = gk("store", "verify", "--store", str(tmp_path / "store"), cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    warnings = [ln for ln in proc.stderr.splitlines() if "signatures are not checked" in ln]
    assert len(warnings) == 1 and "GATEKEEPER_SIGNING_KEY" in warnings[0]


def test_numbers_that_mean_nothing_are_refused_before_any_work(
    tmp_path: Path, github_api: FakeGitHub
) -> None:
    """`store prune --older-than nan` deleted nothing and said it had pruned; `comment
    --pr -5` (or a --repo that is a path) reached the GitHub API. Each is one line, exit
    2, and nothing is deleted or sent."""
    store = Store(LocalBackend(tmp_path / "store"))
    loc, archive, manifest = make_bundle(tmp_path, "old")
    store.publish_bundle(loc, archive, archive.name, manifest)
    before = sorted(p.name for p in (tmp_path / "store").rglob("*"))
    for days in ("nan", "inf"):
        proc = gk("store", "prune", "--older-than", days, "--store", str(store.uri), cwd=tmp_path)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        expected = f"gatekeeper: error: --older-than must be a number of days, not {days}"
        assert proc.stderr.strip() == expected
    assert sorted(p.name for p in (tmp_path / "store").rglob("*")) == before

    (tmp_path / "report.md").write_text("# report\n")
    github_api.add_actions_token("ghs_comment_token", write=True)
    env = {"GITHUB_TOKEN": "ghs_comment_token", "GITHUB_API_URL": github_api.url}
    for flags, message in (
        (("--pr", "-5"), "--pr must be a pull request number (1 or more), not -5"),
        (("--pr", "0"), "--pr must be a pull request number (1 or more), not 0"),
        (("--pr", "7", "--repo", "acme/models/../../x"), "--repo must be OWNER/NAME"),
    ):
        repo = () if "--repo" in flags else ("--repo", "acme/models")
        proc = gk("comment", "--report", "report.md", *repo, *flags, cwd=tmp_path, env=env)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        (line,) = proc.stderr.splitlines()
        assert line.startswith(f"gatekeeper: error: {message}"), line
    assert github_api.requests == []
