"""Paired mode: BASE_REF's model code from a git worktree, measured with the head's in
one process, round by round."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support.helpers import git, gk, write_project
from support.projects import BASE_MODEL, CONFIG, QUIET, pr_version

SLOWER = """
    def forward(self, x):
        h = torch.relu(self.fc1(x))
        for _ in range(4):  # new work, which barely touches the outputs
            h = h + 1e-9 * torch.tanh(self.extra(h))
        return self.fc2(h)
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = write_project(tmp_path_factory.mktemp("paired"), BASE_MODEL, CONFIG)
    (root / ".gitignore").write_text("store/\nresults.json\nreport.*\nreferences/\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", ".")
    git(root, "commit", "-qm", "base")
    (root / "tinymodel.py").write_text(pr_version(SLOWER))  # the PR: uncommitted
    return root


@pytest.mark.serial  # a timing verdict: run alone
def test_the_default_run_pairs_and_flags_the_slower_head(repo: Path):
    """No mode flag: in a checkout that has the base branch, `run` pairs with it."""
    proc = gk("run", "--json", "--base-ref", "main", cwd=repo, env=QUIET)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 1, proc.stderr
    (t,) = json.loads(proc.stdout)["targets"]
    assert t["verdict"] == "regressed"
    assert t["latency"]["paired"] is True and t["latency"]["delta"] > 0.3
    assert "paired with main at" in proc.stderr
    results = json.loads((repo / "results.json").read_text())
    assert results["mode"] == "paired" and results["targets"][0]["mode"] == "paired"
    assert "Timing: paired with main at" in (repo / "report.md").read_text()
    pair = results["targets"][0]["paired"]
    assert pair["base_ref"] == "main" and len(pair["base_commit"]) == 40
    assert len(pair["samples"]) == len(results["targets"][0]["latency"]["samples"]["compiled"])
    assert results["targets"][0]["parity"]["vs_baseline"]["passed"]
    # the worktree is gone again
    listed = subprocess.run(
        ["git", "-C", str(repo), "worktree", "list"], capture_output=True, text=True
    ).stdout
    assert len(listed.strip().splitlines()) == 1


def test_paired_needs_git(tmp_path: Path):
    root = write_project(tmp_path / "nogit", BASE_MODEL, CONFIG)
    proc = gk("check", "--paired", "main", cwd=root)
    assert proc.returncode == 2
    assert "git checkout" in proc.stderr and "Traceback" not in proc.stderr


def test_paired_unknown_ref_is_one_line(repo: Path):
    proc = gk("check", "--paired", "no-such-branch", cwd=repo)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_other_version_swaps_modules_and_restores_them(tmp_path: Path):
    import sys

    from gatekeeper.worker.model import other_version

    head, base = tmp_path / "head", tmp_path / "base"
    for root, value in ((head, "head"), (base, "base")):
        (root / "gkswap").mkdir(parents=True)
        (root / "gkswap" / "__init__.py").write_text(f"VERSION = {value!r}\n")
    sys.path.insert(0, str(head))
    try:
        import gkswap

        assert gkswap.VERSION == "head"
        with other_version(base, ["gkswap.models"]):
            import gkswap as other

            assert other.VERSION == "base"
        import gkswap as again

        assert again is gkswap and sys.modules["gkswap"].VERSION == "head"
    finally:
        sys.path.remove(str(head))
        sys.modules.pop("gkswap", None)


def test_paired_rounds_give_base_and_head_the_same_neighbours():
    """An identical base and head must not read differently because of where they sit
    in a round: each takes the first and the second place equally often, and each
    follows the other as often as it follows the reference workload."""
    from gatekeeper.worker.timing import _round_order

    names = ["base", "eager", "compiled", "reference"]
    rounds = [_round_order(names, k) for k in range(11)]
    assert all(sorted(r) == sorted(names) for r in rounds)
    seq = [n for r in rounds for n in r]
    role = lambda n, m: "the other" if n in ("base", "compiled") and n != m else n  # noqa: E731
    before = {
        m: [role(seq[i - 1], m) for i in range(len(names), len(seq)) if seq[i] == m]
        for m in ("base", "compiled")
    }
    assert sorted(before["base"]) == sorted(before["compiled"]) != []
    for m in ("base", "compiled"):
        assert [r.index(m) for r in rounds[1:]].count(0) == 5

    alone = [_round_order(["eager", "compiled", "reference"], k) for k in range(2)]
    assert alone == [["eager", "compiled", "reference"], ["reference", "compiled", "eager"]]


STOCK_STEP = """
from torch import nn


def make():  # torch's own classes: the base runs the same code as the head
    return nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 8))
"""

STEP_CONFIG = """
[tool.gatekeeper]
store = "store"
precompile = "off"

[tool.gatekeeper.measure]
min_time = 0.5

[[tool.gatekeeper.models]]
name = "step"
factory = "tinymodel:make"
tasks = ["infer", "train"]
inputs = [{ shape = ["batch", 64] }]
shapes = [{ batch = 16 }]
"""


def test_an_unchanged_stock_model_paired_with_main_counts_the_same_work(tmp_path: Path):
    """Head and base run the same code (torch's module classes, one training step
    function), so torch can serve the base the head's compiled frames; the base's
    kernels and bytes accessed must still count every frame it runs. They counted only
    the frames compiled for the base: an unchanged training step `regressed` on +57%
    bytes accessed, and the forward's base read 0 kernels and unknown bytes, so its
    work was never compared."""
    root = write_project(tmp_path, STOCK_STEP, STEP_CONFIG)
    (root / ".gitignore").write_text("store/\nresults.json\nreport.*\nreferences/\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", ".")
    git(root, "commit", "-qm", "base")
    git(root, "checkout", "-qb", "pr")
    git(root, "commit", "-qm", "pr: nothing changed", "--allow-empty")
    proc = gk("run", "--json", "--base-ref", "main", cwd=root, env=QUIET)
    assert "Traceback" not in proc.stderr, proc.stderr
    targets = json.loads(proc.stdout)["targets"]
    assert sorted(t["target"] for t in targets) == ["step/b16/default", "step/b16/default+train"]
    for t in targets:
        assert t["latency"]["paired"] is True
        assert not [x for x in t["reasons"] if "bytes accessed" in x or "kernels" in x], t
    for r in json.loads((root / "results.json").read_text())["targets"]:
        head, base = r["work"], r["paired"]["work"]
        assert head["kernels"] == base["kernels"] > 0, r["target"]
        assert head["bytes_accessed"] == base["bytes_accessed"] > 0, r["target"]
        assert r["graphs"]["recompiles"] == 0, r["target"]
