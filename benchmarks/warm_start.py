"""How fast is the first compiled call in a fresh process, per example target?

(For a training target, e.g. ``block/b1-s32/default+train``, the first call is the first
compiled training step: forward, backward and optimizer.)

    (a) cold: empty inductor cache dir
    (b) only the Mega-Cache blob restored (torch.compiler.load_cache_artifacts, PyTorch's
        documented recipe), into an empty cache dir
    (c) `gatekeeper warm` from the store into an empty cache dir, then the first call
    (d) a hot local cache dir: the one a previous process compiled into (the limit)

Each figure is the median over --repeats fresh processes. Usage, from the repo root:

    python benchmarks/warm_start.py [--repeats 3] [--target 'mlp/*']
    python benchmarks/warm_start.py --repeats 1 --target 'block/b1-s32/default+train'

The last columns are (c)'s cache counters: FX graph hits/misses and AOTAutograd
hits/misses (a warm training step: 3 FX hits, 2 AOT hits, no misses).
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tabulate import tabulate

from gatekeeper import bundle
from gatekeeper.compile import compile_all
from gatekeeper.config import load_config
from gatekeeper.key import find_bundle, target_key
from gatekeeper.worker.launch import run_worker
from gatekeeper.worker.protocol import Request
from gatekeeper.store import open_store
from gatekeeper.targets import expand, select

ROOT = Path(__file__).resolve().parents[1]


COUNTERS: dict[str, dict] = {}  # the last probe's cache counters, per cache dir kind


def first_call(target, config, cache_dir: Path, device: str, megacache: Path | None = None):
    req = Request.for_target("probe", target, config, device,
                             megacache_in=str(megacache) if megacache else None)
    resp = run_worker(req, cache_dir=cache_dir, timeout=1800, label=target.id)
    if not resp.ok:
        raise SystemExit(f"{target.id}: {resp.error}")
    COUNTERS[cache_dir.name] = resp.counters or {}
    return resp.compile_seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "examples" / "gatekeeper.toml"))
    ap.add_argument("--target", action="append")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    config = load_config(args.config)
    targets = select(expand(config), args.target)
    work = Path(tempfile.mkdtemp(prefix="gk-bench-"))
    store = open_store(str(work / "store"))
    print(f"compiling {len(targets)} targets into {store.uri}", file=sys.stderr)
    compile_all(targets, config, store)

    rows = []
    for target in targets:
        key = target_key(target, config.base_dir)
        found, _ = find_bundle(store, key, signing_key=None)
        assert found is not None and found.status == "hit", target.id
        manifest = found.manifest
        unpacked = work / "unpacked" / target.id
        archive = work / manifest.archive.name
        store.download(found.location.key(manifest.archive.name), archive)
        bundle.extract(archive, manifest, unpacked)
        blob = unpacked / bundle.MEGACACHE
        times: dict[str, list[float]] = {"a": [], "b": [], "c": [], "d": []}
        for r in range(args.repeats):
            run = work / f"{target.id.replace('/', '_')}-{r}"
            times["a"].append(first_call(target, config, run / "a", key.device))
            times["d"].append(first_call(target, config, run / "a", key.device))
            times["b"].append(first_call(target, config, run / "b", key.device, blob))
            subprocess.run([sys.executable, "-m", "gatekeeper", "warm", "--config",
                            args.config, "--store", store.uri, "--target", target.id,
                            "--cache-dir", str(run / "c"), "--json"], check=True,
                           stdout=subprocess.DEVNULL)
            times["c"].append(first_call(target, config, run / "c", key.device))
            print(f"{target.id} #{r + 1}: " + "  ".join(f"{k}={v[-1]:.2f}s"
                                                       for k, v in times.items()),
                  file=sys.stderr)
        med = {k: statistics.median(v) for k, v in times.items()}
        c = COUNTERS.get("c", {})
        rows.append([target.id, med["a"], med["b"], med["c"], med["d"],
                     med["a"] / med["c"], med["c"] / med["d"], med["a"] / med["b"],
                     f"{c.get('fxgraph_cache_hit', 0)}/{c.get('fxgraph_cache_miss', 0)}",
                     f"{c.get('autograd_cache_hit', 0)}/{c.get('autograd_cache_miss', 0)}"])
    print(tabulate(rows, floatfmt=".2f", headers=[
        "target", "(a) cold s", "(b) mega-cache s", "(c) gatekeeper warm s", "(d) hot s",
        "a/c speedup", "c/d (limit 1.15)", "a/b speedup", "(c) FX hit/miss",
        "(c) AOT hit/miss"]))
    print(f"\nmedian of {args.repeats} fresh processes each; first compiled call, "
          f"torch {manifest.key['env']['torch']}, {key.env_key}")


if __name__ == "__main__":
    main()
