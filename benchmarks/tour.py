"""The whole pipeline on one config, as a user runs it, with the figures worth quoting:
compile -> warm (probe) -> check in several processes -> baseline -> a pull request's run.

In a throwaway git repository holding a copy of the config's folder (main = the copy):

1. `gatekeeper compile`: cold compile time and bundle size per target;
2. `gatekeeper warm --probe` into an empty cache dir: the first compiled call after a
   warm start, and the cold/warm ratio;
3. `gatekeeper check --mode stored`, N times (fresh processes): p50, speedup, peak
   memory, and how far the p50 moves between processes (the drift a stored baseline
   must pay for); the first is published as main's baseline;
4. `--pr paired` (default): a pull request branch that changes only a comment of each
   model file, `gatekeeper run` with no mode flag (as the Action runs it): it pairs with
   main, and unchanged code should pass. `--pr stored`: `gatekeeper gate` of the last
   check against the first one's baseline (no compile: cheaper on a lent GPU).

Usage: python benchmarks/tour.py --config examples/gatekeeper.toml [--target GLOB]...
           [--processes 3] [--min-time 5] [--pr paired|stored|none] [--json PATH]
The JSON file is rewritten after every stage, so a run cut short keeps what it measured.
Runs on CPU and on CUDA (device = "auto" in the config picks the GPU).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate


def sh(*cmd: str, cwd: Path, ok=(0, 1)) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode not in ok:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def gk(repo: Path, config: str, *args: str, targets: list[str]) -> dict:
    flags = [f"--target={t}" for t in targets]
    proc = sh(
        sys.executable, "-m", "gatekeeper", *args, "--config", config, *flags, "--json", cwd=repo
    )
    return json.loads(proc.stdout)


def git(repo: Path, *args: str) -> None:
    sh("git", "-c", "user.name=tour", "-c", "user.email=tour@localhost", *args, cwd=repo, ok=(0,))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--target", action="append", default=[])
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--min-time", type=float, default=5.0)
    ap.add_argument("--pr", choices=("paired", "stored", "none"), default="paired")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args()

    src = Path(args.config).resolve()
    repo = Path(tempfile.mkdtemp(prefix="gk-tour-"))
    shutil.copytree(
        src.parent,
        repo,
        dirs_exist_ok=True,
        ignore=shutil.ignore_patterns(".gatekeeper", "__pycache__"),
    )
    config = src.name
    text = (repo / config).read_text()
    (repo / config).write_text(text + f"\n[tool.gatekeeper.measure]\nmin_time = {args.min_time}\n")
    (repo / ".gitignore").write_text(".gatekeeper/\nout*/\nresults.json\nreport.*\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "main")

    def log(msg: str) -> None:
        print(f"[tour {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    state: dict = {"compiled": {}, "warm": {}, "runs": {}, "verdicts": {}}

    def stage(name: str) -> None:
        log(f"{name} done")
        if args.json:
            Path(args.json).write_text(json.dumps(state, indent=2, default=str))

    log(f"compile in {repo}")
    state["compiled"] = {
        t["target"]: t for t in gk(repo, config, "compile", targets=args.target)["targets"]
    }
    stage("compile")
    state["warm"] = {
        t["target"]: t
        for t in gk(
            repo,
            config,
            "warm",
            "--probe",
            "--cache-dir",
            str(repo / "warm-cache"),
            targets=args.target,
        )["targets"]
    }
    stage("warm --probe")
    runs: dict[str, list[dict]] = state["runs"]
    for n in range(args.processes):
        gk(repo, config, "check", "--mode", "stored", "--out", f"out{n}", targets=args.target)
        results = json.loads((repo / f"out{n}/results.json").read_text())
        for r in results["targets"]:
            r["latency"].pop("samples", None) if r.get("latency") else None
            runs.setdefault(r["target"], []).append(r)
        if n == 0:
            gk(
                repo,
                config,
                "baseline",
                "--results",
                "out0/results.json",
                "--ref",
                "main",
                targets=args.target,
            )
        stage(f"check #{n + 1}")

    if args.pr == "paired":
        git(repo, "checkout", "-qb", "pr")
        for py in sorted(repo.glob("*.py")):
            py.write_text(py.read_text() + "\n# a pull request that changes nothing\n")
        git(repo, "commit", "-qam", "pr")
        report = gk(
            repo, config, "run", "--base-ref", "main", "--out", "out-pr", targets=args.target
        )
    elif args.pr == "stored":
        report = gk(
            repo,
            config,
            "gate",
            "--results",
            f"out{args.processes - 1}/results.json",
            "--base-ref",
            "main",
            targets=args.target,
        )
    else:
        report = {"targets": []}
    state["verdicts"] = verdicts = {t["target"]: t for t in report["targets"]}
    stage(f"pull request ({args.pr})")
    compiled, warm = state["compiled"], state["warm"]

    rows, doc = [], []
    for target, rs in runs.items():
        ok = [r for r in rs if r["status"] == "ok"]
        if not ok:
            rows.append([target, "error: " + (rs[0].get("error") or "")[:60]])
            continue
        p50 = [r["latency"]["compiled"]["p50"] for r in ok]
        logs = [math.log(x) for x in p50]
        drift = statistics.stdev(logs) if len(logs) > 1 else None
        cold = compiled.get(target, {}).get("compile_seconds")
        first = warm.get(target, {}).get("first_call_seconds")
        mem = ok[0]["memory"]
        v = verdicts.get(target, {})
        entry = {
            "target": target,
            "device": ok[0]["device"],
            "cold_compile_s": cold,
            "warm_first_call_s": first,
            "p50_s": statistics.median(p50),
            "speedup": statistics.median(r["latency"]["speedup"] for r in ok),
            "peak_bytes": mem["compiled_peak_bytes"],
            "memory_kind": mem["kind"],
            "eager_peak_bytes": mem["eager_peak_bytes"],
            "p50_drift_between_processes": drift,
            "processes": len(ok),
            "pr_verdict": v.get("verdict"),
            "pr_mode": v.get("mode"),
            "pr_delta": (v.get("latency") or {}).get("delta"),
            "fx_hits_after_warm": warm.get(target, {}).get("fxgraph_cache_hit"),
        }
        doc.append(entry)
        rows.append(
            [
                target,
                ok[0]["device"],
                f"{cold:.1f} s" if cold else "-",
                f"{first:.2f} s" if first else "-",
                f"{cold / first:.1f}x" if cold and first else "-",
                f"{entry['p50_s'] * 1e3:.3f} ms",
                f"{entry['speedup']:.2f}x",
                f"{(mem['compiled_peak_bytes'] or 0) / 2**20:.1f} MiB ({mem['kind']})",
                f"{drift:.1%}" if drift is not None else "-",
                f"{v.get('verdict')} ({v.get('mode')}"
                + (f", {entry['pr_delta']:+.1%})" if entry["pr_delta"] is not None else ")"),
            ]
        )
    print(
        tabulate(
            rows,
            headers=[
                "target",
                "device",
                "cold compile",
                "warm first call",
                "cold/warm",
                "p50",
                "speedup",
                "peak memory",
                f"p50 sd over {args.processes} processes",
                "unchanged PR",
            ],
        )
    )
    print(f"\n{repo}; measure.min_time = {args.min_time} s; {sys.executable}")
    if args.json:
        Path(args.json).write_text(json.dumps({**state, "summary": doc}, indent=2, default=str))


if __name__ == "__main__":
    main()
