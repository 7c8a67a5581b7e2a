"""Distributed targets, per rank: the cold compile, the warm first call a deploy sees,
and the spread of a check's timed rounds.

A scratch project of the tests' three 2-rank models (tests/support/distributed.py: a
DDP training step, a tensor-parallel MLP, an FSDP2 forward; gloo on CPU, nccl on CUDA).
In order, each a fresh ``gatekeeper`` process:

    compile        cold, into an empty store: each rank's first compiled call, from the
                   bundle's manifest (``compile.distributed.seconds``)
    warm --probe   the bundle restored, the first call made on every rank: each rank's
                   first call and FX cache hits/misses
    check          the timed rounds: the target's p50 (each round's slowest rank), each
                   rank's own p50 (wall and CPU per call) and the rounds it was slowest in

Usage, from the repo root:

    python benchmarks/distributed.py [--min-time 2] [--json out.json]
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

from support.distributed import CONFIG, MODELS, TARGETS  # noqa: E402

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # one thread per rank, as the tests measure


def gatekeeper(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "gatekeeper", *args],
        cwd=cwd,
        env=ENV,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    if proc.returncode != 0:
        raise SystemExit(f"gatekeeper {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return proc, time.perf_counter() - start


def manifest(root: Path, target: str) -> dict:
    (found,) = (root / "store" / "bundles" / target).rglob("manifest.json")
    return json.loads(found.read_text())


def measure(root: Path) -> dict:
    _, compile_wall = gatekeeper("compile", "--json", cwd=root)
    probe, warm_wall = gatekeeper("warm", "--probe", "--json", cwd=root)
    gatekeeper("check", "--json", cwd=root)
    results = {t["target"]: t for t in json.loads((root / "results.json").read_text())["targets"]}
    probes = {t["target"]: t for t in json.loads(probe.stdout)["targets"]}
    out = {"compile_wall_s": compile_wall, "warm_probe_wall_s": warm_wall, "targets": {}}
    for target in TARGETS:
        info = manifest(root, target)["compile"]["distributed"]
        r = results[target]
        out["targets"][target] = {
            "cold_first_call_s": info["seconds"],
            "shared_files": len(info["shared"]),
            "own_files": {k: len(v) for k, v in info["ranks"].items()},
            "warm": probes[target]["ranks"],
            "p50_s": r["latency"]["compiled"]["p50"],
            "ranks": r["ranks"],
        }
    return out


def report(doc: dict) -> str:
    compile_rows, spread_rows = [], []
    for target, t in doc["targets"].items():
        for warm in t["warm"]:
            rank = str(warm["rank"])
            cold = t["cold_first_call_s"][rank]
            compile_rows.append(
                [
                    target,
                    rank,
                    f"{cold:.2f}",
                    f"{warm['first_call_seconds']:.2f}",
                    f"{cold / warm['first_call_seconds']:.1f}x",
                    f"{warm['fxgraph_cache_hit']}/{warm['fxgraph_cache_miss']}",
                    f"{t['shared_files']} + {t['own_files'][rank]}",
                ]
            )
        for r in t["ranks"]:
            spread_rows.append(
                [
                    target,
                    r["rank"],
                    f"{t['p50_s'] * 1e3:.3f}",
                    f"{r['latency_p50'] * 1e3:.3f}",
                    f"{r['cpu_p50'] * 1e3:.3f}",
                    r["slowest_rounds"],
                ]
            )
    first = tabulate(
        compile_rows,
        [
            "target",
            "rank",
            "cold first call s",
            "warm first call s",
            "speedup",
            "FX hits/misses",
            "files shared + own",
        ],
        tablefmt="github",
    )
    second = tabulate(
        spread_rows,
        [
            "target",
            "rank",
            "target p50 ms (slowest rank per round)",
            "rank p50 ms",
            "rank CPU p50 ms",
            "slowest in rounds",
        ],
        tablefmt="github",
    )
    walls = (
        f"compile (3 targets, cold) {doc['compile_wall_s']:.1f} s, "
        f"warm --probe (3 targets) {doc['warm_probe_wall_s']:.1f} s"
    )
    return f"{first}\n\n{second}\n\n{walls}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--min-time", type=float, default=2.0, help="measure.min_time")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gk-dist-bench-") as tmp:
        root = Path(tmp)
        (root / "distmodels.py").write_text(MODELS)
        (root / "gatekeeper.toml").write_text(
            CONFIG.replace("min_time = 1.0", f"min_time = {args.min_time}")
        )
        doc = measure(root)
    print(report(doc))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
