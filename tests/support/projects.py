"""The e2e tests' shared project: a base model and its config, and PR versions of it."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from support.helpers import gk

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


def measure_main_again(root: Path, runs: int = 2) -> None:
    """More pushes to main, each measured and published as its baseline: the history from
    which the gate learns this runner's drift between processes."""
    for _ in range(runs):
        for verb in (["check"], ["baseline", "--ref", "main"]):
            proc = gk(*verb, cwd=root, env=QUIET)
            assert proc.returncode == 0, proc.stderr
