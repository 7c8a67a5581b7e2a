"""``gatekeeper compile`` of the README tour's config (examples/gatekeeper.toml), this
checkout against another commit: CPU seconds of the process tree, wall time, and whether
the two stores' bundles have the same keys and files. Both sides compile the models
REF's gatekeeper can load (a model whose task REF lacks, such as ``generate`` before it
existed, is left out of both, and named).

    python benchmarks/example_compile.py --against REF [--together]

Each side compiles into an empty store of its own, in a fresh copy of the example's
folder, with this interpreter and its installed dependencies (``PYTHONPATH`` names each
side's ``gatekeeper``; REF is a detached ``git worktree`` in a temporary folder). The
machine-level state is each side's own (this checkout's shared precompiled headers, if
it built them before). ``--together`` runs both sides at once, one per core: both then
share the machine alike, and it takes half the time; the CPU seconds are the figure to
compare, the wall times are not. Exit 2 when a compile fails.

Bundle files are compared by name, except an FX graph or AOT-autograd entry's own file
name (a digest of its bytes, which hold timings): its folder, the cache key, must match.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from overhead import ROOT, cleanup, fail, worktree

EXAMPLE = ROOT / "examples"


MODEL = "[[tool.gatekeeper.models]]"


def _env(tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "GATEKEEPER_"))}
    return env | {"PYTHONPATH": str(tree)}


def common_config(tree: Path, work: Path) -> tuple[str, list[str]]:
    """The example config less the models the gatekeeper at ``tree`` refuses to load
    (each model's table tried alone with the config's head), and the names left out."""
    head, *models = (EXAMPLE / "gatekeeper.toml").read_text().split(MODEL)
    kept, left_out = [head], []
    probe = work / "probe.toml"
    for model in models:
        probe.write_text(head + MODEL + model)
        loads = subprocess.run(
            [sys.executable, "-c", "import sys; from gatekeeper.project import load_config, "
             "expand; expand(load_config(sys.argv[1]))", str(probe)],
            env=_env(tree), capture_output=True,
        )  # fmt: skip
        if loads.returncode == 0:
            kept.append(model)
        else:
            name = next((ln for ln in model.splitlines() if ln.startswith("name")), model[:40])
            left_out.append(name.split("=", 1)[-1].strip().strip('"'))
    probe.unlink()
    return MODEL.join(kept), left_out


def _start(tree: Path, work: Path, name: str, config: str) -> tuple[subprocess.Popen, Path]:
    where = work / name
    where.mkdir()
    shutil.copy(EXAMPLE / "tiny_models.py", where / "tiny_models.py")
    (where / "gatekeeper.toml").write_text(config)
    env = _env(tree)
    timed = ["/usr/bin/time", "-f", "%e %U %S", "-o", str(where / "time.txt")]
    cmd = [*timed, sys.executable, "-m", "gatekeeper", "compile", "--config", "gatekeeper.toml"]
    with open(where / "compile.log", "wb") as log:  # the child holds its own descriptor
        return subprocess.Popen(cmd, cwd=where, env=env, stdout=log, stderr=log), where


def _figures(proc: subprocess.Popen, where: Path, name: str) -> dict[str, float]:
    if proc.wait() != 0:
        tail = (where / "compile.log").read_text(errors="replace").strip().splitlines()
        fail(f"example_compile: {name}'s compile exited {proc.returncode}: {tail[-1:]}")
    wall, user, system = (float(x) for x in (where / "time.txt").read_text().split()[-3:])
    return {"wall": wall, "cpu": user + system}


def _bundles(where: Path) -> dict[str, tuple[dict, list[str]]]:
    out = {}
    for path in (where / ".gatekeeper" / "store").rglob("manifest.json"):
        doc = json.loads(path.read_text())
        files = []
        for name in doc["files"]:
            parts = name.split("/")
            if "fxgraph" in parts or "aotautograd" in parts:
                parts[-1] = "<entry>"
            files.append("/".join(parts))
        out[doc["target"]] = (doc["key"], sorted(files))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", required=True, metavar="REF", help="the commit to compare")
    ap.add_argument("--together", action="store_true", help="both sides at once")
    args = ap.parse_args()
    if not Path("/usr/bin/time").exists():
        fail("example_compile: needs /usr/bin/time")
    work = Path(tempfile.mkdtemp(prefix="gk-example-compile-"))
    ref_tree = worktree(args.against, work)
    try:
        sides = {"ref": ref_tree, "head": ROOT}
        config, left_out = common_config(ref_tree, work)
        if left_out:
            print(f"left out (models {args.against} cannot load): {', '.join(left_out)}")
        figures, folders = {}, {}
        start = time.perf_counter()
        if args.together:
            running = {n: _start(t, work, n, config) for n, t in sides.items()}
            for n, (proc, where) in running.items():
                figures[n], folders[n] = _figures(proc, where, n), where
        else:
            for n, t in sides.items():
                proc, where = _start(t, work, n, config)
                figures[n], folders[n] = _figures(proc, where, n), where
        print(f"{args.against} vs this checkout, {os.cpu_count()} CPUs, ", end="")
        print(
            f"{'together' if args.together else 'one after the other'}, "
            f"{time.perf_counter() - start:.0f} s in all"
        )
        ref, head = figures["ref"], figures["head"]
        print("| figure | ref | this checkout | ratio |\n|---|---|---|---|")
        for k in ("cpu", "wall"):
            print(f"| {k} s | {ref[k]:.1f} | {head[k]:.1f} | {head[k] / ref[k]:.2f}x |")
        a, b = _bundles(folders["ref"]), _bundles(folders["head"])
        keys = [t for t in a if t not in b or a[t][0] != b[t][0]]
        files = [t for t in a if t in b and a[t][1] != b[t][1]]
        print(
            f"targets {len(a)} and {len(b)}; keys differ for {len(keys)} {keys[:3]}; "
            f"files differ for {len(files)} {files[:3]}"
        )
    finally:
        cleanup(ref_tree, work)


if __name__ == "__main__":
    main()
