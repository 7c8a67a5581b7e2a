"""How often does the gate flag a slowdown, and how often does it cry wolf?

A model with a knob that adds x% of extra work (one more tanh(Linear) layer of 20 per 5%)
is measured as main's baseline (by default three pushes, so the baseline knows the
runner's drift between processes); then each gate trial runs `gatekeeper run` in new
processes, as CI does, at 0%, 5%, 10% and 20% slowdown, in two modes:

    stored  the PR is measured alone and gated against the stored baseline of main
    paired  `--paired main`: main's code is checked out in a git worktree and measured
            round by round with the PR's in the same process

Prints, per mode and level: the share of trials flagged `regressed`, the median Δ% the
gate measured, and the time per trial. Usage, from the repo root:

    python benchmarks/detection_power.py [--trials 20] [--levels 0,5,10,20]
                                         [--modes stored,paired] [--min-time 10]

``--levels 0:60,5:20,10:60,20:20`` runs 60 trials at 0% and 10% and 20 at 5% and 20%
(a level without ``:N`` takes ``--trials``).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from tabulate import tabulate

MODEL = textwrap.dedent('''
    import torch
    from torch import nn

    SLOWDOWN = {slowdown}  # percent of extra work

    class Net(nn.Module):
        def __init__(self, width=256, layers=20):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
            self.extra = nn.Linear(width, width)

        def forward(self, x):
            for layer in self.layers:
                x = torch.tanh(layer(x))
            y = x
            for _ in range(round(SLOWDOWN * len(self.layers) / 100)):
                y = torch.tanh(self.extra(y))
            return x + 1e-12 * y

    def make():
        return Net()
''')

CONFIG = textwrap.dedent('''
    [tool.gatekeeper]
    store = "store"

    [tool.gatekeeper.measure]
    min_time = {min_time}
    max_samples = 100000

    [[tool.gatekeeper.models]]
    name = "knob"
    factory = "knob_model:make"
    inputs = [{{ shape = ["batch", 256] }}]
    shapes = [{{ batch = 32 }}]
''')


def sh(*cmd: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)
    if check and proc.returncode not in (0, 1):
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return proc


def gk(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return sh(sys.executable, "-m", "gatekeeper", *args, cwd=cwd)


def set_slowdown(repo: Path, pct: int) -> None:
    (repo / "knob_model.py").write_text(MODEL.format(slowdown=pct))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--levels", default="0,5,10,20",
                    help="slowdowns in percent, each optionally with its own trial count "
                         "(0:60,10:60,5:20)")
    ap.add_argument("--modes", default="stored,paired")
    ap.add_argument("--min-time", type=float, default=10.0,
                    help="seconds of timed rounds per measurement (measure.min_time)")
    ap.add_argument("--baseline-runs", type=int, default=3,
                    help="pushes to main measured before the trials (baseline history)")
    ap.add_argument("--json", metavar="PATH", help="also write every trial here")
    args = ap.parse_args()
    counts = {int(pct): int(n or args.trials)
              for pct, _, n in (x.partition(":") for x in args.levels.split(","))}
    levels = list(counts)
    modes = args.modes.split(",")

    repo = Path(tempfile.mkdtemp(prefix="gk-detect-"))
    (repo / "gatekeeper.toml").write_text(CONFIG.format(min_time=args.min_time))
    set_slowdown(repo, 0)
    for cmd in (["init", "-q", "-b", "main"], ["add", "."],
                ["-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-qm",
                 "base"]):
        sh("git", *cmd, cwd=repo)
    print(f"work dir {repo}; baseline of main", file=sys.stderr)
    gk("compile", cwd=repo)
    for _ in range(args.baseline_runs):  # main's history: the runner's drift between runs
        gk("check", "--out", "base", cwd=repo)
        gk("baseline", "--results", "base/results.json", "--ref", "main", cwd=repo)

    trials: list[dict] = []
    for pct in levels:
        set_slowdown(repo, pct)
        gk("compile", cwd=repo)  # each trial then starts warm, as a PR's CI does
        for mode in modes:
            for n in range(counts[pct]):
                extra = ["--paired", "main"] if mode == "paired" else []
                start = time.monotonic()
                proc = gk("run", "--json", "--base-ref", "main", "--out", f"trial/{mode}",
                          *extra, cwd=repo)
                took = time.monotonic() - start
                doc = json.loads(proc.stdout)
                (t,) = doc["targets"]
                lat = t.get("latency") or {}
                trial = {"mode": mode, "slowdown": pct, "trial": n, "verdict": t["verdict"],
                         "delta": lat.get("delta"), "remeasured": t.get("remeasured"),
                         "seconds": took}
                trials.append(trial)
                delta = "-" if trial["delta"] is None else f"{trial['delta']:+.1%}"
                print(f"{mode} {pct}% #{n + 1}: {t['verdict']} Δ {delta} ({took:.0f} s)",
                      file=sys.stderr)
    set_slowdown(repo, 0)

    rows = []
    for mode in modes:
        for pct in levels:
            ts = [t for t in trials if t["mode"] == mode and t["slowdown"] == pct]
            flagged = sum(t["verdict"] == "regressed" for t in ts)
            deltas = [t["delta"] for t in ts if t["delta"] is not None]
            rows.append([mode, f"{pct}%", len(ts), f"{flagged}/{len(ts)}",
                         f"{flagged / len(ts):.0%}",
                         f"{statistics.median(deltas):+.1%}" if deltas else "-",
                         f"{statistics.median(t['seconds'] for t in ts):.0f} s",
                         sum(bool(t["remeasured"]) for t in ts)])
    print(tabulate(rows, headers=["mode", "slowdown", "trials", "flagged", "share",
                                  "median Δ", "time/trial", "re-measured"]))
    print(f"\nmeasure.min_time = {args.min_time} s per measurement; 2 CPU cores; "
          f"torch via {sys.executable}")
    if args.json:
        Path(args.json).write_text(json.dumps(trials, indent=2))


if __name__ == "__main__":
    main()
