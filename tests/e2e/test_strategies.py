"""Ship a model every way PyTorch can (issue 23): regional and aot targets of one tiny
model with a repeated block, with real compiles (each compiled once per session).

* regional: after a change to the head only, the blocks' FX graphs still hit (the
  compile is seeded with the previous bundle);
* aot: ``check`` verifies the AOTInductor package, ``warm`` serves it, and
  ``gatekeeper.load_aot`` loads it in a fresh process with eager's outputs and without
  importing ``torch._inductor``;
* a data-dependent branch is ``not exportable`` naming its line, and a pull request that
  introduces one is ``regressed``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from support.helpers import gk, gk_json, parity_only_config, write_project

from gatekeeper import bundle
from gatekeeper.runtime import MANIFEST, package_dir

MODEL = textwrap.dedent("""
    import torch
    from torch import nn


    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(32, 32)

        def forward(self, x):
            return x + torch.relu(self.fc(x))


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(16, 32)
            self.layers = nn.ModuleList(Block() for _ in range(3))
            self.head = nn.Linear(32, 4)

        def forward(self, x):
            h = self.inp(x)
            for layer in self.layers:
                h = layer(h)
            return self.head(h)


    def make():
        return Net()
""")

CONFIG = textwrap.dedent("""
    [tool.gatekeeper]
    store = "store"
    precompile = "off"  # packages: tests/e2e/test_precompile.py

    [tool.gatekeeper.measure]
    warmup = 2
    min_time = 0.3

    [tool.gatekeeper.gate]
    latency_regression = 0.95
    speedup_regression = 0.95
    compile_time_regression = 100.0
    memory_regression = 100.0

    [[tool.gatekeeper.models]]
    name = "net"
    factory = "tinymodel:make"
    inputs = [{ shape = ["batch", 16] }]
    shapes = [{ batch = 4 }]
    strategies = ["regional", "aot"]  # whole: every other e2e test
""")

REGIONAL, AOT = "net/b4/default+regional", "net/b4/default+aot"


@pytest.fixture(scope="session")
def shipped(tmp_path_factory) -> Path:
    """The project compiled every way, checked (the aot package verified), and its
    results published as main's baseline."""
    root = write_project(tmp_path_factory.mktemp("strategies") / "project", MODEL, CONFIG)
    out = gk_json("compile", cwd=root)
    assert [t["status"] for t in out["targets"]] == ["published"] * 2, out
    assert gk("check", "--out", "base", cwd=root).returncode == 0
    gk("baseline", "--results", "base/results.json", "--ref", "main", cwd=root, check=True)
    return root


def copy_of(shipped: Path, tmp_path: Path) -> Path:
    root = tmp_path / "project"
    shutil.copytree(shipped, root)
    return root


def results(root: Path, out: str = "base") -> dict:
    doc = json.loads((root / out / "results.json").read_text())
    return {t["target"]: t for t in doc["targets"]}


def test_the_aot_package_is_verified_served_and_loaded_without_inductor(
    shipped: Path, tmp_path: Path
):
    aot = results(shipped)[AOT]
    assert aot["status"] == "ok" and aot["parity"]["vs_eager"]["passed"], aot
    assert aot["aot"]["verified"] is True and aot["aot"]["from"] == "bundle", aot["aot"]
    deploy = tmp_path / "deploy"
    (warmed,) = gk_json(
        "warm", "--cache-dir", str(deploy), "--probe", "--target", AOT, cwd=shipped
    )["targets"]
    assert (warmed["status"], warmed["aot"]) == ("hit", "served"), warmed
    assert warmed["inductor_imported"] is False and warmed["dynamo"] == "skipped", warmed

    service = textwrap.dedent(f"""
        import sys
        import torch
        import gatekeeper

        model = gatekeeper.load_aot("gatekeeper.toml", {AOT!r}, cache_dir={str(deploy)!r})
        x = torch.randn(4, 16)
        out = model(x)
        assert "torch._inductor" not in sys.modules, "load_aot imported inductor"
        import tinymodel

        torch.manual_seed(0)  # the config's seed: the weights the package was built with
        with torch.no_grad():
            eager = tinymodel.make().eval()(x)
        assert out.shape == eager.shape and torch.allclose(out, eager, atol=1e-5), (out, eager)
        print("ok")
    """)
    proc = subprocess.run(
        [sys.executable, "-c", service], cwd=shipped, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr

    # a target without a verified package is a clear error, before torch is touched
    missing = textwrap.dedent(f"""
        import gatekeeper
        from gatekeeper.runtime import AotUnavailable
        try:
            gatekeeper.load_aot("gatekeeper.toml", {AOT!r}, cache_dir={str(tmp_path / "x")!r})
        except AotUnavailable as e:
            print(e)
    """)
    proc = subprocess.run(
        [sys.executable, "-c", missing], cwd=shipped, capture_output=True, text=True, timeout=60
    )
    assert "no AOTInductor package installed" in proc.stdout, proc.stdout + proc.stderr


def _service_load(root: Path, deploy: Path, env: dict[str, str] | None = None) -> str:
    """What a service's ``gatekeeper.load_aot`` of the aot target says: ``loaded`` (and
    called), or why it refused."""
    code = textwrap.dedent(f"""
        import torch
        import gatekeeper
        from gatekeeper.runtime import AotUnavailable
        try:
            model = gatekeeper.load_aot("gatekeeper.toml", {AOT!r}, cache_dir={str(deploy)!r})
            model(torch.randn(4, 16))
            print("loaded")
        except AotUnavailable as e:
            print(e)
    """)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GATEKEEPER_")}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        env=clean | (env or {}),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_a_package_changed_after_warm_is_never_loaded(shipped: Path, tmp_path: Path):
    """Loading an AOTInductor package runs its shared library: load_aot loads only the
    file warm verified (its sha256), and where the service has the signing key, only
    what the bundle's signed manifest records, whatever package.json says."""
    deploy = tmp_path / "deploy"
    (warmed,) = gk_json("warm", "--cache-dir", str(deploy), "--target", AOT, cwd=shipped)["targets"]
    assert warmed["aot"] == "served", warmed
    where = package_dir(deploy, AOT)
    package, info_path = where / "model.pt2", where / "package.json"
    original = package.read_bytes()
    with zipfile.ZipFile(package, "a") as z:  # still a package torch loads, another file
        z.writestr(z.namelist()[0].split("/")[0] + "/data/planted.txt", "changed after warm")
    tampered = package.read_bytes()
    assert "is not the package warm verified" in _service_load(shipped, deploy)

    # a signed bundle: the manifest warm kept beside the package, signed (as main's are)
    key = {"GATEKEEPER_SIGNING_KEY": "aot-load-test-key"}
    manifest = bundle.Manifest.model_validate_json((where / MANIFEST).read_bytes())
    signed = bundle.sign(manifest, key["GATEKEEPER_SIGNING_KEY"].encode())
    (where / MANIFEST).write_bytes(signed.to_bytes())
    package.write_bytes(original)
    assert _service_load(shipped, deploy, key) == "loaded"  # the verified package loads

    # package.json edited to the tampered file's sha256: the signed manifest says otherwise
    package.write_bytes(tampered)
    info = json.loads(info_path.read_text())
    info_path.write_text(json.dumps(info | {"sha256": hashlib.sha256(tampered).hexdigest()}))
    assert "is not what its signed manifest says" in _service_load(shipped, deploy, key)
    required = {"GATEKEEPER_REQUIRE_SIGNATURE": "true"}
    assert "a signature is required" in _service_load(shipped, deploy, required)


def test_load_aot_takes_the_loader_constructor_of_an_older_torch(shipped: Path, tmp_path: Path):
    """torch's C++ loader is no stable API: torch 2.6 takes (path, model name) and refuses
    torch 2.13's five arguments with pybind11's TypeError. A stand-in with 2.6's
    constructor around the real loader: load_aot still loads and runs the package."""
    deploy = tmp_path / "deploy"
    gk("warm", "--cache-dir", str(deploy), "--target", AOT, cwd=shipped, check=True)
    service = textwrap.dedent(f"""
        import torch
        import gatekeeper

        Real = torch._C._aoti.AOTIModelPackageLoader
        made = []

        class Loader26:  # torch 2.6's constructor: (path, model name) only
            def __init__(self, *args):
                if len(args) != 2:
                    raise TypeError("__init__(): incompatible constructor arguments. "
                                    "The following argument types are supported: ...")
                made.append(args)
                self._real = Real(*args, False, 1, -1)

            def __getattr__(self, name):
                return getattr(self._real, name)

        torch._C._aoti.AOTIModelPackageLoader = Loader26
        model = gatekeeper.load_aot("gatekeeper.toml", {AOT!r}, cache_dir={str(deploy)!r})
        x = torch.randn(4, 16)
        import tinymodel

        torch.manual_seed(0)
        with torch.no_grad():
            eager = tinymodel.make().eval()(x)
        assert torch.allclose(model(x), eager, atol=1e-5) and made[0][1] == "model", made
        print("ok")
    """)
    proc = subprocess.run(
        [sys.executable, "-c", service], cwd=shipped, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_a_head_only_change_still_hits_the_regional_blocks(shipped: Path, tmp_path: Path):
    regional = results(shipped)[REGIONAL]
    assert regional["status"] == "ok" and regional["parity"]["vs_eager"]["passed"], regional
    assert regional["graphs"]["count"] == 1  # three blocks, one graph
    root = copy_of(shipped, tmp_path)
    model = root / "tinymodel.py"
    model.write_text(model.read_text().replace("nn.Linear(32, 4)", "nn.Linear(32, 4, bias=False)"))
    (entry,) = gk_json("compile", "--target", REGIONAL, cwd=root)["targets"]
    assert entry["status"] == "published", entry
    # the blocks' one graph is reused (compiled whole, the head would be in the graph)
    seeded = entry["seed"]
    assert (seeded["fx_graphs_reused"], seeded["fx_graphs"]) == (1, 1), entry
    assert seeded["code_hash"] == regional["code_hash"]


def test_a_data_dependent_branch_is_not_exportable_and_regressed(shipped: Path, tmp_path: Path):
    root = copy_of(shipped, tmp_path)
    model = root / "tinymodel.py"
    text = model.read_text().replace(
        "        return self.head(h)",
        "        if h.sum() > 0:\n            h = h * 2\n        return self.head(h)",
    )
    model.write_text(text)
    line = text.splitlines().index("        if h.sum() > 0:") + 1
    proc = gk("run", "--json", "--mode", "stored", "--base-ref", "main", "--target", AOT, cwd=root)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    (target,) = json.loads(proc.stdout)["targets"]
    assert target["verdict"] == "regressed", target
    (reason,) = target["reasons"]
    assert "not exportable: " in reason and f"at tinymodel.py:{line}" in reason, reason
    assert "data-dependent" in reason.lower(), reason


def test_check_of_an_aot_target_without_a_bundle_exports_and_builds_its_own(tmp_path: Path):
    """No compile ran: the check's worker exports and builds the package itself, and
    its export record (with the seconds export took) is a result, not a crash."""
    root = write_project(tmp_path / "project", MODEL, CONFIG)
    proc = gk("check", "--out", "fresh", "--target", AOT, cwd=root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    aot = results(root, "fresh")[AOT]
    assert aot["status"] == "ok" and aot["export"]["exportable"], aot
    assert aot["export"]["seconds"] > 0 and aot["aot"]["from"] == "compiled", aot


# a service's check that what it loaded is the tiny model: its outputs are eager's
MATCHES_EAGER = textwrap.dedent("""
    def matches_eager(model):
        import torch
        import tinymodel

        x = torch.randn(4, 16)
        torch.manual_seed(0)
        with torch.no_grad():
            eager = tinymodel.make().eval()(x)
        return torch.allclose(model(x), eager, atol=1e-5)
""")


def test_load_aot_loads_the_bytes_it_verified_not_what_the_path_holds_later(
    shipped: Path, tmp_path: Path
):
    """load_aot hashes a private copy of the package and loads that copy (issue 41): a
    package file replaced after its verification (here: by bytes that are no package at
    all) changes nothing of what loads, and a symlink in its place is refused."""
    deploy = tmp_path / "deploy"
    gk("warm", "--cache-dir", str(deploy), "--target", AOT, cwd=shipped, check=True)
    installed = package_dir(deploy, AOT) / "model.pt2"
    service = MATCHES_EAGER + textwrap.dedent(f"""
        import os
        import gatekeeper.runtime as runtime

        verified = runtime.verified_aot("gatekeeper.toml", {AOT!r}, cache_dir={str(deploy)!r})
        installed = {str(installed)!r}
        with open(installed, "wb") as f:  # swapped after verification, before the load
            f.write(b"not the package warm verified")
        assert matches_eager(verified.load())
        assert not any(p.startswith(".gk-load-") for p in os.listdir(os.path.dirname(installed)))
        os.unlink(installed)
        os.symlink({str(tmp_path / "elsewhere.pt2")!r}, installed)
        try:
            runtime.verified_aot("gatekeeper.toml", {AOT!r}, cache_dir={str(deploy)!r})
        except runtime.AotUnavailable as e:
            print(e)
    """)
    (tmp_path / "elsewhere.pt2").write_bytes(b"anything")
    proc = subprocess.run(
        [sys.executable, "-c", service], cwd=shipped, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "model.pt2 unreadable" in proc.stdout, proc.stdout


def test_load_aot_loads_its_own_copy_not_what_the_copys_name_holds_later(
    shipped: Path, tmp_path: Path
):
    """Before: load_aot made its private copy (``.gk-load-*``) inside the package's
    folder, so another user who can write that folder swapped the copy after the check
    (renamed its folder, put a package of theirs in its place) and theirs was loaded.
    Now the copy lives in a new 0700 folder of the process's temp dir, and what loads is
    the open file that was hashed: even the copy's own name swapped for bytes that are no
    package (which only its owner could do) loads the package warm verified."""
    deploy = tmp_path / "deploy"
    gk("warm", "--cache-dir", str(deploy), "--target", AOT, cwd=shipped, check=True)
    installed = package_dir(deploy, AOT) / "model.pt2"
    service = MATCHES_EAGER + textwrap.dedent(f"""
        import os
        import gatekeeper.runtime as runtime

        verified = runtime.verified_aot("gatekeeper.toml", {AOT!r}, cache_dir={str(deploy)!r})
        copy = verified.copy
        assert not copy.is_relative_to({str(installed.parent)!r}), copy
        assert os.stat(copy.parent).st_mode & 0o777 == 0o700, oct(os.stat(copy.parent).st_mode)
        fake = copy.with_name("fake.pt2")  # the copy's name, swapped after the check
        fake.write_bytes(b"not the package warm verified")
        os.replace(fake, copy)
        assert matches_eager(verified.load())
        assert not copy.parent.exists()
        print("loaded the verified package")
    """)
    proc = subprocess.run(
        [sys.executable, "-c", service], cwd=shipped, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "loaded the verified package" in proc.stdout


UNCALLED = """
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(16, 16)
        self.spare = nn.Linear(16, 16)  # named in regions, never called

    def forward(self, x):
        return torch.relu(self.body(x))


def make():
    return Model()
"""


def test_a_region_the_model_never_calls_stops_compile_and_check_naming_it(tmp_path: Path):
    """It compiled nothing and published a bundle without its graph; compile and check
    now end the target in a one-line config error (exit 2) naming the block, in the
    compile's first calls and in check's (which compiles without a bundle)."""
    config = parity_only_config("[{ batch = 2 }]")
    config += 'backend = "eager"\nstrategies = ["regional"]\nregions = ["body", "spare"]\n'
    root = write_project(tmp_path / "p", UNCALLED, config)
    said = "regions: spare: never called by forward of model 'tiny'"
    for verb in (["compile"], ["check", "--mode", "stored"]):
        proc = gk(*verb, cwd=root)
        assert proc.returncode == 2 and said in proc.stdout + proc.stderr, proc.stderr
    assert not list((root / "store").rglob("*.tar*")), "nothing published"
