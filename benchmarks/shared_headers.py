"""What sharing inductor's precompiled C++ headers saves (GATEKEEPER_PCH_DIR).

Runs ``gatekeeper compile`` of a tiny two-layer model, each time in a fresh project
and store (a cold compile), alternating: each worker's own header
(``GATEKEEPER_PCH_DIR=off``) and one shared folder (its first use builds the header, by
gatekeeper's header worker, the rest reuse it). Prints each
run's wall time, the compile time gatekeeper reports and the CPU time of the process
tree, then the medians of each side and their ratio.

    python benchmarks/shared_headers.py --rounds 3
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

MODEL = textwrap.dedent("""
    import torch
    from torch import nn

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(16, 32)
            self.fc2 = nn.Linear(32, 4)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))

    def make():
        return Tiny()
""")

CONFIG = textwrap.dedent("""
    [tool.gatekeeper]
    store = "store"
    precompile = "off"

    [[tool.gatekeeper.models]]
    name = "tiny"
    factory = "tinymodel:make"
    inputs = [{ shape = ["batch", 16] }]
    shapes = [{ batch = 4 }]
""")


def compile_once(pch: str | None) -> tuple[float, float, float]:
    """One cold ``gatekeeper compile``: (wall s, reported compile s, CPU s)."""
    root = Path(tempfile.mkdtemp(prefix="gk-pch-"))
    (root / "tinymodel.py").write_text(MODEL)
    (root / "gatekeeper.toml").write_text(CONFIG)
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["GATEKEEPER_PCH_DIR"] = pch or "off"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "gatekeeper", "compile"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"gatekeeper compile exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    found = re.search(r"published, ([0-9.]+) s", proc.stderr)
    reported = float(found.group(1)) if found else float("nan")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, reported, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="compiles per side")
    args = parser.parse_args()
    shared = tempfile.mkdtemp(prefix="gk-pch-shared-")
    compile_once(shared)  # the shared folder's first use builds its header
    rows: dict[str, list[tuple[float, float, float]]] = {"own": [], "shared": []}
    for i in range(args.rounds):
        for side in ("own", "shared"):
            wall, reported, cpu = compile_once(shared if side == "shared" else None)
            rows[side].append((wall, reported, cpu))
            print(f"{i + 1} {side:6} wall {wall:6.1f} s  compile {reported:6.1f} s", end="")
            print(f"  cpu {cpu:6.1f} s", flush=True)
    print("\n| header | wall | compile (reported) | CPU |\n|---|---|---|---|")
    medians = {}
    for side, runs in rows.items():
        medians[side] = [statistics.median(col) for col in zip(*runs, strict=True)]
        wall, reported, cpu = medians[side]
        print(f"| {side} | {wall:.1f} s | {reported:.1f} s | {cpu:.1f} s |")
    ratios = [s / o for s, o in zip(medians["shared"], medians["own"], strict=True)]
    print(f"| shared / own | {ratios[0]:.2f} | {ratios[1]:.2f} | {ratios[2]:.2f} |")


if __name__ == "__main__":
    main()
