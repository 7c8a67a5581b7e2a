"""How often does the gate flag a slowdown, and how often does it cry wolf?

A model with a knob that makes it x% slower is measured as main's baseline; then each
trial runs `gatekeeper run` in new processes, as CI does, on a pull request branch at
0%, 5%, 10% and 20%, in a git repository whose main is the base:

    default  `gatekeeper run` with no mode flag, as the Action runs it: it pairs with
             main's commit (measured round by round with the PR in one process)
    stored   `--mode stored`: the PR measured alone against main's stored baseline

Two knobs make the model slower:

    compute  more elementwise work fused into one kernel: no more FLOPs and no more
             bytes accessed, so only timing can see it (the test of timing detection);
             a chain of sines, sized on this machine before each level (`calibrate`)
             or given with --sines. With --device cuda the chain runs over a buffer of
             --work elements that base and head both read (on the model's 32x256
             activations it would cost a GPU nothing next to a kernel launch), and
             its mean joins the output scaled by 1e-12: below float32's resolution, so
             the outputs stay as they were
    layers   more Linear+tanh layers (one of 20 per 5%): more FLOPs, which the
             deterministic work counters see without timing (stored mode, one run)

Prints, per mode and level: trials, how many were flagged `regressed` (by any rule, by
latency, by the work counters), how many were `inconclusive`, the median Δ the latency
test measured, seconds of timed rounds per target, and seconds per trial. Usage:

    python benchmarks/detection_power.py [--levels 0:100,10:60,5:20,20:20]
        [--modes default,stored] [--knob compute|layers] [--baseline-runs 1] [--threads N]
        [--sines 5:14,10:23,20:42] [--calibration 3:8] [--json PATH] [--samples PATH]
        [--device cpu|cuda] [--work 1048576]
    python benchmarks/detection_power.py --from-json PATH [PATH ...]

`--json` writes every trial as it ends, so a run stopped early keeps what it measured;
`--samples` writes each paired trial's base and head samples (tests/data/paired_samples.json
was recorded so, for tests/gate/test_detection_power.py);
`--from-json` prints one table of such files (a row per thread count, mode and level).

A level without ``:N`` takes ``--trials``. Measurement settings are the defaults unless
``--min-time`` is given.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from tabulate import tabulate

MODEL = textwrap.dedent("""
    import torch
    from torch import nn

    SLOWDOWN = {slowdown}  # percent
    KNOB = "{knob}"
    SINES = {sines}  # the compute knob's chain, calibrated to SLOWDOWN on this machine
    WORK = {work}  # elements the chain runs over (0: the activations)

    class Net(nn.Module):
        def __init__(self, width=256, layers=20):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
            self.extra = nn.Linear(width, width)
            if WORK:
                self.register_buffer("work", torch.linspace(-1, 1, WORK))

        def forward(self, x):
            for layer in self.layers:
                x = torch.tanh(layer(x))
            y = self.work if WORK else x
            if KNOB == "layers":  # one more layer per 5%: more FLOPs
                for _ in range(round(SLOWDOWN * len(self.layers) / 100)):
                    y = torch.tanh(self.extra(y))
            else:  # elementwise work fused into one kernel: same FLOPs and bytes
                for _ in range(SINES):
                    y = torch.sin(y) + 0.5
            return x + 1e-12 * (y.mean() if WORK else y)

    def make():
        return Net()
""")

CONFIG = textwrap.dedent("""
    [tool.gatekeeper]
    store = "store"
    {measure}
    [[tool.gatekeeper.models]]
    name = "knob"
    factory = "knob_model:make"
    inputs = [{{ shape = ["batch", 256] }}]
    shapes = [{{ batch = 32 }}]
    device = "{device}"
""")


ENV = dict(os.environ)  # of every command run; --threads sets OMP_NUM_THREADS here


def sh(*cmd: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL, env=ENV
    )
    if check and proc.returncode not in (0, 1):
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return proc


def gk(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return sh(sys.executable, "-m", "gatekeeper", *args, cwd=cwd)


def git(repo: Path, *args: str) -> None:
    sh("git", "-c", "user.name=bench", "-c", "user.email=bench@localhost", *args, cwd=repo)


DEVICE = {"device": "cpu", "work": 0}  # --device, --work


def model_text(pct: int, knob: str, sines: int = 0) -> str:
    return MODEL.format(slowdown=pct, knob=knob, sines=sines, work=DEVICE["work"])


def set_slowdown(repo: Path, pct: int, knob: str, sines: int = 0) -> None:
    (repo / "knob_model.py").write_text(model_text(pct, knob, sines))


# The compute knob's cost per sine depends on the CPU, the thread count and the moment:
# 40 sines read +8.5% with 2 threads on one 2-core machine and +16% on another, and 16
# sines with 1 thread read +12% at one hour and +6.5% an hour later on the same idle
# machine (the 20 layers' weights streamed slower, the sines did not). So the chain is
# sized on the machine at hand, with torch's threads as set, right before each level's
# trials: each calibration process compiles the model with 0 sines (the base) and with
# each grid count, and times base and head in rounds as paired mode does (base and head
# first and second, swapping every round, then an eager copy of the head and a small
# reference workload), with plain perf_counter loops (not gatekeeper's timing); it
# reports each count's slowdown, the geometric mean of the per-round ratios.
CALIBRATE = textwrap.dedent("""
    import copy, math, statistics, sys, time
    import torch
    sys.path.insert(0, sys.argv[1])
    grid = [int(n) for n in sys.argv[2].split(",")]
    seconds = float(sys.argv[3]) / len(grid)
    device = sys.argv[4]
    x = torch.randn(32, 256).to(device)
    rx, rw = torch.randn(128, 128).to(device), (torch.randn(128, 128) / 12).to(device)

    def make(n):
        torch.manual_seed(0)
        return __import__(f"knob_{n}").make().to(device)

    def reference():
        y = rx
        for _ in range(4):
            y = torch.tanh(y @ rw)

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    def sample(fn, loops=2):
        sync()
        start = time.perf_counter()
        for _ in range(loops):
            fn()
        sync()
        return time.perf_counter() - start

    with torch.no_grad():
        base = torch.compile(make(0))
        base(x), base(x)
        for n in grid:
            head_model = make(n)
            eager = copy.deepcopy(head_model)
            head = torch.compile(head_model)
            head(x), head(x), eager(x)
            fns = {"base": lambda: base(x), "head": lambda: head(x), "eager": lambda: eager(x)}
            ratios, end, k = [], time.perf_counter() + seconds, 0
            while time.perf_counter() < end or k < 10:
                order = ["base", "head"] if k % 2 == 0 else ["head", "base"]
                took = {name: sample(fns[name]) for name in (*order, "eager")}
                sample(reference, 4)
                ratios.append(math.log(took["head"] / took["base"]))
                k += 1
            print(n, math.expm1(statistics.fmean(ratios)) * 100)
""")

GRID = (16, 32, 64, 128)  # sines; 128 read +27% to +60% on the machines we had
# CUDA, over --work elements: a sine costs ~1 ns per 1k elements on an H100-class GPU,
# against a 20-layer model that takes a few hundred microseconds (launch-bound)
GRID_CUDA = (8, 32, 128, 512)


def calibrate(level: int, processes: int, seconds: float) -> int:
    """The number of sines that makes the model ``level`` percent slower on this machine
    now: the grid's median slowdown over ``processes`` calibration processes, made
    monotone, interpolated linearly (from 0 sines at 0%); a level beyond the grid's
    largest is extrapolated from its last two points, with a warning."""
    work = Path(tempfile.mkdtemp(prefix="gk-calibrate-"))
    sizes = GRID_CUDA if DEVICE["device"] == "cuda" else GRID
    for n in (0, *sizes):
        (work / f"knob_{n}.py").write_text(model_text(0, "compute", n))
    runs: dict[int, list[float]] = {n: [] for n in sizes}
    grid = ",".join(map(str, sizes))
    for i in range(processes):
        out = sh(
            sys.executable,
            "-c",
            CALIBRATE,
            str(work),
            grid,
            str(seconds),
            DEVICE["device"],
            cwd=work,
        )
        for line in out.stdout.splitlines():
            n, pct = line.split()
            runs[int(n)].append(float(pct))
        read = ", ".join(f"{n} sines {runs[n][-1]:+.1f}%" for n in sizes)
        print(f"calibration {i + 1}/{processes}: {read}", file=sys.stderr)
    points = [(0, 0.0)]
    for n in sizes:
        points.append((n, max(points[-1][1], statistics.median(runs[n]))))
    (n0, p0), (n1, p1) = next(
        (pair for pair in itertools.pairwise(points) if pair[1][1] >= level), points[-2:]
    )
    if p1 < level:
        print(
            f"calibration: {level}% lies beyond {n1} sines ({p1:+.1f}%), extrapolated",
            file=sys.stderr,
        )
    slope = (p1 - p0) / (n1 - n0) if p1 > p0 else max(p1, 1e-3) / n1
    return max(1, round(n0 + (level - p0) / slope))


def halves(result: dict) -> list[float] | None:
    """Paired: the Δ of each half of the timed rounds (the geometric mean of its
    rounds' head/base ratios, less 1). Each half starts on frames compiled again, the
    head first for the first and the base first for the second, so an order effect
    shows as halves of opposite sign, and what is left of it as their mean."""
    try:
        head, base = result["latency"]["samples"]["compiled"], result["paired"]["samples"]
    except (KeyError, TypeError):
        return None
    logs = [math.log(h / b) for h, b in zip(head, base, strict=True)]
    mid = len(logs) // 2
    return [math.expm1(statistics.fmean(part)) for part in (logs[:mid], logs[mid:])]


def paired_samples(result: dict) -> dict | None:
    """A paired trial's samples as the gate compares them: the base commit's and the
    head's compiled seconds per call, round by round (index i of each is one round),
    rounded to 6 significant digits; None for a trial not measured paired."""
    try:
        head, base = result["latency"]["samples"]["compiled"], result["paired"]["samples"]
    except (KeyError, TypeError):
        return None
    return {"base": [float(f"{x:.6g}") for x in base], "head": [float(f"{x:.6g}") for x in head]}


def level_map(text: str, default: int) -> dict[int, int]:
    """``"0:100,10:60,5"`` as {0: 100, 10: 60, 5: default}."""
    return {int(a): int(b or default) for a, _, b in (x.partition(":") for x in text.split(","))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument(
        "--levels",
        default="0,5,10,20",
        help="slowdowns in percent, each optionally with its own trial count (0:100,10:60,5:20)",
    )
    ap.add_argument("--modes", default="default,stored")
    ap.add_argument("--knob", choices=("compute", "layers"), default="compute")
    ap.add_argument(
        "--min-time",
        type=float,
        help="seconds of timed rounds per measurement (default: the config's "
        "default, measure.min_time)",
    )
    ap.add_argument(
        "--baseline-runs",
        type=int,
        default=1,
        help="pushes to main measured before the trials (baseline history)",
    )
    ap.add_argument(
        "--threads",
        type=int,
        help="torch's CPU threads in every process (OMP_NUM_THREADS; default: torch's own)",
    )
    ap.add_argument(
        "--sines",
        metavar="LEVEL:N,...",
        help="the compute knob's sines per level (5:12,10:25,20:52) instead of calibrating",
    )
    ap.add_argument(
        "--calibration",
        metavar="PROCESSES:SECONDS",
        default="3:8",
        help="calibration processes, and seconds of timed rounds in each (default 3:8)",
    )
    ap.add_argument("--json", metavar="PATH", help="also write every trial here, as each one ends")
    ap.add_argument(
        "--samples",
        metavar="PATH",
        help="also write each trial's paired samples here (base and head compiled "
        "seconds per round, as the gate compares them), as each one ends",
    )
    ap.add_argument(
        "--budget",
        type=float,
        metavar="SECONDS",
        help="per level: start no trial after this many seconds of its trials (a lent "
        "GPU's call is limited); the trials done are kept",
    )
    ap.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where the model runs (the config's device)",
    )
    ap.add_argument(
        "--work",
        type=int,
        help="elements of the buffer the compute knob's sines run over (default: 0 on "
        "cpu, the activations; 1048576 on cuda)",
    )
    ap.add_argument(
        "--from-json",
        metavar="PATH",
        nargs="+",
        help="run nothing: print one table of the trials that runs wrote with --json",
    )
    args = ap.parse_args()
    if args.from_json:
        trials = [t for path in args.from_json for t in json.loads(Path(path).read_text())]
        print_table(trials)
        print(f"\n{len(trials)} trials read from {', '.join(args.from_json)}")
        return
    if args.threads:
        ENV["OMP_NUM_THREADS"] = str(args.threads)
    DEVICE.update(
        device=args.device,
        work=args.work if args.work is not None else (1 << 20 if args.device == "cuda" else 0),
    )
    counts = level_map(args.levels, args.trials)
    modes = args.modes.split(",")
    sines = level_map(args.sines, 0) if args.sines else {}
    processes, _, seconds = args.calibration.partition(":")

    repo = Path(tempfile.mkdtemp(prefix="gk-detect-"))
    measure = f"[tool.gatekeeper.measure]\nmin_time = {args.min_time}\n" if args.min_time else ""
    (repo / "gatekeeper.toml").write_text(CONFIG.format(measure=measure, device=args.device))
    (repo / ".gitignore").write_text("store/\nbase/\ntrial/\n")
    set_slowdown(repo, 0, args.knob)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "base")
    print(f"work dir {repo}; baseline of main ({args.knob} knob)", file=sys.stderr)
    gk("compile", cwd=repo)
    for _ in range(args.baseline_runs):
        gk("check", "--mode", "stored", "--out", "base", cwd=repo)
        gk("baseline", "--results", "base/results.json", "--ref", "main", cwd=repo)
    git(repo, "checkout", "-qb", "pr")

    trials: list[dict] = []
    kept: list[dict] = []  # --samples
    for pct, n_trials in counts.items():
        if args.knob == "compute":
            if pct and pct not in sines:  # sized right before its trials
                sines[pct] = calibrate(pct, int(processes), float(seconds))
            print(f"compute knob: {pct}% = {sines.get(pct, 0)} sines", file=sys.stderr)
        set_slowdown(repo, pct, args.knob, sines.get(pct, 0))
        git(repo, "commit", "-qam", f"pr {pct}%", "--allow-empty")
        gk("compile", cwd=repo)  # each trial then starts warm, as a PR's CI does
        deadline = time.monotonic() + (args.budget if args.budget is not None else math.inf)
        for mode in modes:
            for n in range(n_trials):
                if time.monotonic() > deadline:
                    print(f"--budget {args.budget:.0f} s spent: no more trials", file=sys.stderr)
                    break
                extra = ["--mode", "stored"] if mode == "stored" else []
                start = time.monotonic()
                proc = gk(
                    "run",
                    "--json",
                    "--base-ref",
                    "main",
                    "--out",
                    f"trial/{mode}",
                    *extra,
                    cwd=repo,
                )
                took = time.monotonic() - start
                (t,) = json.loads(proc.stdout)["targets"]
                results = json.loads((repo / f"trial/{mode}/results.json").read_text())
                (r,) = results["targets"]
                lat = t.get("latency") or {}
                disturbance = (r.get("latency") or {}).get("disturbance") or {}
                runs = (r.get("latency") or {}).get("runs") or [1]
                trial = {
                    "device": args.device,
                    "threads": args.threads,  # None: torch's own default
                    "knob": args.knob,
                    "mode": mode,
                    "decided_by": t.get("mode"),
                    "slowdown": pct,
                    "sines": sines.get(pct, 0) if args.knob == "compute" else None,
                    "trial": n,
                    "verdict": t["verdict"],
                    "delta": lat.get("delta"),
                    "ci": [lat.get("ci_lo"), lat.get("ci_hi")],
                    "latency_verdict": lat.get("verdict"),
                    "by_latency": any(
                        x.startswith("latency") and "(significant" in x for x in t["reasons"]
                    ),
                    "by_counters": any("FLOPs" in x or "bytes accessed" in x for x in t["reasons"]),
                    "remeasured": t.get("remeasured"),
                    "seconds": took,
                    "timed_seconds": (disturbance.get("seconds") or 0) * len(runs),
                    "disturbed": t.get("disturbed"),
                    "halves": halves(r),
                }
                trials.append(trial)
                if args.json:  # after every trial, so a run stopped early keeps what it measured
                    Path(args.json).write_text(json.dumps(trials, indent=2))
                if args.samples and (pair := paired_samples(r)):
                    kept.append({"slowdown": pct, "trial": n, "verdict": t["verdict"], **pair})
                    Path(args.samples).write_text(json.dumps(kept, indent=1) + "\n")
                delta = "-" if trial["delta"] is None else f"{trial['delta']:+.1%}"
                print(
                    f"{mode} {pct}% #{n + 1}: {t['verdict']} Δ {delta} "
                    f"({took:.0f} s{', disturbed' if trial['disturbed'] else ''})",
                    file=sys.stderr,
                )

    print_table(trials)
    over = f" over {DEVICE['work']} elements" if DEVICE["work"] else ""
    print(
        f"\nknob: {args.knob} on {args.device}{over}; "
        f"measure.min_time = {args.min_time or 'default'}; "
        f"threads: {args.threads or 'torch default'}; "
        f"{args.baseline_runs} baseline run(s) of main; torch via {sys.executable}"
    )


def print_table(trials: list[dict]) -> None:
    groups: dict[tuple, list[dict]] = {}  # (threads, mode, slowdown), in the order run
    for t in trials:
        groups.setdefault((t.get("threads"), t["mode"], t["slowdown"]), []).append(t)
    rows = []
    for (threads, mode, pct), ts in groups.items():
        flagged = sum(t["verdict"] == "regressed" for t in ts)
        deltas = [t["delta"] for t in ts if t["delta"] is not None]
        decided = sorted({t["decided_by"] for t in ts if t["decided_by"]})
        sines = sorted({t["sines"] for t in ts if t.get("sines") is not None})
        hs = [t["halves"] for t in ts if t.get("halves")]
        rows.append(
            [
                threads or "default",
                mode,
                "/".join(decided) or "-",
                f"{pct}%",
                "/".join(map(str, sines)) or "-",
                len(ts),
                f"{flagged}/{len(ts)} ({flagged / len(ts):.0%})",
                sum(t["by_latency"] for t in ts),
                sum(t["by_counters"] for t in ts),
                sum(t["verdict"] == "inconclusive" for t in ts),
                sum(t["verdict"] == "improved" for t in ts),
                f"{statistics.median(deltas):+.1%}" if deltas else "-",
                " / ".join(f"{statistics.median(h):+.1%}" for h in zip(*hs, strict=True))
                if hs
                else "-",
                f"{min(deltas):+.1%} to {max(deltas):+.1%}" if deltas else "-",
                f"{statistics.median(t['timed_seconds'] for t in ts):.0f} s",
                f"{statistics.median(t['seconds'] for t in ts):.0f} s",
                sum(bool(t["remeasured"]) for t in ts),
                sum(bool(t["disturbed"]) for t in ts),
            ]
        )
    print(
        tabulate(
            rows,
            headers=[
                "threads",
                "mode",
                "decided by",
                "slowdown",
                "sines",
                "trials",
                "regressed",
                "by latency",
                "by counters",
                "inconclusive",
                "improved",
                "median Δ",
                "halves",
                "Δ range",
                "timed/target",
                "time/trial",
                "re-measured",
                "disturbed",
            ],
        )
    )


if __name__ == "__main__":
    main()
