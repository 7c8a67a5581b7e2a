"""A hit is a hit (issue 16, item 4), with real compiles.

The key used to hash only the .py files of the factory's own top-level package. These
tests change, one at a time, what the model is really built from — the factory named,
a sibling module outside that package, a data file it reads, an installed distribution
it imports, an environment variable that configures inductor — and require ``compile``
to compile anew and the new bundle to warm with FX graph hits. Then: a manifest moved
to another key is refused, ``compile --force`` replaces a bundle atomically under a
concurrent reader, a bundle written before dependencies were recorded warms as
``partial``, a key hit whose FX graphs all miss is ``stale``, and paired mode builds
the base from the base checkout's files for a dotted factory.

The project is compiled once per session; each test works on a private copy.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.helpers import gk, gk_json

from gatekeeper import bundle
from gatekeeper.store import open_store
from gatekeeper.store.maintenance import ORPHAN_GRACE_S, prune

TARGET = "net/b4/default"

NET = textwrap.dedent("""
    import json
    from pathlib import Path

    import torch
    from torch import nn

    import gkdep
    import helpers

    def _hidden():
        return json.loads((Path(__file__).parent.parent / "dims.json").read_text())["hidden"]

    class Net(nn.Module):
        def __init__(self, hidden):
            super().__init__()
            self.fc1 = nn.Linear(16, hidden)
            self.fc2 = nn.Linear(hidden, 4)

        def forward(self, x):
            return gkdep.post(self.fc2(helpers.act(self.fc1(x))))

    def make():
        return Net(_hidden())

    def make_other():
        return Net(_hidden() + 8)
""")

HELPERS = "import torch\n\ndef act(h):\n    return torch.relu(h)\n"
HELPERS_CHANGED = "import torch\n\ndef act(h):\n    return torch.tanh(h)\n"

CONFIG = textwrap.dedent("""
    [tool.gatekeeper]
    store = "store"
    precompile = "off"  # packages: tests/e2e/test_precompile.py

    [[tool.gatekeeper.models]]
    name = "net"
    factory = "models.net:make"
    inputs = [{ shape = ["batch", 16] }]
    shapes = [{ batch = 4 }]
""")


def write_dist(site: Path, version: str, body: str) -> None:
    """A throwaway installed distribution ``gkdep`` (a module and its dist-info)."""
    for old in site.glob("gkdep-*.dist-info"):
        shutil.rmtree(old)
    (site / "gkdep").mkdir(parents=True, exist_ok=True)
    (site / "gkdep" / "__init__.py").write_text(body)
    info = site / f"gkdep-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: gkdep\nVersion: {version}\n")
    (info / "RECORD").write_text(
        f"gkdep/__init__.py,,\ngkdep-{version}.dist-info/METADATA,,\n"
        f"gkdep-{version}.dist-info/RECORD,,\n"
    )


def write_net_project(root: Path, site: Path) -> None:
    (root / "models").mkdir(parents=True)
    (root / "models" / "__init__.py").write_text("")
    (root / "models" / "net.py").write_text(NET)
    (root / "helpers.py").write_text(HELPERS)
    (root / "dims.json").write_text('{"hidden": 32}\n')
    (root / "gatekeeper.toml").write_text(CONFIG)
    write_dist(site, "1.0", "def post(y):\n    return y * 2.0\n")


@dataclass
class Project:
    root: Path
    site: Path  # on PYTHONPATH, outside the project: an installed distribution lives here
    env: dict

    def json(self, *args: str, env: dict | None = None, expect: int = 0) -> dict:
        return gk_json(*args, cwd=self.root, env={**self.env, **(env or {})}, expect=expect)

    def run(self, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return gk(*args, cwd=self.root, env={**self.env, **(env or {})})

    def manifests(self) -> list[Path]:
        return sorted((self.root / "store" / "bundles").rglob("manifest.json"))

    def probe(self, cache: Path, env: dict | None = None) -> dict:
        (entry,) = self.json("warm", "--cache-dir", str(cache), "--probe", env=env)["targets"]
        return entry


@pytest.fixture(scope="session")
def compiled_net(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("net")
    root, site = tmp / "project", tmp / "site"
    write_net_project(root, site)
    out = gk_json("compile", cwd=root, env={"PYTHONPATH": str(site)})
    (entry,) = out["targets"]
    assert entry["status"] == "published"
    return {
        "root": root,
        "site": site,
        "code_hash": entry["code_hash"],
        "env_key": entry["env_key"],
    }


@pytest.fixture
def project(compiled_net: dict, tmp_path: Path) -> Project:
    """A private copy of the compiled project and its site dir, at new paths."""
    root, site = tmp_path / "project", tmp_path / "site"
    shutil.copytree(compiled_net["root"], root)
    shutil.copytree(compiled_net["site"], site)
    return Project(root, site, {"PYTHONPATH": str(site)})


def keyed_anew(
    project: Project, compiled_net: dict, tmp_path: Path, env: dict | None = None
) -> dict:
    """What the model is built from changed: its key changes before any compile (``key``
    builds the model in a worker, compiles nothing), and ``warm`` no longer calls the
    bundle of the old code a hit. One test (b) also compiles anew and warms from the new
    key; ``key`` reports the key ``compile`` uses (checked there and in the unchanged
    case), so the other changes need no compile of their own."""
    (key,) = project.json("key", env=env)["targets"]
    assert (key["code_hash"], key["env_key"]) != (
        compiled_net["code_hash"],
        compiled_net["env_key"],
    ), key
    (warmed,) = project.json("warm", "--cache-dir", str(tmp_path / "old"), env=env)["targets"]
    assert warmed["status"] in ("partial", "miss"), warmed
    return key


def compiles_anew_and_warms(project: Project, tmp_path: Path, env: dict | None = None) -> dict:
    """``compile`` must compile (not say ``exists``), and the new bundle must warm a new
    process with FX graph hits: the key it was found under really is this code's."""
    (entry,) = project.json("compile", env=env)["targets"]
    assert entry["status"] == "published", entry
    assert len(project.manifests()) == 2
    probe = project.probe(tmp_path / "cache", env=env)
    assert probe["status"] == "hit", probe
    assert probe["bundle_code_hash"] == entry["code_hash"]
    assert probe["fxgraph_cache_hit"] >= 1 and probe["fxgraph_cache_miss"] == 0, probe
    return entry


# -- (a)-(e): what the model is built from changes; the key must change too -------------
def test_unchanged_project_in_another_folder_hits(
    project: Project, tmp_path: Path, compiled_net: dict
):
    (entry,) = project.json("compile")["targets"]
    assert entry["status"] == "exists" and entry["code_hash"] == compiled_net["code_hash"]
    # `key` knows the code hash before any compile of this checkout: a worker builds it
    (key,) = project.json("key")["targets"]
    assert key["code_hash"] == compiled_net["code_hash"]


def test_a_another_factory_of_the_same_module(project: Project, tmp_path: Path, compiled_net: dict):
    cfg = project.root / "gatekeeper.toml"
    cfg.write_text(cfg.read_text().replace("models.net:make", "models.net:make_other"))
    keyed_anew(project, compiled_net, tmp_path)


def test_b_sibling_module_outside_the_package(project: Project, tmp_path: Path, compiled_net: dict):
    (project.root / "helpers.py").write_text(HELPERS_CHANGED)
    key = keyed_anew(project, compiled_net, tmp_path)
    entry = compiles_anew_and_warms(project, tmp_path)
    assert entry["code_hash"] == key["code_hash"]  # key says what compile will use


def test_c_data_file_the_factory_reads(project: Project, tmp_path: Path, compiled_net: dict):
    (project.root / "dims.json").write_text('{"hidden": 48}\n')
    keyed_anew(project, compiled_net, tmp_path)


def test_d_installed_distribution_upgraded(project: Project, tmp_path: Path, compiled_net: dict):
    write_dist(project.site, "1.1", "def post(y):\n    return y * 3.0 + 1.0\n")
    keyed_anew(project, compiled_net, tmp_path)


def test_e_environment_variable_that_configures_inductor(
    project: Project, tmp_path: Path, compiled_net: dict
):
    key = keyed_anew(project, compiled_net, tmp_path, env={"TORCHINDUCTOR_SIZE_ASSERTS": "0"})
    assert key["env_key"] != compiled_net["env_key"]


# -- a manifest is only served from the key it names ------------------------------------
def test_manifest_moved_to_another_key_is_refused(project: Project, tmp_path: Path):
    (manifest,) = project.manifests()
    folder = manifest.parent
    folder.rename(folder.with_name("0123456789abcdef"))
    proc = project.run("warm", "--cache-dir", str(tmp_path / "c"), "--json")
    assert proc.returncode == 0, proc.stderr
    (entry,) = json.loads(proc.stdout)["targets"]
    assert entry["status"] == "miss", entry
    warnings = [ln for ln in proc.stderr.splitlines() if "0123456789abcdef" in ln]
    assert len(warnings) == 1 and "refused" in warnings[0], proc.stderr
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").rglob("*.so"))


def test_bundle_without_recorded_dependencies_warms_as_partial(project: Project, tmp_path: Path):
    """A store written before dependencies were recorded keeps warming, never as hit."""
    (path,) = project.manifests()
    manifest = bundle.Manifest.model_validate_json(path.read_bytes())
    key = {k: v for k, v in manifest.key.items() if k != "deps"}
    key["files"] = {"models/net.py": "0" * 64}  # what the old key recorded
    path.write_bytes(manifest.model_copy(update={"key": key}).to_bytes())
    (entry,) = project.json("warm", "--cache-dir", str(tmp_path / "cache"))["targets"]
    assert entry["status"] == "partial" and entry["files"] > 0, entry
    assert "no dependencies" in entry["reason"]


# -- stale: a key hit whose FX graphs all miss --------------------------------------------
def test_key_hit_whose_graphs_all_miss_is_stale(project: Project, tmp_path: Path):
    (path,) = project.manifests()
    manifest = bundle.Manifest.model_validate_json(path.read_bytes())
    empty = tmp_path / "empty-cache"
    empty.mkdir()
    archive, hollow = bundle.pack(
        empty,
        None,
        tmp_path,
        target=manifest.target,
        key=manifest.key,
        compile_info=manifest.compile,
        creator=manifest.creator,
        version=manifest.gatekeeper_version,
        signing_key=None,
    )
    for old in path.parent.glob("bundle-*.tar.zst"):
        old.unlink()
    shutil.copyfile(archive, path.parent / archive.name)
    path.write_bytes(hollow.to_bytes())
    outputs = tmp_path / "github-output"
    outputs.write_text("")
    probe = project.probe(tmp_path / "cache", env={"GITHUB_OUTPUT": str(outputs)})
    assert probe["status"] == "stale", probe
    assert probe["fxgraph_cache_hit"] == 0 and probe["fxgraph_cache_miss"] >= 1
    assert "cache-hit" in outputs.read_text() and "true" not in outputs.read_text()


# -- compile --force replaces atomically --------------------------------------------------
def test_force_replaces_atomically_under_a_concurrent_reader(project: Project, tmp_path: Path):
    (path,) = project.manifests()
    old = bundle.Manifest.model_validate_json(path.read_bytes())
    old_archive = old.archive.name
    store = open_store(str(project.root / "store"), read_only=True)
    loc_prefix = path.parent.relative_to(project.root / "store").as_posix()
    seen: set[tuple[str, str]] = set()  # (manifest created_at, archive) read whole
    failures: list[str] = []
    reads = 0
    done = threading.Event()

    def reader() -> None:
        nonlocal reads
        scratch = tmp_path / "reader"
        while not done.is_set():
            try:
                got = store.read(f"{loc_prefix}/manifest.json")
                assert got is not None, "manifest missing"
                m = bundle.verify_manifest(got[0], target=TARGET, signing_key=None)
                shutil.rmtree(scratch, ignore_errors=True)
                archive = scratch / m.archive.name
                store.download(f"{loc_prefix}/{m.archive.name}", archive, max_bytes=m.archive.size)
                bundle.extract(scratch / m.archive.name, m, scratch / "staging")
                seen.add((m.created_at, m.archive.name))
                reads += 1
            except Exception as e:  # any failure is the finding
                failures.append(f"{type(e).__name__}: {e}")

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        (entry,) = project.json("compile", "--force")["targets"]
        new = bundle.Manifest.model_validate_json(path.read_bytes())
        deadline = time.monotonic() + 30  # the reader reads the new bundle too, whole
        while (new.created_at, new.archive.name) not in seen and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        done.set()
        thread.join(timeout=60)
    assert entry["status"] == "replaced", entry
    assert failures == []
    # whatever inductor's bytes (an identical output keeps the archive's name), the
    # manifest is new (its created_at), and the reader read the old bundle and then the
    # new one, each verified and extracted whole, with no failure in between
    assert new.created_at != old.created_at, (old.created_at, new.created_at)
    assert (old.created_at, old_archive) in seen, seen
    assert (new.created_at, new.archive.name) in seen, seen
    assert reads > 1, reads
    new_archive = new.archive.name
    archives = sorted(p.name for p in path.parent.glob("bundle-*.tar.zst"))
    assert archives == sorted({old_archive, new_archive}), archives
    # the old archive is left for prune, which treats it as an orphan after the grace
    writable = open_store(str(project.root / "store"))
    assert prune(writable, keep=None, older_than_days=None) == []
    doomed = prune(writable, keep=None, older_than_days=None, now=time.time() + ORPHAN_GRACE_S + 60)
    assert doomed == ([f"{loc_prefix}/{old_archive}"] if new_archive != old_archive else [])
    assert sorted(p.name for p in path.parent.glob("bundle-*.tar.zst")) == [new_archive]
    (warmed,) = project.json("warm", "--cache-dir", str(tmp_path / "cache"))["targets"]
    assert warmed["status"] == "hit" and warmed["bundle_code_hash"] == entry["code_hash"]


# -- paired mode: a dotted factory resolves in the base checkout ---------------------------
PAIRED_CONFIG = textwrap.dedent("""
    [tool.gatekeeper]
    store = "store"
    precompile = "off"  # packages: tests/e2e/test_precompile.py

    [tool.gatekeeper.measure]
    warmup = 2
    min_time = 0.3

    [[tool.gatekeeper.models]]
    name = "dotted"
    factory = "pkg.sub.mod:make"
    inputs = [{ shape = ["batch", 16] }]
    shapes = [{ batch = 4 }]
""")

DOTTED = textwrap.dedent("""
    import torch
    from torch import nn

    import scaling

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 4)

        def forward(self, x):
            return self.fc(x) * scaling.SCALE

    def make():
        return Net()
""")


def git(root: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
    )


def test_paired_dotted_factory_builds_and_keys_the_base_from_its_checkout(tmp_path: Path):
    root = tmp_path / "repo"
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "sub" / "__init__.py").write_text("")
    (root / "pkg" / "sub" / "mod.py").write_text(DOTTED)
    (root / "scaling.py").write_text("SCALE = 1.0\n")
    (root / "gatekeeper.toml").write_text(PAIRED_CONFIG)
    (root / ".gitignore").write_text("store/\nout/\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", ".")
    git(root, "commit", "-qm", "base")
    (root / "scaling.py").write_text("SCALE = 2.0\n")  # the PR, uncommitted
    proc = gk("check", "--paired", "main", "--out", "out", "--json", cwd=root)
    assert proc.returncode == 0, proc.stderr
    (t,) = json.loads((root / "out" / "results.json").read_text())["targets"]
    assert t["status"] == "ok", t
    # the base model was built from the base checkout's scaling.py: outputs differ 2x
    assert t["parity"]["vs_baseline"]["passed"] is False
    assert t["paired"]["code_hash"] != t["code_hash"]
