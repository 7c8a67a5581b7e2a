"""What does the baseline job's compile cost after a small change to a model?

``gatekeeper compile`` seeds each target's cache dir with the newest bundle of the same
target and env, so inductor's content-addressed keys decide what still hits. For each
example target, in a copy of the examples (a fresh store per repeat):

    cold      ``gatekeeper compile --cold``: an empty cache dir (what every compile of a
              new code hash cost before seeding)
    comment   a comment added to the models' file, then ``gatekeeper compile``
    layer     one layer of the model changed (an activation swapped, see LAYER), then
              ``gatekeeper compile``, seeded with the comment's bundle
    head      (``--change head``) only the output head changed (a new bias-free output
              layer); for a regional target the blocks' graphs still hit

Each figure is the wall time of the target's compile step as the baseline job runs it
(the worker's process start, build, first compiled calls, and packing and publishing
the bundle), next to the FX graphs it reused ("hit/total") and the worker's first
compiled call alone. Usage, from the repo root:

    python benchmarks/seeded_compile.py [--repeats 3] [--target 'mlp/b1/default']
    python benchmarks/seeded_compile.py --config examples/large.toml --change comment \\
        --change layer --change head
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

ROOT = Path(__file__).resolve().parents[1]

# one layer of each example model changed: (factory, submodule path, its replacement)
LAYER = {
    "mlp": ("net.3", "nn.ReLU()"),
    "cnn": ("features.5", "nn.GELU()"),
    "transformer_block": ("mlp.1", "nn.ReLU()"),
    "transformer_12": ("layers.11.mlp.1", "nn.ReLU()"),
}
# only the output head changed
HEAD = {
    "mlp": ("net.4", "nn.Linear(256, 10, bias=False)"),
    "cnn": ("head", "nn.Linear(32, 10, bias=False)"),
    "transformer_block": ("out", "nn.Linear(64, 512, bias=False)"),
    "transformer_12": ("out", "nn.Linear(512, 1024, bias=False)"),
}
PATCH = '''

def _replace(factory, path, make):
    """``factory`` whose model has the submodule at ``path`` replaced by ``make()``."""

    def build():
        model = factory()
        *parents, name = path.split(".")
        parent = model
        for part in parents:
            parent = parent[int(part)] if part.isdigit() else getattr(parent, part)
        if name.isdigit():
            parent[int(name)] = make()
        else:
            setattr(parent, name, make())
        return model

    return build
'''


def change(models: Path, kind: str) -> None:
    """Apply one change to the copied models file."""
    text = models.read_text()
    if kind == "comment":
        models.write_text("# a comment-only change\n" + text)
        return
    edits = LAYER if kind == "layer" else HEAD
    if "def _replace(" not in text:
        text += PATCH
    for factory, (path, make) in edits.items():
        if f"def {factory}(" in text:
            text += f"\n{factory} = _replace({factory}, {path!r}, lambda: {make})\n"
    models.write_text(text)


def compile_one(project: Path, config: str, target: str, *flags: str) -> tuple[float, dict]:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "gatekeeper", "compile", "--config", config, "--target", target]
        + [*flags, "--json"],
        cwd=project,
        stdout=subprocess.PIPE,
        text=True,
    )
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{target}: compile exited {proc.returncode}")
    (entry,) = json.loads(proc.stdout)["targets"]
    if entry["status"] != "published":
        raise SystemExit(f"{target}: {entry}")
    return took, entry


def reused(entry: dict) -> str:
    seed = entry.get("seed")
    if not seed:
        return f"0/{entry['counters'].get('fxgraph_cache_miss', 0)}"
    return f"{seed['fx_graphs_reused']}/{seed['fx_graphs']}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "examples" / "gatekeeper.toml"))
    ap.add_argument("--target", action="append", help="target glob (default: every target)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument(
        "--change",
        action="append",
        choices=["comment", "layer", "head"],
        help="the changes, in order (default: comment, layer)",
    )
    args = ap.parse_args()
    changes = args.change or ["comment", "layer"]
    source = Path(args.config).resolve()
    sys.path.insert(0, str(ROOT))
    from gatekeeper.project import expand, load_config
    from gatekeeper.targets import one_per_bundle, select

    config = load_config(source)
    targets = [t.id for t in one_per_bundle(select(expand(config), args.target))]
    modules = {m.factory.split(":")[0] for m in config.models}
    times: dict[tuple[str, str], list[float]] = {}
    calls: dict[tuple[str, str], list[float]] = {}
    hits: dict[tuple[str, str], str] = {}
    for r in range(args.repeats):
        work = Path(tempfile.mkdtemp(prefix="gk-seeded-"))
        project = work / "project"
        shutil.copytree(source.parent, project, ignore=shutil.ignore_patterns(".gatekeeper"))
        config_path = str(project / source.name)
        store = ["--store", str(work / "store")]
        for target in targets:
            steps = [("cold", ("--cold",))] + [(c, ()) for c in changes]
            snapshot = {m: (project / f"{m}.py").read_text() for m in modules}
            for name, flags in steps:
                if name != "cold":
                    for module in modules:
                        change(project / f"{module}.py", name)
                took, entry = compile_one(project, config_path, target, *store, *flags)
                times.setdefault((target, name), []).append(took)
                calls.setdefault((target, name), []).append(entry["compile_seconds"])
                hits[(target, name)] = reused(entry)
                print(
                    f"{target} #{r + 1} {name}: {took:.1f} s (first call "
                    f"{entry['compile_seconds']:.1f} s), FX graphs reused {hits[(target, name)]}",
                    file=sys.stderr,
                )
            for module, text in snapshot.items():  # the next target starts unchanged
                (project / f"{module}.py").write_text(text)
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    for target in targets:
        cold = statistics.median(times[(target, "cold")])
        row: list = [target, cold, statistics.median(calls[(target, "cold")])]
        for name in changes:
            t = statistics.median(times[(target, name)])
            row += [t, t / cold, hits[(target, name)]]
        rows.append(row)
    headers = ["target", "cold s", "cold first call s"]
    for name in changes:
        headers += [f"{name} s", f"{name}/cold", f"{name} FX reused"]
    print(tabulate(rows, headers=headers, floatfmt=".2f"))
    print(
        f"\nmedian of {args.repeats} run(s); wall time of each target's compile step "
        "(gatekeeper compile --target T), a fresh store per run"
    )


if __name__ == "__main__":
    main()
