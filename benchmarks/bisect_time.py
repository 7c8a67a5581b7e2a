"""How long does ``gatekeeper bisect`` take, against the number of commits in the range,
with and without the commits' bundles in the store?

For each count (8 and 32 by default), a scratch git repository of the tests' base model
(tests/support/projects.py, ``bisect_history``): commit 0, then that many commits, each
changing the model's file (a comment: every commit has a code hash and a bundle of its
own), one of them (at 60% of the range) scaling the outputs: a numerics change. Then,
timed, from a fresh ``--out`` each time:

    no bundles   an empty store: bisect compiles the good commit and each commit it
                 measures, each seeded from its nearest measured neighbour's bundle
    bundles      the store holds every commit's bundle (``gatekeeper compile`` at each
                 commit beforehand, not timed): each measurement warm-starts

``gatekeeper bisect --good <c0> --bad <cN> --metric parity``: parity decides each step
without timing noise, so the count of measurements is the search's own (bad, then
ceil(log2 N), then the culprit against its parent); ``--metric latency`` times the
planted step's rounds as well (the config's ``min_time``, 0.5 s here). Wall time of the
whole command, the commits it measured, and the time per measurement. Usage, from the
repo root:

    python benchmarks/bisect_time.py [--commits 8 32] [--metric parity] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from support.projects import bisect_history, git  # noqa: E402

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # one thread, as the tests measure


def gatekeeper(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "gatekeeper", *args],
        cwd=cwd,
        env=ENV,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    if proc.returncode not in (0, 1):
        raise SystemExit(f"gatekeeper {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return proc


def compile_every_commit(root: Path, shas: list[str], store: Path) -> None:
    """Each commit's bundle into ``store`` (a worktree per commit, then removed)."""
    for sha in shas:
        tree = root.parent / f"tree-{sha[:12]}"
        git(root, "worktree", "add", "--detach", str(tree), sha)
        try:
            gatekeeper("compile", "--store", str(store), cwd=tree)
        finally:
            git(root, "worktree", "remove", "--force", str(tree))


def one(commits: int, bundles: bool, metric: str, work: Path) -> dict:
    root = work / f"repo-{commits}-{'b' if bundles else 'n'}"
    step = max(1, round(commits * 0.6))
    shas = bisect_history(root, commits, numerics=step, slower=step, every_model=True)
    store = work / f"store-{commits}-{'b' if bundles else 'n'}"
    if bundles:
        compile_every_commit(root, shas, store)
    start = time.perf_counter()
    proc = gatekeeper(
        "bisect", "--good", shas[0], "--bad", shas[-1], "--metric", metric,
        "--store", str(store), "--out", str(work / f"out-{root.name}"), "--json",
        *(["--min-effect", "20"] if metric == "latency" else []),
        cwd=root,
    )  # fmt: skip
    wall = time.perf_counter() - start
    (t,) = json.loads(proc.stdout)["targets"]
    found = (t["culprit"] or {}).get("sha")
    measured = len(t["tested"]) + len(t["skipped"])
    confirm = t["culprit"] is not None and t["culprit"]["index"] != 1
    return {
        "commits": commits,
        "bundles": bundles,
        "found": found == shas[step],
        "measured": measured,
        "confirm": confirm,
        "wall_s": wall,
        "per_measurement_s": wall / (measured + confirm),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--commits", type=int, nargs="+", default=[8, 32])
    p.add_argument("--metric", choices=("parity", "latency"), default="parity")
    p.add_argument("--json", type=Path, help="write the rows here too")
    a = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="gk-bisect-bench-") as tmp:
        for commits in a.commits:
            for bundles in (False, True):
                row = one(commits, bundles, a.metric, Path(tmp))
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    print(
        tabulate(
            [
                [
                    r["commits"],
                    "yes" if r["bundles"] else "no",
                    f"{r['measured']} + 1" if r["confirm"] else r["measured"],
                    "yes" if r["found"] else "NO",
                    f"{r['wall_s']:.0f} s",
                    f"{r['per_measurement_s']:.1f} s",
                ]
                for r in rows
            ],
            headers=[
                "commits",
                "bundles in the store",
                "measured (+ culprit vs parent)",
                "culprit found",
                "wall time",
                "per measurement",
            ],
            tablefmt="github",
        )
    )
    if a.json:
        a.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
