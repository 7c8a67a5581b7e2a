"""The model zoo through the whole pipeline, one family at a time, as a user runs it.

In a throwaway git repository holding a copy of the config's folder (``main``), for each
model of the config (a family):

1. ``gatekeeper compile``: the cold compile, its bundle published;
2. ``gatekeeper warm --probe`` into an empty cache dir: the first compiled call of a
   fresh process after the warm start, and its FX graph cache hits;
3. ``gatekeeper check``: parity (method, max abs error), speedup;
4. ``gatekeeper baseline``: those results published as main's baseline;
5. an unchanged pull request: a branch ``pr`` whose commit changes a comment of the
   factory module only, then ``gatekeeper run --base-ref main`` (paired with main, as the
   Action runs it): it must pass.

A stage that fails does not stop the others of its family where they can still run. The
table: status per stage, parity method and max abs error, speedup, cold compile and warm
first call. Exit 1 when any family failed a stage.

Usage:
  python benchmarks/zoo.py                         # examples/zoo.toml, every stage
  python benchmarks/zoo.py --more                  # examples/zoo_more.toml: compile, check
  python benchmarks/zoo.py --target 'llama' --target 'bert' [--json PATH] [--keep]
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("compile", "warm", "check", "baseline", "pr")
PR_OK = ("pass", "improved", "inconclusive", "no-baseline")  # an unchanged PR's fine verdicts


@dataclass
class Family:
    """One model of the config through the stages."""

    name: str
    stages: dict[str, str] = field(default_factory=dict)  # stage -> "ok" or why not
    parity: str | None = None  # method and max abs error vs eager
    speedup: float | None = None
    cold_s: float | None = None
    warm_first_s: float | None = None
    fx_hits: str | None = None
    pr_verdict: str | None = None
    outputs: str | None = None  # what the model returned
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(v == "ok" for v in self.stages.values())


def _run(cmd: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            cmd, cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"timed out after {timeout:.0f} s")


def git(repo: Path, *args: str) -> None:
    proc = _run(["git", "-c", "user.name=zoo", "-c", "user.email=zoo@localhost", *args], repo, 120)
    if proc.returncode != 0:
        sys.exit(f"git {' '.join(args)} failed: {proc.stderr}")


def gk(repo: Path, config: str, *args: str, target: str, timeout: float) -> tuple[int, dict, str]:
    """``gatekeeper <args> --json`` on one family: exit code, JSON (or {}), last stderr line."""
    proc = _run(
        [
            sys.executable,
            "-m",
            "gatekeeper",
            *args,
            "--config",
            config,
            "--target",
            target,
            "--json",
        ],
        repo,
        timeout,
    )
    try:
        doc = json.loads(proc.stdout) if proc.stdout.strip() else {}
    except json.JSONDecodeError:
        doc = {}
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    return proc.returncode, doc, (lines[-1] if lines else "")


def _first(doc: dict) -> dict:
    targets = doc.get("targets") or []
    return targets[0] if targets else {}


def setup(config: Path, keep: Path | None = None) -> tuple[Path, str]:
    """A git repository (``main``) holding a copy of the config's folder."""
    repo = keep or Path(tempfile.mkdtemp(prefix="gk-zoo-"))
    repo.mkdir(parents=True, exist_ok=True)
    shutil.copytree(
        config.parent,
        repo,
        dirs_exist_ok=True,
        ignore=shutil.ignore_patterns(".gatekeeper", "__pycache__", "*.png"),
    )
    (repo / ".gitignore").write_text(".gatekeeper/\nout/\nwarm-cache/\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "main")
    return repo, config.name


def families_of(config: Path, globs: list[str]) -> list[str]:
    doc = tomllib.loads(config.read_text())
    section = doc.get("tool", {}).get("gatekeeper", doc)
    names = [m["name"] for m in section.get("models", [])]
    if globs:
        names = [n for n in names if any(fnmatch.fnmatchcase(n, g) for g in globs)]
    return names


def run_family(
    fam: Family, repo: Path, config: str, stages: tuple[str, ...], timeout: float
) -> None:
    """Stages ``compile`` to ``baseline`` of one family (``pr`` runs on the pr branch)."""
    target = f"{fam.name}/*"

    def failed(stage: str, why: str) -> None:
        fam.stages[stage] = why[:120] or "failed"
        fam.errors.append(f"{stage}: {why}")

    if "compile" in stages:
        rc, doc, err = gk(repo, config, "compile", target=target, timeout=timeout)
        t = _first(doc)
        if rc == 0 and t.get("status") in ("published", "exists", "replaced"):
            fam.stages["compile"] = "ok"
            fam.cold_s = t.get("compile_seconds")
        else:
            failed("compile", t.get("error") or err)
    if "warm" in stages:
        cache = repo / "warm-cache" / fam.name
        rc, doc, err = gk(
            repo,
            config,
            "warm",
            "--probe",
            "--cache-dir",
            str(cache),
            target=target,
            timeout=timeout,
        )
        t = _first(doc)
        fam.warm_first_s = t.get("first_call_seconds")
        hit, miss = t.get("fxgraph_cache_hit"), t.get("fxgraph_cache_miss")
        fam.fx_hits = f"{hit}/{miss}" if hit is not None else None
        if rc == 0 and t.get("status") == "hit" and not t.get("probe_error"):
            fam.stages["warm"] = "ok"
        else:
            failed("warm", f"{t.get('status')}: {t.get('probe_error') or t.get('reason') or err}")
    if "check" in stages:
        out = f"out/{fam.name}/base"
        rc, doc, err = gk(repo, config, "check", "--out", out, target=target, timeout=timeout)
        results = repo / out / "results.json"
        r = _result(results)
        if r is None:
            failed("check", err)
        else:
            _read_check(fam, r)
            parity = (r.get("parity") or {}).get("vs_eager") or {}
            if r.get("status") != "ok":
                failed("check", r.get("error") or "error")
            elif not parity.get("passed"):
                failed("check", f"parity: {parity.get('detail') or parity.get('method')}")
            else:
                fam.stages["check"] = "ok"
    if "baseline" in stages:
        results = repo / f"out/{fam.name}/base/results.json"
        if not results.is_file():
            failed("baseline", "no results to publish")
        else:
            rc, doc, err = gk(
                repo,
                config,
                "baseline",
                "--results",
                str(results),
                "--ref",
                "main",
                target=target,
                timeout=timeout,
            )
            fam.stages["baseline"] = "ok" if rc == 0 else (err or f"exit {rc}")


def _result(path: Path) -> dict | None:
    if not path.is_file():
        return None
    targets = json.loads(path.read_text()).get("targets") or []
    return targets[0] if targets else None


def _read_check(fam: Family, r: dict) -> None:
    parity = (r.get("parity") or {}).get("vs_eager") or {}
    if parity:
        err = parity.get("max_abs_err")
        fam.parity = parity.get("method", "?") + (f" {err:.1e}" if err is not None else "")
    fam.speedup = (r.get("latency") or {}).get("speedup")
    outputs = (r.get("parity") or {}).get("outputs") or {}
    if outputs:
        fam.outputs = f"{outputs.get('kind')} ({outputs.get('tensors')} tensors)"


def run_pr(fam: Family, repo: Path, config: str, timeout: float) -> None:
    rc, doc, err = gk(
        repo,
        config,
        "run",
        "--base-ref",
        "main",
        "--out",
        f"out/{fam.name}/pr",
        target=f"{fam.name}/*",
        timeout=timeout,
    )
    t = _first(doc)
    fam.pr_verdict = f"{t.get('verdict')} ({t.get('mode')})" if t else None
    if rc == 0 and t.get("verdict") in PR_OK:
        fam.stages["pr"] = "ok"
    else:
        why = "; ".join(t.get("reasons") or []) or t.get("error") or err or f"exit {rc}"
        fam.stages["pr"] = f"{t.get('verdict')}: {why}"[:120]
        fam.errors.append(f"pr: {why}")


def run_zoo(
    config: Path,
    *,
    globs: list[str] | None = None,
    stages: tuple[str, ...] = STAGES,
    timeout: float = 1800,
    keep: Path | None = None,
    log: Any = None,
    pr_touches: str = "comment",
) -> tuple[list[Family], Path]:
    """Every family of ``config`` through ``stages``; returns them and the repository.
    The unchanged pull request changes a comment of every module (``pr_touches =
    "comment"``: a new code hash, so it compiles anew) or adds a file beside them
    (``"file"``: the same code hash, its bundles are hits)."""
    repo, name = setup(config.resolve(), keep)
    say = log or (lambda msg: print(f"[zoo {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr))
    fams = [Family(n) for n in families_of(config, globs or [])]
    for fam in fams:
        start = time.perf_counter()
        run_family(fam, repo, name, stages, timeout)
        say(f"{fam.name}: {fam.stages} ({time.perf_counter() - start:.0f} s)")
    if "pr" in stages:
        git(repo, "checkout", "-qb", "pr")
        if pr_touches == "comment":
            for py in sorted(repo.glob("*.py")):  # a pull request that changes no model
                py.write_text(py.read_text() + "\n# a pull request that changes nothing\n")
        else:
            (repo / "NOTES.md").write_text("A pull request that changes no model.\n")
        git(repo, "add", ".")
        git(repo, "commit", "-qm", "pr")
        for fam in fams:
            start = time.perf_counter()
            run_pr(fam, repo, name, timeout)
            say(f"{fam.name}: pr {fam.pr_verdict} ({time.perf_counter() - start:.0f} s)")
    return fams, repo


def table(fams: list[Family], stages: tuple[str, ...]) -> str:
    from tabulate import tabulate

    def cell(fam: Family, stage: str) -> str:
        v = fam.stages.get(stage)
        return "-" if v is None else ("ok" if v == "ok" else "FAIL")

    rows = [
        [
            f.name,
            *[cell(f, s) for s in stages],
            f.parity or "-",
            f"{f.speedup:.2f}x" if f.speedup else "-",
            f"{f.cold_s:.1f} s" if f.cold_s else "-",
            f"{f.warm_first_s:.2f} s" if f.warm_first_s else "-",
            f.pr_verdict or "-",
            f.outputs or "-",
        ]
        for f in fams
    ]
    headers = [
        "family",
        *stages,
        "parity vs eager",
        "speedup",
        "cold compile",
        "warm first call",
        "unchanged PR",
        "outputs",
    ]
    return tabulate(rows, headers=headers, tablefmt="github")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", help="default: examples/zoo.toml (--more: examples/zoo_more.toml)")
    ap.add_argument("--more", action="store_true", help="more architectures: compile and check")
    ap.add_argument("--target", action="append", default=[], help="family (model name) glob")
    ap.add_argument("--stages", help=f"comma-separated, of {','.join(STAGES)}")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per command")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--keep", metavar="DIR", help="the scratch repository here (kept)")
    args = ap.parse_args()
    default = "zoo_more.toml" if args.more else "zoo.toml"
    config = Path(args.config or ROOT / "examples" / default)
    if args.stages:
        stages = tuple(s for s in args.stages.split(",") if s)
        if unknown := [s for s in stages if s not in STAGES]:
            ap.error(f"--stages: unknown {', '.join(unknown)} (of {', '.join(STAGES)})")
    else:
        stages = ("compile", "check") if args.more else STAGES
    start = time.perf_counter()
    fams, repo = run_zoo(
        config,
        globs=args.target,
        stages=stages,
        timeout=args.timeout,
        keep=Path(args.keep) if args.keep else None,
    )
    print(table(fams, stages))
    for f in fams:
        for e in f.errors:
            print(f"{f.name}: {e}")
    print(
        f"\n{len([f for f in fams if f.ok])}/{len(fams)} families passed every stage; "
        f"{time.perf_counter() - start:.0f} s; {repo}; {sys.executable}"
    )
    if args.json:
        doc = [{**vars(f), "ok": f.ok} for f in fams]
        Path(args.json).write_text(json.dumps(doc, indent=2, default=str))
    return 0 if all(f.ok for f in fams) else 1


if __name__ == "__main__":
    sys.exit(main())
