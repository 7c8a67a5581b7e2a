"""The e2e tests' shared project: a base model and its config, and PR versions of it."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

from support.helpers import gk, write_project

BASE_MODEL = textwrap.dedent("""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(256, 256)
            self.fc2 = nn.Linear(256, 256)
            self.extra = nn.Linear(256, 256)

        def forward(self, x):
            h = torch.relu(self.fc1(x))
            return self.fc2(h)

    def make():
        return Net()
""")

CONFIG = textwrap.dedent("""
    [tool.gatekeeper]
    store = "store"
    precompile = "off"  # packages: tests/e2e/test_precompile.py

    [tool.gatekeeper.measure]
    min_time = 1.0

    # Wide timing thresholds: these tests check the mechanism end to end on a shared
    # 2-core machine (the slower version below does 3x the work); the detection rates at
    # 5-10% are measured by benchmarks/detection_power.py, not asserted here.
    [tool.gatekeeper.gate]
    latency_regression = 0.5
    speedup_regression = 0.5
    compile_time_regression = 1.0

    [[tool.gatekeeper.models]]
    name = "net"
    factory = "tinymodel:make"
    inputs = [{ shape = ["batch", 256] }]
    shapes = [{ batch = 64 }]
""")

TARGET = "net/b64/default"


def pr_version(body: str) -> str:
    """The base model with a new forward()."""
    head, found, _ = BASE_MODEL.partition("    def forward(self, x):")
    assert found
    return (
        head
        + textwrap.indent(textwrap.dedent(body).lstrip("\n"), " " * 4)
        + "\n\ndef make():\n    return Net()\n"
    )


# One OpenMP thread: on a 2-core runner, a second thread that the OS deschedules turns
# every parallel region into a scheduler quantum, and timings into noise.
QUIET = {"OMP_NUM_THREADS": "1"}


def run_gate(project: Path, *extra: str, env: dict | None = None) -> tuple[int, dict, str]:
    """``gatekeeper run --json --base-ref main`` on one thread: exit code, JSON, stderr."""
    proc = gk(
        "run", "--json", "--base-ref", "main", *extra, cwd=project, env={**QUIET, **(env or {})}
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def check_gate(project: Path, *extra: str, env: dict | None = None) -> tuple[int, dict, str]:
    """``check`` then ``gate --json``, both ``--base-ref main``, on one thread: gate's exit
    code and JSON, check's stderr. What ``run_gate`` says of a changed model, less ``run``'s
    compile stage (the worker compiles it for ``check``; run would compile it twice) and
    its re-measure of a borderline timing (for tests whose verdicts timing does not decide)."""
    env = {**QUIET, **(env or {})}
    check = gk("check", "--base-ref", "main", *extra, cwd=project, env=env)
    assert "Traceback" not in check.stderr, check.stderr
    assert check.returncode == 0, check.stderr
    gate = gk("gate", "--json", "--base-ref", "main", cwd=project, env=env)
    assert "Traceback" not in gate.stderr, gate.stderr
    assert gate.stdout.strip(), gate.stderr
    return gate.returncode, json.loads(gate.stdout), check.stderr


def measure_main_again(root: Path, runs: int = 2) -> None:
    """More pushes to main, each measured and published as its baseline: the history from
    which the gate learns this runner's drift between processes."""
    for _ in range(runs):
        for verb in (["check"], ["baseline", "--ref", "main"]):
            proc = gk(*verb, cwd=root, env=QUIET)
            assert proc.returncode == 0, proc.stderr


# -- a branch's history for bisect: a planted slowdown, numerics change, broken commit --

# the base model's timed rounds, short: the planted slowdown is large and clean
BISECT_CONFIG = CONFIG.replace("min_time = 1.0", "warmup = 2\nmin_time = 0.5")
# one more layer of work, the outputs the same (within any tolerance): +50-60% on 1 thread
SLOWER_STEP = """
    def forward(self, x):
        h = torch.relu(self.fc1(x))
        h = h + 1e-9 * torch.tanh(self.extra(h))
        return self.fc2(h)
"""


def git(root: Path, *args: str) -> str:
    proc = subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
        text=True,
    )
    return proc.stdout.strip()


def bisect_history(
    root: Path,
    commits: int,
    *,
    slower: int | None = None,
    numerics: int | None = None,
    broken: int | None = None,
    every_model: bool = False,
) -> list[str]:
    """A git repository of the base model: commit 0, then ``commits`` more, each
    changing a notes file (``every_model``: a comment at the end of the model's file
    too, so that each commit has a code hash and a bundle of its own), except: at
    ``slower`` the forward does a layer more work (same outputs); at ``numerics`` its
    outputs are scaled by 1.5; at ``broken`` the model file does not parse, and the
    commit after it repairs it. Returns the shas, oldest first."""
    write_project(root, BASE_MODEL, BISECT_CONFIG)
    (root / ".gitignore").write_text("store/\n")
    git(root, "init", "-q", "-b", "main")
    body, scale, shas = "", "", []
    for i in range(commits + 1):
        if i == slower:
            body = SLOWER_STEP
        if i == numerics:
            scale = " * 1.5"
        model = pr_version(body) if body else BASE_MODEL
        model = model.replace("return self.fc2(h)\n", f"return self.fc2(h){scale}\n")
        if i == broken:
            model = model.replace("def forward(self, x):", "def forward(self, x:")
        if every_model:
            model += f"# commit {i}\n"
        (root / "tinymodel.py").write_text(model)
        (root / "NOTES").write_text(f"commit {i}\n")
        git(root, "add", "-A")
        what = {slower: "slower", numerics: "numerics", broken: "broken"}.get(i, "notes")
        git(root, "commit", "-qm", f"c{i} {what}")
        shas.append(git(root, "rev-parse", "HEAD"))
    return shas
