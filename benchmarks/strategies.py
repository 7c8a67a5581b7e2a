"""Whole, regional and aot side by side: what each costs to compile and to run.

For every inference target of the config (or ``--target`` globs), in a copy of its
folder with a fresh store:

    cold compile   ``gatekeeper compile --cold``: the worker's first compiled call from an
                   empty cache dir (aot: export, then the AOTInductor package built and
                   loaded), median of --repeats fresh stores
    p50, speedup   ``gatekeeper check`` (stored mode): compiled and eager latency
    deploy         the first call in a new process after a warm start (aot: the verified
                   package loaded, as ``gatekeeper.load_aot`` does)
    head change    ``--head``: only the model's output head changed (benchmarks/seeded_compile
                   HEAD), then ``gatekeeper compile``, seeded with the previous bundle: the
                   FX graphs it reused (a regional target's blocks still hit)

then, per model and shape set, regional and aot against whole: cold compile (goal for
regional: <= 0.35x of whole on examples/large.toml), p50 (goal: within 5%). The report's
"Which mode and strategy?" table is printed too. Usage, from the repo root:

    python benchmarks/strategies.py --config examples/large.toml --repeats 3 --head
    python benchmarks/strategies.py --target 'block/*' --repeats 1
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tabulate import tabulate

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from seeded_compile import change  # noqa: E402 - the benchmarks' shared model edits


def gk(project: Path, *args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "gatekeeper", *args, "--json"],
        cwd=project,
        stdout=subprocess.PIPE,
        text=True,
    )
    if not proc.stdout.strip():
        raise SystemExit(f"gatekeeper {' '.join(args)} exited {proc.returncode}")
    return json.loads(proc.stdout)


def p50(by_id: dict, target: str) -> float | None:
    return ((by_id.get(target) or {}).get("latency") or {}).get("compiled", {}).get("p50")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "examples" / "gatekeeper.toml"))
    ap.add_argument("--target", action="append", help="target glob (default: inference ones)")
    ap.add_argument("--repeats", type=int, default=1, help="cold compiles per target")
    ap.add_argument("--head", action="store_true", help="then change the head, compile seeded")
    ap.add_argument("--min-time", type=float, default=None, help="measure.min_time for check")
    args = ap.parse_args()
    source = Path(args.config).resolve()
    sys.path.insert(0, str(ROOT))
    from gatekeeper.project import expand, load_config
    from gatekeeper.targets import select

    config = load_config(source)
    targets = [t.id for t in select(expand(config), args.target) if t.task == "infer"]
    globs = [a for t in targets for a in ("--target", t)]
    work = Path(tempfile.mkdtemp(prefix="gk-strategies-"))
    project = work / "project"
    shutil.copytree(source.parent, project, ignore=shutil.ignore_patterns(".gatekeeper"))
    cfg = ["--config", str(project / source.name)]
    if args.min_time is not None:  # a quicker check: the copy's measure.min_time
        text = (project / source.name).read_text()
        if "[tool.gatekeeper.measure]" in text:
            raise SystemExit(f"{source}: has a measure section; set min_time there")
        text += f"\n[tool.gatekeeper.measure]\nmin_time = {args.min_time}\n"
        (project / source.name).write_text(text)
    cold: dict[str, list[float]] = {}
    status: dict[str, str] = {}
    for r in range(args.repeats):
        store = ["--store", str(work / f"store-{r}")]
        for entry in gk(project, "compile", "--cold", *cfg, *store, *globs)["targets"]:
            status[entry["target"]] = entry["status"]
            if entry.get("compile_seconds") is not None:
                cold.setdefault(entry["target"], []).append(entry["compile_seconds"])
            print(
                f"#{r + 1} {entry['target']}: {entry['status']} "
                f"{entry.get('compile_seconds') or 0:.1f} s {entry.get('error') or ''}",
                file=sys.stderr,
            )
    store = ["--store", str(work / f"store-{args.repeats - 1}")]
    gk(project, "check", "--mode", "stored", "--out", str(work / "check"), *cfg, *store, *globs)
    results = json.loads((work / "check" / "results.json").read_text())
    by_id = {t["target"]: t for t in results["targets"]}
    heads: dict[str, str] = {}
    if args.head:
        for module in {m.factory.split(":")[0] for m in config.models}:
            change(project / f"{module}.py", "head")
        for entry in gk(project, "compile", *cfg, *store, *globs)["targets"]:
            seed = entry.get("seed") or {}
            heads[entry["target"]] = (
                f"{seed['fx_graphs_reused']}/{seed['fx_graphs']}" if seed else entry["status"]
            )
    rows = []
    for t in targets:
        r = by_id.get(t, {})
        lat, comp, aot = r.get("latency") or {}, r.get("compile") or {}, r.get("aot") or {}
        deploy = aot.get("first_call_seconds") if t.endswith("+aot") else comp.get("seconds")
        rows.append(
            [
                t,
                status.get(t),
                statistics.median(cold[t]) if t in cold else None,
                lat["compiled"]["p50"] * 1e3 if lat else None,
                lat.get("speedup"),
                deploy,
                heads.get(t),
                r.get("error"),
            ]
        )
    print(
        tabulate(
            rows,
            floatfmt=".3f",
            missingval="-",
            headers=[
                "target",
                "compile",
                "cold compile s",
                "p50 ms",
                "speedup",
                "deploy first call s",
                "head change: FX reused",
                "error",
            ],
        )
    )
    print()
    ratios = []
    for t in targets:
        base = t.rsplit("+", 1)[0] if t.endswith(("+regional", "+aot")) else None
        if base is None or base not in cold or t not in cold:
            continue
        ratio = p50(by_id, t) / p50(by_id, base) if p50(by_id, t) and p50(by_id, base) else None
        ratios.append([t, statistics.median(cold[t]) / statistics.median(cold[base]), ratio])
    if ratios:
        print(
            tabulate(
                ratios,
                floatfmt=".3f",
                missingval="-",
                headers=[
                    "vs whole",
                    "cold compile ratio (regional goal <= 0.35)",
                    "p50 ratio (goal within 1.05)",
                ],
            )
        )
    results_file = str(work / "check" / "results.json")
    report = subprocess.run(
        [sys.executable, "-m", "gatekeeper", "gate", "--results", results_file, *cfg, *store],
        cwd=project,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout
    start = report.find("### Which mode")
    if start >= 0:
        print("\n" + report[start : report.find("### Details", start)].strip())
    print(
        f"\ncold compile: median of {args.repeats} fresh store(s); p50 and deploy first call "
        "from one gatekeeper check"
    )
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
