"""gatekeeper's own overheads, this checkout paired against another commit.

    python benchmarks/overhead.py --against REF [--rounds 5] [--warmup 1] [--quickstart]
    python benchmarks/overhead.py --against env:GATEKEEPER_FORKS=off

Checks REF out beside this checkout (a detached ``git worktree`` in a temporary folder,
run with this interpreter and its installed dependencies: ``PYTHONPATH`` names each
side's own ``gatekeeper`` package), or, with ``env:NAME=VALUE``, pairs this checkout
with itself run with that variable set; then measures both in one run, interleaved (each
round runs both sides, their order alternating), on the quick start's model
(``examples/quickstart/``), each command in a fresh scratch git repository and store:

- ``cli``: ``gatekeeper --help``, the CLI's start;
- ``key``: ``gatekeeper key``, which starts one worker in its box to build the model;
- ``compile``: a cold ``gatekeeper compile`` (wall and CPU seconds of the process tree);
- ``check``: ``gatekeeper check`` after it (stored mode: no base commit to pair with),
  and from its ``results.json`` the compile seconds it reports and its worker's peak
  resident set (``peak MiB``: n/a where a side does not record it);
- ``warm``: ``gatekeeper warm --probe`` into an empty cache dir, and ``first call``,
  the first compiled call of a fresh process on it (the probe's own figure);
- ``quickstart`` (``--quickstart``): each side's ``examples/quickstart.py``, whole.

Warm-up rounds (``--warmup``, not counted) leave each side's machine-level state as a
machine that ran it before has it (its precompiled C++ headers, the torch facts it
remembers). Prints each figure's medians and the ratio this checkout / REF, with a 95%
bootstrap interval over the rounds' paired ratios (scipy). Exit 0; 1 with
``--fail-above X`` when a figure's whole interval lies above X (the scheduled workflow,
workflows/overhead.yml, fails then); 2 when a command fails. Run it on an otherwise
idle machine: the ratios are paired, the absolute figures are this machine's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ROOT / "examples" / "quickstart"
Figures = dict[str, float]


def fail(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
    sys.exit(2)


def run(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, str]:
    """(wall s, CPU s of the process tree, stdout) of one command, which must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        fail(f"overhead: {' '.join(cmd[2:])} exited {proc.returncode} in {cwd}: {tail}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout


def scratch_project(work: Path) -> Path:
    """The quick start's project in a new git repository (commands record its commit)."""
    repo = Path(tempfile.mkdtemp(dir=work, prefix="p-"))
    for f in PROJECT.iterdir():
        if f.is_file():
            shutil.copy(f, repo / f.name)
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "quick start"]):
        subprocess.run(
            ["git", "-c", "user.name=o", "-c", "user.email=o@o", *args],
            cwd=repo,
            check=True,
            capture_output=True,
        )
    return repo


class Side:
    """One gatekeeper: its source tree, run with this interpreter."""

    def __init__(self, name: str, tree: Path, work: Path, extra: dict[str, str]) -> None:
        self.name, self.tree, self.work = name, tree, work
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("GITHUB_", "GATEKEEPER_")) and k != "PYTHONPATH"
        }
        self.env["PYTHONPATH"] = str(tree)
        self.env.update(extra)

    def gk(self, repo: Path, *args: str) -> tuple[float, float, str]:
        return run([sys.executable, "-m", "gatekeeper", *args], repo, self.env)

    def measure(self, quickstart: bool) -> Figures:
        repo = scratch_project(self.work)
        out: Figures = {}
        out["cli"] = run([sys.executable, "-m", "gatekeeper", "--help"], repo, self.env)[0]
        out["key"] = self.gk(repo, "key", "--json")[0]
        out["compile"], out["compile CPU"], _ = self.gk(repo, "compile", "--json")
        out["check"], out["check CPU"], _ = self.gk(
            repo, "check", "--mode", "stored", "--json", "--out", "main"
        )
        result = json.loads((repo / "main" / "results.json").read_text())["targets"][0]
        out["check compile s"] = float((result.get("compile") or {}).get("seconds", "nan"))
        peak = (result.get("memory") or {}).get("process_peak_bytes")
        out["check peak MiB"] = peak / 2**20 if peak else float("nan")
        wall, _, text = self.gk(repo, "warm", "--probe", "--cache-dir", "deploy", "--json")
        out["warm"] = wall
        first = json.loads(text)["targets"][0].get("first_call_seconds")
        if first is None:
            fail(f"overhead: {self.name}: warm --probe made no first call: {text[-300:]}")
        out["first call"] = first
        if quickstart:
            where = Path(tempfile.mkdtemp(dir=self.work, prefix="qs-"))
            script = [sys.executable, str(self.tree / "examples" / "quickstart.py")]
            out["quickstart"] = run([*script, "--dir", str(where)], self.tree, self.env)[0]
        return out


def interval(ratios: list[float]) -> tuple[float, float]:
    """A 95% bootstrap interval of the median paired ratio (over the rounds)."""
    import numpy as np
    from scipy.stats import bootstrap

    if len(set(ratios)) < 2:
        return ratios[0], ratios[0]
    logs = np.log(np.asarray(ratios))
    res = bootstrap((logs,), np.median, method="percentile", random_state=0, n_resamples=2000)
    return float(np.exp(res.confidence_interval.low)), float(np.exp(res.confidence_interval.high))


def table(ref: str, rows: dict[str, list[Figures]], above: float | None) -> tuple[str, list[str]]:
    """The markdown table, and the figures whose whole interval lies above ``above``."""
    names = list(rows["head"][0])
    slower: list[str] = []
    lines = [
        f"| figure | {ref} (median) | this checkout (median) | ratio [95% interval] |",
        "|---|---|---|---|",
    ]
    for name in names:
        a = [r[name] for r in rows["ref"]]
        b = [r[name] for r in rows["head"]]
        if any(math.isnan(x) for x in a + b):
            lines.append(f"| {name} | n/a | n/a | n/a |")
            continue
        ratios = [y / x for x, y in zip(a, b, strict=True)]
        lo, hi = interval(ratios)
        unit = "" if name.endswith("MiB") else " s"
        if above is not None and lo > above:
            slower.append(f"{name} {statistics.median(ratios):.2f}x [{lo:.2f}, {hi:.2f}]")
        lines.append(
            f"| {name} | {statistics.median(a):.2f}{unit} | {statistics.median(b):.2f}{unit} "
            f"| {statistics.median(ratios):.2f}x [{lo:.2f}, {hi:.2f}] |"
        )
    return "\n".join(lines), slower


def worktree(ref: str, work: Path) -> Path:
    where = work / "ref"
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), ref],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        fail(f"overhead: cannot check out {ref}: {proc.stderr.strip()}")
    return where


def cleanup(tree: Path, work: Path) -> None:
    """Remove REF's worktree (none when ``tree`` is this checkout) and the scratch folder."""
    if tree != ROOT:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
            capture_output=True,
        )
    shutil.rmtree(work, ignore_errors=True)


def rounds(sides: dict[str, Side], n: int, quickstart: bool, say: Callable[[str], None]):
    rows: dict[str, list[Figures]] = {name: [] for name in sides}
    for i in range(n):
        order = ["ref", "head"] if i % 2 == 0 else ["head", "ref"]
        for name in order:
            figures = sides[name].measure(quickstart)
            rows[name].append(figures)
            say(f"round {i + 1} {name:4} " + "  ".join(f"{k} {v:.2f}" for k, v in figures.items()))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--against",
        required=True,
        metavar="REF",
        help="the commit to pair with, or env:NAME=VALUE (this checkout with that variable)",
    )
    ap.add_argument("--rounds", type=int, default=5, help="measured rounds (default 5)")
    ap.add_argument("--warmup", type=int, default=1, help="rounds not counted (default 1)")
    ap.add_argument("--quickstart", action="store_true", help="also the whole quick start")
    ap.add_argument("--out", metavar="JSON", help="every round's figures, as JSON")
    ap.add_argument(
        "--fail-above",
        type=float,
        metavar="X",
        help="exit 1 when a figure's whole interval lies above X (a ratio, e.g. 1.15)",
    )
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gk-overhead-"))
    extra: dict[str, str] = {}
    if args.against.startswith("env:"):
        name, _, value = args.against[4:].partition("=")
        ref_tree, extra = ROOT, {name: value}
    else:
        ref_tree = worktree(args.against, work)
    try:
        sides = {
            "ref": Side(args.against, ref_tree, work, extra),
            "head": Side("head", ROOT, work, {}),
        }
        say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
        if args.warmup:
            rounds(sides, args.warmup, args.quickstart, lambda t: say("warm-up " + t))
        rows = rounds(sides, args.rounds, args.quickstart, say)
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        print(f"this checkout {head} (and its uncommitted changes) / {args.against}, ", end="")
        print(
            f"{args.rounds} rounds interleaved after {args.warmup} warm-up, {os.cpu_count()} CPUs"
        )
        text, slower = table(args.against, rows, args.fail_above)
        print(text)
        if args.out:
            Path(args.out).write_text(json.dumps({"against": args.against, **rows}, indent=1))
        if slower:
            print(f"\nslower than {args.fail_above}x {args.against}: {'; '.join(slower)}")
            sys.exit(1)
    finally:
        cleanup(ref_tree, work)


if __name__ == "__main__":
    main()
