"""Training steps, autocast precisions and dynamic shapes end to end (issue 12), with real
compiles: one project, compiled and gated as main once per session.

* ``tiny``: tasks infer + train, precisions fp32 + bf16 (four targets; the base branch
  gates the training step and the bf16 forward: the plain forward is covered elsewhere,
  and the bf16 training step costs another compile);
* ``dyn``: ``dynamic = true`` over two shape sets, which share one bundle.

Each test runs PR versions on a private copy of that project (store included).
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest
from support.helpers import TINY_MODEL, gk, gk_json, shared_objects, write_project
from support.projects import QUIET, check_gate

# the helpers' tiny model (its forward in two lines, so a test can cut the gradient in
# one) and a model for dynamic shapes
MODELS = TINY_MODEL.replace(
    "return self.fc2(torch.relu(self.fc1(x)))",
    "h = torch.relu(self.fc1(x))\n        return self.fc2(h)",
) + textwrap.dedent("""

    class Dyn(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 4)

        def forward(self, x):
            return self.fc(x)

    def make_dyn():
        return Dyn()
""")


CONFIG = textwrap.dedent("""
    [tool.gatekeeper]
    store = "store"
    precompile = "off"  # packages: tests/e2e/test_precompile.py

    [tool.gatekeeper.measure]
    warmup = 1
    min_time = 0.2
    max_samples = 30

    # wide timing rules: these tests are about parity, bundles and recompiles
    [tool.gatekeeper.gate]
    latency_regression = 0.95
    speedup_regression = 0.95
    compile_time_regression = 100.0
    memory_regression = 100.0

    [[tool.gatekeeper.models]]
    name = "tiny"
    factory = "tinymodel:make"
    inputs = [{ shape = ["batch", 16] }]
    shapes = [{ batch = 4 }]
    tasks = ["infer", "train"]
    precisions = ["fp32", "bf16"]

    [[tool.gatekeeper.models]]
    name = "dyn"
    factory = "tinymodel:make_dyn"
    inputs = [{ shape = ["batch", 16] }]
    shapes = [{ batch = 2 }, { batch = 8 }]
    dynamic = true
""")

TRAIN = "tiny/b4/default+train"
BF16 = "tiny/b4/default+bf16"
GATED = ["--target", TRAIN, "--target", BF16, "--target", "dyn/*"]


def verdicts(doc: dict) -> dict[str, dict]:
    return {t["target"]: t for t in doc["targets"]}


@pytest.fixture(scope="session")
def base_project(tmp_path_factory) -> Path:
    """Main: compiled (the training step and the dynamic model), measured, published."""
    root = write_project(tmp_path_factory.mktemp("train-base"), MODELS, CONFIG)
    out = gk_json("compile", "--target", TRAIN, "--target", "dyn/*", cwd=root, env=QUIET)
    # the dynamic model's two shape sets compile once, into one bundle
    assert [(t["target"], t["status"]) for t in out["targets"]] == [
        (TRAIN, "published"),
        ("dyn/b2/default+dynamic", "published"),
    ]
    # measured and published as main's baseline (the bf16 forward compiled by check)
    code, doc, _ = check_gate(root, *GATED)
    assert code == 0, doc
    gk("baseline", "--results", "results.json", "--ref", "main", cwd=root, check=True)
    return root


@pytest.fixture
def project(base_project: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "pr"
    shutil.copytree(base_project, dest)
    return dest


def results(project: Path) -> dict[str, dict]:
    doc = json.loads((project / "results.json").read_text())
    return {t["target"]: t for t in doc["targets"]}


def test_training_step_warm_starts_forward_backward_and_optimizer(project: Path, tmp_path: Path):
    cache = tmp_path / "deploy-cache"
    out = gk_json("warm", "--target", TRAIN, "--cache-dir", str(cache), cwd=project, env=QUIET)
    assert out["targets"][0]["status"] == "hit"
    before = shared_objects(cache)
    assert before
    # the training job: a fresh process runs its first compiled step on that cache
    probe = gk_json(
        "warm", "--target", TRAIN, "--cache-dir", str(cache), "--probe", cwd=project, env=QUIET
    )
    (entry,) = probe["targets"]
    # forward, backward and optimizer graphs from the FX graph cache, the forward+backward
    # and optimizer from AOTAutograd's: nothing compiled, no C++ kernel built
    assert (entry["fxgraph_cache_hit"], entry["fxgraph_cache_miss"]) == (3, 0), entry
    assert (entry["autograd_cache_hit"], entry["autograd_cache_miss"]) == (2, 0), entry
    assert shared_objects(cache) == before


def test_base_run_dynamic_shape_sets_share_one_bundle_without_recompiles(base_project: Path):
    bundles = base_project / "store" / "bundles" / "dyn"
    assert [p.name for p in bundles.iterdir()] == ["dynamic"]
    res = results(base_project)
    for target in ("dyn/b2/default+dynamic", "dyn/b8/default+dynamic"):
        t = res[target]
        assert t["compile"]["cache"] == "hit" and t["compile"]["fxgraph_cache_miss"] == 0
        sweep = t["graphs"]["sweep"]
        assert (sweep["shape_sets"], sweep["recompiles"], sweep["guards"]) == (2, 0, [])
    # the training target: compiled vs eager after 3 steps, and its reference saved
    train = res[TRAIN]
    assert train["parity"]["vs_eager"]["passed"] and train["compile"]["cache"] == "hit"
    assert train["latency"]["compiled"]["p50"] > 0 and train["memory"]["eager_peak_bytes"]


def test_unchanged_training_and_bf16_targets_pass_against_their_baselines(project: Path):
    code, doc, _ = check_gate(project, "--target", TRAIN, "--target", BF16)
    v = verdicts(doc)
    assert sorted(v) == [BF16, TRAIN]
    for target, t in v.items():
        assert t["verdict"] in ("pass", "improved") or (
            t["verdict"] == "inconclusive" and t["disturbed"]
        ), (target, t["reasons"])
    for target, t in results(project).items():
        assert t["parity"]["vs_eager"]["passed"], target
        assert t["parity"]["vs_baseline"]["passed"], target
    assert code == 0


def test_detached_gradient_fails_training_parity_naming_the_task(project: Path):
    model = project / "tinymodel.py"
    # the same forward output, but fc1 no longer learns
    model.write_text(
        model.read_text().replace(
            "h = torch.relu(self.fc1(x))", "h = torch.relu(self.fc1(x)).detach()"
        )
    )
    code, doc, _ = check_gate(project, "--target", TRAIN)
    t = verdicts(doc)[TRAIN]
    assert t["verdict"] == "parity-failed", t
    (reason,) = [r for r in t["reasons"] if "parity" in r]
    assert "vs baseline" in reason and "train: parameters after 3 steps differ" in reason
    assert "fc1" in reason
    assert results(project)[TRAIN]["parity"]["vs_eager"]["passed"]  # eager agrees: a real change
    assert code == 1


def test_shape_dependent_branch_recompiles_and_is_regressed(project: Path):
    model = project / "tinymodel.py"
    model.write_text(
        model.read_text().replace(
            "        return self.fc(x)\n",
            "        if x.shape[0] > 4:\n            return self.fc(x) + 0.0\n"
            "        return self.fc(x)\n",
        )
    )
    code, doc, _ = check_gate(project, "--target", "dyn/b2/*")
    t = verdicts(doc)["dyn/b2/default+dynamic"]
    assert t["verdict"] == "regressed", t
    (reason,) = [r for r in t["reasons"] if "recompiles" in r]
    assert "0 -> 1" in reason and "x.size()[0]" in reason, reason
    assert code == 1


def test_train_task_of_a_model_without_floating_output_exits_2_in_one_line(tmp_path: Path):
    config = CONFIG.split("[[tool.gatekeeper.models]]")[0] + textwrap.dedent("""
        [[tool.gatekeeper.models]]
        name = "argmax"
        factory = "tinymodel:make"
        inputs_factory = "tinymodel:ids"
        tasks = ["train"]
    """)
    model = MODELS.replace(
        "def make():", "def ids(shapes):\n    return torch.randn(2, 16)\n\ndef make():"
    ).replace("return self.fc2(h)", "return self.fc2(h).argmax(-1)")
    root = write_project(tmp_path, model, config)
    proc = gk("compile", cwd=root)
    assert proc.returncode == 2
    (line,) = [ln for ln in proc.stderr.splitlines() if "error" in ln.lower()]
    assert "tasks" in line and "floating-point output" in line and "train.loss" in line
    assert "Traceback" not in proc.stderr
