"""Precompile packages end to end, with real compiles: ``compile`` records torch's
caching-precompile package in the bundle, ``check`` loads it in a fresh process and
compares it with eager before the manifest says it may be served, and ``warm`` serves
only a verified package of exactly this code (so a deploy skips Dynamo).

The tiny model calls its activation through a module-level alias: torch 2.13 drops the
guard on such a name when it packages a graph, so a changed alias loads the old graph
silently. That is the change only gatekeeper's parity check catches.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
from support.helpers import TINY_MODEL, gk, gk_json, parity_only_config, write_project
from support.outbox import Outbox

from gatekeeper import bundle, kinds
from gatekeeper.boundary.client import run_or_fail
from gatekeeper.boundary.protocol import PackageRef, VerifyRequest
from gatekeeper.kinds.precompile import PRECOMPILE, entries
from gatekeeper.project import expand, load_config
from gatekeeper.warm import warm_target

TARGET = "tiny/b4/default"
SIGNING = {"GATEKEEPER_SIGNING_KEY": "precompile-test-key"}

# the tiny model, its activation called through a module-level alias; with GK_ALIVE set,
# each build notes how many models the factory built before are still alive
MODEL = (
    TINY_MODEL.replace(
        "from torch import nn\n",
        "from torch import nn\n\nACT = torch.relu  # torch does not guard this name in a package\n",
    )
    .replace("torch.relu(self.fc1(x))", "ACT(self.fc1(x))")
    .replace(
        "def make():\n    return Tiny()\n",
        textwrap.dedent("""
        import os, weakref
        BUILT = []

        def make():
            if os.environ.get("GK_ALIVE"):
                alive = sum(1 for ref in BUILT if ref() is not None)
                with open(os.environ["GK_ALIVE"], "a") as f:
                    f.write(f"{alive}\\n")
            model = Tiny()
            BUILT.append(weakref.ref(model))
            return model
    """),
    )
)
CONFIG = parity_only_config("[{ batch = 4 }]", precompile=True).replace(
    'store = "store"', 'store = "store"\npass_env = ["GK_ALIVE"]', 1
)


@pytest.fixture(scope="session")
def compiled(tmp_path_factory) -> Path:
    """The project with its bundle (and package) published; compiled once."""
    root = write_project(tmp_path_factory.mktemp("precompile"), MODEL, CONFIG)
    alive = Outbox()  # the box leaves the factory nowhere else to write that outlives it
    (out,) = gk_json("compile", cwd=root, env={**SIGNING, "GK_ALIVE": str(alive.path)})["targets"]
    (root.parent / "alive.txt").write_text("\n".join(alive.close()))
    assert out["status"] == "published", out
    assert out["precompile"]["status"] == "recorded", out
    return root


@pytest.fixture(scope="session")
def verified(compiled: Path, tmp_path_factory) -> tuple[Path, dict]:
    """A copy of the project after one ``check``: its results document."""
    root = tmp_path_factory.mktemp("verified") / "project"
    shutil.copytree(compiled, root)
    gk_json("check", "--out", "out", cwd=root, env=SIGNING)
    return root, json.loads((root / "out" / "results.json").read_text())


def copy_of(root: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "project"
    shutil.copytree(root, dest)
    return dest


def manifest(project: Path) -> bundle.Manifest:
    (path,) = (project / "store" / "bundles").rglob("manifest.json")
    return bundle.verify_manifest(
        path.read_bytes(), target=TARGET, signing_key=SIGNING["GATEKEEPER_SIGNING_KEY"].encode()
    )


def packages(cache: Path) -> list[str]:
    return sorted(p.parent.name for p in cache.glob("dynamo/*/entry"))


def test_the_compiled_model_is_gone_before_the_package_builds_its_own(compiled: Path):
    """Recording the package builds the model again; the compile's own model was still
    alive then, so a compile held two models (the 1B Llama's compile peaked at 2.15x its
    weights, against 1.09x built). The factory notes, at each build, how many models it
    built before are alive: none, at each of the three (the plan's on the meta device,
    the compile's, the package's)."""
    builds = (compiled.parent / "alive.txt").read_text().split()
    assert builds == ["0", "0", "0"], builds


def test_compile_records_a_package_that_warm_does_not_serve_before_a_check(
    compiled: Path, tmp_path: Path
):
    project = copy_of(compiled, tmp_path)
    m = manifest(project)
    info = PRECOMPILE.info(m)
    assert info["status"] == "recorded" and info["verified"] is None
    assert info["unguarded"] == ["G['ACT']"]  # what only a parity check can vouch for
    assert entries(m) == {f"dynamo/{e}" for e in info["entries"]}

    cache = tmp_path / "cache"
    (w,) = gk_json("warm", "--cache-dir", str(cache), "--probe", cwd=project, env=SIGNING)[
        "targets"
    ]
    assert w["status"] == "hit"
    assert w["precompile"] == "unverified" and "no check" in w["precompile_reason"]
    assert packages(cache) == []  # the plain cache only
    assert w["dynamo"] == "traced" and w["fxgraph_cache_hit"] >= 1


def test_check_verifies_the_package_and_warm_then_skips_dynamo(verified, tmp_path: Path):
    root, results = verified
    (t,) = results["targets"]
    pc = t["precompile"]
    assert pc["verified"] is True and pc["dynamo"] == "skipped", pc
    assert pc["now"] is True and pc["stored"] == "updated"
    project = copy_of(root, tmp_path)
    info = PRECOMPILE.info(manifest(project))  # re-signed: it still verifies
    assert info["verified"] is True and info["check"]["dynamo"] == "skipped"

    cache = tmp_path / "cache"
    doc = gk_json("warm", "--cache-dir", str(cache), "--probe", cwd=project, env=SIGNING)
    (w,) = doc["targets"]
    assert w["precompile"] == "served" and packages(cache) == info["entries"]
    assert w["dynamo"] == "skipped", w  # the deploy's first call never ran Dynamo
    # one target, served from its package: the ISA probe is skipped too
    assert doc["service_env"] == {"TORCH_CACHING_PRECOMPILE": "1", "TORCHINDUCTOR_VEC_ISA_OK": "1"}


def test_a_package_whose_outputs_differ_from_eager_is_never_served(compiled: Path, tmp_path: Path):
    """The model's code changes after compile (same target id): an alias torch does not
    guard. Loaded by torch as it is, the package computes the old model; the check's
    worker catches that, and warm never serves a package to other code."""
    project = copy_of(compiled, tmp_path)
    config = load_config(project / "gatekeeper.toml")
    (target,) = expand(config)
    cache = tmp_path / "cache"
    w = warm_target(
        target,
        config,
        config_store(config),
        cache,
        megacache=False,
        signing_key=SIGNING["GATEKEEPER_SIGNING_KEY"].encode(),
        serve="any",
    )
    assert w.precompile == "served" and packages(cache)

    model = project / "tinymodel.py"
    model.write_text(model.read_text().replace("ACT = torch.relu", "ACT = torch.tanh"))
    resp = run_or_fail(
        VerifyRequest.of(
            target,
            config,
            "cpu",
            kind=kinds.of(target),
            package=PackageRef.of(PRECOMPILE, cache),
            parity=config.gate.parity,
        ),
        cache_dir=cache,
        timeout=300,
        label=TARGET,
    )
    assert resp.ok, resp.error
    verdict = resp.packages["precompile"]
    assert verdict["dynamo"] == "skipped"  # torch loaded the stale graph
    assert verdict["verified"] is False
    assert "differ vs eager" in verdict["reason"], verdict

    # warm, for the changed code: another version's bundle, so no package (the plain
    # cache still helps), and none left where torch would look
    fresh = tmp_path / "fresh"
    shutil.copytree(cache, fresh)
    (w,) = gk_json("warm", "--cache-dir", str(fresh), cwd=project, env=SIGNING)["targets"]
    assert w["status"] == "partial"
    assert w["precompile"] == "unverified" and "another version" in w["precompile_reason"]
    assert packages(fresh) == []


def test_another_cpu_capability_never_loads_the_package(verified, tmp_path: Path):
    root, _ = verified
    project = copy_of(root, tmp_path)
    default = gk_json("key", cwd=project)["targets"][0]
    lower = "avx2" if default["env"]["cpu_capability"] == "avx512" else "default"
    cache = tmp_path / "cache"
    (w,) = gk_json(
        "warm",
        "--cache-dir",
        str(cache),
        cwd=project,
        env={**SIGNING, "ATEN_CPU_CAPABILITY": lower},
    )["targets"]
    assert w["status"] == "miss" and "precompile" not in w
    assert packages(cache) == []


def config_store(config):
    from gatekeeper.store import open_store

    return open_store(config.store, base_dir=config.base_dir)


# a service: warm-started (in this process, or by `gatekeeper warm` before it), then a
# call at the compiled batch size (the package) and one at another (a guard fails)
SERVICE = """
import os, sys
import torch
if sys.argv[1] == "in-process":
    import gatekeeper
    (w,) = gatekeeper.warm_start(cache_dir=sys.argv[2])
    assert w.precompile == "served", w
from torch._dynamo.utils import counters
from tinymodel import make
torch.manual_seed(0)
model = make().eval()
compiled = torch.compile(model)
with torch.no_grad():
    for batch in (4, 3):
        x = torch.randn(batch, 16)
        assert torch.allclose(compiled(x), model(x), atol=1e-5), batch
print(counters["dynamo_cache"]["dynamo_cache_hit"], counters["stats"]["unique_graphs"])
"""


@pytest.mark.parametrize("how", ["in-process", "service-env"])
def test_a_guard_that_fails_after_loading_recompiles_and_computes_the_same(
    verified, tmp_path: Path, how: str
):
    """Another batch size than the package's fails its guards: the service recompiles
    (one graph) and computes what eager computes; it never crashes."""
    import os
    import subprocess
    import sys

    root, _ = verified
    project = copy_of(root, tmp_path)
    cache = tmp_path / "cache"
    env = {**os.environ, **SIGNING}
    if how == "service-env":  # `gatekeeper warm` first, then the environment it prints
        doc = gk_json("warm", "--cache-dir", str(cache), cwd=project, env=SIGNING)
        env |= {**doc["service_env"], "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    proc = subprocess.run(
        [sys.executable, "-c", SERVICE, how, str(cache)],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    hits, graphs = map(int, proc.stdout.split()[-2:])
    assert hits == 1 and graphs == 1, proc.stdout  # batch 4 loaded, batch 3 recompiled


def test_a_paired_check_never_loads_the_base_commits_package(verified, tmp_path: Path):
    """A check measures the ordinary warm start, with no precompile package where it
    measures: paired, the base commit's bundle is warmed into the same cache dir, and its
    verified package must stay out of it too (the head's factory lists what is there)."""
    root, _ = verified
    project = copy_of(root, tmp_path)
    (project / ".gitignore").write_text("store/\nout/\npaired/\noutbox.txt\n")
    git = ["git", "-C", str(project), "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q", "-b", "main"], ["add", "."], ["commit", "-qm", "base"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    # the control: at the base commit, its bundle is an exact hit whose package is served
    cache = tmp_path / "deploy"
    (w,) = gk_json("warm", "--cache-dir", str(cache), cwd=project, env=SIGNING)["targets"]
    assert (w["status"], w["precompile"]) == ("hit", "served") and packages(cache), w

    spy = MODEL.replace(
        "def make():\n",
        "def make():\n"
        "    import json, os, pathlib\n"
        "    cache = pathlib.Path(os.environ['TORCHINDUCTOR_CACHE_DIR'])\n"
        "    found = sorted(p.parent.name for p in cache.glob('dynamo/*/entry'))\n"
        "    out = (pathlib.Path(__file__).parent / 'outbox.txt').read_text()\n"  # a FIFO
        "    with open(out, 'w') as f:\n"
        "        f.write(json.dumps(found) + '\\n')\n",
    )
    (project / "tinymodel.py").write_text(spy)  # the pull request: uncommitted
    outbox = Outbox()
    (project / "outbox.txt").write_text(str(outbox.path))
    proc = gk(
        "check", "--mode", "paired", "--base-ref", "main", "--out", "paired",
        cwd=project, env=SIGNING,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (target,) = json.loads((project / "paired" / "results.json").read_text())["targets"]
    assert target["paired"], target  # measured beside the base commit's model
    docs = outbox.docs()  # the head's factory runs twice: the plan's meta build, the real
    assert docs == [[], []], docs
