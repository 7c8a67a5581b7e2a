"""How fast is the first compiled call in a fresh process, per example target?

(For a training target, e.g. ``block/b1-s32/default+train``, the first call is the first
compiled training step: forward, backward and optimizer.)

    (a) cold: empty inductor cache dir
    (b) only the Mega-Cache blob restored (torch.compiler.load_cache_artifacts, PyTorch's
        documented recipe), into an empty cache dir
    (c) `gatekeeper warm` from the store into an empty cache dir, then the first call
    (d) a hot local cache dir: the one a previous process compiled into (the limit)
    (e) `gatekeeper warm` after `check` verified the bundle's precompile package, then
        the first call in the environment warm says the service needs (its
        ``service_env``: TORCH_CACHING_PRECOMPILE=1, TORCHINDUCTOR_VEC_ISA_OK=1):
        Dynamo skipped
    eager: the first call of the model, not compiled, in a fresh process (the floor)
    (f) an ``+aot`` target: `gatekeeper warm` (after `check` verified its AOTInductor
        package), then in a fresh process the package loaded the way
        ``gatekeeper.load_aot`` loads it and its first call; ``import torch`` is timed
        apart and not included. Goal: (f) <= eager's first call + 0.1 s, and <= 0.1x of
        (c) of the same model's whole target. A second table compares them.

Every first call includes ``torch.compile()`` itself (a package loads in there) and
importing inductor (``torch._inductor.compile_fx``), which any process that compiles
pays once whatever its cache holds; the probe times that import apart. The compile
overhead of a path is its first call minus eager's, shown with and without the import;
the goal for (e) is at most 0.4x (c)'s overhead, with (c) within 1.15x of (d). Each
figure is the median over --repeats fresh processes. Usage, from the repo root:

    python benchmarks/warm_start.py [--repeats 3] [--target 'mlp/*']
    python benchmarks/warm_start.py --repeats 1 --target 'block/b1-s32/default+train'
    python benchmarks/warm_start.py --config examples/large.toml --repeats 3
    python benchmarks/warm_start.py --no-cold --target '*/default*'   # (c)-(e) only
    python benchmarks/warm_start.py --no-cold --target '*/default' --target '*/default+aot'

The last columns are (c)'s cache counters: FX graph hits/misses and AOTAutograd
hits/misses (a warm training step: 3 FX hits, 2 AOT hits, no misses), and whether (e)'s
first call ran Dynamo. A training step has no package (torch cannot package its
optimizer graph): its (e) is "-".
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tabulate import tabulate

from gatekeeper import bundle, kinds
from gatekeeper.boundary.client import run_worker
from gatekeeper.boundary.protocol import PackageRef, ProbeRequest, dynamo_skipped
from gatekeeper.compile import compile_all
from gatekeeper.key import find_bundle, target_key
from gatekeeper.project import expand, load_config
from gatekeeper.runtime import PACKAGE, package_dir
from gatekeeper.store import open_store
from gatekeeper.targets import select

ROOT = Path(__file__).resolve().parents[1]


COUNTERS: dict[str, dict] = {}  # the last probe's cache counters, per cache dir kind
IMPORTS: list[float] = []  # every compiled first call's inductor import


def first_call(
    target,
    config,
    cache_dir: Path,
    device: str,
    megacache: Path | None = None,
    env: dict[str, str] | None = None,
    eager: bool = False,
    precompile: bool = False,
):
    # precompile: the packages warm served in this cache dir load, as in the service
    load = PackageRef.of(kinds.package("precompile"), cache_dir) if precompile else None
    req = ProbeRequest.of(
        target,
        config,
        device,
        kind=kinds.of(target),
        megacache_in=str(megacache) if megacache else None,
        eager=eager,
        load=load,
    )
    resp = run_worker(req, cache_dir=cache_dir, timeout=1800, label=target.id, env=env)
    if not resp.ok:
        raise SystemExit(f"{target.id}: {resp.error}")
    COUNTERS[cache_dir.name] = resp.counters or {}
    if resp.import_seconds is not None:
        IMPORTS.append(resp.import_seconds)
    return resp.compile_seconds


def gk(*args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "gatekeeper", *args, "--json"],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout
    return json.loads(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "examples" / "gatekeeper.toml"))
    ap.add_argument("--target", action="append")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--no-cold",
        action="store_true",
        help="skip (a) and (b), the cold compiles; (d) is then one hot dir, "
        "compiled by an unmeasured first process, for every repeat",
    )
    args = ap.parse_args()
    config = load_config(args.config)
    targets = select(expand(config), args.target)
    work = Path(tempfile.mkdtemp(prefix="gk-bench-"))
    store = open_store(str(work / "store"))
    print(f"compiling {len(targets)} targets into {store.uri}", file=sys.stderr)
    compiled = compile_all(targets, config, store)
    packaged = [r.target for r in compiled if (r.precompile or {}).get("status") == "recorded"]
    aot = [r.target for r in compiled if r.status in ("published", "exists")]
    aot = [t for t in aot if t.endswith("+aot")]
    if packaged or aot:  # only a package a check verified is served
        print(f"checking {len(packaged + aot)} targets to verify their packages", file=sys.stderr)
        gk(
            "check",
            "--config",
            args.config,
            "--store",
            store.uri,
            *[a for t in packaged + aot for a in ("--target", t)],
            "--out",
            str(work / "check"),
        )
    not_exportable = {r.target: r.error for r in compiled if r.status == "not-exportable"}
    aot_rows = []

    rows = []
    c_of: dict[str, float] = {}  # (c) of each whole target, for the aot table
    for target in targets:
        if target.id in not_exportable:
            aot_rows.append([target.id, "not exportable: " + str(not_exportable[target.id])])
            continue
        if target.strategy == "aot":
            aot_rows.append(aot_row(target, config, args, store, work))
            continue
        key = target_key(target, config.base_dir)
        found, _ = find_bundle(store, key, signing_key=None)
        assert found is not None and found.status == "hit", target.id
        manifest = found.manifest
        unpacked = work / "unpacked" / target.id
        archive = work / manifest.archive.name
        store.download(found.location.key(manifest.archive.name), archive)
        bundle.extract(archive, manifest, unpacked)
        blob = unpacked / bundle.MEGACACHE
        package = target.id in packaged
        times: dict[str, list[float]] = {"eager": [], "a": [], "b": [], "c": [], "d": [], "e": []}
        for r in range(args.repeats):
            run = work / f"{target.id.replace('/', '_')}-{r}"
            if target.task == "infer":
                times["eager"].append(
                    first_call(target, config, run / "eager", key.device, eager=True)
                )
            if args.no_cold:
                hot = work / f"{target.id.replace('/', '_')}-hot"
                if r == 0:
                    first_call(target, config, hot, key.device)
            else:
                hot = run / "a"
                times["a"].append(first_call(target, config, hot, key.device))
            times["d"].append(first_call(target, config, hot, key.device))
            if not args.no_cold:
                times["b"].append(first_call(target, config, run / "b", key.device, blob))
            env = {
                kind: gk(
                    "warm",
                    "--config",
                    args.config,
                    "--store",
                    store.uri,
                    "--target",
                    target.id,
                    "--cache-dir",
                    str(run / kind),
                ).get("service_env")
                for kind in (("c", "e") if package else ("c",))
            }
            times["c"].append(first_call(target, config, run / "c", key.device))
            if package:  # the same warm, with packages loading: only this one skips Dynamo
                assert env["e"], "warm served no package"  # the env it says the service needs
                times["e"].append(
                    first_call(target, config, run / "e", key.device, env=env["e"], precompile=True)
                )
            print(
                f"{target.id} #{r + 1}: "
                + "  ".join(f"{k}={v[-1]:.2f}s" for k, v in times.items() if v),
                file=sys.stderr,
            )
        med = {k: statistics.median(v) if v else None for k, v in times.items()}
        if target.strategy == "whole" and med["c"] is not None:
            c_of[target.id] = med["c"]
        c, e = COUNTERS.get("c", {}), COUNTERS.get("e", {})
        over = {
            k: med[k] - med["eager"] if med[k] is not None and med["eager"] is not None else None
            for k in ("c", "e")
        }
        # a training step's probe does not time the import apart
        imports = statistics.median(IMPORTS) if IMPORTS else None
        IMPORTS.clear()
        # the same without importing inductor, which every compiling process pays once
        bare = {
            k: v - imports if v is not None and imports is not None else None
            for k, v in over.items()
        }
        skipped = "-" if not package else ("skipped" if dynamo_skipped(e) else "traced")
        rows.append(
            [
                target.id,
                med["eager"],
                med["a"],
                med["b"],
                med["c"],
                med["d"],
                med["e"],
                med["a"] / med["c"] if med["a"] else None,
                med["c"] / med["d"],
                over["c"],
                over["e"],
                over["e"] / over["c"] if over["e"] is not None and over["c"] else None,
                imports,
                bare["e"] / bare["c"] if bare["e"] is not None and bare["c"] else None,
                f"{c.get('fxgraph_cache_hit', 0)}/{c.get('fxgraph_cache_miss', 0)}",
                f"{c.get('autograd_cache_hit', 0)}/{c.get('autograd_cache_miss', 0)}",
                skipped,
            ]
        )
    print(
        tabulate(
            rows,
            floatfmt=".2f",
            missingval="-",
            headers=[
                "target",
                "eager s",
                "(a) cold s",
                "(b) mega-cache s",
                "(c) gatekeeper warm s",
                "(d) hot s",
                "(e) precompiled s",
                "a/c speedup",
                "c/d (limit 1.15)",
                "(c) overhead s",
                "(e) overhead s",
                "e/c overhead",
                "inductor import s",
                "e/c without the import (goal 0.4)",
                "(c) FX hit/miss",
                "(c) AOT hit/miss",
                "(e) Dynamo",
            ],
        )
    )
    if rows:
        print(
            f"\nmedian of {args.repeats} fresh processes each; first compiled call, "
            f"torch {manifest.key['env']['torch']}, {key.env_key}"
        )
    if aot_rows:
        print_aot(aot_rows, c_of, args.repeats)


def aot_row(target, config, args, store, work: Path) -> list:
    """(f): the first call of an +aot target's package in fresh processes after
    `gatekeeper warm`, next to eager's."""
    key = target_key(target, config.base_dir)
    eager, first, imports, loads, inductor = [], [], [], [], []
    for r in range(args.repeats):
        run = work / f"{target.id.replace('/', '_')}-{r}"
        eager.append(first_call(target, config, run / "eager", key.device, eager=True))
        warmed = gk(
            "warm",
            "--config",
            args.config,
            "--store",
            store.uri,
            "--target",
            target.id,
            "--cache-dir",
            str(run / "f"),
        )["targets"][0]
        if warmed.get("aot") != "served":
            return [target.id, f"package not served: {warmed.get('aot_reason')}"]
        package = package_dir(run / "f", target.id) / PACKAGE
        load = PackageRef.of(kinds.package("aot"), package)
        req = ProbeRequest.of(target, config, key.device, kind=kinds.of(target), load=load)
        resp = run_worker(req, cache_dir=run / "f", timeout=1800, label=target.id)
        loaded = resp.packages.get("aot")
        if not resp.ok or loaded is None:
            raise SystemExit(f"{target.id}: {resp.error}")
        first.append(resp.compile_seconds)
        imports.append(resp.import_seconds)
        loads.append(loaded["load_seconds"])
        inductor.append(loaded["inductor_imported"])
        print(f"{target.id} #{r + 1}: eager={eager[-1]:.3f}s f={first[-1]:.3f}s", file=sys.stderr)
    med = statistics.median
    return [target.id, med(eager), med(first), med(loads), med(imports), any(inductor)]


def print_aot(rows: list, c_of: dict[str, float], repeats: int) -> None:
    table = []
    for row in rows:
        if len(row) == 2:  # not exportable, or not served: said as it is
            table.append([row[0], row[1]])
            continue
        target, eager, f, load, imports, inductor = row
        c = c_of.get(target.removesuffix("+aot"))
        table.append(
            [
                target,
                eager,
                f,
                load,
                f - eager,
                c,
                f / c if c else None,
                imports,
                "yes" if inductor else "no",
            ]
        )
    print()
    print(
        tabulate(
            table,
            floatfmt=".3f",
            missingval="-",
            headers=[
                "target",
                "eager first call s",
                "aot first call s (f)",
                "of which load s",
                "aot - eager (goal <= 0.1)",
                "whole first call s (c)",
                "aot / whole (goal <= 0.1)",
                "import torch s (apart)",
                "inductor imported",
            ],
        )
    )
    print(
        f"\n(f): median of {repeats} fresh processes after gatekeeper warm; the package "
        "loaded as gatekeeper.load_aot loads it, import torch excluded"
    )


if __name__ == "__main__":
    main()
