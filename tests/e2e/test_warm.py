"""The spine end to end, with real compiles: compile once, then warm-start new processes.

One tiny model is compiled once per session (about 15 s on 2 CPU cores); every test
reuses that store through a copy, so tests never disturb each other.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.helpers import gk, gk_json, shared_objects, write_project

from gatekeeper import bundle

TARGET = "tiny/b4/default"


@pytest.fixture(scope="session")
def compiled(tmp_path_factory) -> Path:
    """A project whose store holds the tiny target's bundle; compiled once."""
    root = write_project(tmp_path_factory.mktemp("project"))
    out = gk_json("compile", cwd=root)
    assert [t["status"] for t in out["targets"]] == ["published"]
    return root


@pytest.fixture
def project(compiled: Path, tmp_path: Path) -> Path:
    """A private copy of the compiled project (store included)."""
    dest = tmp_path / "project"
    shutil.copytree(compiled, dest)
    return dest


def manifest_path(project: Path) -> Path:
    (path,) = (project / "store" / "bundles").rglob("manifest.json")
    return path


def test_compile_is_idempotent(project: Path):
    out = gk_json("compile", cwd=project)
    assert out["targets"][0]["status"] == "exists"
    assert out["skipped_writes"] == 0


def test_warm_start_in_new_process_hits_cache_and_compiles_no_kernel(project: Path, tmp_path: Path):
    cache = tmp_path / "fresh-cache"
    out = gk_json("warm", "--cache-dir", str(cache), cwd=project)
    (entry,) = out["targets"]
    assert entry["status"] == "hit" and entry["files"] > 0
    before = shared_objects(cache)
    assert before

    # the deploy: a new process on that cache dir runs the first compiled call
    probe = gk_json("warm", "--cache-dir", str(cache), "--probe", cwd=project)
    (entry,) = probe["targets"]
    assert entry["fxgraph_cache_hit"] >= 1
    assert entry["fxgraph_cache_miss"] == 0
    assert shared_objects(cache) == before  # no kernel was compiled (or rebuilt)


def test_cold_compile_does_compile_kernels(project: Path, tmp_path: Path):
    """The check above can fail: without a warm start the same probe compiles kernels."""
    cold = tmp_path / "cold"
    probe = gk_json(
        "warm",
        "--store",
        str(tmp_path / "empty-store"),
        "--cache-dir",
        str(cold),
        "--probe",
        cwd=project,
    )
    (entry,) = probe["targets"]
    assert entry["status"] == "miss"
    assert entry["fxgraph_cache_miss"] >= 1
    assert shared_objects(cold) != {}


def test_lower_cpu_capability_changes_key_and_misses(project: Path, tmp_path: Path):
    default = gk_json("key", cwd=project)["targets"][0]
    lower = "avx2" if default["env"]["cpu_capability"] == "avx512" else "default"
    env = {"ATEN_CPU_CAPABILITY": lower}
    other = gk_json("key", cwd=project, env=env)["targets"][0]
    assert other["env"]["cpu_capability"] == lower
    assert other["env_key"] != default["env_key"]
    assert other["code_hash"] == default["code_hash"]
    out = gk_json("warm", "--cache-dir", str(tmp_path / "c"), cwd=project, env=env)
    assert out["targets"][0]["status"] == "miss"
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").rglob("*.so"))


def test_flipped_byte_is_refused_and_nothing_extracted(project: Path, tmp_path: Path):
    (archive,) = (project / "store" / "bundles").rglob("bundle-*.tar.zst")
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0x01
    archive.write_bytes(bytes(data))
    cache = tmp_path / "cache"
    proc = gk("warm", "--cache-dir", str(cache), "--json", cwd=project)
    assert proc.returncode == 0
    (entry,) = json.loads(proc.stdout)["targets"]
    assert entry["status"] == "miss"
    assert TARGET in entry["reason"] and "sha256" in entry["reason"]
    assert "Traceback" not in proc.stderr
    warnings = [ln for ln in proc.stderr.splitlines() if "refused" in ln]
    assert len(warnings) == 1 and TARGET in warnings[0]
    assert not any(p.is_file() for p in cache.rglob("*") if "megacache" not in p.name)
    strict = gk("warm", "--cache-dir", str(cache), "--strict", cwd=project)
    assert strict.returncode == 1


def test_signature_is_required_and_checked(project: Path, tmp_path: Path):
    path = manifest_path(project)
    # unsigned bundle, but this deploy requires signatures
    out = gk_json(
        "warm",
        "--cache-dir",
        str(tmp_path / "a"),
        cwd=project,
        env={"GATEKEEPER_SIGNING_KEY": "deploy-key"},
    )
    assert out["targets"][0]["status"] == "miss"
    assert "unsigned" in out["targets"][0]["reason"]
    # signed with another key
    manifest = bundle.Manifest.model_validate_json(path.read_bytes())
    forged = manifest.model_copy(
        update={"signature": bundle._sign(manifest.signed_bytes(), b"attacker-key")}
    )
    path.write_bytes(forged.to_bytes())
    out = gk_json(
        "warm",
        "--cache-dir",
        str(tmp_path / "b"),
        cwd=project,
        env={"GATEKEEPER_SIGNING_KEY": "deploy-key"},
    )
    assert "signature does not verify" in out["targets"][0]["reason"]
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").rglob("*.so"))
    # signed with the right key: accepted
    good = manifest.model_copy(
        update={"signature": bundle._sign(manifest.signed_bytes(), b"deploy-key")}
    )
    path.write_bytes(good.to_bytes())
    out = gk_json(
        "warm",
        "--cache-dir",
        str(tmp_path / "c"),
        cwd=project,
        env={"GATEKEEPER_SIGNING_KEY": "deploy-key"},
    )
    assert out["targets"][0]["status"] == "hit"


def test_changed_code_finds_partial_bundle(project: Path, tmp_path: Path):
    model = project / "tinymodel.py"
    model.write_text(model.read_text() + "\n# a comment changes the code hash\n")
    out = gk_json("warm", "--cache-dir", str(tmp_path / "c"), cwd=project)
    (entry,) = out["targets"]
    assert entry["status"] == "partial"
    # no stored bundle is this code's, so its code hash is not known here: say why
    assert "code_hash" not in entry and entry["bundle_code_hash"]
    assert "module tinymodel changed" in entry["reason"]


def test_unreachable_store_is_a_miss_not_a_crash(project: Path, tmp_path: Path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    proc = gk(
        "warm",
        "--store",
        str(blocker / "store"),
        "--cache-dir",
        str(tmp_path / "c"),
        "--json",
        cwd=project,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["targets"][0]["status"] == "miss"
    assert "Traceback" not in proc.stderr


def test_python_api_warm_start(project: Path, tmp_path: Path):
    import subprocess
    import sys

    code = (
        "import gatekeeper, json; r = gatekeeper.warm_start('gatekeeper.toml', "
        f"cache_dir={str(tmp_path / 'c')!r}); print(json.dumps([x.status for x in r]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=project, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == ["hit"]


def test_factory_that_raises_exits_2_naming_it(tmp_path: Path):
    root = write_project(tmp_path, model="def make():\n    raise ValueError('no weights')\n")
    proc = gk("compile", cwd=root)
    assert proc.returncode == 2
    assert "tinymodel:make" in proc.stderr and "no weights" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_a_miss_names_the_nearest_bundle_and_every_fact_that_differs(project: Path, tmp_path: Path):
    """The store holds the target's bundle compiled under another thread count and
    compile environment: warm's miss (and key --explain) names that bundle and exactly
    the facts that differ, and --json carries them."""
    default = gk_json("key", cwd=project)["targets"][0]
    threads = default["env"]["threads"]  # torch takes no more threads than cores: fewer
    assert threads > 1, "a machine of one core cannot run this test"
    env = {"OMP_NUM_THREADS": str(threads - 1), "TORCHINDUCTOR_MAX_AUTOTUNE_GEMM": "0"}
    (entry,) = gk_json("warm", "--cache-dir", str(tmp_path / "c"), cwd=project, env=env)["targets"]
    assert entry["status"] == "miss", entry
    near = entry["nearest"]
    assert near["env_key"] == default["env_key"] and near["code_hash"] == default["code_hash"]
    differs = {d["fact"]: (d["bundle"], d["here"]) for d in near["differs"]}
    assert differs == {
        "threads": (threads, threads - 1),
        "compile_env.TORCHINDUCTOR_MAX_AUTOTUNE_GEMM": (None, "0"),
    }, near
    assert f"threads {threads} (here {threads - 1})" in entry["reason"], entry["reason"]

    # the code changed too: key --explain names the module beside the env facts
    (project / "tinymodel.py").write_text((project / "tinymodel.py").read_text() + "\n# edit\n")
    (explained,) = gk_json("key", "--explain", cwd=project, env=env)["targets"]
    found = explained["store"]
    assert found["status"] == "miss", found
    facts = {d["fact"] for d in found["nearest"]["differs"]}
    assert facts == {"threads", "compile_env.TORCHINDUCTOR_MAX_AUTOTUNE_GEMM", "module tinymodel"}
    text = gk("key", "--explain", cwd=project, env=env, check=True).stdout
    assert "differs    module tinymodel" in text and "differs    threads" in text, text
